"""SVG snapshots of the main screens, fed the recorded stream in fakes.py (timings of a real
engine change every run, so a real engine's screens cannot be compared with stored SVGs).

Update after an intended change: uv run pytest tests/app/test_snapshots.py --snapshot-update"""

from __future__ import annotations

from mlx_spec import Baseline
from mlx_spec_app.app import SpecChatApp
from mlx_spec_app.widgets import PromptInput

from .fakes import FakeEngine

SIZE = (120, 40)
BASELINE = Baseline(200.0, 32, "fixed for the snapshot")


def make_app() -> SpecChatApp:
    return SpecChatApp(engine=FakeEngine(), baseline=BASELINE)  # type: ignore[arg-type]


async def still_cursor(pilot) -> None:
    pilot.app.query_one(PromptInput).cursor_blink = False  # a blinking cursor is not stable


async def one_turn(pilot) -> None:
    await still_cursor(pilot)
    pilot.app.query_one(PromptInput).text = "Write add(a, b) and call it"
    await pilot.press("enter")
    while pilot.app.busy:
        await pilot.pause(0.02)
    await pilot.pause()


def test_chat_after_one_turn(snap_compare, home):
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=one_turn)


def test_chat_at_80x24(snap_compare, home):
    """macOS Terminal's default size: the panel folds away, legend and status stay whole."""
    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=one_turn)


def test_chat_without_highlighting(snap_compare, home):
    async def run(pilot):
        await one_turn(pilot)
        await pilot.press("ctrl+t")

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=run)


def test_rejected_drafts_at_80x24(snap_compare, home):
    """f3: the drafts each correction replaced, struck out just before it."""
    async def run(pilot):
        await one_turn(pilot)
        await pilot.press("f3")

    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=run)


def test_inspect_at_80x24(snap_compare, home):
    """f2 on the last answer: the cursor on its first correction, what decided it below."""
    async def run(pilot):
        await one_turn(pilot)
        await pilot.press("f2")

    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=run)


def test_round_timeline_at_80x24(snap_compare, home):
    async def run(pilot):
        await one_turn(pilot)
        await pilot.press("f2", "t")

    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=run)


def test_help_screen(snap_compare, home):
    assert snap_compare(make_app(), terminal_size=SIZE, press=["f1"], run_before=still_cursor)


def test_settings_screen(snap_compare, home):
    assert snap_compare(make_app(), terminal_size=SIZE, press=["ctrl+s"],
                        run_before=still_cursor)
