"""EAGLE-3 heads (speculators format and the original naming) on a llama target, from tiny
random checkpoints: the taps are the layer inputs the format means, parity with the reference
equations, a known-answer head, greedy identity with the head's cache equal to a recompute,
χ² at T = 1 with top-p, one-line errors."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from eagle3 import (
    LAYERS,
    TAPS,
    VOCAB,
    bigram,
    build_head,
    build_target,
    draft_vocabulary,
    head_config,
    write_head,
    write_target,
)
from helpers import (
    assert_same_or_near_tie,
    checked,
    conversation,
    loaded_pairs,
    open_chat,
    padded,
    run,
)
from mlx.utils import tree_flatten
from reference import eagle3 as ref
from test_engine_sampling import assert_both_paths_taken, chi2_pvalue, sample_pairs, target_joint

from mlx_spec import cache as kv
from mlx_spec.drafters import DraftContext
from mlx_spec.drafters.eagle3 import load_eagle3
from mlx_spec.errors import ModelLoadError
from mlx_spec.sampling import Sampler, SamplingConfig

PROMPT = [int(x) for x in draft_vocabulary()[:20]]


def orbit(start: int, n: int) -> list[int]:
    """A prompt the known-answer target would have written itself: x, nu(x), nu(nu(x)), ..."""
    nu, out = bigram(), [start]
    while len(out) < n:
        out.append(int(nu[out[-1]]))
    return out


@pytest.fixture(scope="module")
def pair_dir(tmp_path_factory, tokenizer_dir):
    """kind -> (target dir, head dir). random, random-nbr (norm_before_residual), original
    (yuhuili naming and config), random-flags / agree-flags (speculators 0.9's training
    flags: fc_norm, norm_output, a sliding-window layer, two layers), agree, agree-original,
    soft (agree with softened norms)."""
    root, made = tmp_path_factory.mktemp("eagle3"), {}

    def get(kind: str):
        if kind not in made:
            agree = kind.startswith(("agree", "soft"))
            original = kind.endswith("original")
            model = build_target(agree=agree)
            config = head_config(original=original, norm_before_residual=kind == "random-nbr",
                                 flagged=kind.endswith("flags"))
            head = build_head(config, target=model if agree else None)
            if kind == "soft":
                for norm in (model.model.norm, head.norm):
                    norm.weight = norm.weight * 0.4
            made[kind] = (write_target(root / f"{kind}-target", model, tokenizer_dir),
                          write_head(root / f"{kind}-head", head, config, original=original))
        return made[kind]

    return get


@pytest.fixture(scope="module")
def pair(pair_dir):
    return loaded_pairs(pair_dir)


def test_taps_are_the_inputs_of_those_layers(pair):
    """Tap i is HF's hidden_states[i]: running layers i.. on it reproduces the logits."""
    target, _, _ = pair("random")
    x = mx.array([PROMPT])
    want = target.model(x)
    _, taps = target.forward(PROMPT, kv.make_cache(target.model), hidden=tuple(TAPS))
    from mlx_lm.models.base import create_attention_mask

    for n, i in enumerate(TAPS):
        h = taps[None, :, n * 64 : (n + 1) * 64]
        mask = create_attention_mask(h, None)
        for layer in target.backbone.layers[i:]:
            h = layer(h, mask, cache=None)
        got = target.head(target.backbone.norm(h))
        np.testing.assert_allclose(np.array(got), np.array(want), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["random", "random-nbr", "original", "random-flags"])
def test_drafts_match_the_reference(pair, pair_dir, kind):
    """Three chained steps through the drafter (catch-up over the prompt, then the state fed
    back) at T = 1: each q is the reference's distribution, recomputed from scratch each step
    (the flagged head: a 20-token prompt past its 4-entry window)."""
    target, _, drafter = pair(kind)
    config = json.loads((pair_dir(kind)[1] / "config.json").read_text())
    w = {k: np.array(v, np.int64 if v.dtype == mx.int32 else np.float64)
         for k, v in tree_flatten(drafter.head.parameters())}
    tokens = PROMPT
    cache = kv.make_cache(target.model)
    _, taps = target.forward(tokens[:-1], cache, hidden=drafter.needs_hidden)
    state = drafter.new_state()
    drafter.commit(state, DraftContext(target, tokens, cache, taps, 0), 0)
    draft = drafter.draft(state, DraftContext(target, tokens, cache), 3,
                          Sampler(SamplingConfig(temperature=1.0, seed=5)))
    table = np.array(target.embed(mx.arange(VOCAB)), np.float64)
    emb = list(table[tokens[1:]])  # entry i pairs token i + 1 with the taps at i
    g = list(ref.fuse(w, np.array(taps, np.float64), config))
    true = len(g)
    for i, drafted in enumerate(draft.tokens):
        h = ref.forward(w, config, np.stack(emb), np.stack(g), true)[-1]
        logits = ref.target_logits(w, config, h, VOCAB)
        q = np.exp(logits - logits.max())
        np.testing.assert_allclose(np.array(draft.probs[i]), q / q.sum(), atol=1e-5)
        emb.append(table[drafted])
        g.append(h)  # the state fed back is the next step's hidden (no fc)
    assert all(int(t) in set(draft_vocabulary().tolist()) for t in draft.tokens)


