"""Ratios of two decoders that one run each cannot settle (single runs here vary by ±10%)."""

from __future__ import annotations

import statistics
from collections.abc import Callable


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
