"""Several conversations' verify passes as ONE target forward (the server's batch).

Each conversation keeps its own caches; for the one pass, layer i of every row is seen through
a `RowsCache` (rows.py): each row's new keys go to its own cache, the attention sees each row's
own keys, masked, and RoPE takes each row's own offset. So every row's logits are those of its
conversation verified alone (up to the batched kernels' rounding), and after the pass each
conversation's caches are as its own verify would leave them: commit and rollback stay per
conversation, ragged (each keeps its own prefix).

Recurrent layers (Gated DeltaNet) batch through recurrent.RowsRecurrent: padded steps are masked
out of the recurrence, and each row records its own update (its replay over its own inputs),
so rollback stays per conversation too. Quantized KV verifies one conversation at a time.

The drafts before that pass batch too where the drafter can (`draft_together`): a shared-kv MTP
head or a draft model runs each draft step once over every row instead of once per row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from ..cache import WindowKVCache
from ..drafters import Draft
from ..recurrent import RecurrentCache
from ..rows import rows_of

if TYPE_CHECKING:
    from .conversation import Conversation
    from .turn import Drafting, Pause

Verified = tuple[mx.array, mx.array | None]  # a round's logits [k+1, V], hidden [k+1, ·]


@dataclass(frozen=True)
class Prefilled:
    """A driver ran a Pause's chunk (its cache took it): the chunk's hidden rows, if wanted."""

    hidden: mx.array | None


def batchable(convs: list[Conversation]) -> bool:
    """Can these conversations verify in one pass? Same weights, attention caches or
    recurrent ones that record their updates (quantized KV does not batch)."""
    first = convs[0]
    return all(c.target is first.target and c.wants_hidden == first.wants_hidden
               and all(type(x) in (KVCache, WindowKVCache)
                       or (type(x) is RecurrentCache and x.rollback) for x in c.cache)
               for c in convs)


def forward_together(convs: list[Conversation], inputs: list[mx.array]):
    """ONE target forward over every conversation's inputs (rows right-padded to the
    longest): row r's new keys go to its own caches (rows.py). Logits [B, n, V] and hidden
    [B, n, ·] (if the drafter wants them); row r's own are its first len(inputs[r])."""
    lengths = [x.shape[0] for x in inputs]
    width = max(lengths)
    x = mx.stack([mx.pad(t, [(0, width - t.shape[0])]) for t in inputs])
    layers = len(convs[0].cache)
    caches = [rows_of([c.cache[i] for c in convs], lengths) for i in range(layers)]
    return convs[0].target.forward_rows(x, caches, hidden=convs[0].wants_hidden)


def verify_together(rounds: list[tuple[Conversation, Draft]]) -> list[Verified]:
    """Every round's verify pass: one target forward for all when they batch, else each its
    own. Each conversation's bookkeeping is its own (Conversation.verified)."""
    convs = [conv for conv, _ in rounds]
    if len(rounds) == 1 or not batchable(convs):
        return [conv.verify(draft) for conv, draft in rounds]
    inputs = [conv.verify_input(draft) for conv, draft in rounds]
    lengths = [x.shape[0] for x in inputs]
    logits, hidden = forward_together(convs, inputs)
    return [conv.verified(q, draft, logits[r, :q], hidden[r, :q] if hidden is not None else None)
            for r, ((conv, draft), q) in enumerate(zip(rounds, lengths, strict=True))]


def prefill_together(pauses: list[Pause]) -> list[Prefilled | None]:
    """Several conversations' next prompt chunks as ONE target forward when they batch (rows
    right-padded, each row's keys to its own cache, as a verify pass), each conversation's
    cache then sealed as its own chunk would leave it; else None for each (it runs alone).
    On a CPU a 47-token prompt's pass is compute-bound, so four of them together save the
    per-pass cost only: 474 → 330–363 ms on the bench's widened target."""
    convs = [p.conv for p in pauses]
    if len(pauses) < 2 or not batchable(convs):
        return [None] * len(pauses)
    lengths = [p.tokens for p in pauses]
    _, hidden = forward_together(convs, [mx.array(p.chunk, dtype=mx.int32) for p in pauses])
    return [Prefilled(conv.prefilled(q, hidden[r, :q] if hidden is not None else None))
            for r, (conv, q) in enumerate(zip(convs, lengths, strict=True))]


def draft_together(rounds: list[Drafting]) -> list[Draft]:
    """Every round's drafts: the rounds whose conversations share a drafter that drafts rows
    together (`draft_rows`) in one chain of its steps over all of them, the rest each alone
    (Conversation.draft). Each row draws its own k from its own sampler, so its drafts and
    the probabilities they report are what it would draw alone, up to the batched kernels'
    rounding; the target decides what is emitted either way. Synced where a round times its
    draft apart (split), else left to run while the host builds the verify pass."""
    drafts: list[Draft | None] = [None] * len(rounds)
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(rounds):
        groups.setdefault(id(r.conv.drafter), []).append(i)
    for members in groups.values():
        convs = [rounds[i].conv for i in members]
        rows = getattr(convs[0].drafter, "draft_rows", None)
        got = None if len(members) < 2 or rows is None else rows(
            [c.drafter_state for c in convs], [c.draft_context() for c in convs],
            [rounds[i].k for i in members], [rounds[i].sampler for i in members])
        if got is None:
            continue
        arrays = [a for d in got for a in (d.tokens, d.probs) if a is not None]
        (mx.eval if any(rounds[i].split for i in members) else mx.async_eval)(arrays)
        for i, d in zip(members, got, strict=True):
            drafts[i] = d
    return [d if d is not None else r.conv.draft(r.k, r.sampler, split=r.split)
            for d, r in zip(drafts, rounds, strict=True)]
