"""Hybrid targets (Gated DeltaNet + attention: Qwen3.5 / 3.6 / 3.8, Qwen3-Next) and the MTP heads
published with them, from checkpoints written in the published layouts and loaded as a download
would be: plain decoding equals mlx-lm, speculation is lossless, every layer's state (KV, conv,
recurrent, the head's own KV) equals a recompute after every round, and a head constructed to
agree with its target is accepted (so a head that loaded wrong cannot pass as merely bad)."""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import numpy as np
import pytest
from helpers import (
    PROMPT,
    assert_cache_equals_recompute,
    assert_lossless_behind_lookup,
    assert_same_or_near_tie,
    assert_turn_matches_fresh,
    checked,
    conversation,
    open_chat,
    padded,
    run,
)
from mlx_lm.generate import generate_step
from published import CONFIGS, build_pair, write_checkpoint, write_sidecar
from test_engine_sampling import (
    CFG,
    assert_both_paths_taken,
    chi2_pvalue,
    redraws_counted,
    sample_pairs,
)
from test_engine_sampling import target_joint as exact_joint

from mlx_spec import cache as kv
from mlx_spec.cache import RecurrentCache
from mlx_spec.drafters import DraftModelDrafter, nextn
from mlx_spec.errors import ModelLoadError, UnsupportedModelError
from mlx_spec.loading import find_mtp_head, load_target, make_drafter
from mlx_spec.recurrent import rollback_strategy
from mlx_spec.sampling import SamplingConfig
from mlx_spec.train.modeldir import build_model, save_model_dir

HYBRID = ["qwen3_5", "qwen3_next"]
PUBLISHED = ["qwen3_5", "qwen3_next", "glm4_moe", "mimo"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tokenizer_dir):
    """{(arch, kind): dir}: the original checkpoint with its MTP module inside. kind: 'agree'
    (known answer), 'partial' (mostly agrees: rollbacks land mid-round), 'random'."""
    root = tmp_path_factory.mktemp("published")
    made = {}

    def get(arch, kind="partial"):
        if (arch, kind) not in made:
            model, head = build_pair(arch, agree=kind != "random",
                                     noise={"agree": 0.0, "partial": 0.15}.get(kind, 1.0))
            made[arch, kind] = write_checkpoint(root / f"{arch}-{kind}", arch, model, head,
                                                tokenizer_dir)
        return made[arch, kind]

    return get


@pytest.fixture(scope="module")
def loaded(checkpoints):
    memo = {}

    def get(arch, kind="partial"):
        if (arch, kind) not in memo:
            memo[arch, kind] = load_target(checkpoints(arch, kind))
        return memo[arch, kind]

    return get


@pytest.mark.parametrize("arch", HYBRID)
def test_plain_decoding_equals_mlx_lm(loaded, arch):
    target, tok = loaded(arch)
    engine = conversation(target, tok, None)
    end, _ = run(engine)
    ref = [int(t) for t, _ in generate_step(mx.array(PROMPT), target.model, max_tokens=40)]
    assert_same_or_near_tie(target, PROMPT, list(end.tokens), ref)
    assert any(isinstance(c, RecurrentCache) for c in engine.cache)
    assert_cache_equals_recompute(target, engine.cache, engine.tokens[:-1])


def test_top_p_redraw_rolls_back_the_recurrent_step_built_ahead(loaded, monkeypatch):
    """Plain decoding builds its next step on a token still lazy; when top-p's candidates fall
    short, that token is redrawn and the step — recurrent state included — rolled back."""
    redraws = redraws_counted(monkeypatch)
    target, tok = loaded(HYBRID[0])
    engine = conversation(target, tok, None)
    checked(engine)
    end, _ = run(engine, max_tokens=12,
                 sampling=SamplingConfig(temperature=1.0, top_p=0.9, seed=2))
    assert len(end.tokens) == 12 and len(redraws) >= 10
    assert_cache_equals_recompute(target, engine.cache, engine.tokens[:-1])


