"""Sums over turns (Totals), and the measured baseline that speedups are quoted against."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from .events import TurnStats, acceptance_rate, tokens_per_pass


@dataclass
class Totals:
    """Turns summed: the app's session panel, the benchmark's rows and the drafter evaluation
    all read these (k may differ between turns: per-position tallies grow as needed)."""

    turns: int = 0
    tokens: int = 0
    ends: int = 0  # turns ended by an end-of-turn token (its pass produced it, unshown)
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
        """A whole turn."""
        self.turns += 1
        self.tokens += s.generated_tokens
        self.ends += s.produced_tokens - s.generated_tokens
        self.seconds += s.generation_s if s.generated_tokens else 0.0
        self.commit_s += s.commit_s
        self._add_passes(s.target_passes, s.drafted, s.accepted, s.draft_s, s.verify_s,
                         s.per_position_drafted, s.per_position_accepted)
        if s.drafted:
            self.acceptance.append(100 * s.acceptance_rate)
        self.last = s

    def add_pass(self, k: int, n: int, draft_s: float, verify_s: float) -> None:
        """One target pass of a turn in progress: it verified k drafts and accepted n."""
        self._add_passes(1, k, n, draft_s, verify_s, (1,) * k, (1,) * n)

    def _add_passes(self, passes: int, drafted: int, accepted: int, draft_s: float,
                    verify_s: float, pos_drafted: tuple[int, ...],
                    pos_accepted: tuple[int, ...]) -> None:
        self.passes += passes
        self.drafted += drafted
        self.accepted += accepted
        self.draft_s += draft_s
        self.verify_s += verify_s
        _add_into(self.pos_drafted, pos_drafted)
        _add_into(self.pos_accepted, pos_accepted)
        # a position drafted (a copy past the first ceiling) and never accepted: counted at 0
        self.pos_accepted.extend([0] * (len(self.pos_drafted) - len(self.pos_accepted)))

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return acceptance_rate(self.accepted, self.drafted)

    @property
    def tokens_per_pass(self) -> float:
        return tokens_per_pass(self.tokens + self.ends, self.passes)

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


BASELINE_KEEP = 5  # sessions' measurements a saved baseline is the median of


@dataclass(frozen=True)
class Baseline:
    """Target-only decoding speed, measured on this machine with this model.

    One measurement can be far off (on a shared host a small target's speed swings from one stretch
    to the next, and a saved outlier would misquote every later turn), so each session measures
    again and speedups are quoted on the median of the last BASELINE_KEEP sessions' measurements
    (`joined`)."""

    tok_s: float
    tokens: int
    method: str  # human-readable: how one measurement is made
    samples: tuple[float, ...] = ()  # the measurements tok_s is the median of, oldest first

    @classmethod
    def from_dict(cls, d: dict) -> Baseline:
        """From its saved fields (a file written before `samples` existed has one measurement)."""
        tok_s = float(d["tok_s"])
        return cls(tok_s, int(d["tokens"]), str(d["method"]),
                   tuple(float(s) for s in d.get("samples") or (tok_s,)))

    @property
    def measurements(self) -> tuple[float, ...]:
        return self.samples or (self.tok_s,)

    def joined(self, new: Baseline, keep: int = BASELINE_KEEP) -> Baseline:
        """This baseline with a new measurement: the median of the last `keep` of them."""
        samples = (self.measurements + new.measurements)[-keep:]
        return Baseline(statistics.median(samples), new.tokens, new.method, samples)

    def describe(self) -> str:
        """How tok_s was measured, for the user: the method, and over how many sessions."""
        if len(self.measurements) < 2:
            return self.method
        runs = ", ".join(f"{s:.0f}" for s in self.measurements)
        return (f"the median of the last {len(self.measurements)} sessions' measurements "
                f"({runs} tok/s), each the {self.method}")

    def speedup(self, tok_s: float) -> float:
        return tok_s / self.tok_s if self.tok_s > 0 else 0.0


def quantiles(values: list[float]) -> tuple[float, float, float]:
    """(median, 90th percentile, max) by nearest rank; zeros when there are none."""
    if not values:
        return 0.0, 0.0, 0.0
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]

    return rank(0.5), rank(0.9), ordered[-1]
