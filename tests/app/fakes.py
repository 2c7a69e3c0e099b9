"""A recorded event stream standing in for the engine.

Snapshot tests use it: a real engine's timings (tok/s, TTFT, draft/verify times) differ from run
to run, so its screens can never match a stored SVG. Wiring and idle-work tests use it to count
and order the app's engine calls; what the engine itself does is tested on the real one
(test_pilot.py, test_idle.py)."""

from __future__ import annotations

import threading
from dataclasses import replace

from mlx_spec import (
    Baseline,
    DraftLength,
    EngineInfo,
    Kind,
    SamplingConfig,
    TokenEvent,
    TurnEnd,
    TurnStats,
)

A, C, B, T = Kind.ACCEPTED, Kind.CORRECTED, Kind.BONUS, Kind.TARGET

# an answer as the demo pair might give it, with every kind of token
ANSWER = [
    ("def", A), (" add", A), ("(a", C), (",", A), (" b", A), ("):", B), ("\n   ", C),
    (" return", A), (" a", A), (" +", A), (" b", B), ("\n", T), ("\n", T), ("print", C),
    ("(add", A), ("(1", A), (",", A), (" 2", B), ("))", T),
]

STATS = TurnStats(  # fixed numbers: see the module docstring
    prompt_tokens=15, generated_tokens=len(ANSWER), target_passes=8, drafted=24, accepted=11,
    per_position_drafted=(8, 8, 8), per_position_accepted=(6, 3, 2), prefill_s=0.010,
    draft_s=0.020, verify_s=0.080, ttft_s=0.015, total_s=0.110, itl_p50_s=0.0, itl_p90_s=0.012,
    itl_max_s=0.014, peak_memory=6 * 2**20,
    target_bytes=2663168, drafter_bytes=2198784, kv_cache_bytes=524288, drafter="mtp",
    max_draft=3, finish_reason="stop",
)


MEASURED = Baseline(50.0, 64, "measured by the fake")  # what its idle measurement gives


class FakeEngine:
    """An EngineService replaying ANSWER; configure() changes what `info` says, nothing else.

    Its idle work (calibrate, measure_baseline) is done at once; while `release` is clear it
    runs until its stop event is set, then says it was stopped. `calls` lists every call in
    order, `stops` the stop events idle work was given, `overlaps` the calls that began while
    idle work ran (the app must never make one)."""

    def __init__(self, *, baseline: Baseline | None = None, calibrated: bool = False) -> None:
        self.info = EngineInfo("demo-target-q8", "mtp", 3, ("none", "mtp", "ngram"),
                               baseline, calibrated)
        self.calls: list[str] = []
        self.stops: list[threading.Event | None] = []
        self.overlaps = 0
        self.release = threading.Event()
        self.release.set()
        self._idle = False

    def _call(self, name: str) -> None:
        self.overlaps += self._idle
        self.calls.append(name)

    def _idle_work(self, name: str, stop: threading.Event | None) -> bool:
        """True when done, False when `stop` ended it first (checked as a round would)."""
        self._call(name)
        self.stops.append(stop)
        self._idle = True
        try:
            while not (stop is not None and stop.is_set()):
                if self.release.wait(0.005):
                    return True
            return False
        finally:
            self._idle = False

    def calibrate(self, *, stop: threading.Event | None = None) -> bool:
        return self._idle_work("calibrate", stop)

    def measure_baseline(self, *, tokens: int = 64, repeats: int = 3,
                         stop: threading.Event | None = None) -> Baseline | None:
        return MEASURED if self._idle_work("measure_baseline", stop) else None

    def chat(self, messages, *, max_tokens: int = 256, sampling: SamplingConfig | None = None,
             stop: threading.Event | None = None, target_only: bool = False):
        self._call("chat")
        for i, (text, kind) in enumerate(ANSWER[:max_tokens]):
            yield TokenEvent(i, text, kind)
        yield TurnEnd(STATS, "stop", tuple(range(len(ANSWER))))

    def configure(self, *, draft_length: DraftLength | None = None,
                  drafter: str | None = None) -> EngineInfo:
        self._call("configure")
        self.info = replace(self.info, drafter=drafter or self.info.drafter,
                            draft_length=draft_length or self.info.draft_length)
        return self.info

    def close(self) -> None:
        pass
