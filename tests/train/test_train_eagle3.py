"""`train-drafter --kind eagle3`: an EAGLE-3 head of our own, trained through the one loop on
its chained steps, written in the speculators format. On the known-answer target of
tests/eagle3.py (a bigram machine: the target says nu(x) after x) a few dozen steps teach it;
the written directory loads through `--draft-model DIR` with its acceptance kept exactly;
greedy decoding with it is the target's own; the training forward is the drafting forward; the
config validates against speculators' own schema and speculators' module reads the weights
with every tensor used and drafts what we draft (`reference`: needs torch)."""

from __future__ import annotations

import json

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from eagle3 import build_target, write_target
from helpers import assert_same_or_near_tie, checked, conversation, open_chat, run, sampled_draft

from mlx_spec import cache as kv
from mlx_spec.cli import main
from mlx_spec.drafters.mtp import eagle3_drafter
from mlx_spec.loading import load_target, make_drafter
from mlx_spec.train.data import build_training_set, held_rows
from mlx_spec.train.distill import (
    DistillConfig,
    distill_eagle3,
    eagle3_trainee,
    held_out_scores,
)
from mlx_spec.train.eagle3 import chained_steps

DC = DistillConfig(steps=40, batch_size=4, seq_len=32, lr=3e-3, warmup=5, save_every=20,
                   reweigh_every=10)
RNG = np.random.default_rng(1)
TRAIN_PROMPTS = [[int(v) for v in RNG.integers(3, 300, 8)] for _ in range(40)]
HELD_OUT = [[int(v) for v in RNG.integers(3, 300, 8)] for _ in range(3)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tokenizer_dir):
    """(target dir, target, tokenizer, the trained head in memory, its directory)."""
    root = tmp_path_factory.mktemp("train-eagle3")
    target_dir = write_target(root / "target", build_target(agree=True), tokenizer_dir)
    target, tok = load_target(target_dir)
    data = build_training_set(target, None, DC, n_generated=64, log=lambda s: None,
                              prompts=TRAIN_PROMPTS)
    held = held_rows(target, HELD_OUT, DC.seq_len)
    head = distill_eagle3(target, data, DC, root / "head", progress=lambda *a: None, held=held)
    return target_dir, target, tok, head, root / "head"


def test_written_head_loads_and_keeps_the_trained_acceptance(trained):
    """Known answer: the acceptance measured on the head in memory is exactly the acceptance
    after writing and loading it (`--draft-model DIR`), at every position of k = 8, and well
    above an untrained head's."""
    _, target, tok, head, head_dir = trained
    drafter = make_drafter("draft", target, draft_model=head_dir)
    # our own head: `auto` chooses its length (a published one keeps its speculative_tokens)
    assert drafter.name == "draft-eagle3" and drafter.draft_length is None
    in_memory = held_out_scores(target, tok, eagle3_drafter(head, target), HELD_OUT, max_tokens=32)
    loaded = held_out_scores(target, tok, drafter, HELD_OUT, max_tokens=32)
    assert loaded == in_memory
    untrained = held_out_scores(
        target, tok, eagle3_drafter(eagle3_trainee(target, DC.depth)[0].head, target), HELD_OUT,
        max_tokens=32)
    assert loaded["tokens_per_pass"] >= untrained["tokens_per_pass"] + 0.5, (loaded, untrained)
    assert loaded["acceptance_k8"][0] >= 0.3 and len(loaded["acceptance_k8"]) == 8
    info = json.loads((head_dir / "training.json").read_text())
    assert info["depth"] == 8 and len(info["position_weights"]["weights"]) == 8


def test_greedy_identity_with_the_trained_head(trained):
    target_dir, target, tok, _, head_dir = trained
    drafter = make_drafter("draft", target, draft_model=head_dir)
    prompt = HELD_OUT[0] + [7, 11]
    want, _ = run(conversation(target, tok, None), prompt=prompt, max_tokens=40)
    for k in (1, 4, 8):
        engine = conversation(target, tok, drafter, draft_length=k)
        checked(engine)  # the target's caches, the taps history, the head's own KV: a recompute
        got, _ = run(engine, prompt=prompt, max_tokens=40)
        assert got.stats.accepted > 0
        assert_same_or_near_tie(target, prompt, list(got.tokens), list(want.tokens))


