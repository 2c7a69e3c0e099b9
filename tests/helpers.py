"""Shared checks: cache == recompute, and near-tie analysis of greedy divergences."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from mlx_spec import cache as kv
from mlx_spec.cache import RecurrentCache, WindowKVCache

# Batched verification runs other kernels than one-token decoding. Two greedy runs may only part
# at a near-tie: the top-2 logit gap at the divergence is below this (relative to the logit scale).
NEAR_TIE = {None: 2e-3, 8: 2e-2, 4: 5e-2}


def stored_kv(c):
    """(keys, values) in temporal order, as float arrays (dequantized if needed)."""
    k, v = c.keys_and_values() if hasattr(c, "keys_and_values") else c.state[:2]
    if isinstance(k, tuple | list):  # QuantizedKVCache: (w, scales, biases)
        k = mx.dequantize(*k, group_size=c.group_size, bits=c.bits)
        v = mx.dequantize(*v, group_size=c.group_size, bits=c.bits)
    return np.array(k.astype(mx.float32)), np.array(v.astype(mx.float32))


def assert_cache_equals_recompute(target, caches, tokens, atol=1e-4):
    """The cache after speculation equals a fresh prefill of exactly these tokens: every layer's
    K/V, and every recurrent layer's conv and delta-rule state."""
    fresh = kv.make_cache(target.model, slack=64)
    if tokens:
        target.forward(tokens, fresh)
    for got, want in zip(caches, fresh, strict=True):
        if isinstance(got, RecurrentCache):
            assert len(got.cache) == len(want.cache)
            for a, b in zip(got.cache, want.cache, strict=True):
                assert (a is None) == (b is None)
                if a is not None:
                    np.testing.assert_allclose(np.array(a.astype(mx.float32)),
                                               np.array(b.astype(mx.float32)),
                                               atol=atol, rtol=1e-3)
            continue
        assert got.offset == len(tokens)
        gk, gv = stored_kv(got)
        wk, wv = stored_kv(want)
        if isinstance(got, WindowKVCache):  # only the window matters for future queries
            w = got.window - 1
            gk, gv, wk, wv = gk[..., -w:, :], gv[..., -w:, :], wk[..., -w:, :], wv[..., -w:, :]
        assert gk.shape == wk.shape, (gk.shape, wk.shape)
        np.testing.assert_allclose(gk, wk, atol=atol, rtol=1e-3)
        np.testing.assert_allclose(gv, wv, atol=atol, rtol=1e-3)


def first_divergence(a, b):
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None


def top2_gap(target, context):
    """Relative gap between the two best next-token logits after `context` (fresh forward)."""
    logits = np.array(target.model(mx.array(context)[None])[0, -1].astype(mx.float32))
    top = np.sort(logits)[-2:]
    return (top[1] - top[0]) / (np.abs(logits).max() + 1e-9)


# tallies printed at the end of the run (tests/conftest.py): how often greedy outputs were
# identical token for token, and how often they parted at a measured near-tie
IDENTITY = {"identical": 0, "near_tie": 0, "tokens": 0}


def assert_same_or_near_tie(target, prompt, got, want, bits=None):
    """got == want, except that they may part at a genuine near-tie (measured, not assumed)."""
    i = first_divergence(got, want)
    IDENTITY["tokens"] += len(want)
    if i is None:
        assert len(got) == len(want)
        IDENTITY["identical"] += 1
        return None
    gap = top2_gap(target, prompt + list(want[:i]))
    assert gap < NEAR_TIE[bits], f"diverged at {i} with top-2 gap {gap:.4g}: not a near-tie"
    IDENTITY["near_tie"] += 1
    return gap
