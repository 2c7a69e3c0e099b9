"""Train a small causal LM (any mlx-lm architecture, qwen3 by default) on token windows.

Resumable: a checkpoint (weights, optimizer state, step) is written every `save_every` steps and
picked up again by a later run with the same output directory.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

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


def lr_schedule(cfg: TrainConfig):
    warm = optim.linear_schedule(1e-5, cfg.lr, cfg.warmup)
    decay = optim.cosine_decay(cfg.lr, max(1, cfg.steps - cfg.warmup), cfg.lr * 0.05)
    return optim.join_schedules([warm, decay], [cfg.warmup])


def batches(tokens: np.ndarray, cfg: TrainConfig, start_step: int):
    """Random windows, re-seeded from (seed, step) so a resumed run sees the same data."""
    for step in range(start_step, cfg.steps):
        rng = np.random.default_rng((cfg.seed, step))
        starts = rng.integers(0, len(tokens) - cfg.seq_len - 1, cfg.batch_size)
        window = np.stack([tokens[s : s + cfg.seq_len + 1] for s in starts]).astype(np.int32)
        yield step, mx.array(window[:, :-1]), mx.array(window[:, 1:])


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
    workdir: Path, *, log=print,
) -> nn.Module:
    workdir.mkdir(parents=True, exist_ok=True)
    model = build_model(config, seed=cfg.seed)
    optimizer = optim.AdamW(learning_rate=lr_schedule(cfg), weight_decay=cfg.weight_decay)
    start = 0
    ckpt = workdir / "checkpoint.safetensors"
    if ckpt.exists():
        start = load_checkpoint(ckpt, model, optimizer)
        log(f"resumed from step {start}")

    state = [model.state, optimizer.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step_fn(x, y):
        loss, grads = nn.value_and_grad(model, lm_loss)(model, x, y)
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        optimizer.update(model, grads)
        return loss

    t0, seen, running = time.perf_counter(), 0, None
    for step, x, y in batches(train_tokens, cfg, start):
        loss = step_fn(x, y)
        mx.eval(state, loss)
        running = loss.item() if running is None else 0.95 * running + 0.05 * loss.item()
        seen += x.size
        if (step + 1) % cfg.log_every == 0:
            rate = seen / (time.perf_counter() - t0)
            log(f"step {step + 1}/{cfg.steps} loss {running:.3f} ({rate:,.0f} tok/s)")
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            save_checkpoint(ckpt, model, optimizer, step + 1)
    held = evaluate(model, heldout_tokens, cfg.seq_len)
    (workdir / "metrics.json").write_text(json.dumps({"heldout_loss": held, "steps": cfg.steps}))
    log(f"held-out loss {held:.3f} (perplexity {math.exp(held):.1f})")
    return model


def save_checkpoint(path: Path, model: nn.Module, optimizer: optim.Optimizer, step: int) -> None:
    flat = {f"model.{k}": v for k, v in tree_flatten(model.parameters())}
    flat.update({f"opt.{k}": v for k, v in tree_flatten(optimizer.state)})
    tmp = path.with_suffix(".tmp.safetensors")
    mx.save_safetensors(str(tmp), flat, metadata={"step": str(step)})
    tmp.replace(path)  # atomic: a kill mid-write never leaves a broken checkpoint


def load_checkpoint(path: Path, model: nn.Module, optimizer: optim.Optimizer) -> int:
    flat, meta = mx.load(str(path), return_metadata=True)
    model.update(tree_unflatten([(k[6:], v) for k, v in flat.items() if k.startswith("model.")]))
    optimizer.state = tree_unflatten([(k[4:], v) for k, v in flat.items() if k.startswith("opt.")])
    return int(meta["step"])
