"""Pilot tests driving the REAL engine on the bundled demo pair (greedy, short answers).

The engine is loaded once for the module and handed to each app. Outputs are never hard-coded:
the demo pair is retrained from time to time."""

from __future__ import annotations

import pytest
from helpers import assert_same_or_near_tie
from textual.widgets import OptionList

from mlx_spec import EngineInThread, EngineProcess, LoadSpec, TokenEvent, TurnEnd
from mlx_spec.templates import encode_chat
from mlx_spec_app.app import SpecChatApp
from mlx_spec_app.history import History
from mlx_spec_app.models import WelcomeScreen
from mlx_spec_app.screens import HistoryScreen, LoadErrorScreen, SettingsScreen
from mlx_spec_app.settings import EngineChoice, Settings
from mlx_spec_app.widgets import KIND_STYLE, STOPPED, Answer, PromptInput, StatsPanel, UserMessage

SIZE = (120, 40)
KINDS = {"accepted", "corrected", "bonus", "target"}


@pytest.fixture(scope="module")
def engine():
    # In this process (EngineInThread), loaded once for the module; the app's own default, the
    # engine process, is tested at the end of this file.
    # k fixed at 3: every round drafts, so answers always hold drafted-token kinds ("auto" may
    # turn speculation off on a CPU, where the quantized target cannot gain from it)
    return EngineInThread.load(LoadSpec(draft_length=3))


@pytest.fixture(scope="module")
def baseline(engine):
    return engine.measure_baseline(tokens=8, repeats=1)


def make_app(engine, baseline, max_tokens: int = 24) -> SpecChatApp:
    app = SpecChatApp(engine=engine, baseline=baseline, history=History())
    app.settings = Settings(max_tokens=max_tokens)
    return app


async def idle(pilot, timeout: float = 30.0) -> None:
    """Wait until the engine is idle again (and the UI has caught up)."""
    waited = 0.0
    while pilot.app.busy and waited < timeout:
        await pilot.pause(0.02)
        waited += 0.02
    assert not pilot.app.busy, f"still {pilot.app.busy} after {timeout}s"
    await pilot.pause()


async def send(pilot, text: str) -> Answer:
    pilot.app.query_one(PromptInput).text = text
    await pilot.press("enter")
    await idle(pilot)
    return pilot.app.query(Answer).last()


async def test_answer_streams_coloured_tokens_and_stats(engine, baseline, home):
    app = make_app(engine, baseline)
    async with app.run_test(size=SIZE) as pilot:
        answer = await send(pilot, "def add(a, b):")
        assert answer.text and set(answer.kinds) <= KINDS
        assert set(answer.kinds) - {"target"}  # k=3: every round drafted
        styles = {str(span.style) for span in answer.content.spans}
        assert any("$success" in s or "$error" in s or "$primary" in s for s in styles)
        line = str(answer.query_one(".stats").render())
        for part in ("tokens", "tok/s", "TTFT", "tok/pass", "speedup", "draft", "verify"):
            assert part in line
        panel = app.query_one(StatsPanel)
        assert "1 turn ·" in str(panel.query_one("#totals").render())
        assert "%" in str(panel.query_one("#positions").render())
        assert "MB" in str(panel.query_one("#memory").render())
        assert baseline.method in str(panel.query_one("#method").render())


async def test_highlight_and_markdown_toggles(engine, baseline, home):
    app = make_app(engine, baseline)
    async with app.run_test(size=SIZE) as pilot:
        answer = await send(pilot, "def f(x):")
        await pilot.press("ctrl+t")  # only the rejected drafts stay told apart
        assert {str(s.style) for s in answer.content.spans} <= {KIND_STYLE["rejected"]}
        await pilot.press("ctrl+t")
        assert answer.content.spans
        await pilot.press("ctrl+g")
        await pilot.pause()
        assert answer.has_class("markdown") and answer.query("Markdown")
        await pilot.press("ctrl+g")
        assert not answer.has_class("markdown")


