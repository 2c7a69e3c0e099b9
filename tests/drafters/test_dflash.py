"""DFlash block drafters in z-lab's published layout, from tiny random checkpoints loaded through
`--draft-model DIR`: the block's q equal an independent reading of speculators' forward (past
the sliding window, causal and bidirectional blocks), a known-answer pair that is always
accepted, greedy identity at block lengths 2, 8 and 16 with the drafter's context entries equal
to a recompute after every round, χ² at T = 1, and bad configs refused by name."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from dflash import (
    CONSTANT,
    IDS,
    build_head,
    build_target,
    config,
    write_head,
    write_target,
)
from eagle3 import VOCAB
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
from published import build_pair, write_checkpoint
from reference import dflash as ref
from test_engine_sampling import assert_both_paths_taken, chi2_pvalue, sample_pairs, target_joint

from mlx_spec import cache as kv
from mlx_spec.drafters import DraftContext
from mlx_spec.drafters.dflash import load_dflash
from mlx_spec.errors import ModelLoadError
from mlx_spec.sampling import Sampler, SamplingConfig

PROMPT = [int(x) for x in np.random.default_rng(3).integers(0, VOCAB - 1, 20)]


@pytest.fixture(scope="module")
def pair_dir(tmp_path_factory, tokenizer_dir):
    """kind -> (target dir, drafter dir): random (window 6, sliding layer causal), open (the
    z-lab `is_causal: false`), agree (known answer), soft (agree, with a softer target),
    hybrid (a Qwen3.5 hybrid target)."""
    root, made = tmp_path_factory.mktemp("dflash"), {}

    def get(kind: str):
        if kind == "hybrid" and kind not in made:  # z-lab's own case: a Qwen3.5 hybrid target
            model, mtp = build_pair("qwen3_5")
            raw = config(ids=[0, 1, 2], target_layers=4)
            made[kind] = (write_checkpoint(root / "hybrid-target", "qwen3_5", model, mtp,
                                           tokenizer_dir),
                          write_head(root / "hybrid-drafter", build_head(raw, seed=2), raw))
        if kind not in made:
            agree = kind in ("agree", "soft")
            model = build_target(agree=agree)
            if kind == "soft":  # p and q both spread, q sharper: drafts kept and rejected
                model.lm_head.weight = model.lm_head.weight * 0.6
            raw = config(causal=False if kind == "open" else None)
            head = build_head(raw, agree=agree)
            if kind == "soft":
                head.norm.weight = head.norm.weight * 1.6
            made[kind] = (write_target(root / f"{kind}-target", model, tokenizer_dir),
                          write_head(root / f"{kind}-drafter", head, raw))
        return made[kind]

    return get


@pytest.fixture(scope="module")
def pair(pair_dir):
    return loaded_pairs(pair_dir)


@pytest.mark.parametrize("kind", ["random", "open"])
@pytest.mark.parametrize("k", [1, 7, 15])
def test_block_q_matches_the_reference(pair, pair_dir, kind, k):
    """Commit a prompt (in two parts, as rounds do), draft a block of k at T = 1: each q_i is
    the reference's softmax of slot i, recomputed from scratch."""
    target, _, drafter = pair(kind)
    raw = json.loads((pair_dir(kind)[1] / "config.json").read_text())
    w = {k: np.array(v, np.float64) for k, v in tree_flatten(drafter.head.parameters())}
    head_w = np.array(target.model.lm_head.weight, np.float64)
    table = np.array(target.embed(mx.arange(VOCAB)), np.float64)
    for n in (3, 9, 20):  # inside the window, at it, past it
        tokens = PROMPT[:n]
        cache, state = kv.make_cache(target.model), drafter.new_state()
        half = n // 2
        _, taps = target.forward(tokens[:half], cache, hidden=drafter.needs_hidden)
        drafter.commit(state, DraftContext(target, tokens[: half + 1], cache, taps, 0), 0)
        _, more = target.forward(tokens[half:-1], cache, hidden=drafter.needs_hidden)
        drafter.commit(state, DraftContext(target, tokens, cache, more, half), half + 1)
        draft = drafter.draft(state, DraftContext(target, tokens, cache), k,
                              Sampler(SamplingConfig(temperature=1.0, seed=5)))
        assert draft.k == k
        all_taps = np.array(mx.concatenate([taps, more]), np.float64)
        block = table[[tokens[-1]] + [VOCAB - 1] * k]
        logits = ref.block_logits(w, raw, all_taps, block, head_w)
        q = np.exp(logits - logits.max(-1, keepdims=True))
        q /= q.sum(-1, keepdims=True)
        np.testing.assert_allclose(np.array(draft.probs), q[1:], atol=1e-5)


