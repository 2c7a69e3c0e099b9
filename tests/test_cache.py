"""The one commit path: trimming every cache kind gives exactly a recompute of the kept prefix."""

from __future__ import annotations

import mlx.core as mx
import pytest
from helpers import assert_cache_equals_recompute
from mlx_lm.models.cache import QuantizedKVCache

from mlx_spec import cache as kv
from mlx_spec.cache import WindowKVCache
from mlx_spec.errors import UnsupportedModelError


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_trim_after_speculative_append_equals_recompute(load, arch):
    target, _ = load(arch)
    seq = [(i * 37) % 300 + 3 for i in range(70)]  # 70 > the 16-token window of gemma3_text
    cache = kv.make_cache(target.model, slack=8)
    pos = 0
    for step in [20, 5, 9, 3, 7, 1, 8]:
        junk = [(t * 11) % 300 + 3 for t in range(step)]  # rejected drafts
        target.forward(seq[pos : pos + step] + junk, cache)
        kv.trim_to(cache, pos + step, have=pos + 2 * step)  # roll the junk back
        pos += step
        assert_cache_equals_recompute(target, cache, seq[:pos])


def test_gemma_uses_window_caches_that_roll_back_after_wrapping(load):
    target, _ = load("gemma3_text")
    cache = kv.make_cache(target.model, slack=4)
    assert any(isinstance(c, WindowKVCache) for c in cache)
    seq = [(i * 7) % 300 + 3 for i in range(300)]
    target.forward(seq[:200], cache)  # far past the 16-token window
    target.forward(seq[200:], cache)  # the buffer is full: entries outside the window go
    w = next(c for c in cache if isinstance(c, WindowKVCache))
    assert w.stored < 150  # old entries were dropped...
    assert kv.can_trim_to(cache, 296, have=300)  # ...but rollback within the slack stays possible
    kv.trim_to(cache, 296, have=300)
    assert_cache_equals_recompute(target, cache, seq[:296])
    assert not kv.can_trim_to(cache, 150, have=296)
    with pytest.raises(UnsupportedModelError):
        w.trim(146)


def test_quantized_kv_cache_rolls_back(load):
    target, _ = load("llama")
    cache = [QuantizedKVCache(group_size=32, bits=8) for _ in target.model.layers]
    target.forward(list(range(3, 30)), cache)
    kv.trim_to(cache, 20, have=27)
    target.forward(list(range(22, 25)), cache)
    ref = [QuantizedKVCache(group_size=32, bits=8) for _ in target.model.layers]
    target.forward(list(range(3, 23)) + list(range(22, 25)), ref)
    for a, b in zip(cache, ref, strict=True):
        ka, kb = a.state[0][0], b.state[0][0]
        n = a.offset
        assert mx.array_equal(ka[..., :n, :], kb[..., :n, :])


def test_recurrent_caches_are_refused():
    from mlx_lm.models.cache import ArraysCache

    with pytest.raises(UnsupportedModelError, match="recurrent"):
        kv.check_rollback([ArraysCache(2)])
