"""The MTP drafters obey every losslessness rule of the engine: greedy identity, caches (the
target's and the drafter's own state) equal a recompute, and T>0 samples the target distribution."""

from __future__ import annotations

import mlx.core as mx
import pytest
from helpers import (
    PROMPT,
    assert_same_or_near_tie,
    assert_turn_matches_fresh,
    checked,
    conversation,
    open_chat,
    run,
)
from mlx.utils import tree_map
from test_engine_sampling import (
    CFG,
    assert_both_paths_taken,
    chi2_pvalue,
    sample_pairs,
    target_joint,
)

from mlx_spec import cache as kv
from mlx_spec.assets import demo_model
from mlx_spec.drafters.mtp import MTPConfig, MTPDrafter, make_head
from mlx_spec.drafters.mtp_files import load_mtp_drafter, save_mtp
from mlx_spec.errors import ModelLoadError, TokenizerMismatchError
from mlx_spec.sampling import SamplingConfig


def make_drafter(target, kind, seed=0):
    mx.random.seed(seed)
    cfg = MTPConfig.for_target(target, kind, hidden_size=48, num_layers=2, intermediate_size=96)
    head = make_head(cfg)
    mx.eval(head.parameters())
    return MTPDrafter(head, cfg, target)


@pytest.mark.parametrize("kind", ["shared-kv", "deepseek"])
@pytest.mark.parametrize("arch", ["qwen3", "gemma3_text"])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_mtp_greedy_identity_and_state(load, kind, arch, k):
    target, tok = load(arch)
    baseline, _ = run(conversation(target, tok, None))
    engine = conversation(target, tok, make_drafter(target, kind), draft_length=k)
    checked(engine)
    end, events = run(engine)
    assert_same_or_near_tie(target, PROMPT, list(end.tokens), list(baseline.tokens))
    assert end.stats.drafted > 0 and end.stats.drafter_bytes > 0
    # multi-turn: the second turn reuses the prefix, the drafter follows the rollback
    turn2 = PROMPT + list(end.tokens)[:5] + [9, 10]
    assert_turn_matches_fresh(engine, turn2, 10)


@pytest.mark.slow
def test_trained_mtp_sampling_matches_target_distribution():
    """The bundled demo pair's trained head: its drafts are accepted about half the time at
    these settings, so both the acceptance and the residual paths are exercised."""

    engine = open_chat(drafter="mtp", draft_length=2)
    prompt = engine.tokenizer.encode("import os\n\n\ndef read_config(path):\n    ")
    tally = []
    pairs = sample_pairs(engine, CFG, tally, prompt)
    assert_both_paths_taken(tally)
    pval = chi2_pvalue(pairs, target_joint(engine.target, SamplingConfig(**CFG), prompt))
    print(f"trained shared-kv χ² p = {pval:.3f}")
    assert pval > 0.01


def test_random_deepseek_head_sampling_matches_target_distribution(load):
    """No trained DeepSeek-style head ships; a random one is (nearly) always rejected, so this
    checks the residual path and the head's cache bookkeeping under sampling."""
    target, tok = load("qwen3")
    engine = conversation(target, tok, make_drafter(target, "deepseek"), draft_length=2)
    pairs = sample_pairs(engine, CFG)
    pval = chi2_pvalue(pairs, target_joint(target, SamplingConfig(**CFG)))
    print(f"deepseek χ² p = {pval:.3f}")
    assert pval > 0.01


def test_save_load_and_mismatch_errors(load, tmp_path):
    target, _ = load("qwen3")
    d = make_drafter(target, "shared-kv")
    save_mtp(tmp_path / "mtp", d.head, d.cfg)
    again = load_mtp_drafter(tmp_path / "mtp", target)
    x = mx.ones((1, 1, d.cfg.target_hidden_size))
    assert again.cfg == d.cfg
    emb = target.embed(mx.array([[3]]))
    cache = kv.make_cache(target.model)
    target.forward([1, 2, 3], cache)
    kk, vv = cache[-1].keys_and_values()
    a = d.head(emb, x, kk, vv, d.rope, 3)
    b = again.head(emb, x, kk, vv, again.rope, 3)
    assert mx.allclose(a, b).item()
    cfg_file = tmp_path / "mtp" / "mtp_config.json"
    good = cfg_file.read_text()
    cfg_file.write_text(good.replace(f'"vocab_size": {d.cfg.vocab_size}', '"vocab_size": 999'))
    with pytest.raises(TokenizerMismatchError, match="999"):
        load_mtp_drafter(tmp_path / "mtp", target)
    cfg_file.write_text(good)
    with pytest.raises(ModelLoadError, match="not an MTP head"):
        load_mtp_drafter(tmp_path, target)
    (tmp_path / "mtp" / "mtp.safetensors").write_bytes(b"junk")
    with pytest.raises(ModelLoadError, match="cannot load MTP head"):
        load_mtp_drafter(tmp_path / "mtp", target)


