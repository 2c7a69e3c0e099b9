"""Several conversations' caches seen as one batch cache, for a single forward over their rows.

Layer i of every row is seen through a `RowsCache`: it appends each row's own new keys and
values to that row's cache (only its real tokens: a row shorter than the batch is padded with
inputs whose keys go nowhere), and hands the attention the rows' keys side by side,
right-padded to the longest, with a mask that gives each row its own causal (or windowed) view
and never a padded key. RoPE takes each row's own offset. Recurrent layers batch through
recurrent.RowsRecurrent. The target's batched verify (engine/batch.py) and a draft model's
batched drafting (drafters/draft_model.py) both run through these.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from .cache import WindowKVCache
from .recurrent import RecurrentCache, RowsRecurrent


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


def rows_of(caches: list[Any], lengths: list[int]) -> RowsCache | RowsRecurrent:
    """Layer i of every row, as the batch cache of its kind."""
    if isinstance(caches[0], RecurrentCache):
        return RowsRecurrent(caches, lengths)
    return RowsCache(caches, lengths)
