"""Gemma 4 targets (sliding, full and KV-shared layers) and their assistant drafters, from tiny
random checkpoints in the published names: parity with the reference equations, a known-answer
pair, greedy identity with rollback past the sliding window, χ² at T = 1 with top-p."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from gemma4 import (
    VOCAB,
    assistant_config,
    build_assistant,
    build_target,
    write_assistant,
    write_target,
)
from helpers import (
    assert_cache_equals_recompute,
    assert_same_or_near_tie,
    checked,
    conversation,
    loaded_pairs,
    open_chat,
    run,
)
from mlx.utils import tree_flatten
from reference import gemma4_assistant as ref
from test_engine_sampling import assert_both_paths_taken, chi2_pvalue, sample_pairs, target_joint

from mlx_spec import cache as kv
from mlx_spec.drafters import DraftContext, DraftModelDrafter
from mlx_spec.drafters.assistant import load_assistant
from mlx_spec.errors import ModelLoadError
from mlx_spec.sampling import Sampler, SamplingConfig

PROMPT = [(i * 29) % 300 + 5 for i in range(20)]


@pytest.fixture(scope="module")
def pair_dir(tmp_path_factory, tokenizer_dir):
    """(kind, seed) -> (target dir, assistant dir); kinds: random, random-clustered, agree,
    agree-clustered (every cluster chosen: the clustered head then equals the dense one),
    partial (the known-answer pair with some of the target's layers left on), soft (partial,
    with softer distributions: for T = 1)."""
    root, made = tmp_path_factory.mktemp("gemma4"), {}

    def get(kind: str):
        if kind not in made:
            agree = kind.startswith(("agree", "partial", "soft"))
            noise = {"partial": 0.6, "soft": 0.3}.get(kind, 0.0)
            model = build_target(agree=agree, noise=noise,
                                 sharpness=0.5 if kind == "soft" else 1.0)
            config = assistant_config(hidden=64 if agree else 32,
                                      ordered=kind.endswith("clustered"),
                                      top_k=16 if agree else 4)
            module = build_assistant(config, target=model if agree else None)
            made[kind] = (write_target(root / f"{kind}-target", model, tokenizer_dir),
                          write_assistant(root / f"{kind}-assistant", module, config, 3))
        return made[kind]

    return get


@pytest.fixture(scope="module")
def pair(pair_dir):
    return loaded_pairs(pair_dir)


# -- the assistant's forward against the reference equations --------------------------------


@pytest.mark.parametrize("kind", ["random", "random-clustered"])
def test_assistant_drafts_match_the_reference(pair, pair_dir, kind):
    """Three chained draft steps through the drafter's own path (commit, then draft at T = 1):
    each q equals the softmax of the reference's logits, whose input embedding is the target's
    times √d; a drafter without that scale would not match (the embed-scale pitfall)."""
    target, _, drafter = pair(kind)
    config = json.loads((pair_dir(kind)[1] / "config.json").read_text())
    weights = {k: np.array(v, np.int64 if v.dtype == mx.int32 else np.float64)
               for k, v in tree_flatten(drafter.module.parameters())}
    tokens = PROMPT + [(i * 13) % 300 + 7 for i in range(30)]  # past the window (16)
    cache = kv.make_cache(target.model)
    _, h = target.forward(tokens[:-1], cache, hidden=True)
    state = drafter.new_state()
    drafter.commit(state, DraftContext(target, tokens, cache, h, 0), 0)
    draft = drafter.draft(state, DraftContext(target, tokens, cache), 3,
                          Sampler(SamplingConfig(temperature=1.0, seed=3)))
    kvs, position = _committed_kv(target, cache), len(tokens) - 1
    table = np.array(target.embed(mx.arange(VOCAB)), np.float64)

    def reference_q(scale):
        token, hid, out = tokens[-1], np.array(h[-1], np.float64), []
        for drafted in draft.tokens:
            logits, hid = ref.forward(weights, config, np.concatenate([table[token] * scale, hid]),
                                      kvs, position)
            e = np.exp(logits - logits.max())
            out.append(e / e.sum())
            token = drafted
        return np.stack(out)

    got = np.array(draft.probs)
    np.testing.assert_allclose(got, reference_q(np.sqrt(target.hidden_size)), atol=1e-5)
    assert np.abs(got - reference_q(1.0)).max() > 1e-3  # the test can see a missing scale


def _committed_kv(target, cache):
    """Every committed position's K/V of the last cache of each attention type, [Hkv, L, D]."""
    out = {}
    for i, kind in enumerate(target.args.layer_types[: len(cache)]):
        k, v = cache[i].keys_and_values() if hasattr(cache[i], "keys_and_values") else \
            cache[i].state[:2]
        out[kind] = (np.array(k[0], np.float64), np.array(v[0], np.float64))
    return out


