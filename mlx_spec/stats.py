"""The measured baseline that speedups are quoted against."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .events import TurnEnd

if TYPE_CHECKING:
    from .engine import Engine


@dataclass(frozen=True)
class Baseline:
    """Target-only decoding speed, measured on this machine with this model."""

    tok_s: float
    tokens: int
    method: str  # human-readable: how it was measured

    def speedup(self, tok_s: float) -> float:
        return tok_s / self.tok_s if self.tok_s > 0 else 0.0


def measure_baseline(engine: Engine, *, tokens: int = 64, prompt: list[int] | None = None,
                     repeats: int = 3) -> Baseline:
    """Time target-only greedy decoding through the same loop, on a scratch conversation (the
    engine's own caches are untouched): the median of `repeats` runs after a short warm-up.

    Median, not best: the best of a few noisy runs overstates the speed a turn will see, and so
    understates every speedup quoted against it. 64 tokens, not fewer: per-token cost grows with
    the context, and on the demo pair 32-token runs were ~10% faster than 256-token ones."""
    from .engine import Engine

    scratch = Engine(engine.target, engine.tokenizer, None)
    scratch.eos = set()
    ids = prompt or list(range(3, 35))

    def timed(n: int) -> float:
        scratch.reset()
        end = [e for e in scratch.generate(ids, max_tokens=n) if isinstance(e, TurnEnd)][0]
        return end.stats.tok_s

    timed(8)  # warm-up: kernels and allocations
    speed = statistics.median(timed(tokens) for _ in range(repeats))
    return Baseline(speed, tokens, f"median of {repeats} timed target-only runs of {tokens} "
                                   f"tokens (greedy, same loop, no drafter), measured at load")
