"""Several conversations' verify passes as ONE target forward (the server's batch).

Each conversation keeps its own caches; for the one pass, layer i of every row is seen through
a `RowsCache`: it appends each row's own new keys and values to that row's cache (only its real
tokens: a row shorter than the batch is padded with inputs whose keys go nowhere), and hands
the attention the rows' keys side by side, right-padded to the longest, with a mask that gives
each row its own causal (or windowed) view and never a padded key. RoPE takes each row's own
offset. So every row's logits are those of its conversation verified alone (up to the batched
kernels' rounding), and after the pass each conversation's caches are as its own verify would
leave them: commit and rollback stay per conversation, ragged (each keeps its own prefix).

Recurrent layers (Gated DeltaNet) batch through recurrent.RowsRecurrent: padded steps are masked
out of the recurrence, and each row records its own update (its replay over its own inputs),
so rollback stays per conversation too. Quantized KV verifies one conversation at a time.

The drafts before that pass batch too where the drafter can (`draft_together`): a shared-kv MTP
head runs each draft step once over every row instead of once per row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from ..cache import WindowKVCache
from ..drafters import Draft
from ..recurrent import RecurrentCache, RowsRecurrent

if TYPE_CHECKING:
    from .conversation import Conversation
    from .turn import Drafting

Verified = tuple[mx.array, mx.array | None]  # a round's logits [k+1, V], hidden [k+1, ·]


class RowsCache:
    """Layer i's caches of B conversations as one batch cache, for a single forward."""

    def __init__(self, caches: list[Any], lengths: list[int]):
        self.caches, self.lengths = caches, lengths
        self.width = max(lengths)

    @property
    def offset(self) -> mx.array:
        """Each row's position of its first new token (RoPE per row)."""
        return mx.array([c.offset for c in self.caches])

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None):
        """[B, 1, N, keys]: row r's own mask over its real queries (a padded query repeats
        the row's last), False on the padded keys."""
        rows = []
        for c, q in zip(self.caches, self.lengths, strict=True):
            m = c.make_mask(q, return_array=True, window_size=window_size)
            keys = _keys_after(c, q)
            m = mx.ones((q, keys), mx.bool_) if m is None else m.astype(mx.bool_)
            m = mx.broadcast_to(m, (q, keys))
            if q < N:
                m = mx.concatenate([m, mx.repeat(m[-1:], N - q, axis=0)])
            rows.append(m)
        width = max(r.shape[1] for r in rows)
        return mx.stack([mx.pad(r, [(0, 0), (0, width - r.shape[1])], constant_values=False)
                         for r in rows])[:, None]

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        """Append row r's first lengths[r] keys/values to its cache; return all rows' stored
        keys/values [B, H, width, D], right-padded with zeros (masked out)."""
        ks, vs = [], []
        for r, (c, q) in enumerate(zip(self.caches, self.lengths, strict=True)):
            k, v = c.update_and_fetch(keys[r : r + 1, :, :q], values[r : r + 1, :, :q])
            ks.append(k)
            vs.append(v)
        width = max(k.shape[2] for k in ks)

        def pad(x):
            return mx.pad(x, [(0, 0), (0, 0), (0, width - x.shape[2]), (0, 0)])

        return mx.concatenate([pad(k) for k in ks]), mx.concatenate([pad(v) for v in vs])


def _keys_after(cache: Any, q: int) -> int:
    """How many keys the cache hands the attention once q more are appended."""
    stored = cache.stored if isinstance(cache, WindowKVCache) else cache.offset
    return stored + q


def batchable(convs: list[Conversation]) -> bool:
    """Can these conversations verify in one pass? Same weights, attention caches or
    recurrent ones that record their updates (quantized KV does not batch)."""
    first = convs[0]
    return all(c.target is first.target and c.wants_hidden == first.wants_hidden
               and all(type(x) in (KVCache, WindowKVCache)
                       or (type(x) is RecurrentCache and x.rollback) for x in c.cache)
               for c in convs)


def rows_of(caches: list[Any], lengths: list[int]) -> RowsCache | RowsRecurrent:
    """Layer i of every row, as the batch cache of its kind."""
    if isinstance(caches[0], RecurrentCache):
        return RowsRecurrent(caches, lengths)
    return RowsCache(caches, lengths)


def verify_together(rounds: list[tuple[Conversation, Draft]]) -> list[Verified]:
    """Every round's verify pass: one target forward for all when they batch, else each its
    own. Each conversation's bookkeeping is its own (Conversation.verified)."""
    convs = [conv for conv, _ in rounds]
    if len(rounds) == 1 or not batchable(convs):
        return [conv.verify(draft) for conv, draft in rounds]
    inputs = [conv.verify_input(draft) for conv, draft in rounds]
    lengths = [x.shape[0] for x in inputs]
    width = max(lengths)
    x = mx.stack([mx.pad(t, [(0, width - t.shape[0])]) for t in inputs])
    layers = len(convs[0].cache)
    caches = [rows_of([c.cache[i] for c in convs], lengths) for i in range(layers)]
    logits, hidden = convs[0].target.forward_rows(x, caches, hidden=convs[0].wants_hidden)
    return [conv.verified(q, draft, logits[r, :q], hidden[r, :q] if hidden is not None else None)
            for r, ((conv, draft), q) in enumerate(zip(rounds, lengths, strict=True))]


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
