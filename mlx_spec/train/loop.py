"""The one training loop: AdamW with linear warm-up then cosine decay, a compiled step with
gradient clipping, resumable checkpoints. The target trainer (target.py) and the drafter
distiller (distill.py) both run through it; they differ only in their loss and their batches.

Resumable: a checkpoint (weights, optimizer state, step) is written every `save_every` steps and
at the end, atomically, and a later run with the same checkpoint path continues from it. Batches
come from `batch(step)`, which must depend on the step alone, so a resumed run sees the same data.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_unflatten

# progress(step, total, running loss, steps per second)
Progress = Callable[[int, int, float, float], None]


@dataclass(frozen=True)
class Recipe:
    """`steps` steps, or with `seconds` as many as fit in that much training time (steps is
    then only an upper bound): the cosine decay runs over the time instead of the steps."""

    steps: int
    lr: float
    warmup: int
    weight_decay: float = 0.01
    save_every: int = 100
    clip: float = 1.0
    seconds: float | None = None

    def optimizer(self) -> optim.Optimizer:
        if self.seconds is not None:  # the rate is set before every step (lr_at)
            return optim.AdamW(learning_rate=self.lr, weight_decay=self.weight_decay)
        warm = optim.linear_schedule(1e-5, self.lr, self.warmup)
        decay = optim.cosine_decay(self.lr, max(1, self.steps - self.warmup), self.lr * 0.05)
        return optim.AdamW(learning_rate=optim.join_schedules([warm, decay], [self.warmup]),
                           weight_decay=self.weight_decay)

    def lr_at(self, step: int, elapsed: float) -> float:
        """Timed runs: linear warm-up over steps, then cosine over the time budget to 5%."""
        if step < self.warmup:
            return 1e-5 + (self.lr - 1e-5) * step / self.warmup
        done = min(1.0, elapsed / self.seconds) if self.seconds else 1.0
        return self.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * done)))


def train(module: nn.Module, loss_fn: Callable[..., mx.array],
          batch: Callable[[int], tuple[mx.array, ...]], recipe: Recipe, checkpoint: Path,
          progress: Progress | None = None,
          evaluate: tuple[float, Callable[[int, float], None]] | None = None, *,
          deadline: float | None = None, reserve: float = 0.0,
          saved: Callable[[int, float], None] | None = None) -> float:
    """Optimise `module`'s trainable parameters on loss_fn(*batch(step)); returns the final
    running loss (an exponential average, 0.95). evaluate = (every seconds, fn(step, training
    seconds so far)): called that often and at the end; its own time is not training time.
    deadline: a wall-clock end (time.perf_counter()) that the last evaluation must fit before
    too: training stops when what is left is no more than the longest evaluation so far
    (`reserve`: one the caller timed before). saved(step, loss): after every checkpoint."""
    opt = recipe.optimizer()
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    start = load_checkpoint(checkpoint, module, opt) if checkpoint.exists() else 0
    state = [module.state, opt.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step_fn(*xs):
        loss, grads = nn.value_and_grad(module, loss_fn)(*xs)
        grads, _ = optim.clip_grad_norm(grads, recipe.clip)
        opt.update(module, grads)
        return loss

    running, trained, step = math.nan, 0.0, start
    next_eval = evaluate[0] if evaluate else math.inf
    saved_at = evaluated_at = start

    def late() -> bool:
        return deadline is not None and time.perf_counter() + reserve >= deadline

    while (step < recipe.steps and (recipe.seconds is None or trained < recipe.seconds)
           and not (late() and step > start)):
        t = time.perf_counter()
        if recipe.seconds is not None:
            opt.learning_rate = recipe.lr_at(step, trained)
        loss = step_fn(*batch(step))
        mx.eval(state, loss)
        trained += time.perf_counter() - t
        step += 1
        running = loss.item() if math.isnan(running) else 0.95 * running + 0.05 * loss.item()
        rate = (step - start) / trained
        timed_out = recipe.seconds is not None and trained >= recipe.seconds or late()
        if progress is not None:  # a timed run's total: what the remaining time will allow
            total = (recipe.steps if recipe.seconds is None else
                     step + int(rate * max(0.0, recipe.seconds - trained)))
            progress(step, total, running, rate)
        if step % recipe.save_every == 0 or step == recipe.steps or timed_out:
            save_checkpoint(checkpoint, module, opt, step)
            saved_at = step
            if saved is not None:
                saved(step, running)
        if evaluate and (trained >= next_eval or step == recipe.steps or timed_out):
            t = time.perf_counter()
            evaluate[1](step, trained)
            evaluated_at = step
            reserve = max(reserve, time.perf_counter() - t)
            next_eval = trained + evaluate[0]
    # the deadline can end the loop at its top, after a step it did not expect to be the last
    # (a resumed sitting has measured no evaluation to keep room for): that step is kept and
    # scored too
    if saved_at < step:
        save_checkpoint(checkpoint, module, opt, step)
        if saved is not None:
            saved(step, running)
    if evaluate and evaluated_at < step:
        evaluate[1](step, trained)
    return running


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


def checkpoint_step(path: Path) -> int:
    """The steps a checkpoint has trained (a timed run's count is known only at its end)."""
    return int(mx.load(str(path), return_metadata=True)[1]["step"])
