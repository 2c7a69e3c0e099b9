"""What a turn does next, as data: one scheduler for the engine's turns and the replay harness.

Each step of a turn is a `Next`: `Speculate(k)` (k drafts, one verify pass), `Plain()` (a run of
plain decoding until the schedule asks for something else) or `End(reason)`. The decision is a
value, computed from counts alone (tokens left, context left, a stop flag), with the draft-length
policy's choice of k inside it: whoever makes it (rank 0, the replay) can hand it on, and the
rounds that carry it out report back through `observe_*`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .adaptive import AdaptiveDraftLength

PLAIN_RUN_REPORT = 64  # a long plain run (speculation off) reports its cost every this many


@dataclass(frozen=True)
class Speculate:
    k: int  # drafts in the round, >= 1


@dataclass(frozen=True)
class Plain:
    """Plain decoding, one token per target pass, until the schedule says otherwise."""


@dataclass(frozen=True)
class End:
    reason: str  # "length", "context", "cancelled"


Next = Speculate | Plain | End


class Schedule:
    """Which round comes next in a turn, and what the policy learns from each round.

    policy: the adaptive draft-length policy (None: a fixed k = max_draft); drafting: whether a
    drafter is there at all (without one every step is plain)."""

    def __init__(self, policy: AdaptiveDraftLength | None, max_draft: int, *,
                 drafting: bool) -> None:
        self.policy, self.max_draft, self.drafting = policy, max_draft, drafting
        self._plain_s, self._plain_n = 0.0, 0

    def new_turn(self) -> None:
        """A new prompt: the last turn's acceptance says less about it."""
        if self.policy is not None:
            self.policy.new_turn()

    def next(self, *, left: int, room: int, stopped: bool = False) -> Next:
        """left: tokens the turn may still emit; room: positions left in the context."""
        if stopped:
            return End("cancelled")
        if left <= 0:
            return End("length")
        if room <= 0:
            return End("context")
        limit = min(left - 1, room - 1)  # a round emits its drafts and one token more
        if not self.drafting or limit <= 0:
            return Plain()
        k = self.policy.choose(limit) if self.policy is not None else min(self.max_draft, limit)
        return Speculate(k) if k > 0 else Plain()

    def split(self) -> bool:
        """Time this round's draft and verify apart (a sync between them)?"""
        return self.policy is not None and self.policy.split()

    def observe_round(self, k: int, n: int, *, round_s: float, fed: int,
                      draft_s: float | None = None, verify_s: float | None = None) -> None:
        """A round drafted k and the target accepted n; draft_s / verify_s when it was split."""
        if self.policy is not None:
            self.policy.observe(k, n, draft_s, verify_seconds=verify_s, round_seconds=round_s,
                                fed=fed)

    def observe_plain(self, seconds: float) -> None:
        """One plain token, timed from the run's start or the token before: its text ages the
        policy's evidence, and the run's cost is reported whole (first step included)."""
        if self.policy is None:
            return
        self.policy.age()
        self._plain_s, self._plain_n = self._plain_s + seconds, self._plain_n + 1
        if self._plain_n == PLAIN_RUN_REPORT:
            self.end_plain_run()

    def end_plain_run(self) -> None:
        if self.policy is not None:
            self.policy.observe_plain(self._plain_s, self._plain_n)
        self._plain_s, self._plain_n = 0.0, 0
