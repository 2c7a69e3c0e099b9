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

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from ..cache import WindowKVCache
from ..drafters import Draft
from ..recurrent import RecurrentCache
from ..rows import rows_of
from .conversation import Conversation
from .rounds import PrefillDue, Prefilled, RoundDue

PassRows = tuple[mx.array, mx.array | None]  # a round's logits [k+1, V], hidden [k+1, ·]


def batch_key(conv: Conversation) -> tuple[int, bool] | None:
    """Conversations with the same key verify in one pass: the same weights and the same
    outputs wanted, over attention caches or recurrent ones that record their updates. None:
    it batches with nothing (quantized KV does not batch)."""
    if not all(type(x) in (KVCache, WindowKVCache) or (type(x) is RecurrentCache and x.rollback)
               for x in conv.cache):
        return None
    return id(conv.target), bool(conv.wants_hidden)


def batchable(convs: list[Conversation]) -> bool:
    """Can these conversations verify in one pass? (Their batch_keys are one, not None.)"""
    return same_key([batch_key(c) for c in convs])


def same_key(keys: list[tuple[int, bool] | None]) -> bool:
    return keys[0] is not None and all(k == keys[0] for k in keys)


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


def verify_together(rounds: list[tuple[Conversation, Draft]], *,
                    together: bool | None = None) -> list[PassRows]:
    """Every round's verify pass: one target forward for all when they batch, else each its
    own. Each conversation's bookkeeping is its own (Conversation.took_pass). together: the
    caller already knows whether they batch (None: asked here)."""
    convs = [conv for conv, _ in rounds]
    if together is None:
        together = len(rounds) > 1 and batchable(convs)
    if not together:
        return [conv.verify(draft) for conv, draft in rounds]
    inputs = [conv.pass_input(draft) for conv, draft in rounds]
    lengths = [x.shape[0] for x in inputs]
    logits, hidden = forward_together(convs, inputs)
    return [conv.took_pass(q, draft, logits[r, :q], hidden[r, :q] if hidden is not None else None)
            for r, ((conv, draft), q) in enumerate(zip(rounds, lengths, strict=True))]


def prefill_together(chunks: list[tuple[Conversation, PrefillDue]], *,
                     together: bool | None = None) -> list[Prefilled | None]:
    """Several conversations' next prompt chunks as ONE target forward when they batch (rows
    right-padded, each row's keys to its own cache, as a verify pass), each conversation's
    cache then sealed as its own chunk would leave it; else None for each (it runs alone).
    A long chunk's pass is compute-bound on a CPU: together they save the per-pass cost only
    (DESIGN.md, "Measurements behind the rules"). together: as verify_together's."""
    convs = [conv for conv, _ in chunks]
    if together is None:
        together = len(chunks) > 1 and batchable(convs)
    if not together:
        return [None] * len(chunks)
    lengths = [len(due.chunk) for _, due in chunks]
    _, hidden = forward_together(convs, [mx.array(due.chunk, dtype=mx.int32)
                                         for _, due in chunks])
    return [Prefilled(conv.prefilled(q, hidden[r, :q] if hidden is not None else None))
            for r, (conv, q) in enumerate(zip(convs, lengths, strict=True))]


def draft_together(rounds: list[tuple[Conversation, RoundDue]]) -> list[Draft]:
    """Every round's drafts: the rounds whose conversations share a drafter that drafts rows
    together (`draft_rows`) in one chain of its steps over all of them, the rest each alone
    (Conversation.draft). Each row draws its own k from its own sampler, so its drafts and
    the probabilities they report are what it would draw alone, up to the batched kernels'
    rounding; the target decides what is emitted either way. Synced where a round times its
    draft apart (split), else left to run while the host builds the verify pass."""
    drafts: list[Draft | None] = [None] * len(rounds)
    groups: dict[int, list[int]] = {}
    for i, (conv, due) in enumerate(rounds):
        if due.k and conv.drafter is not None:
            groups.setdefault(id(conv.drafter), []).append(i)
    for members in groups.values():
        convs, dues = [rounds[i][0] for i in members], [rounds[i][1] for i in members]
        got = None if len(members) < 2 else convs[0].drafter.draft_rows(
            [c.drafter_state for c in convs], [c.draft_context(copy=d.copy) for c, d in
                                               zip(convs, dues, strict=True)],
            [d.k for d in dues], [d.sampler for d in dues])
        if got is None:
            continue
        arrays = [a for d in got for a in (d.tokens, d.probs) if a is not None]
        (mx.eval if any(d.split for d in dues) else mx.async_eval)(arrays)
        for i, d in zip(members, got, strict=True):
            drafts[i] = d
    return [d if d is not None else conv.draft(due.k, due.sampler, split=due.split,
                                               copy=due.copy)
            for d, (conv, due) in zip(drafts, rounds, strict=True)]
