"""What speculation did, on screen: the drafts each correction replaced struck out before it (not
part of the answer), the inspect screen (p, q, the test and the round of any token; the round
timeline), and the saved trace — on the recorded engine (fakes.py) and on the real demo pair."""

from __future__ import annotations

from textual.widgets import DataTable, OptionList, Static, TextArea

from mlx_spec import Baseline, EngineInThread, LoadSpec, load_trace, rejected_text
from mlx_spec.paths import data_dir
from mlx_spec_app.app import SpecChatApp
from mlx_spec_app.inspect import InspectScreen
from mlx_spec_app.keys import ACTIONS
from mlx_spec_app.race import RacePicker, RaceScreen
from mlx_spec_app.stream import TokenBuffer
from mlx_spec_app.widgets import Answer, PromptInput

from .fakes import ANSWER, REJECTED, FakeEngine, rounds

BASELINE = Baseline(200.0, 32, "fixed")
ANSWER_TEXT = "".join(t for t, _ in ANSWER)


async def one_turn(pilot, text: str = "Write add(a, b)") -> Answer:
    pilot.app.query_one(PromptInput).text = text
    await pilot.press("enter")
    for _ in range(3000):
        if not pilot.app.busy:
            break
        await pilot.pause(0.01)
    await pilot.pause()
    return pilot.app.chat.last_answer()


def test_the_buffer_puts_a_rounds_rejected_drafts_just_before_its_correction():
    buffer = TokenBuffer()
    from mlx_spec import TokenEvent

    starts = 0
    for r in rounds():
        buffer.push_round(r)
        for i in range(starts, starts + r.emitted):
            buffer.push(TokenEvent(i, *ANSWER[i]))
        starts += r.emitted
    pieces = buffer.drain()
    ghosts = [(i, t) for i, (t, k) in enumerate(pieces) if k == "rejected"]
    assert [t for _, t in ghosts] == ["".join(v) for v in REJECTED.values()]
    assert all(pieces[i + 1][1] == "corrected" for i, _ in ghosts)
    assert "".join(t for t, k in pieces if k != "rejected") == ANSWER_TEXT


async def test_rejected_drafts_show_struck_out_and_are_never_the_answer(home):
    """Off until f3 (a weak drafter's ghosts clutter the answer); the choice is remembered."""
    app = SpecChatApp(engine=FakeEngine(), baseline=BASELINE)
    async with app.run_test(size=(100, 30)) as pilot:
        answer = await one_turn(pilot)
        assert answer.content.plain == answer.text == ANSWER_TEXT  # copied, saved, sent back
        assert "rejected" not in str(app.query_one("#legend", Static).render())
        await pilot.press("f3")
        shown = answer.content.plain
        assert "(x,(a" in shown and " pass\n" in shown and "add(2print" in shown
        assert answer.text == ANSWER_TEXT and app.history.get("ghosts") is True
        assert "rejected" in str(app.query_one("#legend", Static).render())
        assert app.chat.messages[-1]["content"] == ANSWER_TEXT
        saved = app.history.messages(app.chat.conversation)[-1]
        assert saved["content"] == ANSWER_TEXT
        assert ["(x,", "rejected"] in saved["kinds"]  # reopened, the ghosts come back
        await pilot.press("f3")
        assert answer.content.plain == ANSWER_TEXT and answer.text == ANSWER_TEXT
        assert app.history.get("ghosts") is False