@pytest.mark.parametrize("kind", ["shared-kv", "deepseek"])
def test_hidden_history_keeps_only_what_the_head_can_read(load, kind):
    """A 600-token conversation: the head's copy of the target's hidden states stays a few
    hundred rows (older ones are dropped), and a later turn that rewrites history from before
    what was kept still decodes exactly as target-only (the prefill hands the rows in again)."""
    target, tok = load("qwen3")
    drafter = make_drafter(target, kind)
    engine = conversation(target, tok, drafter, draft_length=4)
    end, _ = run(engine, max_tokens=600)
    want, _ = run(conversation(target, tok, None), max_tokens=600)
    assert_same_or_near_tie(target, PROMPT, list(end.tokens), list(want.tokens))
    hist = engine.drafter_state.hist
    assert hist.base > 0 and hist.buf.shape[0] <= 2 * (hist.n - hist.base) + 512
    assert hist.nbytes < 620 * target.hidden_size * 4 / 2  # under half of one row per position
    edited = PROMPT[:10] + [11, 12, 13]  # shares only 10 tokens: rows from before `base`
    got = assert_turn_matches_fresh(engine, edited, 24)
    assert got.stats.drafted > 0


def test_shared_kv_head_reads_a_quantized_cache_in_place(monkeypatch):
    """With an 8-bit KV cache the trained shared-KV head attends over the target's quantized
    K/V as they are (quantized SDPA): nothing is dequantized per round, its drafts are still
    accepted as often as over plain K/V, and greedy output stays the 8-bit target's own."""

    q8 = str(demo_model("demo-target-q8"))  # a CPU opens the f32 demo variant by default
    prompt = open_chat(model=q8, drafter="none").tokenizer.encode("def read_config(path):\n    ")
    plain = open_chat(model=q8, drafter="mtp", draft_length=4)
    quantized = open_chat(model=q8, drafter="mtp", draft_length=4, kv_bits=8)
    baseline, _ = run(open_chat(model=q8, drafter="none", kv_bits=8), prompt, max_tokens=48)
    want, _ = run(plain, prompt, max_tokens=48)
    calls = []  # K/V are [B, heads, L, D]: 4-d (the 8-bit embedding dequantizes 3-d rows)
    real = mx.dequantize
    monkeypatch.setattr(mx, "dequantize",
                        lambda w, *a, **kw: calls.append(w.ndim == 4) or real(w, *a, **kw))
    got, _ = run(quantized, prompt, max_tokens=48)
    assert calls and not any(calls)
    assert_same_or_near_tie(quantized.target, prompt, list(got.tokens), list(baseline.tokens),
                            bits=8)
    assert got.stats.acceptance_rate >= 0.9 * want.stats.acceptance_rate > 0.3


def test_compiled_shared_kv_step_equals_the_head(load):
    """The compiled step (one traced graph, the cache's whole 256-entry buffer with the entries
    past its offset masked) gives the head's own h' on the stored entries alone: at a length in
    the first buffer step and one in the second (a new trace), and after the head's weights
    change (they are the compiled function's inputs, never baked in)."""
    target, _ = load("qwen3")
    drafter = make_drafter(target, "shared-kv")
    for length in (37, 300):
        cache = target.make_cache()
        target.forward(list(range(3, 3 + length)), cache, hidden=True)
        layer = cache[drafter.cfg.kv_layer]
        assert type(layer) is kv.KVCache and layer.keys.shape[2] > layer.offset
        keys, values = layer.keys_and_values()
        emb = drafter._embed([5])
        h = mx.random.normal((1, 1, target.hidden_size))
        for _ in range(2):
            want = drafter.head(emb, h, keys, values, drafter.rope, length)
            mask = (mx.arange(layer.keys.shape[2]) < layer.offset)[None, None, None]
            got = drafter.compiled()(emb, h, layer.keys, layer.values, mask, mx.array(length))
            assert mx.abs(got - want).max().item() < 1e-5
            drafter.head.update(tree_map(lambda w: w * 1.5, drafter.head.parameters()))
