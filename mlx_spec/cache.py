"""The one cache-commit path: every cache kind the engine uses can be cut back to a length.

Invariant kept by the engine: after every round, a cache holds exactly the committed tokens it
was fed (for the target: every committed token but the last, whose logits come next round), so it
equals a from-scratch recompute of that sequence. Rejected tokens are removed by `trim_to`.

* KVCache / QuantizedKVCache: entries are positions; trimming moves the write offset back and the
  stale slots are overwritten by the next write (as gpt-fast does with a preallocated cache).
* Sliding-window layers: mlx-lm's RotatingKVCache overwrites the oldest entries in place, so after
  the window wraps a rejected draft could not be taken back. We replace it with WindowKVCache, a
  linear buffer that keeps `window + slack` entries and masks attention to the window; rollback
  of up to `slack` tokens is always exact.
* Recurrent layers (Gated DeltaNet's conv + delta-rule state, mlx-lm's ArraysCache) fold every
  token into one state, which cannot be cut back. RecurrentCache (recurrent.py) keeps a *tape*
  of the updates since the last commit: each holds the state before it and a replay function
  for its own inputs.
  Trimming into an update restores the state before it and replays only the kept prefix (the
  recurrence alone: no projection, no other layer runs again). Layers that do not record their
  updates (recurrent.py says which do) still decode; speculation refuses them.

Lengths are the caller's: the engine knows how many tokens it fed (`have`), so no cache kind has
to expose an offset. Every trim also *seals*: nothing before the kept length is ever taken back,
so recurrent tapes are dropped there and their memory returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import (
    ArraysCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
    make_prompt_cache,
)

from .errors import UnsupportedModelError
from .recurrent import RecurrentCache, enable_rollback


class WindowKVCache(KVCache):
    """A sliding-window KV cache that can roll back up to `slack` tokens after it wraps.

    `offset` is the absolute position (RoPE needs it); `start` is the absolute position of the
    first stored entry. Entries older than the window are dropped in amortised chunks.
    """

    def __init__(self, window: int, slack: int):
        super().__init__()
        self.window, self.slack, self.start = window, slack, 0

    @property
    def stored(self) -> int:
        return self.offset - self.start

    def update_and_fetch(self, keys, values):
        prev = self.stored
        if self.keys is None or prev + keys.shape[2] > self.keys.shape[2]:
            need = prev + keys.shape[2]
            cap = ((need + self.step - 1) // self.step) * self.step
            B, H, _, Dk = keys.shape
            new_k = mx.zeros((B, H, cap, Dk), keys.dtype)
            new_v = mx.zeros((B, H, cap, values.shape[3]), values.dtype)
            if self.keys is not None and prev:
                new_k[..., :prev, :] = self.keys[..., :prev, :]
                new_v[..., :prev, :] = self.values[..., :prev, :]
            self.keys, self.values = new_k, new_v
        self.keys[..., prev : prev + keys.shape[2], :] = keys
        self.values[..., prev : prev + keys.shape[2], :] = values
        self.offset += keys.shape[2]
        n = self.stored
        out = self.keys[..., :n, :], self.values[..., :n, :]
        self._drop_old()  # after the write, so the mask the model built for this call holds
        return out

    def _drop_old(self) -> None:
        """Forget entries no future query can see, keeping `slack` of them for rollback.
        Amortised: only once a whole `step` of droppable entries has piled up."""
        keep = self.window - 1 + self.slack
        drop = self.stored - keep
        if drop < self.step:
            return
        self.keys = self.keys[..., drop:, :]
        self.values = self.values[..., drop:, :]
        self.start += drop

    def keys_and_values(self):
        n = self.stored
        return self.keys[..., :n, :], self.values[..., :n, :]

    def size(self) -> int:
        return self.stored

    def make_mask(self, N: int, window_size: int | None = None, return_array: bool = False):
        # queries are the N newest positions; stored keys before them: self.stored
        window = window_size or self.window
        if N == 1 and self.stored < window and not return_array:
            return None
        return create_causal_mask(N, self.stored, window_size=window)

    def can_trim(self, n: int) -> bool:
        """After trimming n, every future query must still find its window - 1 predecessors."""
        return self.stored - n >= min(self.offset - n, self.window - 1)

    def trim(self, n: int) -> int:
        if not self.can_trim(n):
            raise UnsupportedModelError("sliding-window cache cannot roll back past its slack")
        self.offset -= n
        return n

    @property
    def state(self):
        return self.keys, self.values, self.offset, self.start

    @state.setter
    def state(self, v):
        self.keys, self.values, self.offset, self.start = v


def make_cache(model: Any, *, slack: int = 16, kv_bits: int | None = None) -> list[Any]:
    """The model's own cache list, with every layer made rollback-able (see module doc)."""
    rollback = enable_rollback(model)
    caches = make_prompt_cache(model)
    if kv_bits and len(caches) < len(getattr(model, "layers", caches)):
        raise UnsupportedModelError(
            "--kv-bits: this model's KV-shared layers (Gemma 4) attend over another layer's "
            "K/V through mlx-lm, which cannot read quantized K/V yet; run without --kv-bits")
    out = []
    for c in caches:
        if isinstance(c, RotatingKVCache):
            if c.keep:
                raise UnsupportedModelError("sliding-window caches with keep > 0 are not supported")
            out.append(WindowKVCache(window=c.max_size, slack=slack))
        elif type(c) is KVCache and kv_bits:
            out.append(QuantizedKVCache(group_size=_kv_group(model), bits=kv_bits))
        elif type(c) is ArraysCache:
            out.append(RecurrentCache(len(c.cache), rollback=rollback))
        else:
            out.append(c)
    return out