# -- known answer: an assistant built to agree with its target ---------------------------------


@pytest.mark.parametrize("kind", ["agree", "agree-clustered"])
def test_known_answer_assistant_is_always_accepted(pair, kind):
    target, tok, drafter = pair(kind)
    for k in (1, 4):
        end, _ = run(conversation(target, tok, drafter, draft_length=k), max_tokens=40)
        assert end.stats.accepted == end.stats.drafted > 0, (k, end.stats)


# -- the loop: identity, rollback past the window, KV-shared layers ---------------------------


@pytest.mark.parametrize("kind", ["random", "random-clustered", "partial"])
def test_greedy_identity_and_caches_equal_a_recompute(pair, kind):
    target, tok, drafter = pair(kind)
    want, _ = run(conversation(target, tok, None), max_tokens=48)
    for k in (1, 2, 4):
        engine = conversation(target, tok, drafter, draft_length=k)
        rounds = checked(engine)  # target caches (sliding, full) == recompute every round
        got, _ = run(engine, max_tokens=48)
        assert_same_or_near_tie(target, PROMPT, list(got.tokens), list(want.tokens))
        assert len(rounds) > 1
        state = engine.drafter_state
        assert state.at == len(engine.tokens) - 2  # its one row: the newest committed h
        _, h = target.forward(engine.tokens[:-1], kv.make_cache(target.model), hidden=True)
        np.testing.assert_allclose(np.array(state.h[0, 0]), np.array(h[-1]), atol=2e-4)


@pytest.mark.parametrize("kind", ["random", "partial"])
def test_a_seeded_sampled_answer_is_the_target_only_one(pair, kind):
    """Drafter-invariant sampling (coupling.py): seeded at T = 1, the assistant's answer is
    target-only decoding's for that seed, token for token; caches a recompute every round."""
    target, tok, drafter = pair(kind)
    for seed in range(3):
        cfg = SamplingConfig(temperature=1.0, top_k=20, seed=seed)
        want, _ = run(conversation(target, tok, None), max_tokens=24, sampling=cfg)
        for k in (1, 4):
            engine = conversation(target, tok, drafter, draft_length=k)
            checked(engine)
            got, _ = run(engine, max_tokens=24, sampling=cfg)
            assert got.tokens == want.tokens and got.stats.drafted > 0, (seed, k)


def test_multi_turn_and_long_past_the_window_drop(pair):
    """300 tokens: the sliding caches drop their oldest entries (in steps of 256) while
    rounds roll back; a second turn reuses the prefix. Both equal target-only decoding."""
    target, tok, drafter = pair("partial")
    engine = conversation(target, tok, drafter, draft_length=4)
    got, _ = run(engine, max_tokens=300)
    want, _ = run(conversation(target, tok, None), max_tokens=300)
    assert_same_or_near_tie(target, PROMPT, list(got.tokens), list(want.tokens))
    assert any(getattr(c, "start", 0) > 0 for c in engine.cache), "no entry was ever dropped"
    assert_cache_equals_recompute(target, engine.cache, engine.tokens[:-1])
    second = engine.tokens + [7, 8, 9]
    got2, _ = run(engine, prompt=second, max_tokens=24)
    want2, _ = run(conversation(target, tok, None), prompt=second, max_tokens=24)
    assert_same_or_near_tie(target, second, list(got2.tokens), list(want2.tokens))
    assert got2.stats.accepted > 0


def test_a_draft_model_on_a_gemma4_target(pair, pair_dir):
    """The KV-shared target also verifies a plain draft model (itself here: always accepted)."""
    target, tok, _ = pair("random")
    engine = conversation(target, tok, DraftModelDrafter(target, target), draft_length=3)
    checked(engine)
    got, _ = run(engine, max_tokens=30)
    assert got.stats.accepted == got.stats.drafted


# -- T = 1 with top-p: exactly the target's distribution ---------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["soft"])
def test_assistant_speculation_samples_the_target_distribution(pair, kind):
    target, tok, drafter = pair(kind)
    cfg = dict(temperature=1.0, top_p=0.9)
    engine = conversation(target, tok, drafter, draft_length=2)
    tally = []
    pairs = sample_pairs(engine, cfg, tally, prompt=PROMPT[:12])
    assert_both_paths_taken(tally)
    pval = chi2_pvalue(pairs, target_joint(target, SamplingConfig(**cfg), prompt=PROMPT[:12]))
    print(f"gemma4 assistant χ² p = {pval:.3f}")
    assert pval > 0.01