@pytest.mark.parametrize("arch", PUBLISHED)
@pytest.mark.parametrize("k", [1, 2, 4, 6])
def test_published_mtp_greedy_identity_and_state(loaded, checkpoints, arch, k):
    target, tok = loaded(arch)
    baseline, _ = run(conversation(target, tok, None))
    drafter = make_drafter("mtp", target, model_path=checkpoints(arch))
    assert drafter.cfg.kind == "nextn"
    engine = conversation(target, tok, drafter, draft_length=k)
    checked(engine)
    end, _ = run(engine)
    assert_same_or_near_tie(target, PROMPT, list(end.tokens), list(baseline.tokens))
    s = end.stats
    assert 0 < s.accepted < s.drafted  # both paths: kept drafts and rolled-back ones


@pytest.mark.parametrize("arch", HYBRID)
def test_padded_verify_passes_roll_back_every_recurrent_state(loaded, checkpoints, monkeypatch,
                                                               arch):
    """Every verify pass padded to 16 tokens (as where the device runs that size cheaper): the
    recurrent layers took the padding too, and the commit still rolls every state back to
    the accepted prefix; greedy output equals target-only's."""
    target, tok = loaded(arch)
    baseline, _ = run(conversation(target, tok, None))
    engine = conversation(target, tok, make_drafter("mtp", target, model_path=checkpoints(arch)),
                          draft_length=4)
    fed = padded(engine, monkeypatch)
    rounds = checked(engine)
    end, _ = run(engine)
    assert_same_or_near_tie(target, PROMPT, list(end.tokens), list(baseline.tokens))
    assert 0 < end.stats.accepted < end.stats.drafted
    assert 16 in fed and set(fed[-len(rounds):]) <= {16, 1}  # verifies padded (1: plain)


@pytest.mark.parametrize("k", [1, 2, 4, 6])
def test_hybrid_draft_model_for_hybrid_target(loaded, k):
    """A small Qwen3.5 drafting for a Qwen3.5 target: the drafter's recurrent state is rolled
    back across several of its own forward calls."""
    target, tok = loaded("qwen3_5")
    baseline, _ = run(conversation(target, tok, None))
    draft, _ = loaded("qwen3_5", "random")
    engine = conversation(target, tok, DraftModelDrafter(draft, target), draft_length=k)
    checked(engine)
    end, _ = run(engine)
    assert_same_or_near_tie(target, PROMPT, list(end.tokens), list(baseline.tokens))
    self_engine = conversation(target, tok, DraftModelDrafter(target, target), draft_length=k)
    checked(self_engine)
    again, _ = run(self_engine)
    assert list(again.tokens) == list(end.tokens)
    assert again.stats.acceptance_rate > 0.9


def test_multi_turn_prefix_reuse_and_history_rewrite(loaded, checkpoints):
    target, tok = loaded("qwen3_5")
    drafter = make_drafter("mtp", target, model_path=checkpoints("qwen3_5"))
    engine = conversation(target, tok, drafter, draft_length=4)
    checked(engine)
    first, _ = run(engine, max_tokens=12)
    turn2 = PROMPT + list(first.tokens) + [7, 8, 9]
    second = assert_turn_matches_fresh(engine, turn2, 12)
    assert second.stats.reused_tokens == len(PROMPT) + len(first.tokens) - 1
    # a rewritten history: recurrent state cannot go back past a commit, so it is recomputed
    third = assert_turn_matches_fresh(engine, PROMPT[:10] + [11, 12] + PROMPT[10:], 12)
    assert third.stats.reused_tokens == 0


@pytest.mark.slow
@pytest.mark.parametrize("arch", HYBRID)
def test_hybrid_mtp_samples_the_target_distribution(loaded, checkpoints, arch):
    target, tok = loaded(arch)
    drafter = make_drafter("mtp", target, model_path=checkpoints(arch))
    engine = conversation(target, tok, drafter, draft_length=2)
    tally = []
    prompt = PROMPT[:12]
    pairs = sample_pairs(engine, CFG, tally, prompt)
    assert_both_paths_taken(tally)
    pval = chi2_pvalue(pairs, exact_joint(target, SamplingConfig(**CFG), prompt))
    print(f"{arch} published MTP χ² p = {pval:.3f}")
    assert pval > 0.01


# -- known answer: a head built to agree with its target must be accepted -----------------------


