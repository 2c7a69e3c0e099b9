"""Ratios of two decoders that one run each cannot settle (single runs here vary by ±10%)."""

from __future__ import annotations

import importlib
import statistics
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any, TypeVar

from mlx_spec.drafters import Drafter
from mlx_spec.engine import Engine
from mlx_spec.model import TargetModel

from .runners import FirstTurn, Row, Runner, new_engine

R = TypeVar("R")
Pairs = list[list[tuple[Any, Any]]]  # per pair, per side: its (first, second) result


def mirrored(sides: Sequence[Callable[[], R]], pairs: int) -> Pairs:
    """Each side run twice a pair in mirrored order (A B … B A: ABBA for two), so a linear drift
    in machine speed weighs every side alike."""
    out = []
    for _ in range(pairs):
        first = [side() for side in sides]
        second = [side() for side in reversed(sides)][::-1]
        out.append(list(zip(first, second, strict=True)))
    return out


def pair_ratios(runs: Pairs, a: int, b: int, value: Callable[[Any], float] = float) -> dict:
    """Side a ÷ side b of mirrored runs: the median of the pairs' (a1 + a2) / (b1 + b2) of
    `value`, and the ratios themselves."""
    ratios = [(value(p[a][0]) + value(p[a][1])) / (value(p[b][0]) + value(p[b][1]))
              for p in runs]
    return {"median": statistics.median(ratios), "pairs": ratios}


def abba(a: Callable[[], float], b: Callable[[], float], pairs: int = 3) -> dict:
    """tok/s of a ÷ tok/s of b, in ABBA order so a drift in machine speed cancels: the median
    of `pairs` ratios (a1 + a2) / (b1 + b2), and the ratios themselves."""
    return pair_ratios(mirrored([a, b], pairs), 0, 1)


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
    def rate(draft_length: int | str, seed: int) -> float:
        return run.ours(target, drafter(), draft_length, "parity", "", target_name, temperature,
                        top_p, seed=seed).tok_s

    return seeded_parity(lambda s: rate("auto", s), lambda s: rate(k, s), temperature, pairs)


def speedup_parity(run: Runner, target: TargetModel, drafter: Callable[[], Drafter],
                   target_name: str, temperature: float, top_p: float, pairs: int) -> dict:
    """auto with the drafter `drafter()` gives ÷ target-only, on the run's prompts in order:
    the speedup a row reports, in pairs (a row's target-only baseline is one run of its own)."""
    def rate(source: Drafter | None, draft_length: int | str, seed: int) -> float:
        return run.ours(target, source, draft_length, "parity", "", target_name, temperature,
                        top_p, seed=seed).tok_s

    return seeded_parity(lambda s: rate(drafter(), "auto", s), lambda s: rate(None, 1, s),
                         temperature, pairs)


def seeded_parity(a: Callable[[int], float], b: Callable[[int], float], temperature: float,
                  pairs: int) -> dict:
    """a ÷ b in mirrored pairs, each side called with its pair's seed. At T > 0 each pair
    draws with seeds of its own (both its sides the same ones): the median is then over as
    many draws as pairs, where one set of seeds for all would time one draw's luck eight times
    (at T = 1 on the widened target, auto ÷ k = 5 read 0.79–1.14 from one set of seeds to the
    next)."""
    runs: Pairs = []
    for pair in range(pairs):
        seed = pair_seed(pair, temperature)
        runs += mirrored([lambda s=seed: a(s), lambda s=seed: b(s)], 1)
    return pair_ratios(runs, 0, 1)


def pair_seed(pair: int, temperature: float) -> int:
    """The seed both sides of pair `pair` draw with: one of its own at T > 0, 0 at T = 0."""
    return 1000 * pair if temperature > 0 else 0


FIRST_TURN_SIDES = ("prior", "fixed", "known")  # the order of first_turn_parity's sides


def first_turn_parity(run: Runner, target: TargetModel, drafter: Drafter, k: int,
                      known: Engine, temperature: float, pairs: int) -> dict[str, Any]:
    """A conversation's first turn, three ways, in `pairs` mirrored pairs (prior, fixed, known,
    known, fixed, prior): `auto` on a fresh engine (costs: an empty store's prior), a fixed k on
    a fresh engine, and `auto` on `known`, an engine calibrated beforehand. The ratios: TTFT
    prior ÷ fixed and prior ÷ known, tok/s prior ÷ known and prior ÷ fixed; each side's median
    TTFT, tok/s, tokens and drafts per pass. At T > 0 each pair draws with a seed of its own
    (its sides the same one), as seeded_parity's do: with seed 0 for all, the hybrid target's
    tok/s prior ÷ known read 0.81 over 8 pairs of that one draw, and 1.36 over a script's two
    runs a side of the same code: the sides' texts part at their first different k."""
    runs: Pairs = []
    for pair in range(pairs):
        seed = pair_seed(pair, temperature)
        sides = [lambda s=seed: run.first_turn(new_engine(target, run.tokenizer, drafter, "auto"),
                                               temperature, seed=s),
                 lambda s=seed: run.first_turn(new_engine(target, run.tokenizer, drafter, k),
                                               temperature, seed=s),
                 lambda s=seed: run.first_turn(known, temperature, seed=s)]
        runs += mirrored(sides, 1)
    ttft, rate = attrgetter("ttft_s"), attrgetter("tok_s")
    return {"ttft_prior_vs_fixed": pair_ratios(runs, 0, 1, ttft),
            "ttft_prior_vs_known": pair_ratios(runs, 0, 2, ttft),
            "tok_s_prior_vs_known": pair_ratios(runs, 0, 2, rate),
            "tok_s_prior_vs_fixed": pair_ratios(runs, 0, 1, rate),
            "sides": {name: side_medians([t for p in runs for t in p[i]])
                      for i, name in enumerate(FIRST_TURN_SIDES)}}


def side_medians(turns: list[FirstTurn]) -> dict[str, float]:
    """The median of each of a side's first-turn figures."""
    return {"ttft_ms": 1e3 * statistics.median(t.ttft_s for t in turns),
            "tok_s": statistics.median(t.tok_s for t in turns),
            "tokens_per_pass": statistics.median(t.tokens_per_pass for t in turns),
            "drafted_per_pass": statistics.median(t.drafted_per_pass for t in turns)}


Log = Callable[[str], None]


def real_weights():
    """tools/real_weights (a checkout's tools/, not part of the wheel)."""
    try:
        return importlib.import_module("tools.real_weights")
    except ImportError as e:
        raise SystemExit("bench --group real runs from a checkout (tools/real_weights.py "
                         "fetches the models)") from e


def compare(sides: dict[str, Callable[[], Row]], pairs: int) -> tuple[list[Row], list]:
    """Every side run 2 × pairs times in mirrored order; a row per side (its first run, the
    tok/s replaced by the pooled tok/s of all its runs) and the raw runs."""
    names = list(sides)
    runs = mirrored([sides[n] for n in names], pairs)
    rows = []
    for i, _ in enumerate(names):
        mine = [r for p in runs for r in p[i]]
        row = mine[0]
        row.tok_s = sum(r.tok_s for r in mine) / len(mine)
        rows.append(row)
    return rows, runs


def ratio(runs, names: list[str], a: str, b: str) -> dict:
    return pair_ratios(runs, names.index(a), names.index(b), lambda r: r.tok_s)