def test_chained_training_steps_are_the_drafting_steps(trained):
    """Step j of the training forward at anchor row t gives the q the drafter draws its j-th
    token from, when the data goes on with the drafts (T = 1: every position's q, not argmax)."""
    _, target, _, head, _ = trained
    drafter = eagle3_drafter(head, target)
    for n, k in ((5, 8), (12, 4)):
        prefix = [int(v) for v in np.random.default_rng(n).integers(3, 300, n)]
        draft = sampled_draft(target, drafter, prefix, k, n)
        x = mx.array([prefix + [int(t) for t in np.array(draft.tokens)]])
        # entry t pairs x_{t+1} with the taps at t: drafting from n tokens is anchor row n - 2
        for j, step in enumerate(chained_steps(head, target, x, k)):
            q = nn.log_softmax(step.logits[0, n - 2].astype(mx.float32))
            np.testing.assert_allclose(np.array(q), np.log(np.array(draft.probs[j])), atol=1e-4)


def test_train_drafter_eagle3_cli_writes_a_speculators_dir(trained, tmp_path, capsys):
    target_dir = trained[0]
    out = tmp_path / "e3"
    args = ["train-drafter", "--target", str(target_dir), "--kind", "eagle3", "--steps", "3",
            "--depth", "4", "--out", str(out), "--batch-size", "2", "--seq-len", "32"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "held-out before (0 steps)" in err and "held-out after (3 steps)" in err
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]  # [2, L/2, L-3], L = 8
    names = set(mx.load(str(out / "model.safetensors")))
    assert {"fc.weight", "input_norm.weight", "layers.0.hidden_norm.weight", "norm.weight",
            "lm_head.weight"} <= names
    assert not names & {"embed_tokens.weight", "d2t", "t2d"}  # the target's, as in speculators
    curve = json.loads((out / "training.json").read_text())["held_out"]
    assert [p["step"] for p in curve] == [0, 3] and len(curve[-1]["acceptance_k8"]) == 8
    engine = open_chat(model=target_dir, draft_model=out)  # trained here: auto, not the depth
    assert engine.drafter.name == "draft-eagle3" and engine.draft_length == "auto"
    assert open_chat(model=target_dir, draft_model=out, draft_length=4).draft_length == 4
    # an MTP head into the same directory: refused, nothing overwritten
    assert main(args[:4] + ["shared-kv"] + args[5:]) == 2
    assert "another kind of head" in capsys.readouterr().err


@pytest.mark.reference
def test_config_and_weights_are_speculators_own(torch, trained):
    """speculators 0.9 validates the config with its own schema, builds its Eagle3DraftModel
    from it, finds every tensor of ours used and none missing but the embedding (shared with
    the target, as vLLM does), and its TTT forward gives our first two drafts' q."""
    _, target, _, head, head_dir = trained
    check_against_speculators(torch, target, eagle3_drafter(head, target), head_dir)


@pytest.mark.reference
def test_reduced_draft_vocabulary_is_speculators_own(torch, trained, reduced):
    """The same with a reduced draft vocabulary: speculators takes our d2t / t2d (its own
    checks in load_vocab_mappings) and its draft-vocabulary q is ours on those ids."""
    _, target, _, _, _ = trained
    head_dir, ids = reduced
    check_against_speculators(torch, target, make_drafter("draft", target,
                                                          draft_model=head_dir), head_dir, ids)


