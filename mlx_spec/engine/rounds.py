"""What a turn asks of whoever drives it, and what it is given back: data only, with no
reference to a conversation (the driver knows whose turn it asked for).

A turn played in rounds (turn.steps) yields a `RoundDue` before each round (k drafts and the
pass that verifies them; k = 0 is a plain step) and a `PrefillDue` before each prompt chunk.
The driver sends back a `Resume`: what it ran for the turn — a `RoundRan` (the drafts and the
pass's rows, from one pass over several conversations: batch.run_rounds) or a `Prefilled` (the
chunk taken in a batch's pass) — or nothing, and the turn runs it alone; and the cap a batch
puts on the draft length of the turn's next round (None: the turn's own policy alone decides).
One trip down, one up, per round.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from ..drafters.base import Draft
from ..sampling import Sampler


@dataclass(frozen=True)
class RoundDue:
    """A round is next: k drafts (0: a plain step, the pass alone), drawn with `sampler`;
    split: its draft is timed apart (synced before the pass); copy: a lookup drafter may copy
    (False: the planner chose its model)."""

    k: int
    sampler: Sampler
    split: bool
    copy: bool = True


@dataclass(frozen=True)
class PrefillDue:
    """A prompt chunk is next (its tokens go into the target's cache)."""

    chunk: list[int]


@dataclass(frozen=True)
class RoundRan:
    """A driver ran a round: its drafts, and its pass's rows — logits [k+1, V] and hidden
    [k+1, ·] if the drafter wants them (None: the pass failed in the batch, and the turn
    verifies alone) — with the seconds each part took."""

    draft: Draft
    draft_s: float
    logits: mx.array | None
    hidden: mx.array | None
    verify_s: float


@dataclass(frozen=True)
class Prefilled:
    """A driver ran a PrefillDue's chunk (the cache took it): its hidden rows, if wanted."""

    hidden: mx.array | None


@dataclass(frozen=True)
class Resume:
    """What a driver sends into a turn: what it ran (None: the turn runs it alone), and the
    batch's cap on the next round's draft length (None: no batch decides)."""

    ran: RoundRan | Prefilled | None = None
    cap: int | None = None


Due = RoundDue | PrefillDue