def test_taps_are_the_outputs_of_the_configured_layers(pair):
    """z-lab's target_layer_ids name layer outputs: read as the inputs of the layers after."""
    _, _, drafter = pair("random")
    assert drafter.needs_hidden == tuple(i + 1 for i in IDS)


@pytest.mark.parametrize("k", [1, 7, 15])
def test_known_answer_block_is_always_accepted(pair, k):
    target, tok, drafter = pair("agree")
    end, _ = run(conversation(target, tok, drafter, draft_length=k), prompt=PROMPT,
                 max_tokens=48)
    assert set(end.tokens) == {CONSTANT}
    assert end.stats.drafted >= k and end.stats.accepted == end.stats.drafted, end.stats


@pytest.mark.parametrize("kind", ["random", "hybrid"])
def test_a_seeded_sampled_answer_is_the_target_only_one(pair, kind):
    """Drafter-invariant sampling (coupling.py): seeded at T = 1, the block drafter's answer
    is target-only decoding's for that seed, token for token; caches a recompute."""
    target, tok, drafter = pair(kind)
    for seed in range(3):
        cfg = SamplingConfig(temperature=1.0, seed=seed)
        want, _ = run(conversation(target, tok, None), prompt=PROMPT, max_tokens=24,
                      sampling=cfg)
        for k in (3, 15):
            engine = conversation(target, tok, drafter, draft_length=k)
            checked(engine)
            got, _ = run(engine, prompt=PROMPT, max_tokens=24, sampling=cfg)
            assert got.tokens == want.tokens and got.stats.drafted > 0, (seed, k)


@pytest.mark.parametrize("kind", ["random", "hybrid"])  # plain and Gated DeltaNet targets
@pytest.mark.parametrize("k", [1, 7, 15])  # block lengths 2, 8, 16
def test_greedy_identity_and_context_equals_recompute(pair, kind, k):
    """Every round rolls the target back to its accepted prefix (a hybrid's recurrent state
    through its rollback); the drafter's context entries only ever grow by committed ones."""
    target, tok, drafter = pair(kind)
    want, _ = run(conversation(target, tok, None), prompt=PROMPT, max_tokens=40)
    engine = conversation(target, tok, drafter, draft_length=k)
    checked(engine)  # target caches and the drafter's context entries == a recompute
    got, _ = run(engine, prompt=PROMPT, max_tokens=40)
    assert_same_or_near_tie(target, PROMPT, list(got.tokens), list(want.tokens))
    for second in (engine.tokens + PROMPT[:3], engine.tokens[:-6] + PROMPT[5:8]):  # a rewrite
        got2, _ = run(engine, prompt=second, max_tokens=16)
        want2, _ = run(conversation(target, tok, None), prompt=second, max_tokens=16)
        assert_same_or_near_tie(target, second, list(got2.tokens), list(want2.tokens))


@pytest.mark.parametrize("kind", ["random", "hybrid"])
def test_padded_passes_keep_greedy_identity_and_the_context(pair, monkeypatch, kind):
    """Blocks of 8 verified in passes padded to 16: the context takes the real rows only."""
    target, tok, drafter = pair(kind)
    want, _ = run(conversation(target, tok, None), prompt=PROMPT, max_tokens=40)
    engine = conversation(target, tok, drafter, draft_length=7)
    fed = padded(engine, monkeypatch)
    checked(engine)
    got, _ = run(engine, prompt=PROMPT, max_tokens=40)
    assert_same_or_near_tie(target, PROMPT, list(got.tokens), list(want.tokens))
    assert 16 in fed