class HeldUntilStopped:
    """The module's engine, but a turn waits after its first token until the turn's stop event
    is set (esc): the answer cannot end before esc arrives, however fast the machine or short
    the model's answer. Everything else is the engine's own."""

    def __init__(self, engine) -> None:
        self._engine = engine
        self.held = 0  # turns that waited for esc

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def chat(self, messages, *, stop=None, **kw):
        first = True
        for event in self._engine.chat(messages, stop=stop, **kw):
            yield event
            if first and stop is not None and isinstance(event, TokenEvent):
                first = False
                assert stop.wait(30), "esc never reached the turn"
                self.held += 1


async def test_escape_stops_and_keeps_partial_answer(engine, baseline, home, monkeypatch):
    """esc mid-answer: the turn ends cancelled, the partial answer stays on screen and in the
    history, marked stopped. Deterministic: the engine holds the turn after its first token
    until esc, and end-of-turn tokens are ignored (the rest of that round cannot end it)."""
    monkeypatch.setattr(engine.conversation, "eos", set())
    held = HeldUntilStopped(engine)
    app = make_app(held, baseline, max_tokens=3000)
    async with app.run_test(size=SIZE) as pilot:
        app.query_one(PromptInput).text = "class Parser:"
        await pilot.press("enter")
        waited = 0.0
        while not (app.query(Answer) and app.query(Answer).last().kinds) and waited < 30:
            await pilot.pause(0.02)  # until the first tokens are on screen
            waited += 0.02
        assert app.busy and app.query(Answer).last().kinds, "no tokens on screen"
        await pilot.press("escape")
        await idle(pilot)
        answer = app.query(Answer).last()
        assert held.held == 1  # the turn waited for esc, and esc released it
        assert answer.stats.finish_reason == "cancelled"
        assert answer.partial and answer.text
        assert 0 < answer.stats.generated_tokens < 3000
        assert str(answer.query_one(".stats").render()).startswith(STOPPED)
        saved = app.history.messages(app.chat.conversation)
        assert saved[-1]["partial"] and saved[-1]["content"] == answer.text


async def test_regenerate_replaces_the_answer(engine, baseline, home):
    app = make_app(engine, baseline)
    async with app.run_test(size=SIZE) as pilot:
        first = (await send(pilot, "def g(x):")).text
        await pilot.press("ctrl+r")
        await idle(pilot)
        answers = app.query(Answer)
        assert len(answers) == 1 and answers.last().text == first  # greedy: the same again
        assert [m["role"] for m in app.chat.messages] == ["user", "assistant"]
        assert [m["role"] for m in app.history.messages(app.chat.conversation)] == ["user",
                                                                                "assistant"]


async def test_history_survives_a_restart(engine, baseline, home):
    app = make_app(engine, baseline)
    async with app.run_test(size=SIZE) as pilot:
        answer = await send(pilot, "def saved(x):")
        text, kinds = answer.text, answer.runs
    app2 = make_app(engine, baseline)  # same MLX_SPEC_HOME: a new process would see this
    async with app2.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+o")
        assert isinstance(app2.screen, HistoryScreen)
        await pilot.press("enter")
        await pilot.pause()
        restored = app2.query(Answer).last()
        assert restored.text == text and restored.runs == kinds
        assert [m["role"] for m in app2.chat.messages] == ["user", "assistant"]
        follow_up = await send(pilot, "def more(y):")  # the engine re-prefills by itself
        assert follow_up.stats.prompt_tokens > len(text) // 8
        assert len(app2.history.messages(app2.chat.conversation)) == 4
        await pilot.press("ctrl+o", "d", "escape")  # delete the open conversation
        await pilot.pause()
        assert not app2.history.conversations() and not app2.query(Answer)


async def test_settings_drafter_off_gives_target_tokens(engine, baseline, home):
    app = make_app(engine, baseline)
    original = engine.conversation.drafter
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+s")
        screen = app.screen
        assert isinstance(screen, SettingsScreen)
        screen.query_one("#drafter").value = "none"
        await pilot.press("ctrl+s")  # save
        await idle(pilot)
        assert engine.conversation.drafter is None
        answer = await send(pilot, "def h(x):")
        assert set(answer.kinds) == {"target"} and answer.stats.drafted == 0
        app.apply_settings((Settings(max_tokens=24), EngineChoice("mtp", 3)))
        await idle(pilot)
        assert engine.conversation.drafter is original  # the same object back


