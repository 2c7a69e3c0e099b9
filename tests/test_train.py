"""Smoke runs of the training code paths (a few steps each; real training runs outside CI)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import conversation

from mlx_spec.cli import main
from mlx_spec.drafters.mtp import MTPConfig, load_mtp_drafter
from mlx_spec.train.distill import DistillConfig, build_training_set, distill_mtp

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


def test_train_drafter_cli_smoke_and_mismatch(model_dirs, tmp_path, capsys):
    data = tmp_path / "data.txt"
    data.write_text("def f(x):\n    return x + 1\n" * 200)
    out = tmp_path / "head"
    args = ["train-drafter", "--target", str(model_dirs("qwen3")), "--data", str(data),
            "--steps", "3", "--out", str(out), "--batch-size", "2", "--seq-len", "32"]
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


def test_train_drafter_for_minutes_without_data(model_dirs, tmp_path, capsys):
    """No --data: the target's own continuations of the built-in prompts; --minutes: a time
    budget, a held-out tokens-per-pass estimate, progress lines with an ETA without a TTY, and a
    one-line summary. Resuming trains on from the checkpoint."""
    import json

    out = tmp_path / "head"
    args = ["train-drafter", "--target", str(model_dirs("qwen3")), "--minutes", "0.15",
            "--out", str(out), "--batch-size", "2", "--seq-len", "32"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "ETA" in err and "held-out after" in err
    summary = err.strip().splitlines()[-1]
    assert summary.startswith("mlx-spec: trained") and "tokens per target pass" in summary
    curve = json.loads((out / "mtp_config.json").read_text())["train"]["held_out"]
    assert curve and curve[-1]["tokens_per_pass"] >= 1.0
    first = curve[-1]["step"]
    assert main(args) == 0  # resumed: more steps on top
    again = json.loads((out / "mtp_config.json").read_text())["train"]["held_out"]
    assert again[-1]["step"] > first
    assert main(args + ["--steps", "3"]) == 2
    assert "not both" in capsys.readouterr().err
