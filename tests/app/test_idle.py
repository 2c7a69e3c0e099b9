"""Idle work (issue 36): the app is ready once the model is loaded; speedups read "estimating…"
until the baseline, measured while the engine is idle, arrives; a user's call stops that work
first and never overlaps it; a saved baseline is shown at once and timed once more while idle
(one measurement can be far off: speedups quote the median of the last few sessions')."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from mlx_spec import Baseline, EngineInThread, LoadSpec
from mlx_spec_app import engine_host
from mlx_spec_app.app import SpecChatApp
from mlx_spec_app.history import History
from mlx_spec_app.settings import EngineChoice, Settings
from mlx_spec_app.widgets import ESTIMATING, NOT_MEASURED, Answer, PromptInput, StatsPanel

from .fakes import ANSWER, MEASURED, FakeEngine

SIZE = (120, 40)
SAVED = Baseline(80.0, 64, "saved by an earlier run")


async def until(pilot, ok: Callable[[], bool], timeout: float = 10.0) -> None:
    """Let the app run until ok() holds (the UI has caught up after)."""
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, "timed out"
        await pilot.pause(0.01)
    await pilot.pause()


async def send(pilot, text: str) -> Answer:
    """Type `text`, press enter, wait for the answer to finish."""
    pilot.app.query_one(PromptInput).text = text
    await pilot.press("enter")
    await until(pilot, lambda: not pilot.app.busy and pilot.app.chat.answer is None)
    return pilot.app.query(Answer).last()


def panel(app: SpecChatApp, part: str) -> str:
    return str(app.query_one(StatsPanel).query_one(part).render())


def stats(answer: Answer) -> str:
    return str(answer.query_one(".stats").render())


async def test_ready_is_posted_before_any_baseline_measurement(home, monkeypatch):
    fake = FakeEngine()
    fake.release.clear()  # idle work would run until stopped
    monkeypatch.setattr(engine_host, "start_engine", lambda spec: fake)
    calls_at_ready: list[list[str]] = []
    ready = SpecChatApp.on_engine_ready

    def spy(app: SpecChatApp, msg: engine_host.EngineReady) -> None:
        calls_at_ready.append(list(fake.calls))
        ready(app, msg)

    monkeypatch.setattr(SpecChatApp, "on_engine_ready", spy)
    history = History()
    history.set("welcomed", True)  # no welcome screen: the app loads at once
    app = SpecChatApp(LoadSpec(), history=history)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "calibrate" in fake.calls)  # idle work, after ready
        assert calls_at_ready == [[]]  # nothing measured before ready
        assert str(app.query_one("#status").render()).strip().startswith("ready")
        assert ESTIMATING in panel(app, "#method")


async def test_estimating_until_the_baseline_arrives_then_the_speedup(home):
    fake = FakeEngine(calibrated=True)
    fake.release.clear()
    app = SpecChatApp(engine=fake, history=History())
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: fake.calls == ["measure_baseline"])
        assert ESTIMATING in panel(app, "#method")
        first = await send(pilot, "def add(a, b):")  # stops the measurement; the turn runs
        assert ESTIMATING in stats(first) and "×" not in stats(first)
        assert ESTIMATING in panel(app, "#totals") and "×" not in panel(app, "#totals")
        fake.release.set()  # the measurement that resumed after the turn now completes
        await until(pilot, lambda: f"baseline {MEASURED.tok_s:.1f}" in panel(app, "#method"))
        assert "speedup ×" in panel(app, "#totals")
        assert "speedup ×" in stats(first) and ESTIMATING not in stats(first)  # re-quoted
        second = await send(pilot, "def sub(a, b):")
        assert "speedup ×" in stats(second)
    assert fake.calls == ["measure_baseline", "chat", "measure_baseline", "chat"]
    assert fake.overlaps == 0


async def test_a_failed_measurement_says_not_measured_instead_of_estimating_forever(home):
    """Idle work that fails is not tried again on that engine: the answers that waited for
    its speedup, the totals and the ones after say "not measured" and the panel says why."""
    fake = FakeEngine(calibrated=True)
    fake.release.clear()
    failing = fake.measure_baseline

    def measure_baseline(**kw):
        if failing(**kw) is not None:  # the run after the turn: released, then it fails
            raise RuntimeError("the target ran out of memory")
        return None

    fake.measure_baseline = measure_baseline
    app = SpecChatApp(engine=fake, history=History())
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: fake.calls == ["measure_baseline"])
        first = await send(pilot, "def add(a, b):")
        assert ESTIMATING in stats(first) and "1 turn ·" in panel(app, "#totals")
        fake.release.set()
        await until(pilot, lambda: NOT_MEASURED in panel(app, "#method"))
        assert "ran out of memory" in panel(app, "#method")
        assert NOT_MEASURED in stats(first) and ESTIMATING not in stats(first)  # re-quoted
        assert NOT_MEASURED in panel(app, "#totals") and "×" not in panel(app, "#totals")
        second = await send(pilot, "def sub(a, b):")
        assert NOT_MEASURED in stats(second) and "×" not in stats(second)
        assert "2 turns ·" in panel(app, "#totals")
    assert fake.calls == ["measure_baseline", "chat", "measure_baseline", "chat"]


async def test_a_turn_and_a_drafter_switch_stop_idle_work_and_proceed(home):
    fake = FakeEngine()
    fake.release.clear()
    app = SpecChatApp(engine=fake, history=History())
    app.settings = Settings()
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: fake.calls == ["calibrate"])
        assert not fake.stops[0].is_set()
        answer = await send(pilot, "def add(a, b):")
        assert fake.stops[0].is_set()
        assert answer.text == "".join(text for text, _ in ANSWER)
        await until(pilot, lambda: len(fake.calls) == 3)  # idle again: it resumes
        app.apply_settings((app.settings, EngineChoice("ngram", 2)))
        await until(pilot, lambda: app.engine.info.drafter == "ngram" and not app.busy)
        assert fake.stops[1].is_set()
        await until(pilot, lambda: len(fake.calls) == 5)
        quit_at = time.monotonic()
    assert time.monotonic() - quit_at < 2  # quitting stops idle work, promptly
    assert fake.calls == ["calibrate", "chat", "calibrate", "configure", "calibrate"]
    assert fake.stops[2].is_set() and fake.overlaps == 0


async def test_a_saved_baseline_is_shown_at_once_then_timed_once_more(home):
    fake = FakeEngine(baseline=SAVED, calibrated=True)
    fake.release.clear()  # the measurement waits: the saved baseline is what is shown
    app = SpecChatApp(engine=fake, history=History())
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: fake.calls == ["measure_baseline"])
        assert f"baseline {SAVED.tok_s:.1f} tok/s: {SAVED.method}" in panel(app, "#method")
        answer = await send(pilot, "def add(a, b):")  # stops the measurement; quoted on SAVED
        assert f"speedup ×{SAVED.speedup(answer.stats.tok_s):.2f}" in stats(answer)
        fake.release.set()
        await until(pilot, lambda: f"baseline {MEASURED.tok_s:.1f}" in panel(app, "#method"))
        second = await send(pilot, "def sub(a, b):")
        assert f"speedup ×{MEASURED.speedup(second.stats.tok_s):.2f}" in stats(second)
        await pilot.pause(0.1)
    # timed once on this engine, not again
    assert fake.calls == ["measure_baseline", "chat", "measure_baseline", "chat"]


async def test_a_baseline_given_with_the_engine_is_used_as_it_is(home):
    fake = FakeEngine(calibrated=True)
    app = SpecChatApp(engine=fake, baseline=SAVED, history=History())
    async with app.run_test(size=SIZE) as pilot:
        answer = await send(pilot, "def add(a, b):")
        assert f"speedup ×{SAVED.speedup(answer.stats.tok_s):.2f}" in stats(answer)
        await pilot.pause(0.1)
    assert fake.calls == ["chat"]


class Counted(EngineInThread):
    """The real engine in this process, counting its baseline measurements; each measurement
    waits for `go` (set by the test once it has seen "estimating…": the f32 demo target can
    measure faster than the app's first frame)."""

    measured = 0

    def measure_baseline(self, **kwargs) -> Baseline | None:
        self.measured += 1
        assert self.go.wait(120), "the test never let the measurement run"
        return super().measure_baseline(**kwargs)


async def test_a_real_engine_measures_while_idle_and_the_next_run_reads_it(home):
    first = Counted.load(LoadSpec(draft_length=3))  # a fresh MLX_SPEC_HOME: nothing saved
    first.go = threading.Event()
    assert first.info.baseline is None and not first.info.calibrated
    app = SpecChatApp(engine=first, history=History())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert ESTIMATING in panel(app, "#method")
        first.go.set()
        await until(pilot, lambda: app.host.baseline is not None, timeout=120)
        assert "÷ baseline" in panel(app, "#method") and first.measured == 1
    saved = first.info.baseline
    second = Counted.load(LoadSpec(draft_length=3))  # a later run on the same model and device
    second.go = threading.Event()
    assert second.info.baseline == saved and second.info.calibrated  # read, shown at once
    app = SpecChatApp(engine=second, history=History())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert f"baseline {saved.tok_s:.1f}" in panel(app, "#method")
        second.go.set()  # this session's measurement joins the saved one
        await until(pilot, lambda: app.host.baseline != saved, timeout=120)
        joined = app.host.baseline
        assert joined.measurements[0] == saved.tok_s and len(joined.measurements) == 2
        assert "the median of the last 2 sessions' measurements" in panel(app, "#method")
    assert second.measured == 1 and Counted.load(LoadSpec(draft_length=3)).info.baseline == joined