class Recorded:
    """The module's engine, keeping each turn's end (its TurnEnd) as (target_only, end)."""

    def __init__(self, engine) -> None:
        self._engine = engine
        self.ends: list[tuple[bool, TurnEnd]] = []

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def chat(self, messages, *, target_only: bool = False, **kw):
        for event in self._engine.chat(messages, target_only=target_only, **kw):
            if isinstance(event, TurnEnd):
                self.ends.append((target_only, event))
            yield event


async def test_race_shows_both_speeds(engine, baseline, home):
    """F5 races the last prompt target-only. Greedy on a lossless decoder, so the line says
    "same tokens" unless the two runs part at a genuine near-tie (batched verification runs
    other kernels than one-token decoding), measured here on the target's own logits."""
    recorded = Recorded(engine)
    app = make_app(recorded, baseline)
    async with app.run_test(size=SIZE) as pilot:
        answer = await send(pilot, "def race(x):")
        drafter = engine.conversation.drafter
        messages = app.chat.last_turn.messages
        await pilot.press("f5")
        await idle(pilot)
        line = str(answer.query_one(".race").render())
        assert "speculative" in line and "target-only" in line and "tok/s" in line
        assert engine.conversation.drafter is drafter  # the race never touched the main engine
    assert [only for only, _ in recorded.ends] == [False, True]  # the turn, then the race
    (_, spec), (_, plain) = recorded.ends
    assert spec.stats.drafted > 0 and plain.stats.drafted == 0
    n = min(len(spec.tokens), len(plain.tokens))
    assert n > 0
    target = engine.engine.target
    bits = (target.config.get("quantization") or {}).get("bits")
    prompt = encode_chat(engine.engine.tokenizer, messages)
    # equal, or parted at a measured near-tie: anything else fails here, whatever the line says
    gap = assert_same_or_near_tie(target, prompt, list(spec.tokens[:n]), list(plain.tokens[:n]),
                                  bits)
    assert line.endswith(" │ same tokens" if gap is None else " │ outputs differ (a near-tie)")


async def test_copy_answer_and_code_block(engine, baseline, home):
    app = make_app(engine, baseline)
    async with app.run_test(size=SIZE) as pilot:
        answer = await send(pilot, "def copy(x):")
        await pilot.press("f8")
        assert app.clipboard == answer.text
        answer.extend([("\n```python\nprint(1)\n```", "target")])  # a block, to copy
        await pilot.press("f9")
        assert app.clipboard == "print(1)\n"


async def test_bad_input_empty_and_too_long(engine, baseline, home):
    app = make_app(engine, baseline)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("enter")  # empty: nothing sent, a notification
        await pilot.pause()
        assert not app.query(UserMessage)
        assert any("Empty" in n.message for n in app._notifications)
        huge = "def f(x):\n    return x\n" * 2000  # far beyond the model's 4096 tokens
        app.query_one(PromptInput).text = huge
        await pilot.press("enter")
        await idle(pilot)
        assert not app.query(UserMessage) and not app.query(Answer)  # nothing half-sent
        assert app.query_one(PromptInput).text == huge.rstrip()  # given back to edit
        assert any("context" in n.message for n in app._notifications)
        assert not app.history.conversations()


async def test_newline_key_and_resize_mid_stream(engine, baseline, home):
    app = make_app(engine, baseline, max_tokens=200)
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.query_one(PromptInput)
        await pilot.press("d", "e", "f", "ctrl+j", "x")
        assert prompt.text == "def\nx"
        await pilot.press("enter")
        for size in [(80, 24), (60, 20), (140, 50), SIZE]:
            await pilot.resize_terminal(*size)
            await pilot.pause(0.05)
        await idle(pilot)
        assert app.query(Answer).last().stats is not None


async def test_load_failure_shows_one_line_and_exits_2(home):
    app = SpecChatApp(LoadSpec(model=str(home / "no-such-model")))
    async with app.run_test(size=SIZE) as pilot:
        while not (isinstance(app.screen, LoadErrorScreen) and app.screen.query("#message")):
            await pilot.pause(0.05)
        message = str(app.screen.query_one("#message").render())
        assert "not found" in message and "\n" not in message and "Traceback" not in message
        await pilot.press("escape")
        await pilot.pause()
    assert app.return_code == 2


