"""Train a small causal LM (any mlx-lm architecture, qwen3 by default) on token windows, through
the shared training loop (loop.py: resumable from the same output directory)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .loop import Recipe, train
from .modeldir import build_model


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 2000
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 3e-3
    warmup: int = 100
    weight_decay: float = 0.05
    seed: int = 0
    save_every: int = 100
    log_every: int = 50


def batch(tokens: np.ndarray, cfg: TrainConfig, step: int) -> tuple[mx.array, mx.array]:
    """Random windows, seeded from (seed, step): a resumed run sees the same data."""
    rng = np.random.default_rng((cfg.seed, step))
    starts = rng.integers(0, len(tokens) - cfg.seq_len - 1, cfg.batch_size)
    window = np.stack([tokens[s : s + cfg.seq_len + 1] for s in starts]).astype(np.int32)
    return mx.array(window[:, :-1]), mx.array(window[:, 1:])


def lm_loss(model: nn.Module, x: mx.array, y: mx.array) -> mx.array:
    return nn.losses.cross_entropy(model(x), y, reduction="mean")


def evaluate(model: nn.Module, tokens: np.ndarray, seq_len: int, max_windows: int = 64) -> float:
    """Mean next-token loss over consecutive held-out windows."""
    n = min(max_windows, (len(tokens) - 1) // seq_len)
    losses = []
    for i in range(0, n, 8):
        idx = [j * seq_len for j in range(i, min(n, i + 8))]
        x = mx.array(np.stack([tokens[s : s + seq_len] for s in idx]).astype(np.int32))
        y = mx.array(np.stack([tokens[s + 1 : s + seq_len + 1] for s in idx]).astype(np.int32))
        losses.append(lm_loss(model, x, y).item())
    return float(np.mean(losses))


def train_lm(
    config: dict, train_tokens: np.ndarray, heldout_tokens: np.ndarray, cfg: TrainConfig,
    workdir: Path, *, log=print, init: Path | None = None,
) -> nn.Module:
    """Train from random weights, or from the weights of the model directory `init` (a longer
    recipe on top of an earlier run); a checkpoint in `workdir` takes precedence over both."""
    workdir.mkdir(parents=True, exist_ok=True)
    model = build_model(config, seed=cfg.seed)
    ckpt = workdir / "checkpoint.safetensors"
    if ckpt.exists():
        log("resuming from the checkpoint in " + str(workdir))
    elif init is not None:
        weights = mx.load(str(init / "model.safetensors"))
        model.load_weights([(k, v.astype(mx.float32)) for k, v in weights.items()])
        log(f"starting from {init}: held-out loss "
            f"{evaluate(model, heldout_tokens, cfg.seq_len):.3f}")
    tokens_per_step = cfg.batch_size * cfg.seq_len

    def progress(step: int, total: int, loss: float, rate: float) -> None:
        if step % cfg.log_every == 0:
            log(f"step {step}/{total} loss {loss:.3f} ({rate * tokens_per_step:,.0f} tok/s)")

    recipe = Recipe(steps=cfg.steps, lr=cfg.lr, warmup=cfg.warmup,
                    weight_decay=cfg.weight_decay, save_every=cfg.save_every)
    train(model, lambda x, y: lm_loss(model, x, y), partial(batch, train_tokens, cfg), recipe,
          ckpt, progress)
    held = evaluate(model, heldout_tokens, cfg.seq_len)
    (workdir / "metrics.json").write_text(json.dumps({"heldout_loss": held, "steps": cfg.steps}))
    log(f"held-out loss {held:.3f} (perplexity {math.exp(held):.1f})")
    return model