# -- bad input: one clear line ------------------------------------------------------------------


def test_assistant_on_a_non_gemma_target_is_one_line(load, pair_dir):
    target, _ = load("llama")
    with pytest.raises(ModelLoadError, match="only for Gemma 4 targets"):
        load_assistant(pair_dir("random")[1], target)


def test_wrong_backbone_size_is_one_line(tmp_path, pair):
    target, _, _ = pair("random")
    config = dict(assistant_config(), backbone_hidden_size=32)
    module = build_assistant(config)
    path = write_assistant(tmp_path / "a", module, config)
    with pytest.raises(ModelLoadError, match="32-wide Gemma 4.*64 wide"):
        load_assistant(path, target)


def test_missing_tensor_is_one_line(tmp_path, pair, pair_dir):
    target, _, _ = pair("random")
    src = pair_dir("random")[1]
    weights = mx.load(str(src / "model.safetensors"))
    weights.pop("post_projection.weight")
    out = tmp_path / "broken"
    out.mkdir()
    (out / "config.json").write_text((src / "config.json").read_text())
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    with pytest.raises(ModelLoadError, match="lacks 1 tensor") as e:
        load_assistant(out, target)
    assert "\n" not in str(e.value) and "post_projection" in str(e.value)



def test_draft_model_dir_is_recognised_and_sets_the_draft_length(pair_dir, capsys):
    """--draft-model DIR finds the assistant from its config; its generation_config's
    num_assistant_tokens is the default length, -k overrides it, auto still works."""
    from mlx_spec.cli import main

    target_dir, assistant_dir = pair_dir("agree")
    engine = open_chat(model=target_dir, draft_model=assistant_dir)
    assert engine.drafter.name == "draft-assistant"
    assert (engine.draft_length, engine.adaptive) == (3, False)
    assert open_chat(model=target_dir, draft_model=assistant_dir, draft_length="auto").adaptive
    assert open_chat(model=target_dir, draft_model=assistant_dir, draft_length=5).draft_length == 5
    assert main(["generate", "--model", str(target_dir), "--draft-model", str(assistant_dir),
                 "--prompt", "def", "--max-tokens", "8"]) == 0
    assert "assistant" in capsys.readouterr().err


def test_quantized_kv_cache_is_refused_in_one_line(pair):
    """mlx-lm's Gemma 4 KV-shared layers attend over the donor's K/V with plain SDPA, which
    cannot read quantized K/V: --kv-bits is refused up front, not a traceback mid-prefill."""
    from mlx_spec.errors import UnsupportedModelError

    target, tok, drafter = pair("agree")
    with pytest.raises(UnsupportedModelError, match="kv-bits"):
        conversation(target, tok, drafter, draft_length=4, kv_bits=8)


def test_configs_with_per_layer_head_sizes_load(tmp_path, pair_dir):
    """transformers 5.23+ writes the full-attention head size (and KV heads) only inside
    `per_layer_config`, no top-level `global_head_dim`: target and assistant still load (the
    error was 'Expected shape (…) but received (…) for …q_proj'), and the known-answer pair
    is still always accepted."""
    import shutil

    from mlx_spec.loading import load_target, make_drafter

    def per_layer(text: dict) -> dict:
        out = {k: v for k, v in text.items() if k != "global_head_dim"}
        out["per_layer_config"] = {str(i): {"head_dim": text["global_head_dim"]}
                                   for i, t in enumerate(text["layer_types"])
                                   if t == "full_attention"}
        return out

    dirs = []
    for src in pair_dir("agree"):
        out = tmp_path / src.name
        shutil.copytree(src, out)
        raw = json.loads((out / "config.json").read_text())
        raw["text_config"] = per_layer(raw["text_config"])
        (out / "config.json").write_text(json.dumps(raw))
        dirs.append(out)
    target, tok = load_target(dirs[0])
    drafter = make_drafter("draft", target, draft_model=dirs[1])
    end, _ = run(conversation(target, tok, drafter, draft_length=3), max_tokens=24)
    assert end.stats.drafted > 0 and end.stats.accepted == end.stats.drafted


@pytest.mark.parametrize("kind", ["agree", "random"])
def test_behind_prompt_lookup_the_assistant_stays_lossless(pair, kind):
    """--lookup (the CLI's default) around the assistant: copied rounds skip it, and its next
    draft starts from where the target is."""
    from helpers import assert_lossless_behind_lookup

    target, tok, drafter = pair(kind)
    for k in (2, 4):
        assert_lossless_behind_lookup(target, tok, drafter, k, max_tokens=48)
