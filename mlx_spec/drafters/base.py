"""The drafter protocol: propose up to k tokens with their draft probabilities; follow commits.

A drafter never decides what is emitted — the target does (see coupling.py). It only has to
(1) propose tokens, each drawn from the distribution it reports, and (2) after every round cut its
own state back to the committed sequence, so no rejected token survives as context.

A drafter object is weights, shared by every conversation on the engine; what it keeps about one
conversation (a cache, the target's hidden rows, an n-gram index) is a `DrafterState` it makes
with `new_state()`, owned by that conversation and handed back to every call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import mlx.core as mx

from ..model import TargetModel
from ..sampling import Sampler


@dataclass(frozen=True)
class Draft:
    """k proposed tokens [k] (int32, possibly still lazy on the device: they go straight into
    the verify pass); probs [k, V] are the real draft distributions (None when greedy)."""

    tokens: mx.array = field(default_factory=lambda: mx.zeros((0,), mx.int32))
    probs: mx.array | None = None
    fed: int = 1  # tokens the drafter read before drafting (more than a few: a catch-up)
    copied: bool = False  # a copy of the conversation's own text (lookup.py), not a model's

    @property
    def k(self) -> int:
        return self.tokens.shape[0]


@dataclass
class DraftContext:
    """What the engine shares with a drafter, without copies (unified memory).

    tokens: the committed sequence; its last token is pending (no target logits for it yet).
    target_cache: the target's per-layer caches, holding tokens[:-1].
    hidden / hidden_start: the target's final hidden states (or the drafter's taps) for positions
        hidden_start .. hidden_start + len(hidden) - 1 — the positions committed in the last
        verify (or prefill). hidden[i] is what predicted tokens[hidden_start + i + 1].
    """

    target: TargetModel
    tokens: list[int]
    target_cache: list[Any]
    hidden: mx.array | None = None
    hidden_start: int = 0
    copy: bool = True  # a lookup drafter may copy this round (False: the engine chose its model)
    model_max_draft: int | None = None  # the most a model (not a copy) drafts: a copy's k, chosen
    # a token ahead, may meet no copy when the round drafts (None: no limit but k)


class DrafterState(Protocol):
    """What a drafter keeps about one conversation."""

    def has_hidden(self, position: int) -> bool:
        """Hidden-state drafters: is the target's row at `position` still held? (If not, the
        next prefill re-feeds that token.)"""

    def nbytes(self) -> int:
        """Memory of this conversation's state (its caches and rows)."""

    def arrays(self) -> list[Any]:
        """The state's arrays (evaluated by the engine at the end of every turn)."""


class Drafter:
    """What every drafter is. A subclass implements `new_state`, `commit`, `draft` and `nbytes`,
    and declares what else it can do by overriding the attributes and methods below; their
    defaults mean "nothing special", and the engine reads these declarations (it never probes a
    drafter with getattr)."""

    name: str = "drafter"
    # does commit() need the target's hidden states? True: the final ones; (i, j, ...): the
    # inputs of those layers, side by side (EAGLE-3)
    needs_hidden: bool | tuple[int, ...] = False
    # the draft length its files give (a Gemma 4 assistant's, a published head's trained depth);
    # None: `auto` chooses
    draft_length: int | None = None
    # the longest draft it can make (a DFlash block less its pending token; auto's ceiling rises
    # to it); None: as long as asked
    max_draft: int | None = None
    # may its next draft be a copy of the conversation's own text (lookup.py)? Then copy_ready
    # says when, and the engine prices copied rounds by their own record
    copies: bool = False
    # does it read the target's own KV cache (a shared-KV head, Gemma 4's assistant)? Such a
    # drafter cannot follow a target split over machines
    reads_target_kv: bool = False

    def new_state(self) -> DrafterState:
        """The state of an empty conversation."""
        raise NotImplementedError

    def commit(self, state: Any, ctx: DraftContext, valid: int) -> None:
        """The committed sequence is ctx.tokens; only its first `valid` tokens are positions the
        drafter may have seen before. Drop all of `state` beyond them."""
        raise NotImplementedError

    def draft(self, state: Any, ctx: DraftContext, k: int, sampler: Sampler) -> Draft:
        """Propose up to k tokens following ctx.tokens."""
        raise NotImplementedError

    def nbytes(self) -> int:
        """Memory of the weights (shared by every conversation)."""
        raise NotImplementedError

    def draft_rows(self, states: list[Any], ctxs: list[DraftContext], ks: list[int],
                   samplers: list[Sampler]) -> list[Draft] | None:
        """Several conversations' drafts in one chain of steps over all their rows
        (batch.draft_together). None: it cannot, and each drafts alone (the default)."""
        return None

    def copy_ready(self, state: Any, tokens: list[int]) -> bool:
        """Would the next draft be a copy (see `copies`)?"""
        return False


class HostState:
    """A state held on the host alone: no arrays, no hidden rows (the n-gram index)."""

    def has_hidden(self, position: int) -> bool:
        return False

    def nbytes(self) -> int:
        return 0

    def arrays(self) -> list[Any]:
        return []


def draft_chain(step, first_input, ctx: DraftContext, k: int, sampler: Sampler, *,
                fed: int = 1) -> Draft:
    """k autoregressive draft steps: step(input) -> next-token logits [V]; each sampled token is
    the next input. Tokens stay lazy on the device (no host sync at all: the verify pass reads
    them there); a repetition penalty reads the drafts so far there too."""
    def one_row(x: mx.array | None, live: list[bool]) -> mx.array:
        return step(first_input if x is None else x)[None]

    (draft,) = draft_rows_chain(one_row, [ctx], [k], [sampler])
    return Draft(draft.tokens, draft.probs, fed)


def draft_rows_chain(step, ctxs: list[DraftContext], ks: list[int],
                     samplers: list[Sampler]) -> list[Draft]:
    """draft_chain for B conversations at once: step(tokens [B] or None first, live) -> logits
    [B, V], one drafter step over the rows still drafting (live[r]: row r wants this step; a
    step may compute the others too, or not, and their logits are never read). Row r draws
    its first ks[r] tokens from its own sampler, in the order it would alone (its random
    stream advances alike); the chain runs max(ks) steps."""
    seen = [_history(ctx, s) for ctx, s in zip(ctxs, samplers, strict=True)]
    tokens: list[list[mx.array]] = [[] for _ in ks]
    probs: list[list[mx.array]] = [[] for _ in ks]
    x = None
    for i in range(max(ks)):
        live = [i < k for k in ks]
        logits = step(x, live)
        chosen = []
        for r, sampler in enumerate(samplers):
            if not live[r]:  # its drafts are done: a placeholder input, never used
                chosen.append(mx.zeros((), mx.int32))
                continue
            token, q = sampler.draft_token(logits[r], seen[r],
                                           position=len(ctxs[r].tokens) + i)
            if sampler.uses_history:
                seen[r] = mx.concatenate([seen[r], token.reshape(1).astype(mx.int32)])
            tokens[r].append(token)
            if q is not None:
                probs[r].append(q)
            chosen.append(token.astype(mx.int32))
        x = mx.stack(chosen)
    return [Draft(mx.stack(t).astype(mx.int32), mx.stack(p) if p else None)
            for t, p in zip(tokens, probs, strict=True)]


def _history(ctx: DraftContext, sampler: Sampler) -> mx.array | list:
    """What a repetition penalty reads: the history, then each draft as it is drawn (nothing
    without one)."""
    return (mx.array(ctx.tokens[-sampler.cfg.repetition_context :], dtype=mx.int32)
            if sampler.uses_history else [])