def _kv_group(model: Any) -> int:
    """mlx-lm's KV quantization group (64), or 32 where the head size is not a multiple of 64."""
    args = getattr(getattr(model, "language_model", model), "args", None)
    head_dim = getattr(args, "head_dim", None) or (
        args.hidden_size // args.num_attention_heads if args is not None else 64)
    return 64 if head_dim % 64 == 0 else 32


_TRIMMABLE = (KVCache, QuantizedKVCache, WindowKVCache, RecurrentCache)


def check_rollback(caches: list[Any]) -> None:
    """Raise if a cache can never be cut back: speculation would be unsafe."""
    for c in caches:
        if isinstance(c, RecurrentCache) and not c.rollback or not isinstance(c, _TRIMMABLE):
            raise UnsupportedModelError(
                f"this model has {type(c).__name__} layers (recurrent state) whose updates "
                "cannot be rolled back yet; use --drafter none"
            )


def trim_to(caches: list[Any], n: int, *, have: int) -> list[Any]:
    """The commit: cut every layer from `have` entries back to its first n (the committed
    prefix), then seal (recurrent tapes are dropped: nothing before n is taken back).

    Returns the recurrent states it cut back (lazy where a replay made them), for the caller to
    evaluate when it likes."""
    if n > have:
        raise ValueError(f"cache holds {have} tokens, cannot trim to {n}")
    cut = []
    for c in caches:
        if have > n:
            c.trim(have - n)
        if isinstance(c, RecurrentCache):
            if have > n:
                cut.extend(a for a in c.cache if a is not None)
            c.seal()
    return cut


def can_trim_to(caches: list[Any], n: int, *, have: int) -> bool:
    if n == have:
        return True
    for c in caches:
        if isinstance(c, WindowKVCache | RecurrentCache):
            if not c.can_trim(have - n):
                return False
        elif not isinstance(c, KVCache | QuantizedKVCache):
            return False
    return True


def nbytes(caches: list[Any]) -> int:
    total = 0
    for c in caches:
        try:
            total += c.nbytes
        except (AttributeError, TypeError):
            pass
    return total


@dataclass(frozen=True)
class Growth:
    """What a conversation's caches cost: `per_token` bytes for each cached token (full
    attention's K and V), and `fixed` bytes however long it grows (a sliding window at its
    bound, a recurrent state). Buffers grow `step` slots at a time."""

    per_token: float
    fixed: int
    step: int = 1

    def bytes_for(self, tokens: int) -> int:
        slots = -(-tokens // self.step) * self.step
        return int(self.fixed + self.per_token * slots)

    def scaled(self, factor: float) -> Growth:
        return Growth(self.per_token * factor, int(self.fixed * factor), self.step)


def growth(caches: list[Any]) -> Growth:
    """Read off caches written at least once (their buffers exist): a KV buffer's bytes per
    slot are its bytes over its slots, whatever its heads, head size, dtype or quantization; a
    window holds at most window + slack + one allocation step of them; anything else is
    counted at its present size."""
    per, fixed, step = 0.0, 0, 1
    for c in caches:
        keys = getattr(c, "keys", None)
        if isinstance(c, KVCache | QuantizedKVCache | RotatingKVCache) and keys is not None:
            buffer = keys[0] if isinstance(keys, tuple | list) else keys
            slot = c.nbytes / max(1, buffer.shape[-2])
            if isinstance(c, WindowKVCache):
                fixed += int(slot * (c.window + c.slack + c.step))
            elif isinstance(c, RotatingKVCache):
                fixed += int(slot * (c.max_size + c.step))
            else:
                per, step = per + slot, max(step, c.step)
        else:
            fixed += nbytes([c])
    return Growth(per, fixed, step)


def difference(got: list[Any], want: list[Any]) -> float:
    """The largest difference between two cache lists of one model (e.g. a cache after
    speculation and a fresh prefill of its committed tokens): every K/V entry a future query
    can see, every recurrent state; inf where their shapes or lengths differ."""
    worst = 0.0

    def gap(a: mx.array, b: mx.array) -> float:
        if a.shape != b.shape:
            return float("inf")
        return mx.max(mx.abs(a.astype(mx.float32) - b.astype(mx.float32))).item() if a.size \
            else 0.0

    for a, b in zip(got, want, strict=True):
        if isinstance(a, RecurrentCache):
            for x, y in zip(a.cache, b.cache, strict=True):
                if (x is None) != (y is None):
                    return float("inf")
                worst = max(worst, gap(x, y) if x is not None else 0.0)
            continue
        if a.offset != b.offset:
            return float("inf")
        for x, y in zip(_visible(a), _visible(b), strict=True):
            worst = max(worst, gap(x, y))
    return worst


def _visible(c: Any) -> tuple[mx.array, mx.array]:
    """(keys, values) a future query can read, dequantized."""
    k, v = c.keys_and_values() if hasattr(c, "keys_and_values") else c.state[:2]
    if isinstance(k, tuple | list):  # QuantizedKVCache: (w, scales, biases)
        k = mx.dequantize(*k, group_size=c.group_size, bits=c.bits)
        v = mx.dequantize(*v, group_size=c.group_size, bits=c.bits)
    if isinstance(c, WindowKVCache):  # only the window matters
        w = c.window - 1
        k, v = k[..., -w:, :], v[..., -w:, :]
    return k, v