def check_against_speculators(torch, target, drafter, head_dir, ids=None):
    pytest.importorskip("speculators")
    from speculators import SpeculatorModelConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    raw = json.loads((head_dir / "config.json").read_text())
    config = SpeculatorModelConfig.from_dict(raw)
    assert isinstance(config, Eagle3SpeculatorConfig)
    assert config.eagle_aux_hidden_state_layer_ids == raw["eagle_aux_hidden_state_layer_ids"]
    assert (config.norm_before_fc, config.norm_output, config.norm_before_residual) == (
        True, True, True)
    config.transformer_layer_config._attn_implementation = "eager"
    model = Eagle3DraftModel(config)
    weights = {k: torch.from_numpy(np.array(v)) for k, v in mx.load(
        str(head_dir / "model.safetensors")).items()}
    weights["embed_tokens.weight"] = torch.from_numpy(np.array(target.embed(
        mx.arange(target.vocab_size))))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= {"verifier_norm.weight",
                                               "verifier_lm_head.weight"}, (missing, unexpected)
    if ids is not None:  # its own checks of the maps' shapes and counts
        model.load_vocab_mappings(weights["t2d"], weights["d2t"])
        assert model.use_draft_vocab
        np.testing.assert_array_equal(model.d2t.numpy() + np.arange(len(ids)), ids)
    model.eval()
    prefix = HELD_OUT[1] + [5, 9, 13]
    draft = sampled_draft(target, drafter, prefix, 2, 3)
    seq = prefix + [int(draft.tokens[0])]
    _, all_taps = target.forward(seq[:-1], kv.make_cache(target.model),
                                 hidden=drafter.needs_hidden)
    logits = []
    hook = model.lm_head.register_forward_hook(lambda _m, _i, o: logits.append(o[0]))
    try:
        with torch.no_grad():
            model(hidden_states=torch.from_numpy(np.array(all_taps))[None],
                  input_ids=torch.tensor([seq[1:]]),
                  document_ids=torch.zeros(1, len(seq) - 1, dtype=torch.long), ttt_steps=2)
    finally:
        hook.remove()
    row = len(prefix) - 2  # the last committed entry
    for j in range(2):
        q = torch.softmax(logits[j][row].double(), -1).numpy()
        ours = np.array(draft.probs[j], np.float64)
        np.testing.assert_allclose(ours if ids is None else ours[ids], q, atol=1e-5)


def test_default_kind_is_eagle3_where_it_fits_and_is_found_beside_the_model(trained, tmp_path,
                                                                              capsys):
    """No --kind: an EAGLE-3 head where the target's layers can be tapped, written to
    TARGET/eagle3 and used by `--drafter auto` from there; a target whose layers cannot be
    tapped gets the shared-KV head."""
    import shutil

    from mlx_spec.train.distill import default_kind

    target_dir = tmp_path / "target"
    shutil.copytree(trained[0], target_dir)
    assert main(["train-drafter", "--target", str(target_dir), "--steps", "2", "--depth", "2",
                 "--batch-size", "2", "--seq-len", "32"]) == 0
    err = capsys.readouterr().err
    assert "head kind: eagle3" in err and "found by `--drafter auto`" in err
    assert (target_dir / "eagle3" / "config.json").exists()
    engine = open_chat(model=target_dir)
    assert engine.drafter.name == "draft-eagle3"

    class Untappable:  # a trunk whose layer inputs are not exposed (e.g. a recurrent family)
        def __init__(self, t):
            self.t = t

        def __getattr__(self, name):
            return getattr(self.t, name)

        def exposes_taps(self, taps):
            return False

    said = []
    assert default_kind(Untappable(trained[1]), said.append) == "shared-kv"
    assert "not reachable" in said[0]


@pytest.fixture(scope="module")
def reduced(tmp_path_factory, trained):
    """A head trained with a reduced draft vocabulary (the 320 tokens most frequent in its
    training rows) on the same known-answer target: (its directory, the rows' vocabulary)."""
    from mlx_spec.train.eagle3 import draft_vocabulary

    _, target, _, _, _ = trained
    root = tmp_path_factory.mktemp("train-eagle3-vocab")
    data = build_training_set(target, None, DC, n_generated=64, log=lambda s: None,
                              prompts=TRAIN_PROMPTS)
    held = held_rows(target, HELD_OUT, DC.seq_len)
    distill_eagle3(target, data, DC, root / "head", progress=lambda *a: None, held=held,
                   draft_vocab=320)
    return root / "head", draft_vocabulary(data, target.vocab_size, 320)