@pytest.mark.parametrize("kind", ["agree", "agree-original", "agree-flags"])
def test_known_answer_head_drafts_the_next_token(pair, kind):
    """Its first draft is x_{t+2} exactly (deeper ones are not: it was built for one step)."""
    target, tok, drafter = pair(kind)
    for k in (1, 3):
        end, _ = run(conversation(target, tok, drafter, draft_length=k),
                     prompt=orbit(PROMPT[0], 20), max_tokens=40)
        assert end.stats.drafted > 10
        if k == 1:
            assert end.stats.accepted == end.stats.drafted, end.stats
        else:  # every round's first draft accepted: at least two tokens per target pass
            assert end.stats.tokens_per_pass >= 2 - 1 / end.stats.target_passes, end.stats


@pytest.mark.parametrize("kind", ["random", "agree"])
def test_a_seeded_sampled_answer_is_the_target_only_one(pair, kind):
    """Drafter-invariant sampling (coupling.py): seeded at T = 1, the EAGLE-3 head's answer is
    target-only decoding's for that seed, token for token, at every k; caches a recompute."""
    target, tok, drafter = pair(kind)
    prompt = orbit(PROMPT[0], 20) if kind == "agree" else PROMPT
    for seed in range(3):
        cfg = SamplingConfig(temperature=1.0, top_p=0.95, seed=seed)
        want, _ = run(conversation(target, tok, None), prompt=prompt, max_tokens=24,
                      sampling=cfg)
        for k in (1, 4):
            engine = conversation(target, tok, drafter, draft_length=k)
            checked(engine)
            got, _ = run(engine, prompt=prompt, max_tokens=24, sampling=cfg)
            assert got.tokens == want.tokens and got.stats.drafted > 0, (seed, k)


@pytest.mark.parametrize("kind", ["random", "agree", "random-flags"])
def test_greedy_identity_and_head_cache_equals_recompute(pair, kind):
    target, tok, drafter = pair(kind)
    prompt = orbit(PROMPT[0], 20) if kind == "agree" else PROMPT
    want, _ = run(conversation(target, tok, None), prompt=prompt, max_tokens=40)
    for k in (1, 2, 4):
        engine = conversation(target, tok, drafter, draft_length=k)
        checked(engine)  # target caches, the taps history, the head's own KV: a recompute
        got, _ = run(engine, prompt=prompt, max_tokens=40)
        assert_same_or_near_tie(target, prompt, list(got.tokens), list(want.tokens))
        second = engine.tokens + PROMPT[:3]
        got2, _ = run(engine, prompt=second, max_tokens=16)
        want2, _ = run(conversation(target, tok, None), prompt=second, max_tokens=16)
        assert_same_or_near_tie(target, second, list(got2.tokens), list(want2.tokens))


@pytest.mark.parametrize("kind", ["random", "agree"])
def test_padded_passes_keep_greedy_identity_and_the_head_cache(pair, monkeypatch, kind):
    """Every verify pass padded to 16 tokens: the taps the head reads are the real rows', so
    it drafts (and gets right) what it does unpadded."""
    target, tok, drafter = pair(kind)
    prompt = orbit(PROMPT[0], 20) if kind == "agree" else PROMPT
    want, _ = run(conversation(target, tok, None), prompt=prompt, max_tokens=40)
    alone, _ = run(conversation(target, tok, drafter, draft_length=4), prompt=prompt,
                   max_tokens=40)
    engine = conversation(target, tok, drafter, draft_length=4)
    fed = padded(engine, monkeypatch)
    checked(engine)
    got, _ = run(engine, prompt=prompt, max_tokens=40)
    assert_same_or_near_tie(target, prompt, list(got.tokens), list(want.tokens))
    assert 16 in fed and got.stats.accepted == alone.stats.accepted
    assert kind != "agree" or got.stats.accepted > 0