async def test_the_app_runs_its_own_engine_in_a_child_process(home):
    """The default path (no engine handed in): the first run welcomes, the demo is its first
    choice; EngineProcess started, used, closed on exit."""
    app = SpecChatApp(LoadSpec(draft_length=3))
    async with app.run_test(size=SIZE) as pilot:
        while not isinstance(app.screen, WelcomeScreen):
            await pilot.pause(0.05)
        first = app.screen.query_one(OptionList).get_option_at_index(0)
        assert "2.4M-parameter code model" in str(first.prompt)
        await pilot.press("enter")  # the demo
        await pilot.pause(0.1)
        await idle(pilot, timeout=60)  # start the child, load, measure the baseline
        assert "does not chat" in str(app.query_one(".note").render())
        assert isinstance(app.engine, EngineProcess)
        child = app.engine._process
        answer = await send(pilot, "def add(a, b):")
        assert answer.text and set(answer.kinds) - {"target"} and answer.stats is not None
        assert "speedup" in str(answer.query_one(".stats").render())
    assert child.wait(5) == 0  # the app closed its engine


async def test_at_80x24_the_panel_folds_and_the_legend_is_whole(engine, baseline, home):
    app = make_app(engine, baseline)
    async with app.run_test(size=(80, 24)) as pilot:
        await send(pilot, "def add(a, b):")
        panel = app.query_one(StatsPanel)
        assert not panel.display
        legend = app.query_one("#legend")
        assert legend.size.width >= len(str(legend.render()))  # never cut
        status = app.query_one("#status")
        assert status.size.width >= len(str(status.render()).rstrip())
        await pilot.press("ctrl+b")
        await pilot.pause()
        assert panel.display and legend.size.width >= len(str(legend.render()))
        await pilot.press("ctrl+b")
        await pilot.resize_terminal(120, 40)
        await pilot.pause()
        assert not panel.display  # the user folded it: it stays folded when wide


async def test_a_killed_engine_ends_the_turn_in_one_line_and_is_started_again(home):
    from mlx_spec.assets import demo_model

    app = SpecChatApp(LoadSpec(model=str(demo_model()), draft_length=3))
    async with app.run_test(size=SIZE) as pilot:
        await idle(pilot, timeout=60)
        first = app.engine
        assert isinstance(first, EngineProcess)
        app.settings = Settings(max_tokens=2000)
        app.query_one(PromptInput).text = "def add(a, b):"
        await pilot.press("enter")
        while not app.chat.answer or not app.chat.answer.text:
            await pilot.pause(0.02)
        first._process.kill()  # the OOM killer, mid-answer
        for _ in range(1200):
            if app.engine is not None and app.engine is not first and not app.busy:
                break
            await pilot.pause(0.05)
        assert isinstance(app.engine, EngineProcess) and app.engine.alive
        notes = [str(n.message) for n in app._notifications]
        assert any("ended unexpectedly" in n and "\n" not in n for n in notes), notes
        app.settings = Settings(max_tokens=16)
        answer = await send(pilot, "def sub(a, b):")
        assert answer.text and answer.stats is not None


async def test_the_app_says_so_in_one_line_and_chats_on(engine, baseline, home):
    (home / "history.sqlite3").write_bytes(b"\x00garbage" * 500)
    app = make_app(engine, baseline)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        notes = [str(n.message) for n in app._notifications]
        assert any("damaged" in n for n in notes), notes
        answer = await send(pilot, "def add(a, b):")
        assert answer.text
    assert History(home / "history.sqlite3").conversations()  # the fresh file saves


async def test_a_message_with_bytes_that_are_not_utf8_is_replaced_with_a_notice(engine, baseline,
                                                                               home):
    app = make_app(engine, baseline)
    async with app.run_test(size=SIZE) as pilot:
        answer = await send(pilot, "def f(\udcff\udcfe):")  # as surrogateescape carries 0xff 0xfe
        assert answer.text and answer.stats is not None
        assert app.chat.messages[0]["content"] == "def f(\ufffd\ufffd):"
        assert any("not valid Unicode" in str(n.message) for n in app._notifications)
