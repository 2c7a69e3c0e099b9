"""The app's parts wired together on the recorded engine (fakes.py): what a pick or a download
loads, what is remembered and reopened, what a conversation is saved with, the settings
screen's draft-length rule, and the chat pane standing apart from the app."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from textual.widgets import Input

from mlx_spec import Baseline, LoadSpec, MlxSpecError, hub, parse_draft_length
from mlx_spec_app import engine_host
from mlx_spec_app.app import SpecChatApp
from mlx_spec_app.history import History
from mlx_spec_app.screens import SettingsScreen
from mlx_spec_app.widgets import PromptInput

from .fakes import FakeEngine

SIZE = (100, 30)
PAIR = hub.Launch("tiny-pair", Path("/cache/target"), drafter="draft",
                  draft_model=Path("/cache/draft"))
HEAD = hub.Launch("tiny-mtp", Path("/cache/other"), drafter="mtp", mtp=Path("/cache/head"))
GONE = "/no/longer/here"


@pytest.fixture
def started(monkeypatch) -> list[LoadSpec]:
    """Every spec the app starts an engine for; each start gives a FakeEngine (GONE fails)."""
    specs: list[LoadSpec] = []

    def start(spec: LoadSpec) -> FakeEngine:
        specs.append(spec)
        if spec.model == GONE:
            raise MlxSpecError(f"model not found: {GONE}")
        return FakeEngine()

    monkeypatch.setattr(engine_host, "start_engine", start)
    return specs


def welcomed() -> History:
    history = History()
    history.set("welcomed", True)  # no welcome screen: the app loads at once
    return history


async def idle(pilot) -> None:
    for _ in range(500):
        if not pilot.app.busy:
            break
        await pilot.pause(0.01)
    assert not pilot.app.busy
    await pilot.pause()


async def test_a_downloaded_pair_keeps_the_drafter_the_user_chose(home, started):
    """`mlx-spec chat tiny-pair --drafter ngram`: the pair loads with n-gram, not its draft
    model (the app used to overwrite the user's drafter with the pair's)."""
    app = SpecChatApp(LoadSpec(drafter="ngram", draft_length=2), history=welcomed())
    async with app.run_test(size=SIZE) as pilot:
        await idle(pilot)
        app.models.launch(PAIR)
        await idle(pilot)
    assert started[-1] == LoadSpec(model="/cache/target", drafter="ngram", draft_length=2)


async def test_a_pair_fills_the_drafter_left_unset_and_the_next_pair_brings_its_own(home,
                                                                                    started):
    app = SpecChatApp(LoadSpec(draft_length=2), history=welcomed())
    async with app.run_test(size=SIZE) as pilot:
        await idle(pilot)
        app.models.launch(PAIR)
        await idle(pilot)
        app.models.launch(HEAD)
        await idle(pilot)
    pair, head = started[-2:]
    assert pair == LoadSpec(model="/cache/target", drafter="draft", draft_model="/cache/draft",
                            draft_length=2)
    assert head == LoadSpec(model="/cache/other", drafter="mtp", mtp="/cache/head", draft_length=2)


async def test_the_last_model_is_remembered_and_reopened_with_the_users_drafter(home, started):
    app = SpecChatApp(LoadSpec(), history=welcomed())
    async with app.run_test(size=SIZE) as pilot:
        await idle(pilot)
        app.models.launch(PAIR)
        await idle(pilot)
    assert app.history.get("last_model") == {"model": "/cache/target",
                                             "draft_model": "/cache/draft", "mtp": None}
    again = SpecChatApp(LoadSpec(drafter="ngram"), history=History())
    async with again.run_test(size=SIZE) as pilot:
        await idle(pilot)
    assert started[-1] == LoadSpec(model="/cache/target", drafter="ngram")


@pytest.mark.parametrize("saved, expected", [
    ({"model": "/m"}, LoadSpec(model="/m", draft_length=4)),  # an older record: the model only
    ({"model": "/m", "draft_model": "/d", "mtp": None},
     LoadSpec(model="/m", draft_model="/d", draft_length=4)),
    ({"model": GONE}, LoadSpec(draft_length=4)),  # gone since: the demo pair
    ({"model": 3}, LoadSpec(draft_length=4)),  # hand-edited: ignored
    ("/m", LoadSpec(draft_length=4)),
])
async def test_saved_last_models_reopen_or_fall_back_to_the_demo(home, started, saved, expected):
    history = welcomed()
    history.set("last_model", saved)
    app = SpecChatApp(LoadSpec(draft_length=4), history=history)
    async with app.run_test(size=SIZE) as pilot:
        await idle(pilot)
        assert app.engine is not None
    assert started[-1] == expected


async def test_a_conversation_is_saved_titled_by_its_message_with_the_model_it_ran_on(home):
    app = SpecChatApp(engine=FakeEngine(), baseline=Baseline(100.0, 8, "fixed"))
    async with app.run_test(size=SIZE) as pilot:
        app.query_one(PromptInput).text = "def add(a, b):"
        await pilot.press("enter")
        await idle(pilot)
    rows = app.history.db.execute("SELECT title, model FROM conversations").fetchall()
    assert rows == [("def add(a, b):", "demo-target-q8")]


async def test_the_settings_screen_checks_the_draft_length_by_the_engines_rule(home):
    app = SpecChatApp(engine=FakeEngine(), baseline=Baseline(100.0, 8, "fixed"))
    with pytest.raises(MlxSpecError) as rule:
        parse_draft_length("17")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+s")
        screen = app.screen
        assert isinstance(screen, SettingsScreen)
        screen.query_one("#draft_length", Input).value = "17"
        await pilot.press("ctrl+s")
        assert app.screen is screen and str(rule.value) in str(screen.query_one("#error").render())
        screen.query_one("#draft_length", Input).value = " Auto "
        await pilot.press("ctrl+s")
        await idle(pilot)
        assert app.screen is not screen and app.engine.info.draft_length == "auto"


def test_the_chat_pane_does_not_import_the_app():
    code = "import sys, mlx_spec_app.chat_pane; sys.exit('mlx_spec_app.app' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
