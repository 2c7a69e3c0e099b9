"""Recurrent state that can take back a round: RecurrentCache, and the Gated DeltaNet layers that
record their updates into it (cache.py's commit path trims it like any other cache kind).

A Gated DeltaNet layer (Qwen3.5 / 3.6 / 3.8, Qwen3-Next) keeps two states per sequence:

* conv:  the last K-1 rows of its pre-convolution input (a depthwise causal conv of width K);
* delta: S_t = g_t·S_{t-1} + β_t·(v_t − g_t·S_{t-1}k_t)·k_tᵀ, one [H_v, D_v, D_k] matrix per head.

Both fold every token in, so a rejected draft cannot be cut out. Instead, when it is handed a
RecurrentCache, the layer records each update with a replay function over that update's own
inputs (cache.py decides when to call it):

* conv after the first m tokens is rows m .. m+K-2 of concat(conv_before, qkv): a slice;
* delta after the first m tokens is the same recurrence run on the first m (q, k, v, a, b) from
  the state before the update: the round's projections, convolution and every other layer are
  not run again, and the per-step arithmetic is the verify pass's own, so the state is the one
  the verify pass went through at step m.

The forward below is mlx-lm's Gated DeltaNet forward, restated so the intermediate tensors can be
kept; with any other cache (mlx-lm's own ArraysCache, or none) the layer runs mlx-lm's code
unchanged. The tests compare the two paths token for token.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import ArraysCache
from mlx_lm.models.gated_delta import gated_delta_update, normalize_qk

from .errors import UnsupportedModelError


@dataclass
class _Update:
    """One recorded update of a recurrent layer: n tokens, the state before them, and
    replay(m) -> the state after only the first m of them; nbytes: what the record keeps alive
    beyond the state itself (the update's inputs, or its per-step states)."""

    n: int
    before: list[Any]
    replay: Callable[[int], list[Any]]
    nbytes: int = 0


class RecurrentCache(ArraysCache):
    """ArraysCache whose recent updates can be taken back exactly (see the module doc).

    A rollback-aware layer calls `update(state, n, replay)` instead of writing the entries; any
    other write (a layer that does not record) breaks the tape until the next seal."""

    def __init__(self, size: int, *, rollback: bool = True):
        super().__init__(size)
        self.rollback = rollback  # False: the model's recurrent layers do not record updates
        self.tape: list[_Update] | None = []

    def __setitem__(self, idx, value):
        self.tape = None  # an unrecorded write: this state can no longer be taken back
        super().__setitem__(idx, value)

    def update(self, state: list[Any], n: int, replay: Callable[[int], list[Any]], *,
               nbytes: int = 0) -> None:
        if self.tape is not None:
            self.tape.append(_Update(n, list(self.cache), replay, nbytes))
        self.cache = list(state)

    def can_trim(self, n: int) -> bool:
        return n == 0 or (self.tape is not None and n <= sum(u.n for u in self.tape))

    def trim(self, n: int) -> int:
        if not self.can_trim(n):
            raise UnsupportedModelError("recurrent state cannot roll back past its last commit")
        left = n
        while left:
            u = self.tape[-1]
            if u.n <= left:  # the whole update goes: back to the state before it
                self.cache, left = list(u.before), left - u.n
                self.tape.pop()
            else:  # keep its first u.n - left tokens: replay just those from u.before
                self.cache = list(u.replay(u.n - left))
                self.tape[-1] = _Update(u.n - left, u.before, u.replay, u.nbytes)
                left = 0
        return n

    def seal(self) -> None:
        self.tape = []

    @property
    def tape_nbytes(self) -> int:
        """Memory the rollback records hold now (states before, inputs or per-step states)."""
        return sum(u.nbytes + sum(a.nbytes for a in u.before if a is not None)
                   for u in self.tape or [])

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.cache if c is not None)


def _split_projections(layer, x):
    """qwen3_5: separate in_proj_qkv / z / b / a."""
    B, S, _ = x.shape
    z = layer.in_proj_z(x).reshape(B, S, layer.num_v_heads, layer.head_v_dim)
    return layer.in_proj_qkv(x), z, layer.in_proj_b(x), layer.in_proj_a(x)


