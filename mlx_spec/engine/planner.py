"""What a turn does next, as data: one planner for the engine's turns and the replay harness.

Each step of a turn is a `Next`: `Speculate(k)` (k drafts, one verify pass), `Plain()` (a run of
plain decoding until the planner asks for something else) or `End(reason)`. The decision is a
value, computed from counts alone (tokens left, context left, a stop flag), with the draft-length
policy's choice of k inside it: whoever makes it (rank 0, the replay) can hand it on, and the
rounds that carry it out report back through `observe_*`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .adaptive import AdaptiveDraftLength

PLAIN_RUN_REPORT = 64  # a long plain run (speculation off) reports its cost every this many
LOOP_CHECK = 8  # a text loops with period p where its last LOOP_CHECK + p tokens repeat by p


def loop_period(text: Sequence[int], most: int) -> int:
    """The shortest period p <= most of the text's end (each of its last LOOP_CHECK tokens
    equals the one p before it), or 0 where it does not loop."""
    for p in range(1, most + 1):
        if len(text) >= p + LOOP_CHECK and all(text[-i] == text[-i - p]
                                               for i in range(1, LOOP_CHECK + 1)):
            return p
    return 0


@dataclass(frozen=True)
class Speculate:
    k: int  # drafts in the round, >= 1
    copy: bool = True  # a lookup drafter may copy (False: its model drafts this round)


@dataclass(frozen=True)
class Plain:
    """Plain decoding, one token per target pass, until the planner says otherwise."""


@dataclass(frozen=True)
class End:
    reason: str  # "length", "context", "cancelled"


Next = Speculate | Plain | End


class Planner:
    """Which round comes next in a turn, and what the policy learns from each round.

    policy: the adaptive draft-length policy (None: a fixed k = max_draft); drafting: whether a
    drafter is there at all (without one every step is plain). copies / copy_ready: a lookup
    drafter's second policy, for the rounds it copies (drafters/lookup.py), and whether its
    next draft would be one: such a round's k, and whether to draft at all, come from the
    copies' record (no drafting cost; right to the end in a loop, seldom elsewhere), the rest
    from the model's. Each round teaches the policy of the source that drafted it; the text
    ages both. Where the copies' policy says copies do not pay now, the model's decides, and
    its round is the model's (Speculate.copy False). text: the committed text, for greedy
    turns with auto (at T = 0 a round's outcome is a function of it): after a whole round in a
    loop, k is chosen for where the next round lands (`in_phase`)."""

    def __init__(self, policy: AdaptiveDraftLength | None, max_draft: int, *,
                 drafting: bool, copies: AdaptiveDraftLength | None = None,
                 copy_ready: Callable[[], bool] | None = None,
                 text: Callable[[], Sequence[int]] | None = None) -> None:
        self.policy, self.max_draft, self.drafting = policy, max_draft, drafting
        self.text = text if policy is not None else None
        self.full = False  # the last model round's drafts were all accepted
        self.copies, self.copy_ready = copies, copy_ready
        self.chosen = policy  # the policy that chose the round under way
        self.phase_bets = self.phase_wins = 0  # in-phase rounds this turn, and the whole ones
        self.betting = False  # the round under way is an in-phase one
        self._plain_s, self._plain_n = 0.0, 0

    def _policies(self) -> list[AdaptiveDraftLength]:
        return [p for p in (self.policy, self.copies) if p is not None]

    def new_turn(self) -> None:
        """A new prompt: the last turn's acceptance says less about it (and its loops, if any,
        are its own)."""
        self.phase_bets = self.phase_wins = 0
        for policy in self._policies():
            policy.new_turn()

    def next(self, *, left: int, room: int, stopped: bool = False, cap: int | None = None
             ) -> Next:
        """left: tokens the turn may still emit; room: positions left in the context; cap:
        a batch's cap on the draft length (BatchDraftLength; None: verified alone)."""
        if stopped:
            return End("cancelled")
        if left <= 0:
            return End("length")
        if room <= 0:
            return End("context")
        limit = min(left - 1, room - 1)  # a round emits its drafts and one token more
        if not self.drafting or limit <= 0:
            return Plain()
        if self.copies is not None and self.copy_ready is not None and self.copy_ready():
            self.chosen = self.copies
            k = self.copies.choose(limit, cap=cap)
            if k > 0:
                return Speculate(k)
            # copies do not pay now: the model's round, if it does
        self.chosen = self.policy
        k = (self.policy.choose(limit, cap=cap) if self.policy is not None
             else min(self.max_draft, limit))
        if k > 0 and self.full and self.text is not None:
            k = self.in_phase(k, limit, cap)
        return Speculate(k, copy=self.copies is None) if k > 0 else Plain()

    def in_phase(self, k: int, limit: int, cap: int | None = None) -> int:
        """After a round whose drafts were all accepted, in text that loops with period p: the
        deepest k with k + 1 a multiple of p (else the policy's k). At T = 0 which drafts are
        accepted is a function of the text, and in a loop of where in the loop a round starts
        (its phase): a whole round of k + 1 ≡ 0 (mod p) tokens lands on the phase it started from,
        where the drafts were all right, so the next one will most likely be whole again; any
        other k lands elsewhere in the loop, where the drafter may fail at once (auto's α per
        position cannot see a phase; DESIGN.md, "Measurements"). But the round that was
        whole started a phase earlier than this one will: where the drafter fails at the
        phase this one starts from, each such round is lost. So it is priced by how the
        turn's earlier in-phase rounds came out: whole with chance (w + 1) / (n + 1) after w
        whole of n (the first is taken on trust), else only the target's token; kept only
        where that beats the policy's expectation for its own k (a drafter right from one
        phase and wrong from the next would otherwise lose every such round)."""
        assert self.policy is not None and self.text is not None
        top = min(limit, self.policy.max_draft, limit if cap is None else cap)
        p = loop_period(self.text(), top + 1)
        if not p:
            return k
        whole = (top + 1) // p * p - 1
        cost = self.policy.round_costs(max(whole, k))
        chance = (self.phase_wins + 1) / (self.phase_bets + 1)
        tokens = chance * (whole + 1) + (1 - chance)
        if whole < 1 or tokens / cost[whole] < self.policy.expected_tokens(k) / cost[k]:
            return k
        self.betting = True
        return whole

    def split(self) -> bool:
        """Time this round's draft and verify apart (a sync between them)?"""
        return self.chosen is not None and self.chosen.split()

    def observe_round(self, k: int, n: int, *, round_s: float, fed: int,
                      draft_s: float | None = None, verify_s: float | None = None,
                      copied: bool = False,
                      evidence: Sequence[tuple[float, float]] | None = None) -> None:
        """A round drafted k and the target accepted n; draft_s / verify_s when it was split;
        copied: its drafts were a copy (they teach the copies' policy, where there is one);
        evidence: the acceptance chances at T > 0 (Verdict.evidence)."""
        self.full = not copied and n == k > 0  # (a copy says nothing of the model's phase)
        if self.betting:  # an in-phase round (in_phase): was it whole?
            self.phase_bets, self.phase_wins = self.phase_bets + 1, self.phase_wins + (n == k)
            self.betting = False
        source = self.copies if copied and self.copies is not None else self.policy
        for policy in self._policies():
            if policy is source:
                policy.observe(k, n, draft_s, verify_seconds=verify_s, round_seconds=round_s,
                               fed=fed, evidence=evidence)
            else:
                policy.age(n + 1)

    def observe_plain(self, seconds: float) -> None:
        """One plain token, timed from the run's start or the token before: its text ages the
        policies' evidence, and the run's cost is reported whole (first step included)."""
        self.full = False
        if self.policy is None:
            return
        for policy in self._policies():
            policy.age()
        self._plain_s, self._plain_n = self._plain_s + seconds, self._plain_n + 1
        if self._plain_n == PLAIN_RUN_REPORT:
            self.end_plain_run()

    def end_plain_run(self) -> None:
        for policy in self._policies():
            policy.observe_plain(self._plain_s, self._plain_n)
        self._plain_s, self._plain_n = 0.0, 0


Item = TypeVar("Item")


def drive(decide: Callable[[int], Next],
          plain: Callable[[Callable[[int], bool]], Iterator[Item]],
          speculate: Callable[[Speculate], Iterator[Item]]) -> Generator[Item, Any, str]:
    """A turn's steps in the order the planner decides them, the one loop the engine's turns
    (turn.play) and the replay harness both run: decide(ahead) -> the Next after `ahead` more
    tokens; a Plain step runs plain(more) — more(ahead), asked by the run before each token it
    builds, decides the step after it and says whether that is still plain, so the decision
    that ends a run is the next step's — and a Speculate step runs speculate(step). Yields what
    they yield (values sent in reach them) and returns the End's reason. Closing it closes the
    step under way (a plain run cuts back what it built ahead)."""
    planned: Next | None = None  # decided at the end of a plain run, for the step after it
    while True:
        step = planned or decide(0)
        planned = None
        if isinstance(step, End):
            return step.reason
        if isinstance(step, Plain):
            def more(ahead: int = 1) -> bool:
                nonlocal planned
                planned = decide(ahead)
                return isinstance(planned, Plain)

            yield from plain(more)
        else:
            yield from speculate(step)
