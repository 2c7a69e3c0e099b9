"""The measured baseline that speedups are quoted against."""

from __future__ import annotations

from dataclasses import dataclass

from .engine import Engine
from .events import TurnEnd


@dataclass(frozen=True)
class Baseline:
    """Target-only decoding speed, measured on this machine with this model."""

    tok_s: float
    tokens: int
    method: str  # human-readable: how it was measured

    def speedup(self, tok_s: float) -> float:
        return tok_s / self.tok_s if self.tok_s > 0 else 0.0


def measure_baseline(engine: Engine, *, tokens: int = 32, prompt: list[int] | None = None,
                     repeats: int = 2) -> Baseline:
    """Time target-only greedy decoding through the same loop, on a scratch conversation (the
    engine's own caches are untouched). The best of `repeats` runs, after one warm-up."""
    scratch = Engine(engine.target, engine.tokenizer, None)
    scratch.eos = set()
    ids = prompt or list(range(3, 35))
    best = 0.0
    for i in range(repeats + 1):
        scratch.reset()
        end = [e for e in scratch.generate(ids, max_tokens=tokens) if isinstance(e, TurnEnd)][0]
        if i:  # the first run warms up kernels and allocations
            best = max(best, end.stats.tok_s)
    return Baseline(best, tokens, f"best of {repeats} timed target-only runs of {tokens} tokens "
                                  f"(greedy, same loop, no drafter), measured at load")