@pytest.mark.slow
def test_block_speculation_samples_the_target_distribution(pair):
    target, tok, drafter = pair("soft")
    cfg = dict(temperature=1.0, top_p=0.9)
    engine = conversation(target, tok, drafter, draft_length=3)
    tally = []
    pairs = sample_pairs(engine, cfg, tally, prompt=PROMPT[:8], runs=1200)
    assert_both_paths_taken(tally)
    pval = chi2_pvalue(pairs, target_joint(target, SamplingConfig(**cfg), prompt=PROMPT[:8]))
    print(f"dflash χ² p = {pval:.3f}")
    assert pval > 0.01


def test_draft_model_dir_is_recognised(pair_dir):
    target_dir, drafter_dir = pair_dir("random")
    engine = open_chat(model=target_dir, draft_model=drafter_dir, draft_length=7)
    assert engine.drafter.name == "draft-dflash"


def test_bad_configs_are_refused_by_name(tmp_path, pair, pair_dir):
    target, _, _ = pair("random")
    src = pair_dir("random")[1]
    raw = json.loads((src / "config.json").read_text())
    weights = mx.load(str(src / "model.safetensors"))

    def write(name, cfg, w=weights):
        out = tmp_path / name
        out.mkdir()
        (out / "config.json").write_text(json.dumps(cfg))
        mx.save_safetensors(str(out / "model.safetensors"), w)
        return out

    cases = {
        "dflash2": (dict(raw, architectures=["DFlash2DraftModel"]), "DFlash2"),
        "dspark": (dict(raw, dflash_config=dict(raw["dflash_config"], projector_type="dspark")),
                   "DSpark"),
        "mask": (dict(raw, dflash_config={k: v for k, v in raw["dflash_config"].items()
                                          if k != "mask_token_id"}), "mask_token_id"),
        "wide": (dict(raw, hidden_size=128), "128 wide"),
        "taps": (dict(raw, dflash_config=dict(raw["dflash_config"], target_layer_ids=[1, 30])),
                 "reads target layers"),
    }
    for name, (cfg, message) in cases.items():
        with pytest.raises(ModelLoadError, match=message) as e:
            load_dflash(write(name, cfg), target)
        assert "\n" not in str(e.value)
    missing = {k: v for k, v in weights.items() if k != "fc.weight"}
    with pytest.raises(ModelLoadError, match="lacks 1 tensor.s.: fc.weight"):
        load_dflash(write("holes", raw, missing), target)


def test_auto_reaches_the_whole_block(pair, tmp_path):
    """`auto` may draft a DFlash block to its end (block_size - 1), so the engine measures
    the verify costs that far."""
    from mlx_spec.engine import Engine
    from mlx_spec.engine.calibration import CalibrationStore
    from mlx_spec.engine.costs import LONGEST_TIMED_PASS
    from mlx_spec.spec import AUTO_MAX_DRAFT

    target, tok, drafter = pair("random")
    engine = Engine(target, tok, drafter, draft_length="auto",
                    store=CalibrationStore(tmp_path))
    assert engine.auto_max_draft == 15 > AUTO_MAX_DRAFT
    conv = engine.conversation()
    assert conv.max_draft == 15
    engine.calibrate(AUTO_MAX_DRAFT)  # passes are timed to LONGEST_TIMED_PASS (16) whatever it asks
    assert engine.calibrated and len(engine.costs(15).verify) == 16 == LONGEST_TIMED_PASS
    end, _ = run(conv, prompt=PROMPT, max_tokens=24)
    assert end.stats.adaptive and len(end.stats.per_position_drafted) == 15


@pytest.mark.parametrize("kind", ["random", "hybrid"])
def test_behind_prompt_lookup_the_block_drafter_stays_lossless(pair, kind):
    """--lookup (the CLI's default) around a DFlash drafter: its context entries still equal a
    recompute after copied rounds."""
    from helpers import assert_lossless_behind_lookup

    target, tok, drafter = pair(kind)
    assert_lossless_behind_lookup(target, tok, drafter, 7)