@pytest.mark.parametrize("arch", [*PUBLISHED, "deepseek_v3"])  # DeepSeek: 61 tiny layers
def test_known_answer_head_is_accepted(checkpoints, arch):
    # drafter auto: its own head
    engine = open_chat(model=checkpoints(arch, "agree"), draft_length=4)
    assert engine.drafter is not None and engine.drafter.cfg.kind == "nextn"
    end, _ = run(engine)
    assert end.stats.acceptance_rate > 0.9


@pytest.mark.parametrize("mistake", ["norm offset missed", "concat halves swapped"])
def test_known_answer_catches_loader_mistakes(loaded, checkpoints, monkeypatch, mistake):
    """Negative control: the same head loaded with a typical mistake is (nearly) never accepted,
    so the known-answer test above has the power to see one."""
    target, tok = loaded("qwen3_5", "agree")
    if mistake == "norm offset missed":
        original = nextn.build_head
        monkeypatch.setattr(nextn, "build_head",
                            lambda *a, **kw: original(*a, **{**kw, "shift_norms": False}))
    else:
        lay = nextn.layout_for(target)
        swapped = nextn.Layout(**{**lay.__dict__, "hidden_first": True})
        monkeypatch.setattr(nextn, "layout_for", lambda t: swapped)
    drafter = make_drafter("mtp", target, model_path=checkpoints("qwen3_5", "agree"))
    end, _ = run(conversation(target, tok, drafter, draft_length=4))
    assert end.stats.acceptance_rate < 0.3


# -- parity with the published equations --------------------------------------------------------


def _rms(x, w, eps, zero_centred=True):
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return y * ((1.0 + w) if zero_centred else w)