@pytest.mark.slow
def test_eagle3_speculation_samples_the_target_distribution(pair):
    target, tok, drafter = pair("soft")
    cfg = dict(temperature=1.0, top_p=0.9)
    prompt = orbit(PROMPT[0], 12)
    engine = conversation(target, tok, drafter, draft_length=2)
    tally = []
    pairs = sample_pairs(engine, cfg, tally, prompt=prompt)
    assert_both_paths_taken(tally)
    pval = chi2_pvalue(pairs, target_joint(target, SamplingConfig(**cfg), prompt=prompt))
    print(f"eagle3 χ² p = {pval:.3f}")
    assert pval > 0.01


def test_draft_model_dir_is_recognised_and_sets_the_draft_length(pair_dir):
    target_dir, head_dir = pair_dir("random")
    engine = open_chat(model=target_dir, draft_model=head_dir)
    assert engine.drafter.name == "draft-eagle3"
    assert (engine.draft_length, engine.adaptive) == (3, False)  # speculative_tokens
    assert open_chat(model=target_dir, draft_model=head_dir, draft_length="auto").adaptive


def test_wrong_width_missing_tensor_and_bad_taps_are_one_line(tmp_path, pair, pair_dir):
    target, _, _ = pair("random")
    src = pair_dir("random")[1]
    config = json.loads((src / "config.json").read_text())
    weights = mx.load(str(src / "model.safetensors"))

    def write(name, cfg, w):
        out = tmp_path / name
        out.mkdir()
        (out / "config.json").write_text(json.dumps(cfg))
        mx.save_safetensors(str(out / "model.safetensors"), w)
        return out

    cases = {
        "wide": (dict(config, target_hidden_size=128), weights, "128-wide target"),
        "holes": (config, {k: v for k, v in weights.items() if k != "fc.weight"},
                  "lacks 1 tensor"),
        "taps": (dict(config, eagle_aux_hidden_state_layer_ids=[2, 4, LAYERS + 3]), weights,
                 "taps layers"),
        # a head trained with fc_norm whose config lost the flag: every tensor named
        "extra": (config, {**weights, **{f"fc_norm.{i}.weight": mx.ones(64) for i in range(3)}},
                  "3 tensor.s. this layout does not use .*: fc_norm.0.weight, fc_norm.1.weight, "
                  "fc_norm.2.weight"),
        "flag": (dict(config, norm_after_everything=True), weights,
                 "not supported: norm_after_everything"),
        "both": (dict(config, norm_before_fc=True, fc_norm=True), weights, "one or the other"),
        "act": (dict(config, transformer_layer_config=dict(config["transformer_layer_config"],
                                                           hidden_act="gelu")), weights,
                "hidden_act 'gelu'"),
    }
    for name, (cfg, w, message) in cases.items():
        with pytest.raises(ModelLoadError, match=message) as e:
            load_eagle3(write(name, cfg, w), target)
        assert "\n" not in str(e.value)


def test_specforge_ids_are_layer_outputs():
    """SpecForge's `eagle_config` ids are layer outputs (read as the next layer's input);
    speculators' top-level ids are layer inputs; none: [2, L/2, L-3] either way."""
    from mlx_spec.drafters.eagle3 import Eagle3Config

    flat = dict(head_config(original=True), eagle_config=dict(
        eagle_aux_hidden_state_layer_ids=[1, 3, 4], use_aux_hidden_state=True))
    assert Eagle3Config.from_dict(flat).taps(LAYERS) == (2, 4, 5)
    assert Eagle3Config.from_dict(head_config()).taps(LAYERS) == tuple(TAPS)
    assert Eagle3Config.from_dict(head_config(original=True)).taps(LAYERS) == (2, 4, 5)


@pytest.mark.parametrize("kind", ["agree", "random"])
def test_behind_prompt_lookup_the_head_cache_still_equals_a_recompute(pair, kind):
    """--lookup (the CLI's default) around the EAGLE-3 head: after copied rounds the head
    catches up on what it did not read; its own KV and the taps history stay a recompute."""
    from helpers import assert_lossless_behind_lookup

    target, tok, drafter = pair(kind)
    assert_lossless_behind_lookup(target, tok, drafter, 4)