async def test_inspect_shows_p_q_the_test_and_the_round_of_any_token(home):
    app = SpecChatApp(engine=FakeEngine(), baseline=BASELINE)
    async with app.run_test(size=(80, 24)) as pilot:
        await one_turn(pilot)
        await pilot.press("f2")
        screen = app.screen
        assert isinstance(screen, InspectScreen)
        details = screen.query_one("#details", Static)
        text = str(details.render())
        assert screen.cursor == 2 and "'(a'" in text  # the first correction
        assert "round 1: drafted 4, accepted 2" in text
        assert "p 10.0% · q 60.0% · min(1, p/q) 16.7% → rejected" in text
        assert "replaced: '(x' p 10.0% q 60.0% rejected, ',' p 10.0% q 60.0% untested" in text
        await pilot.press("n")
        assert screen.cursor == 6 and "' pass'" in str(details.render())
        await pilot.press("left", "left")
        text = str(details.render())
        assert screen.cursor == 4 and "accepted draft" in text and "→ accepted" in text
        await pilot.click("#tokens", offset=(1, 0))  # "def": the answer's first token
        assert screen.cursor == 0 and "'def'" in str(details.render())
        await pilot.press("t")
        table = screen.query_one(DataTable)
        assert table.display and table.row_count == len(rounds())
        await pilot.press("t", "escape")
        assert not isinstance(app.screen, InspectScreen)


async def test_save_trace_writes_a_page_and_its_record(home):
    app = SpecChatApp(engine=FakeEngine(), baseline=BASELINE)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("f4")  # nothing yet: a warning, no file
        assert not (data_dir() / "traces").exists()
        await one_turn(pilot)
        await pilot.press("f4")
        pages = list((data_dir() / "traces").glob("*.html"))
        assert len(pages) == 1
        trace = load_trace(pages[0].with_suffix(".json"))
        assert trace.text == ANSWER_TEXT and len(trace.rounds) == len(rounds())
        assert trace.engine["target"] == "demo-target-q8"
        assert "class='ghost'" in pages[0].read_text()


async def test_a_real_turn_is_traced_and_its_ghosts_are_its_rejections(home):
    engine = EngineInThread.load(LoadSpec(draft_length=3))
    app = SpecChatApp(engine=engine, baseline=BASELINE)
    async with app.run_test(size=(100, 30)) as pilot:
        answer = await one_turn(pilot, "def add(")
        trace = answer.trace
        assert trace is not None and trace.text == answer.text and trace.rounds
        ghosts = [t for t, k in answer.runs if k == "rejected"]
        fixes = [r for r in trace.rounds if r.rejected and r.accepted < r.emitted]
        assert fixes and ghosts == [rejected_text(r) for r in fixes]
        await pilot.press("f2")
        assert "round " in str(app.screen.query_one("#details", Static).render())


def test_no_app_key_is_taken_by_the_prompt_box():
    """The prompt has focus: a key TextArea binds never reaches the app (f6 and f7 select)."""
    taken = {key for b in TextArea.BINDINGS for key in b.key.split(",")}
    assert not taken & {a.key for a in ACTIONS}


async def test_racing_another_drafter_shows_both_answers_in_their_colours(home):
    """f10, then n-gram: the last prompt again with the other drafter, on a conversation of
    its own. Greedy: the same text in both panes, coloured by what each drafter got right."""
    engine = EngineInThread.load(LoadSpec(draft_length=3))
    app = SpecChatApp(engine=engine, baseline=BASELINE)
    async with app.run_test(size=(100, 30)) as pilot:
        answer = await one_turn(pilot, "def add(")
        before = list(engine.conversation.tokens)
        await pilot.press("f10")
        assert isinstance(app.screen, RacePicker)
        picker = app.screen.query_one(OptionList)
        ids = [picker.get_option_at_index(i).id for i in range(picker.option_count)]
        assert "mtp" not in ids and {"none", "ngram"} <= set(ids)
        picker.highlighted = ids.index("ngram")
        await pilot.press("enter")
        for _ in range(3000):
            if isinstance(app.screen, RaceScreen):
                break
            await pilot.pause(0.01)
        screen = app.screen
        assert isinstance(screen, RaceScreen)
        (_, mine), (end, theirs) = screen.sides
        assert end.stats.drafter == "ngram" and mine.text == theirs.text == answer.text
        assert [t.kind for t in mine.tokens] != [t.kind for t in theirs.tokens]
        assert "same tokens" in screen.verdict and "ngram" in screen.verdict
        assert list(engine.conversation.tokens) == before  # the chat was never touched
