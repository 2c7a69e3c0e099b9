"""The target's final hidden rows a head keeps for one conversation (HiddenHistory)."""

from __future__ import annotations

import mlx.core as mx


class HiddenHistory:
    """The target's hidden states at the positions a head may still read: rows [base, n).

    A head reads a row once (shared-kv: the newest; own-cache heads: each row as its entry is
    built), so rows before `forget_before`'s floor are dropped, in chunks: memory stays at a
    few hundred rows, not one per position of the conversation (256 MB at 32k tokens on a
    4096-wide f32 model). A prefill that reaches further back hands its rows in again."""

    CHUNK = 256  # rows dropped at a time, so the buffer is not copied every round

    def __init__(self, dim: int):
        self.dim, self.buf, self.base, self.n = dim, None, 0, 0

    def set(self, start: int, hidden: mx.array | None, length: int) -> None:
        """Rows [start, start+len(hidden)) := hidden; then the committed length is `length`."""
        if hidden is not None and len(hidden):
            if self.buf is None or start < self.base:  # older rows than we hold: start over
                self.buf, self.base = None, start
            end = start + hidden.shape[0] - self.base
            if self.buf is None or end > self.buf.shape[0]:
                grown = mx.zeros((max(256, 2 * end), self.dim), hidden.dtype)
                if self.buf is not None and start > self.base:
                    grown[: start - self.base] = self.buf[: start - self.base]
                self.buf = grown
            self.buf[start - self.base : end] = hidden
        self.n = length

    def forget_before(self, floor: int) -> None:
        drop = min(floor, self.n) - self.base
        if self.buf is not None and drop >= self.CHUNK:
            self.buf, self.base = self.buf[drop:], self.base + drop

    def has(self, start: int) -> bool:
        return start >= self.base or self.base == 0

    def holds(self, position: int) -> bool:
        return self.buf is not None and self.base <= position < self.n

    def rows(self, start: int, end: int) -> mx.array:
        """Rows [start, end); row -1 (before the first token) is zeros."""
        pad = max(0, -start)
        lo, hi = max(start, 0) - self.base, end - self.base
        out = self.buf[lo:hi] if hi > lo else None
        zeros = mx.zeros((pad, self.dim), self.buf.dtype if self.buf is not None else mx.float32)
        return out if not pad else zeros if out is None else mx.concatenate([zeros, out])

    @property
    def nbytes(self) -> int:
        return self.buf.nbytes if self.buf is not None else 0