def test_reduced_draft_vocabulary_is_written_as_speculators_does_and_drafts_only_from_it(
        trained, reduced):
    """--draft-vocab: d2t (int64) and t2d (bool) beside a 320-row lm_head; loaded through
    `--draft-model DIR` it drafts about as well as the full-vocabulary head trained alike
    (known answer: the bigram walk stays in the draft vocabulary), q is zero off the
    vocabulary, and greedy output is the target's."""
    _, target, tok, _, full_dir = trained
    head_dir, ids = reduced
    config = json.loads((head_dir / "config.json").read_text())
    assert config["draft_vocab_size"] == 320
    w = mx.load(str(head_dir / "model.safetensors"))
    assert w["lm_head.weight"].shape == (320, 64) and w["d2t"].dtype == mx.int64
    assert w["t2d"].dtype == mx.bool_ and int(w["t2d"].sum()) == 320
    np.testing.assert_array_equal(np.arange(320) + np.array(w["d2t"]), ids)
    np.testing.assert_array_equal(np.flatnonzero(np.array(w["t2d"])), ids)
    drafter = make_drafter("draft", target, draft_model=head_dir)
    scores = held_out_scores(target, tok, drafter, HELD_OUT, max_tokens=32)
    full = held_out_scores(target, tok, make_drafter("draft", target, draft_model=full_dir),
                           HELD_OUT, max_tokens=32)
    assert scores["acceptance_k8"][0] >= 0.3, scores  # a wrong d2t would draft ~nothing right
    assert scores["tokens_per_pass"] >= full["tokens_per_pass"] - 0.15, (scores, full)
    prefix = HELD_OUT[2] + [5, 9]
    draft = sampled_draft(target, drafter, prefix, 3, 2)
    off = np.setdiff1d(np.arange(target.vocab_size), ids)
    assert float(np.abs(np.array(draft.probs)[:, off]).max()) == 0.0
    np.testing.assert_allclose(np.array(draft.probs).sum(-1), 1.0, atol=1e-5)
    want, _ = run(conversation(target, tok, None), prompt=prefix, max_tokens=30)
    engine = conversation(target, tok, drafter, draft_length=4)
    checked(engine)
    got, _ = run(engine, prompt=prefix, max_tokens=30)
    assert got.stats.accepted > 0
    assert_same_or_near_tie(target, prefix, list(got.tokens), list(want.tokens))


def test_draft_vocabulary_is_the_most_frequent_tokens_and_refuses_bad_sizes():
    from mlx_spec.errors import MlxSpecError
    from mlx_spec.train.eagle3 import draft_vocabulary

    rows = np.array([[5, 5, 5, 2, 2, 9], [9, 9, 7, 7, 1, 0]])
    # counts: 5 ×3, 9 ×3, 2 ×2, 7 ×2, then 0 and 1 once: ties go to the lower id, sorted
    np.testing.assert_array_equal(draft_vocabulary(rows, 12, 3), [2, 5, 9])
    np.testing.assert_array_equal(draft_vocabulary(rows, 12, 5), [0, 2, 5, 7, 9])
    for bad in (0, 13):
        with pytest.raises(MlxSpecError, match="--draft-vocab"):
            draft_vocabulary(rows, 12, bad)


def test_train_drafter_draft_vocab_is_for_eagle3_only(trained, tmp_path, capsys):
    args = ["train-drafter", "--target", str(trained[0]), "--kind", "shared-kv", "--steps",
            "2", "--draft-vocab", "100", "--out", str(tmp_path / "x")]
    assert main(args) == 2
    assert "--draft-vocab is for --kind eagle3" in capsys.readouterr().err


