"""A recorded event stream standing in for the engine.

Snapshot tests use it: a real engine's timings (tok/s, TTFT, draft/verify times) differ from run
to run, so its screens can never match a stored SVG. Everything else is tested on the real engine
(test_pilot.py)."""

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
    num_draft=3, finish_reason="stop",
)


class FakeEngine:
    """An EngineService replaying ANSWER; configure() changes what `info` says, nothing else."""

    def __init__(self) -> None:
        self.info = EngineInfo("demo-target-q8", "mtp", 3, ("none", "mtp", "ngram"))

    def measure_baseline(self, **_) -> Baseline:
        return Baseline(100.0, 32, "fixed for snapshots")

    def chat(self, messages, *, max_tokens: int = 256, sampling: SamplingConfig | None = None,
             stop: threading.Event | None = None, target_only: bool = False):
        for i, (text, kind) in enumerate(ANSWER[:max_tokens]):
            yield TokenEvent(i, text, kind)
        yield TurnEnd(STATS, "stop", tuple(range(len(ANSWER))))

    def configure(self, *, draft_length: DraftLength | None = None,
                  drafter: str | None = None) -> EngineInfo:
        self.info = replace(self.info, drafter=drafter or self.info.drafter,
                            draft_length=draft_length or self.info.draft_length)
        return self.info

    def close(self) -> None:
        pass
