"""Totals over the turns of this app session (what the side panel shows)."""

from __future__ import annotations

from dataclasses import dataclass, field

from mlx_spec import TurnStats

MB = 2**20


@dataclass
class SessionTotals:
    turns: int = 0
    tokens: int = 0
    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    seconds: float = 0.0  # generation time (prefill excluded, as in TurnStats.tok_s)
    pos_drafted: list[int] = field(default_factory=list)
    pos_accepted: list[int] = field(default_factory=list)
    acceptance: list[float] = field(default_factory=list)  # per turn that drafted, in %
    last: TurnStats | None = None

    def add(self, s: TurnStats) -> None:
        self.turns += 1
        self.tokens += s.generated_tokens
        self.passes += s.target_passes
        self.drafted += s.drafted
        self.accepted += s.accepted
        self.seconds += s.generation_s if s.generated_tokens else 0.0
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
    """Element-wise acc += values; k may differ between turns, so acc grows as needed."""
    acc.extend([0] * (len(values) - len(acc)))
    for i, v in enumerate(values):
        acc[i] += v
