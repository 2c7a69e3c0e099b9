"""What keeps streaming cheap must not change what is shown: the incrementally wrapped token
view against a from-scratch render, its row reservation, and the frame pacer's arithmetic."""

from __future__ import annotations

import random

from textual.app import App
from textual.containers import VerticalScroll
from textual.visual import Visual

from mlx_spec_app.stream import FramePacer
from mlx_spec_app.widgets import Answer, TokenView

KINDS = ["accepted", "corrected", "bonus", "target"]
WORDS = ["def", " f(x):", "\n", "    return", " x", " +", " 1", "\n\n", " a_long_identifier" * 4,
         "\t", " ünïcode", " 中文字", " ", "\n"]


class Host(App[None]):
    CSS = "VerticalScroll { scrollbar-gutter: stable; }"  # as the app's chat

    def compose(self):
        with VerticalScroll():
            yield Answer()


def rendered(view: TokenView) -> list[list]:
    return [list(view.render_line(y)) for y in range(view.rows)]


def from_scratch(view: TokenView, answer: Answer) -> list[list]:
    strips = Visual.to_strips(view, answer.content, view.size.width, None, view.visual_style)
    return [list(s) for s in strips]


async def test_incremental_rows_equal_a_full_render_through_growth_resize_and_highlight():
    rng = random.Random(0)
    app = Host()
    async with app.run_test(size=(50, 30)) as pilot:
        answer = app.query_one(Answer)
        view = answer.query_one(TokenView)
        for step in range(60):
            answer.extend([(rng.choice(WORDS), rng.choice(KINDS))
                           for _ in range(rng.randint(1, 6))])
            await pilot.pause()
            assert rendered(view) == from_scratch(view, answer), step
            # while streaming the height moves in whole steps, so layouts stay rare
            assert view.size.height % TokenView.STEP == 0 and view.size.height >= view.rows
            if step == 30:
                await pilot.resize_terminal(37, 30)
                await pilot.pause()
                await pilot.pause()
        assert view.rows > TokenView.STEP  # the answer outgrew one step
        answer.set_highlight(False)
        await pilot.pause()
        assert not answer.content.spans and rendered(view) == from_scratch(view, answer)
        answer.finish(None, "done")
        await pilot.pause()
        assert view.size.height == view.rows  # no reserved rows once the answer is complete


def test_pacer_holds_the_ui_share_at_its_budget_within_bounds():
    pacer = FramePacer(budget=0.03, fastest=1 / 30, slowest=0.25)
    assert pacer.delay_for(0.0) == 1 / 30  # cheap frames: the fastest rate
    assert abs(pacer.delay_for(0.003) - 0.1) < 1e-12  # 3 ms per frame at 3%: 10 per second
    assert pacer.delay_for(0.5) == 0.25  # a costly frame never stops the stream for long
    pacer.start()
    for _ in range(3):
        sum(range(20000))  # some CPU on this thread between flushes
        pacer.next_delay()
    assert pacer.frames == 3 and pacer.cpu_s > 0 and 0 < pacer.share <= 1.5
