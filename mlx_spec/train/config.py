"""A distillation run's settings (one reason to change: what a run can be asked for)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DistillConfig:
    steps: int = 1000
    minutes: float | None = None  # a time budget instead of `steps` (data generation included)
    batch_size: int = 8
    seq_len: int = 192
    lr: float = 2e-3
    warmup: int = 50
    depth: int = 8  # chained draft steps trained at once: every position `auto` may draft
    reweigh_every: int = 25  # steps between held-out estimates of the per-position weights
    weight_floor: float = 0.02  # positions weighing less than this are not trained (yet)
    seed: int = 0
    save_every: int = 100