def test_reduced_vocabulary_trains_in_draft_ids_on_the_drafting_steps(trained, reduced):
    """With a reduced draft vocabulary the training steps run in draft ids: their q is the
    drafter's q at those target ids (step j at anchor row t, as drafting from t draws it), the
    teacher's p is the target's renormalised over them, `want` is the target's own argmax and
    `ids` maps a draft id back to its target id."""
    from mlx_spec.train.eagle3 import teacher

    _, target, _, _, _ = trained
    head_dir, ids = reduced
    drafter = make_drafter("draft", target, draft_model=head_dir)
    head = drafter.head
    n, k = 9, 4
    prefix = [int(v) for v in np.random.default_rng(n).integers(3, 300, n)]
    draft = sampled_draft(target, drafter, prefix, k, n)
    x = mx.array([prefix + [int(t) for t in np.array(draft.tokens)]])
    for j, step in enumerate(chained_steps(head, target, x, k)):
        assert step.logits.shape[-1] == len(ids)
        q = nn.log_softmax(step.logits[0, n - 2].astype(mx.float32))
        np.testing.assert_allclose(np.array(q), np.log(np.array(draft.probs[j])[ids]), atol=1e-4)
        np.testing.assert_array_equal(np.array(step.ids), ids)
    taps = tuple(head.cfg.layer_ids)
    _, p, want = teacher(target, x, taps, mx.array(ids))
    _, full, _ = teacher(target, x, taps)
    kept = np.array(full)[..., ids]
    np.testing.assert_allclose(np.array(p), kept / kept.sum(-1, keepdims=True), atol=1e-5)
    np.testing.assert_array_equal(np.array(want), np.array(full).argmax(-1))


def test_the_targets_side_is_computed_once_and_trains_as_the_live_one(trained, reduced,
                                                                       tmp_path):
    """features.TeacherCache: each row's taps, p over the draft vocabulary and the target's
    argmax, filled a batch at a time across sittings, give the loss the live target gives (to
    f16 rounding); other rows start the files afresh."""
    from mlx_spec.train.chain import thinning, weighted_loss
    from mlx_spec.train.distill import soft_ce
    from mlx_spec.train.features import FILL_BATCH, TeacherCache

    _, target, _, _, _ = trained
    head_dir, ids = reduced
    head = make_drafter("draft", target, draft_model=head_dir).head
    rows = build_training_set(target, None, DC, n_generated=20, log=lambda s: None,
                              prompts=TRAIN_PROMPTS)[:20]
    taps = tuple(head.cfg.layer_ids)
    cache = TeacherCache(tmp_path / "t", target, rows, taps, ids)
    assert not cache.fill(seconds=0.0) and cache.done == FILL_BATCH  # one batch, then out
    again = TeacherCache(tmp_path / "t", target, rows, taps, ids)  # the next sitting
    assert again.done == FILL_BATCH and again.fill() and again.done == len(rows)
    index = np.array([3, 17, 9])
    x, w = mx.array(rows[index]), mx.array([1.0, 0.5, 0.25])
    live = weighted_loss(chained_steps(head, target, x, 3, thinning), w, soft_ce)
    kept = weighted_loss(chained_steps(head, target, x, 3, thinning, again.get(index)), w,
                         soft_ce)
    np.testing.assert_allclose(float(kept), float(live), rtol=2e-3)
    other = TeacherCache(tmp_path / "t", target, rows[::-1].copy(), taps, ids)
    assert other.done == 0


def test_the_input_norm_is_whitened_against_massive_activations(trained):
    """Taps with a few huge coordinates (a real target's massive activations): one RMSNorm
    leaves the others ~1e-3 of their share; whitened, every coordinate of the normed taps has
    unit RMS over the sample, the huge ones included."""
    from mlx_spec.train.eagle3 import whiten_input

    _, target, _, _, _ = trained
    head = eagle3_trainee(target, 2)[0].head
    width = head.input_dim
    rng = np.random.default_rng(0)
    taps = rng.normal(size=(4, 32, width)).astype(np.float32)
    taps[..., 3] = 2.5e4 + rng.normal(size=(4, 32))  # every token, as a massive activation is
    x = mx.array(taps)
    before = np.sqrt(np.mean(np.array(head.input_norm(x)) ** 2, axis=(0, 1)))
    assert np.median(before) < 0.01
    whiten_input(head, x)
    after = np.sqrt(np.mean(np.array(head.input_norm(x)) ** 2, axis=(0, 1)))
    np.testing.assert_allclose(after, 1.0, rtol=1e-3)