def reference_qwen35_mtp_logits(weights, text, emb_tokens, hidden):
    """Qwen3.5's MTP module written from its equations in numpy, on the HF tensors as stored
    (zero-centred norms, fc over concat(embedding, hidden), gated attention with q/k norms and
    partial RoPE, SwiGLU), followed by the target's LM head. Entry i sits at position i."""
    W = {k: np.array(v.astype(mx.float32)) for k, v in weights.items()}
    eps, H, Hkv, hd = (text["rms_norm_eps"], text["num_attention_heads"],
                       text["num_key_value_heads"], text["head_dim"])
    rope = text["rope_parameters"]
    rd = int(hd * rope["partial_rotary_factor"])
    e = W["model.language_model.embed_tokens.weight"][emb_tokens]
    x = np.concatenate([_rms(e, W["mtp.pre_fc_norm_embedding.weight"], eps),
                        _rms(hidden, W["mtp.pre_fc_norm_hidden.weight"], eps)], -1)
    x = x @ W["mtp.fc.weight"].T
    p = "mtp.layers.0."
    a = _rms(x, W[p + "input_layernorm.weight"], eps)
    L = a.shape[0]
    qg = (a @ W[p + "self_attn.q_proj.weight"].T).reshape(L, H, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:].reshape(L, H * hd)
    k = (a @ W[p + "self_attn.k_proj.weight"].T).reshape(L, Hkv, hd)
    v = (a @ W[p + "self_attn.v_proj.weight"].T).reshape(L, Hkv, hd)
    q, k = _rms(q, W[p + "self_attn.q_norm.weight"], eps), _rms(k, W[p + "self_attn.k_norm.weight"],
                                                                   eps)
    inv = 1.0 / rope["rope_theta"] ** (np.arange(0, rd, 2) / rd)
    ang = np.arange(L)[:, None] * inv[None]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rot(t):  # rotate-half RoPE on the first rd dims only
        r, rest = t[..., :rd], t[..., rd:]
        half = np.concatenate([-r[..., rd // 2 :], r[..., : rd // 2]], -1)
        return np.concatenate([r * cos[:, None] + half * sin[:, None], rest], -1)

    q, k = rot(q), rot(k)
    k, v = np.repeat(k, H // Hkv, 1), np.repeat(v, H // Hkv, 1)
    s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd)
    s = s + np.triu(np.full((L, L), -np.inf), 1)
    s = np.exp(s - s.max(-1, keepdims=True))
    o = np.einsum("hqk,khd->qhd", s / s.sum(-1, keepdims=True), v).reshape(L, H * hd)
    x = x + (o * (1 / (1 + np.exp(-gate)))) @ W[p + "self_attn.o_proj.weight"].T
    m = _rms(x, W[p + "post_attention_layernorm.weight"], eps)
    g, u = m @ W[p + "mlp.gate_proj.weight"].T, m @ W[p + "mlp.up_proj.weight"].T
    x = x + (g / (1 + np.exp(-g)) * u) @ W[p + "mlp.down_proj.weight"].T
    return _rms(x, W["mtp.norm.weight"], eps) @ W["lm_head.weight"].T


def test_qwen35_head_matches_reference_implementation(loaded, checkpoints):
    target, _ = loaded("qwen3_5", "random")
    path = checkpoints("qwen3_5", "random")
    d = make_drafter("mtp", target, model_path=path)
    tokens = PROMPT[:9]
    _, h = target.forward(tokens[:-1], kv.make_cache(target.model), hidden=True)
    cache = kv.KVCache()
    out = d.head(d._embed(tokens[1:], 0), h[None], cache, "causal")
    ours = np.array(target.head(out)[0])
    weights = mx.load(str(path / "model.safetensors"))
    ref = reference_qwen35_mtp_logits(weights, CONFIGS["qwen3_5"]["text_config"],
                                      tokens[1:], np.array(h))
    np.testing.assert_allclose(ours, ref, atol=2e-4, rtol=1e-3)


# -- MLX conversions and sidecar heads ---------------------------------------------------------


@pytest.fixture(scope="module")
def mlx_conversion(tmp_path_factory, loaded, tokenizer_dir):
    """The trunk as an MLX conversion writes it: MLX names, no MTP tensors, but the config
    still says `mtp_num_hidden_layers: 1`."""
    root = tmp_path_factory.mktemp("mlx")
    target, _ = loaded("qwen3_5", "agree")
    out = root / "Qwen3.5-tiny-bf16"
    save_model_dir(out, target.model, CONFIGS["qwen3_5"], tokenizer_dir=tokenizer_dir)
    return out


@pytest.mark.parametrize(("bits", "where"), [(None, "beside"), ("bf16", "beside"), (4, "beside"),
                                             (8, "inside")])
def test_sidecar_head_beside_an_mlx_conversion(mlx_conversion, checkpoints, tmp_path, bits,
                                               where):
    model_dir = tmp_path / mlx_conversion.name
    shutil.copytree(mlx_conversion, model_dir)
    target, _ = load_target(model_dir)
    assert find_mtp_head(model_dir, target) is None
    with pytest.raises(ModelLoadError, match="declares an MTP layer"):
        make_drafter("mtp", target, model_path=model_dir)
    reference = make_drafter("mtp", target, mtp=checkpoints("qwen3_5", "agree"))  # --mtp DIR
    side_dir = tmp_path / f"{model_dir.name}-mtp" if where == "beside" else model_dir / "mtp"
    side = write_sidecar(side_dir, "qwen3_5", reference.head,
                         bits=bits if isinstance(bits, int) else None,
                         dtype=mx.bfloat16 if bits == "bf16" else None)
    assert find_mtp_head(model_dir, target) == side
    engine = open_chat(model=model_dir, draft_length=4)  # auto finds the sidecar
    assert engine.drafter.cfg.kind == "nextn"
    end, _ = run(engine)
    assert end.stats.acceptance_rate > 0.9  # known answer, through the sidecar (and 4-bit)
    checked(engine)
    run(engine, max_tokens=12)


def test_bad_heads_are_refused_by_name(checkpoints, loaded, tmp_path):
    target, _ = loaded("qwen3_5", "random")
    src = checkpoints("qwen3_5", "random")
    weights = dict(mx.load(str(src / "model.safetensors")))

    def variant(name, edit):
        d = tmp_path / name
        shutil.copytree(src, d)
        w = dict(weights)
        edit(w)
        mx.save_safetensors(str(d / "model.safetensors"), w)
        return d

    missing = variant("missing", lambda w: w.pop("mtp.fc.weight"))
    with pytest.raises(ModelLoadError, match=r"missing: mtp\.fc\.weight"):
        make_drafter("mtp", target, model_path=missing)
    misnamed = variant("misnamed", lambda w: w.update({"mtp.fcx.weight": w.pop("mtp.fc.weight")}))
    with pytest.raises(ModelLoadError, match=r"unexpected MTP tensor mtp\.fcx\.weight"):
        make_drafter("mtp", target, model_path=misnamed)
    wrong = variant("wrong-shape", lambda w: w.update(
        {"mtp.fc.weight": mx.zeros((64, 96))}))
    with pytest.raises(ModelLoadError, match=r"mtp\.fc\.weight has shape \(64, 96\)"):
        make_drafter("mtp", target, model_path=wrong)
    # a sidecar made for a wider model
    side = tmp_path / "wide-mtp"
    wide = json.loads(json.dumps(CONFIGS["qwen3_5"]))
    wide["text_config"]["hidden_size"] = 96
    side.mkdir()
    (side / "config.json").write_text(json.dumps({"model_type": "qwen3_5_mtp",
                                                  "text_config": wide["text_config"]}))
    mx.save_safetensors(str(side / "model.safetensors"), {"fc.weight": mx.zeros((96, 192))})
    with pytest.raises(ModelLoadError, match="hidden size is 96"):
        make_drafter("mtp", target, mtp=side)


def test_unknown_hub_head_is_one_line(loaded, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # no network in tests
    target, _ = loaded("qwen3_5", "random")
    with pytest.raises(ModelLoadError, match="cannot fetch nobody/none-MTP-4bit") as e:
        make_drafter("mtp", target, mtp="nobody/none-MTP-4bit")
    assert "\n" not in str(e.value)


def test_recurrent_models_without_rollback_decode_but_do_not_speculate(tmp_path, tokenizer_dir):
    """Any recurrent mlx-lm model decodes through the same loop; speculation on a layer kind
    that does not record its updates is refused in one line."""
    config = dict(model_type="mamba", vocab_size=384, hidden_size=64, intermediate_size=128,
                  state_size=8, num_hidden_layers=2, conv_kernel=4, use_bias=False,
                  use_conv_bias=True, time_step_rank=8, tie_word_embeddings=True)
    save_model_dir(tmp_path / "mamba", build_model(config), config, tokenizer_dir=tokenizer_dir)
    target, tok = load_target(tmp_path / "mamba")
    end, _ = run(conversation(target, tok, None))
    ref = [int(t) for t, _ in generate_step(mx.array(PROMPT), target.model, max_tokens=40)]
    assert_same_or_near_tie(target, PROMPT, list(end.tokens), ref)
    with pytest.raises(UnsupportedModelError, match="cannot be rolled back"):
        conversation(target, tok, DraftModelDrafter(target, target))


@pytest.mark.parametrize("strategy", ["replay", "capture"])
@pytest.mark.parametrize("arch", HYBRID)
def test_trimming_a_recurrent_update_equals_recompute(loaded, arch, strategy):
    """Both rollback strategies (the engine uses replay; the bench measures capture too)."""
    target, _ = loaded(arch, "random")
    seq = [(i * 37) % 300 + 3 for i in range(40)]
    pos = 0
    with rollback_strategy(strategy):
        cache = kv.make_cache(target.model)
        for step in [9, 5, 1, 7, 3]:
            junk = [(t * 11) % 300 + 3 for t in range(step)]
            target.forward(seq[pos : pos + step] + junk, cache)
            assert kv.can_trim_to(cache, pos + step, have=pos + 2 * step)
            kv.trim_to(cache, pos + step, have=pos + 2 * step)
            pos += step
            assert_cache_equals_recompute(target, cache, seq[:pos])
            # a second update in the same round (a drafter's next step), then back past both
            target.forward([17, 18], cache)
            target.forward([19, 20, 21], cache)
            kv.trim_to(cache, pos, have=pos + 5)
            assert_cache_equals_recompute(target, cache, seq[:pos])
    assert not kv.can_trim_to(cache, pos - 1, have=pos)  # sealed: a commit is final



@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_next"])
def test_behind_prompt_lookup_the_published_head_and_the_recurrent_state_hold(loaded, checkpoints,
                                                                             arch):
    """--lookup (the CLI's default) around a hybrid's own MTP head, built as the CLI builds it:
    copied rounds roll the Gated DeltaNet state back like any other; the head catches up."""
    target, tok = loaded(arch)
    drafter = make_drafter("mtp", target, model_path=checkpoints(arch), lookup=True)
    assert drafter.name.endswith("+lookup") and drafter.inner.cfg.kind == "nextn"
    assert_lossless_behind_lookup(target, tok, drafter, 4)