def _fused_projections(layer, x):
    """qwen3_next: fused in_proj_qkvz / in_proj_ba, interleaved per key head."""
    B, S, _ = x.shape
    q, k, v, z, b, a = layer.fix_query_key_value_ordering(layer.in_proj_qkvz(x),
                                                          layer.in_proj_ba(x))
    qkv = mx.concatenate([t.reshape(B, S, -1) for t in (q, k, v)], axis=-1)
    return qkv, z, b, a


class RowsRecurrent:
    """Layer i's RecurrentCaches of B conversations as one batch cache, for a single verify
    pass (engine/batch.py): row r has lengths[r] real tokens, the rest of the batch's width is
    padding. The layer runs the batch with padded steps masked out of the recurrence (the
    state goes through them unchanged) and records into each row's own cache its own update:
    its conv rows after its real tokens, its state, a replay over its own inputs."""

    def __init__(self, caches: list[RecurrentCache], lengths: list[int]):
        self.caches, self.lengths = caches, lengths

    def real(self, width: int) -> mx.array:
        """[B, width]: True at each row's real tokens."""
        return mx.arange(width)[None] < mx.array(self.lengths)[:, None]


def _rows_state(self, rows: RowsRecurrent, dtype) -> tuple[mx.array, mx.array | None]:
    """The rows' states stacked (a row with none yet: zeros, as mlx-lm starts one)."""
    n_keep = self.conv_kernel_size - 1
    conv = [c[0] if c[0] is not None else mx.zeros((1, n_keep, self.conv_dim), dtype)
            for c in rows.caches]
    if all(c[1] is None for c in rows.caches):
        return mx.concatenate(conv), None
    shape = (1, self.num_v_heads, self.head_v_dim, self.head_k_dim)
    state = [c[1] if c[1] is not None else mx.zeros(shape, mx.float32) for c in rows.caches]
    return mx.concatenate(conv), mx.concatenate(state)


def _gated_delta_forward(self, inputs: mx.array, mask=None, cache=None) -> mx.array:
    rows = cache if isinstance(cache, RowsRecurrent) else None
    if (rows is None and not isinstance(cache, RecurrentCache)) or mask is not None:
        return self._mlx_lm_call(inputs, mask, cache)
    B, S, _ = inputs.shape
    qkv, z, b, a = self._project(self, inputs)
    n_keep = self.conv_kernel_size - 1
    if rows is not None:
        conv_before, state_before = _rows_state(self, rows, inputs.dtype)
        real = rows.real(S)  # padded steps leave the state as it is
    else:
        conv_before, state_before, real = cache[0], cache[1], None
    if conv_before is None:
        conv_before = mx.zeros((B, n_keep, self.conv_dim), dtype=inputs.dtype)
    conv_input = mx.concatenate([conv_before, qkv], axis=1)
    conv_out = nn.silu(self.conv1d(conv_input))
    q, k, v = [
        t.reshape(B, S, h, d)
        for t, h, d in zip(
            mx.split(conv_out, [self.key_dim, 2 * self.key_dim], -1),
            [self.num_k_heads, self.num_k_heads, self.num_v_heads],
            [self.head_k_dim, self.head_k_dim, self.head_v_dim],
            strict=True,
        )
    ]
    q, k = normalize_qk(q, k, inv_scale=self.head_k_dim**-0.5, eps=1e-6)
    use_kernel = not self.training

    capture = _STRATEGY[0] == "capture" and S <= CAPTURE_MAX
    if capture:
        out, states = _capture(q, k, v, a, b, self.A_log, self.dt_bias, state_before, use_kernel,
                               real)
        state = states[-1]
    else:
        out, state = gated_delta_update(q, k, v, a, b, self.A_log, self.dt_bias, state_before,
                                        real, use_kernel=use_kernel)
    inputs_kept = (q, k, v, a, b)
    for r, (c, n) in enumerate(zip(rows.caches, rows.lengths, strict=True) if rows
                               else [(cache, S)]):
        one = slice(r, r + 1)  # this row's own update, replayable on its own inputs

        def replay(m: int, one=one) -> list[Any]:
            conv = mx.contiguous(conv_input[one, m : m + n_keep])
            if capture:
                return [conv, states[m - 1][one]]
            before = state_before[one] if state_before is not None else None
            return [conv, gated_delta_update(*(t[one, :m] for t in inputs_kept), self.A_log,
                                             self.dt_bias, before, None,
                                             use_kernel=use_kernel)[1]]

        kept = (conv_input[one].nbytes + sum(s[one].nbytes for s in states[:-1]) if capture
                else sum(t[one].nbytes for t in (conv_input, *inputs_kept)))
        c.update([mx.contiguous(conv_input[one, n : n + n_keep]), state[one]], n, replay,
                 nbytes=kept)
    out = self.norm(out, z)
    return self.out_proj(out.reshape(B, S, -1))


