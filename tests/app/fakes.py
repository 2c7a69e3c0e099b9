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
    RoundTrace,
    SamplingConfig,
    TokenEvent,
    TurnEnd,
    TurnStats,
)
from mlx_spec.events import Choice, Row

A, C, B, T = Kind.ACCEPTED, Kind.CORRECTED, Kind.BONUS, Kind.TARGET

# an answer as the demo pair might give it, with every kind of token
ANSWER = [
    ("def", A), (" add", A), ("(a", C), (",", A), (" b", A), ("):", B), ("\n   ", C),
    (" return", A), (" a", A), (" +", A), (" b", B), ("\n", T), ("\n", T), ("print", C),
    ("(add", A), ("(1", A), (",", A), (" 2", B), ("))", T),
]

# what each correction replaced: the drafts its round rejected (the first one) and left untested
REJECTED = {2: ["(x", ","], 6: [" pass"], 13: ["add", "(", "2"]}


def rounds() -> list[RoundTrace]:
    """ANSWER as rounds (each ends at a token of the target's own), with fixed numbers: an
    accepted draft p 0.9 q 0.8, a rejected one p 0.1 q 0.6, the target's token p 0.7."""
    out, start = [], 0
    for i, (text, kind) in enumerate(ANSWER):
        if kind == A:
            continue
        lost = REJECTED.get(i, []) if kind == C else []
        drafts = [(t, "accepted", 0.9, 0.8) for t, _ in ANSWER[start:i]]
        drafts += [(t, "rejected" if j == 0 else "untested", 0.1, 0.6)
                   for j, t in enumerate(lost)]
        rows = [Row(draft=100 + j, draft_text=t, verdict=v, p=p, q=q,
                    token=start + j if j <= i - start else None,
                    token_text=ANSWER[start + j][0] if j <= i - start else "",
                    p_token=(0.9 if v == "accepted" else 0.7) if j <= i - start else None,
                    top_p=(Choice(1, ANSWER[start + min(j, i - start)][0], 0.7),
                           Choice(2, " other", 0.2)),
                    top_q=(Choice(100 + j, t, q), Choice(3, " else", 0.1)))
                for j, (t, v, p, q) in enumerate(drafts)]
        rows.append(Row(draft=None, draft_text="", verdict="", p=None, q=None,
                        token=i if kind != C or not lost else None,
                        token_text=text if kind != C or not lost else "",
                        p_token=0.7 if kind != C or not lost else None,
                        top_p=(Choice(1, text, 0.7),)))
        k = len(drafts)
        out.append(RoundTrace(index=len(out), k=k, accepted=i - start, emitted=i + 1 - start,
                              drafted=tuple(range(100, 100 + k)), copied=False, rule="p/q",
                              at_s=0.012 + 0.011 * len(out), draft_s=0.002, verify_s=0.008,
                              commit_s=0.001, rows=tuple(rows)))
        start = i + 1
    return out


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
             stop: threading.Event | None = None, target_only: bool = False,
             trace: bool = False, drafter: str | None = None):
        self._call("chat")
        announced, at = {}, 0  # a traced turn: each round just before its first token
        for r in rounds() if trace else ():
            announced[at] = r
            at += r.emitted
        for i, (text, kind) in enumerate(ANSWER[:max_tokens]):
            if i in announced:
                yield announced[i]
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
