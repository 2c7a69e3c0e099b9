"""Sums over turns (Totals), and the measured baseline that speedups are quoted against."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .events import TurnEnd, TurnStats

if TYPE_CHECKING:
    from .engine import Engine


@dataclass
class Totals:
    """Turns summed: the app's session panel, the benchmark's rows and the drafter evaluation
    all read these (k may differ between turns: per-position tallies grow as needed)."""

    turns: int = 0
    tokens: int = 0
    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    seconds: float = 0.0  # generation time (prefill excluded, as in TurnStats.tok_s)
    draft_s: float = 0.0
    verify_s: float = 0.0
    commit_s: float = 0.0
    pos_drafted: list[int] = field(default_factory=list)
    pos_accepted: list[int] = field(default_factory=list)
    acceptance: list[float] = field(default_factory=list)  # per turn that drafted, in %
    last: TurnStats | None = None

    @classmethod
    def from_turns(cls, turns: Iterable[TurnStats]) -> Totals:
        t = cls()
        for s in turns:
            t.add(s)
        return t

    def add(self, s: TurnStats) -> None:
        self.turns += 1
        self.tokens += s.generated_tokens
        self.passes += s.target_passes
        self.drafted += s.drafted
        self.accepted += s.accepted
        self.seconds += s.generation_s if s.generated_tokens else 0.0
        self.draft_s += s.draft_s
        self.verify_s += s.verify_s
        self.commit_s += s.commit_s
        _add_into(self.pos_drafted, s.per_position_drafted)
        _add_into(self.pos_accepted, s.per_position_accepted)
        if s.drafted:
            self.acceptance.append(100 * s.acceptance_rate)
        self.last = s

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / self.passes if self.passes else 0.0

    def per_position(self) -> list[tuple[int, float, int]]:
        """(position, acceptance, times drafted) for each draft position used so far."""
        return [(i + 1, a / d, d)
                for i, (a, d) in enumerate(zip(self.pos_accepted, self.pos_drafted, strict=True))
                if d]


def _add_into(acc: list[int], values: tuple[int, ...]) -> None:
    """Element-wise acc += values, growing acc as needed."""
    acc.extend([0] * (len(values) - len(acc)))
    for i, v in enumerate(values):
        acc[i] += v


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
    ids = prompt or list(range(3, 35))

    def timed(n: int) -> float:
        scratch.reset()
        end = [e for e in scratch.generate(ids, max_tokens=n, ignore_eos=True)
               if isinstance(e, TurnEnd)][0]
        return end.stats.tok_s

    timed(8)  # warm-up: kernels and allocations
    speed = statistics.median(timed(tokens) for _ in range(repeats))
    return Baseline(speed, tokens, f"median of {repeats} timed target-only runs of {tokens} "
                                   f"tokens (greedy, same loop, no drafter), measured at load")


def quantiles(values: list[float]) -> tuple[float, float, float]:
    """(median, 90th percentile, max) by nearest rank; zeros when there are none."""
    if not values:
        return 0.0, 0.0, 0.0
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]

    return rank(0.5), rank(0.9), ordered[-1]