def _capture(q, k, v, a, b, A_log, dt_bias, state, use_kernel, real=None):
    """The recurrence one step at a time, keeping the state after every step (what a capture
    kernel writes): rollback is then a lookup, at one state per layer per drafted token."""
    outs, states = [], []
    for t in range(q.shape[1]):
        y, state = gated_delta_update(q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1],
                                      a[:, t : t + 1], b[:, t : t + 1], A_log, dt_bias, state,
                                      real[:, t : t + 1] if real is not None else None,
                                      use_kernel=use_kernel)
        outs.append(y)
        states.append(state)
    return mx.concatenate(outs, axis=1), states


_STRATEGY = ["replay"]
CAPTURE_MAX = 16  # capture is for verify rounds; a prefill chunk is recorded for replay


@contextmanager
def rollback_strategy(name: str) -> Iterator[None]:
    """"replay" (the default: keep a round's recurrence inputs, re-run the kept prefix) or
    "capture" (keep the state after every step). The benchmark measures both; see DESIGN.md."""
    if name not in ("replay", "capture"):
        raise ValueError(name)
    old, _STRATEGY[0] = _STRATEGY[0], name
    try:
        yield
    finally:
        _STRATEGY[0] = old


def _rollback_classes() -> dict[type, Callable]:
    """mlx-lm layer class -> how it projects its input (the only part that differs)."""
    from mlx_lm.models import qwen3_5, qwen3_next

    return {
        qwen3_5.GatedDeltaNet: _split_projections,
        qwen3_next.Qwen3NextGatedDeltaNet: _fused_projections,
    }


_SUBCLASSES: dict[type, type] = {}


def _rollback_subclass(cls: type, project: Callable) -> type:
    if cls not in _SUBCLASSES:
        _SUBCLASSES[cls] = type(f"Rollback{cls.__name__}", (cls,), {
            "__call__": _gated_delta_forward,
            "_mlx_lm_call": cls.__call__,
            "_project": staticmethod(project),
        })
    return _SUBCLASSES[cls]


def enable_rollback(model: nn.Module) -> bool:
    """Make every recurrent layer of `model` record its updates (idempotent). True if all of the
    model's recurrent layers can then be rolled back."""
    if getattr(model, "_mlx_spec_rollback", None) is not None:
        return model._mlx_spec_rollback
    known = _rollback_classes()
    layers = list(getattr(model, "layers", []))
    caches = model.make_cache() if hasattr(model, "make_cache") else []
    ok = True
    for layer, c in zip(layers, caches, strict=False):
        if not isinstance(c, ArraysCache):
            continue
        found = False
        for m in layer.modules():
            if type(m) in _SUBCLASSES.values():
                found = True
            elif type(m) in known:
                m.__class__ = _rollback_subclass(type(m), known[type(m)])
                found = True
        ok = ok and found
    if any(isinstance(c, ArraysCache) for c in caches) and len(caches) != len(layers):
        ok = False  # caches do not map one to one onto layers: do not guess
    model._mlx_spec_rollback = ok
    return ok
