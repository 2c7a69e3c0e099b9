"""Smoke runs of the training code paths (a few steps each; real training runs outside CI)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import conversation

from mlx_spec import cache as kv
from mlx_spec.cli import main
from mlx_spec.drafters import DraftContext
from mlx_spec.drafters.mtp import MTPConfig, MTPDrafter
from mlx_spec.drafters.mtp_files import load_mtp_drafter
from mlx_spec.sampling import Sampler, SamplingConfig
from mlx_spec.train.chain import (
    PositionWeights,
    Step,
    acceptance,
    position_weights,
    thinning,
)
from mlx_spec.train.data import build_training_set
from mlx_spec.train.distill import (
    DistillConfig,
    distill_draft_model,
    distill_mtp,
    mtp_trainee,
)

DC = DistillConfig(steps=40, batch_size=4, seq_len=32, lr=3e-3, warmup=5, save_every=20)


@pytest.mark.parametrize("kind", ["shared-kv", "deepseek"])
def test_distill_mtp_learns_and_resumes(load, tmp_path, kind):
    target, tok = load("qwen3")
    tokens = np.random.default_rng(0).integers(3, 300, 5000)
    data = build_training_set(target, tokens, DC, n_generated=16, log=lambda s: None)
    losses = []

    def progress(step, total, loss, rate):
        losses.append(loss)

    cfg = MTPConfig.for_target(target, kind, hidden_size=48, num_layers=1, intermediate_size=64)
    distill_mtp(target, data, cfg, DC, tmp_path / "mtp", progress=progress)
    assert losses[-1] < losses[0]  # it learns the target's (deterministic) continuations
    drafter = load_mtp_drafter(tmp_path / "mtp", target)
    engine = conversation(target, tok, drafter, draft_length=3)
    end = list(engine.generate(list(range(5, 20)), max_tokens=10))[-1]
    assert end.stats.drafted > 0
    # a finished run resumes as a no-op from its checkpoint
    again = []
    distill_mtp(target, data, cfg, DC, tmp_path / "mtp", progress=lambda *a: again.append(a))
    assert again == []


def test_distill_draft_model_continues_from_a_model_directory(load, tmp_path):
    """init: the run starts from those weights (the demo's draft model is continued so)."""
    from mlx_spec.train.modeldir import save_model_dir

    target, _ = load("qwen3")
    tokens = np.random.default_rng(0).integers(3, 300, 5000)
    data = build_training_set(target, tokens, DC, n_generated=8, log=lambda s: None)
    config = {**target.config, "num_hidden_layers": 1}
    first: dict[str, list[float]] = {"fresh": [], "continued": []}

    def run(name, init=None):
        dc = DistillConfig(steps=30, batch_size=4, seq_len=32, lr=3e-3, warmup=2, save_every=50)
        return distill_draft_model(target, data, config, dc, tmp_path / name, init=init,
                                   progress=lambda step, total, loss, rate:
                                   first[name].append(loss))

    trained = run("fresh")
    save_model_dir(tmp_path / "trained", trained, config)
    run("continued", init=tmp_path / "trained")
    # the continued run starts where the trained model ended (at or below the fresh run's
    # running loss, which still averages in its early steps), not from scratch
    assert first["continued"][0] < first["fresh"][0] - 0.5
    assert first["continued"][0] < first["fresh"][-1] + 0.1


def test_train_drafter_cli_smoke_and_mismatch(model_dirs, tmp_path, capsys):
    data = tmp_path / "data.txt"
    data.write_text("def f(x):\n    return x + 1\n" * 200)
    out = tmp_path / "head"
    args = ["train-drafter", "--target", str(model_dirs("qwen3")), "--data", str(data),
            "--steps", "3", "--out", str(out), "--batch-size", "2", "--seq-len", "32",
            "--kind", "shared-kv"]
    assert main(args) == 0
    assert (out / "mtp_config.json").exists()
    # the same --out for a target of another shape: a clear error, nothing overwritten
    other = model_dirs("llama")
    import json
    cfg = json.loads((out / "mtp_config.json").read_text())
    cfg["hidden_size"] = 999
    (out / "mtp_config.json").write_text(json.dumps(cfg))
    args[2] = str(other)
    assert main(args) == 2
    assert "choose another --out" in capsys.readouterr().err
    assert main(["train-drafter", "--target", str(other), "--data", str(tmp_path / "none"),
                 "--steps", "1"]) == 2


@pytest.mark.slow
def test_train_drafter_for_minutes_without_data(model_dirs, tmp_path, capsys):
    """No --data (a chat model): the target's own answers to chat prompts; --minutes: a time
    budget, a held-out tokens-per-pass estimate, progress lines with an ETA without a TTY, and a
    one-line summary. Resuming trains on from the checkpoint."""
    import json

    out = tmp_path / "head"
    args = ["train-drafter", "--target", str(model_dirs("qwen3")), "--minutes", "0.15",
            "--out", str(out), "--batch-size", "2", "--seq-len", "32", "--kind", "shared-kv",
            "--chat-prompts", "12"]
    assert main(args) == 0
    err = capsys.readouterr().err
    answered = [np.load(f) for f in (out / "train" / "chat").glob("answers-*.npy")]
    assert sum(_conversations(flat) for flat in answered) == 12  # --chat-prompts
    assert "ETA" in err and "held-out after" in err
    summary = err.strip().splitlines()[-1]
    assert summary.startswith("mlx-spec: trained") and "tokens per target pass" in summary
    assert "held-out before (0 steps): per-position acceptance at k=8" in err
    info = json.loads((out / "mtp_config.json").read_text())["train"]
    curve = info["held_out"]
    assert curve[0]["step"] == 0 and curve[-1]["tokens_per_pass"] >= 1.0  # before, after
    assert len(curve[-1]["acceptance_k8"]) == 8 and curve[-1]["tokens_per_pass_k8"] >= 1.0
    assert info["depth"] == 8 and len(info["position_weights"]["alpha"]) == 8
    first = curve[-1]["step"]
    assert main(args) == 0  # resumed: more steps on top
    again = json.loads((out / "mtp_config.json").read_text())["train"]["held_out"]
    assert again[-1]["step"] > first and again[: len(curve)] == curve  # the curve carries on
    assert main(args + ["--steps", "3"]) == 2
    assert "not both" in capsys.readouterr().err


def _conversations(flat: np.ndarray) -> int:
    """How many conversations a kept answers file holds (each: its length, then its ids)."""
    n = i = 0
    while i < len(flat):
        n, i = n + 1, i + 1 + int(flat[i])
    return n


def test_position_weights_are_the_gradient_of_tokens_per_pass():
    """w_i ∝ ∂E/∂log α_i for E = 1 + Σ_m Π_{j≤m} α_j (finite differences), 1 at the first."""
    np.testing.assert_allclose(position_weights(np.ones(3)), [1, 2 / 3, 1 / 3])
    np.testing.assert_allclose(position_weights(np.array([0.5, 0.5])), [1, 1 / 3])
    alpha = np.random.default_rng(0).uniform(0.1, 0.9, 8)

    def tokens_per_pass(a):
        return 1 + np.cumprod(a).sum()

    grad = []
    for i in range(8):
        up, down = np.log(alpha.copy()), np.log(alpha.copy())
        up[i] += 1e-6
        down[i] -= 1e-6
        grad.append((tokens_per_pass(np.exp(up)) - tokens_per_pass(np.exp(down))) / 2e-6)
    np.testing.assert_allclose(position_weights(alpha), np.array(grad) / grad[0], rtol=1e-5)
    assert np.all(np.diff(position_weights(alpha)) < 0)


def test_acceptance_counts_each_position_given_the_chain_so_far():
    """Position j is tried where drafts 1..j-1 were right and the data went on with them."""
    import mlx.core as mx

    def onehot(ids):
        return mx.array(np.eye(5, dtype=np.float32)[np.array(ids)][None])

    want = [[1, 2, 3, 4], [2, 2, 2, 2]]  # the target's argmax per step, at rows 0..3
    drafted = [[1, 2, 0, 4], [2, 0, 2, 2]]
    data = [[1, 2, 3, 0], [2, 2, 2, 2]]  # row 3: the data leaves the target after step 0
    steps = [Step(onehot(d), onehot(w), mx.ones((1, 4)), mx.array([y]))
             for d, w, y in zip(drafted, want, data, strict=True)]
    hits, trials = acceptance(iter(steps))
    assert trials.tolist() == [4, 2] and hits.tolist() == [3, 1]
    calls = []

    def measure():
        calls.append(1)
        return np.array([3, 1]), np.array([4, 2])

    weights = PositionWeights(2, measure, every=10)
    for step in range(25):
        weights.at(step)
    assert len(calls) == 3  # steps 0, 10, 20
    np.testing.assert_allclose(weights.alpha, [4 / 6, 2 / 4])
    # positions weighing under the floor are not trained until the drafts before them pay
    low = PositionWeights(8, lambda: (np.zeros(8), np.full(8, 98)), every=10, floor=0.02)
    assert low.at(0).shape == (1,)
    high = PositionWeights(8, lambda: (np.full(8, 69), np.full(8, 98)), every=10, floor=0.02)
    assert high.at(0).shape == (8,) and high.describe()["trained_positions"] == 8


@pytest.mark.parametrize("kind", ["shared-kv", "deepseek"])
def test_chained_training_steps_are_the_drafting_steps(load, kind):
    """Step j of the training forward at an anchor row gives the q the drafter draws its
    j-th token from, when the data goes on with the drafts (T = 1, every position)."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_map

    target, _ = load("qwen3")
    cfg = MTPConfig.for_target(target, kind, hidden_size=48, num_layers=2, intermediate_size=64)
    t = mtp_trainee(target, cfg, seed=3)
    t.head.update(tree_map(lambda a: a * 3 if a.ndim == 2 else a, t.head.parameters()))
    drafter = MTPDrafter(t.head, cfg, target)
    n, k = 9, 6
    prefix = [int(v) for v in np.random.default_rng(2).integers(3, 300, n)]
    cache = kv.make_cache(target.model)
    _, h = target.forward(prefix[:-1], cache, hidden=True)
    state = drafter.new_state()
    drafter.commit(state, DraftContext(target, prefix, cache, h, 0), 0)
    draft = drafter.draft(state, DraftContext(target, prefix, cache), k,
                          Sampler(SamplingConfig(temperature=1.0, seed=1)))
    x = mx.array([prefix + [int(v) for v in np.array(draft.tokens)]])
    full = list(t.steps(x, k))
    for j, step in enumerate(full):  # entry i pairs token i with h_{i-1}: row n-1
        q = nn.log_softmax(step.logits[0, n - 1].astype(mx.float32))
        np.testing.assert_allclose(np.array(q), np.log(np.array(draft.probs[j])), atol=1e-4)
    # training scores deeper steps on every r-th row: the same rows of the same steps
    for j, step in enumerate(t.steps(x, k, thinning)):
        r = thinning(j)
        for field in ("logits", "p", "valid", "y"):
            np.testing.assert_allclose(np.array(getattr(step, field)),
                                       np.array(getattr(full[j], field)[:, j % r :: r]),
                                       atol=1e-5)


def test_a_head_from_the_target_s_last_layer_starts_as_that_layer(load):
    """Known answer for train/compare.py's `last-layer` kind: fed the residual the target's
    last layer reads, with that layer's own keys and values, the head's layer gives the
    layer's output (so the copy mapped every weight, and shared-KV attention over the
    target's keys is the layer's own self-attention)."""
    import mlx.core as mx

    from mlx_spec.train.compare import last_layer_head

    target, _ = load("qwen3")
    cfg, head = last_layer_head(target)
    layers = len(target.backbone.layers)
    cache = target.make_cache()
    x = mx.array([[5, 17, 42, 9, 250, 3, 77, 12]])
    _, taps = target.forward_rows(x, cache, hidden=(layers - 1, layers))
    into, out = taps[..., : cfg.hidden_size], taps[..., cfg.hidden_size :]
    last = cache[-1]
    keys, values = last.keys[..., : last.offset, :], last.values[..., : last.offset, :]
    rope = target.model.layers[-1].self_attn.rope
    got = head.layers[0](into, keys, values, rope, 0, "causal")
    np.testing.assert_allclose(np.array(got), np.array(out), atol=2e-4)
    assert cfg.kv_layer == -1 and cfg.num_layers == 1 and cfg.hidden_size == target.hidden_size


def test_a_run_stopped_part_way_leaves_a_head_that_drafts(load, tmp_path):
    """The head (config and weights) is written at every checkpoint: killed after its first
    one, the directory loads and drafts, and says it is not complete."""
    import json

    target, tok = load("qwen3")
    tokens = np.random.default_rng(0).integers(3, 300, 5000)
    data = build_training_set(target, tokens, DC, n_generated=8, log=lambda s: None)
    cfg = MTPConfig.for_target(target, "shared-kv", hidden_size=48, num_layers=1,
                               intermediate_size=64)

    def killed(step, total, loss, rate):
        if step == DC.save_every + 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        distill_mtp(target, data, cfg, DC, tmp_path / "mtp", progress=killed)
    info = json.loads((tmp_path / "mtp" / "mtp_config.json").read_text())["train"]
    assert info["steps"] == DC.save_every and info["complete"] is False
    drafter = load_mtp_drafter(tmp_path / "mtp", target)
    end = list(conversation(target, tok, drafter, draft_length=3)
               .generate(list(range(5, 20)), max_tokens=8))[-1]
    assert end.stats.drafted > 0
    assert not list((tmp_path / "mtp").glob(".*partial*"))  # nothing half-written left


def test_a_resume_with_other_settings_is_one_line(model_dirs, tmp_path, capsys):
    data = tmp_path / "data.txt"
    data.write_text("def f(x):\n    return x + 1\n" * 200)
    args = ["train-drafter", "--target", str(model_dirs("qwen3")), "--data", str(data),
            "--steps", "3", "--out", str(tmp_path / "head"), "--batch-size", "2",
            "--seq-len", "32", "--kind", "shared-kv"]
    assert main(args) == 0
    capsys.readouterr()
    assert main([*args[:-4], "--seq-len", "48", "--kind", "shared-kv"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--seq-len 32" in err[0] and "resume with those" in err[0]


def test_a_wall_deadline_keeps_room_for_the_last_scoring():
    """loop.train stops where what is left of the deadline is no more than the longest
    scoring so far (here one the caller timed: 1 h), after at least one step, saved and
    scored at the end."""
    import time

    import mlx.core as mx
    import mlx.nn as nn

    from mlx_spec.train.loop import Recipe, train

    model = nn.Linear(4, 4)
    x = mx.ones((2, 4))
    saved, scored = [], []
    train(model, lambda x: (model(x) ** 2).mean(), lambda step: (x,),
          Recipe(steps=1000, lr=1e-3, warmup=1), _tmp_checkpoint(),
          evaluate=(1e9, lambda step, t: scored.append(step)),
          deadline=time.perf_counter() + 30.0, reserve=3600.0,
          saved=lambda step, loss: saved.append(step))
    assert saved == [1] and scored == [1]


def _tmp_checkpoint():
    import tempfile
    from pathlib import Path

    return Path(tempfile.mkdtemp()) / "checkpoint.safetensors"
