"""Ratios of two decoders that one run each cannot settle (single runs here vary by ±10%)."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from ..drafters import Drafter
from ..model import TargetModel
from .runners import Runner


def abba(a: Callable[[], float], b: Callable[[], float], pairs: int = 3) -> dict:
    """tok/s of a ÷ tok/s of b, in ABBA order so a drift in machine speed cancels: the median
    of `pairs` ratios (a1 + a2) / (b1 + b2), and the ratios themselves."""
    ratios = []
    for _ in range(pairs):
        a1, b1, b2, a2 = a(), b(), b(), a()
        ratios.append((a1 + a2) / (b1 + b2))
    return {"median": statistics.median(ratios), "pairs": ratios}


def describe(p: dict) -> str:
    return f"{p['median']:.3f} (pairs: {', '.join(f'{r:.3f}' for r in p['pairs'])})"


def target_only_parity(run: Runner, target: TargetModel, target_name: str, temperature: float,
                       pairs: int, prompts: list[list[int]] | None = None) -> dict:
    """Our target-only decoding ÷ mlx-lm's generate_step on the same model and prompts."""
    return abba(lambda: run.ours(target, None, 1, "parity", "none", target_name, temperature,
                                 prompts=prompts).tok_s,
                lambda: run.mlx_lm(target, "parity", target_name, temperature,
                                   prompts=prompts).tok_s, pairs)


def auto_parity(run: Runner, target: TargetModel, drafter: Callable[[], Drafter], k: int,
                target_name: str, temperature: float, top_p: float, pairs: int) -> dict:
    """auto ÷ fixed k with the drafter `drafter()` gives, on the run's prompts in order (auto's
    policy carries over from one to the next, as in a conversation); each side is a fresh
    engine, as a row is."""
    def rate(num_draft: int | str) -> float:
        return run.ours(target, drafter(), num_draft, "parity", "", target_name, temperature,
                        top_p).tok_s

    return abba(lambda: rate("auto"), lambda: rate(k), pairs)
