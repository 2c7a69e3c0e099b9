"""What the target costs on this machine: one verify pass over q tokens, and one pipelined plain
decoding step, timed on a scratch cache (the conversation's caches are never touched)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from ..model import TargetModel

LONGEST_TIMED_PASS = 16  # verify passes are timed up to this many tokens, whatever the draft length
# a q-token pass runs padded to q' > q tokens where q' took at most 85% of q (a looser gain
# padded for small gains on paper and lost in the loop: DESIGN.md, "Measurements behind the
# rules")
PAD_GAIN = 0.85


@dataclass(frozen=True)
class TargetCosts:
    """verify[q - 1]: seconds for one target pass over q tokens (q = 1..max_draft + 1), as it
    runs (padded where pad_to says), made non-decreasing (smooth_monotone); plain: seconds per
    token of pipelined plain decoding. pad_to[q - 1]: the tokens a q-token verify pass runs
    as (see `pad_targets`); empty where nothing was measured (a prior): q itself."""

    verify: tuple[float, ...]
    plain: float
    measured: bool = True  # False: a prior (calibration.prior), refined online
    pad_to: tuple[int, ...] = ()

    @property
    def max_draft(self) -> int:
        return len(self.verify) - 1

    def up_to(self, max_draft: int) -> TargetCosts:
        """The costs for drafts of at most `max_draft` tokens."""
        return TargetCosts(self.verify[: max_draft + 1], self.plain, self.measured, self.pad_to)

    def pass_size(self, q: int) -> int:
        """How many tokens a verify pass over q runs as: q, or a longer pass measured cheaper."""
        return self.pad_to[q - 1] if q <= len(self.pad_to) else q


class Stopped(Exception):
    """A measurement was asked to stop (a user's turn is waiting)."""


def measure_costs(target: TargetModel, max_draft: int, *, stop: Any = None) -> TargetCosts:
    """Calibrate both, one after the other, so they see the machine in the same state. stop
    (an Event-like `is_set()`): checked between timed passes; raises Stopped. Verify passes
    are timed up to LONGEST_TIMED_PASS tokens at least, so a shorter one can run as a cheaper
    longer one."""
    raw = measure_verify_costs(target, max(max_draft, LONGEST_TIMED_PASS - 1), smooth=False,
                               stop=stop)
    return TargetCosts(as_run(raw), measure_plain_cost(target, stop=stop),
                       pad_to=pad_targets(raw))


def as_run(raw: Sequence[float]) -> tuple[float, ...]:
    """Verify costs as the engine runs the passes: each q at the size it pads to
    (`pad_targets`), made non-decreasing (smooth_monotone)."""
    return smooth_monotone([raw[p - 1] for p in pad_targets(raw)])


def pad_targets(raw: Sequence[float], gain: float = PAD_GAIN) -> tuple[int, ...]:
    """For q = 1..len(raw), the pass size q' ≥ q to run a q-token verify as: the q' with the
    least time, taken only where it took at most `gain` of q's own. A pass's rows past the
    drafts are padding: their logits are not read and the commit cuts their cache entries with
    the rejected drafts'. Worth it where the device's matmul kernels are cheaper at some sizes
    than at smaller ones (OpenBLAS's: the cost climbs and falls every 16 rows)."""
    out = []
    for q in range(1, len(raw) + 1):
        best = min(range(q, len(raw) + 1), key=lambda p: raw[p - 1])
        out.append(best if raw[best - 1] <= gain * raw[q - 1] else q)
    return tuple(out)


def _check(stop: Any) -> None:
    if stop is not None and stop.is_set():
        raise Stopped


def _scratch(target: TargetModel, context: int, *, slack: int):
    """A scratch cache holding a fixed `context`-token prompt: (cache, prompt, its logits)."""
    cache = target.make_cache(slack=slack)
    prompt = [(i * 31) % max(2, target.vocab_size - 3) + 3 for i in range(context)]
    logits, _ = target.forward(prompt, cache)
    mx.eval(logits)
    return cache, prompt, logits


def measure_verify_costs(target: TargetModel, max_draft: int, *, context: int = 96,
                         repeats: int = 5, smooth: bool = True,
                         stop: Any = None) -> tuple[float, ...]:
    """Seconds for one target forward over q = 1..max_draft+1 tokens after `context` tokens, on a
    scratch cache: the fastest of `repeats` (other load only ever adds time), then made
    non-decreasing (smooth_monotone): a longer pass never reads cheaper. Not a line: on a CPU
    the cost steps where the kernels' shapes change, and a line through such steps prices deep
    rounds far above what they cost, so a policy that extrapolates from shallow rounds never
    goes deep (smooth=False: the fastest timings themselves, for the benchmark's
    efficiency)."""
    cache, prompt, _ = _scratch(target, context, slack=max_draft + 2)
    costs = []
    for q in range(1, max_draft + 2):
        times = []
        for _ in range(repeats + 1):
            _check(stop)
            t0 = time.perf_counter()
            logits, _ = target.forward(prompt[:q], cache)
            mx.eval(logits)
            times.append(time.perf_counter() - t0)
            target.trim(cache, context, have=context + q)
        costs.append(min(times[1:]))  # drop the warm-up
    return smooth_monotone(costs) if smooth else tuple(costs)


def measure_plain_cost(target: TargetModel, *, context: int = 96, steps: int = 8,
                       repeats: int = 3, stop: Any = None) -> float:
    """Seconds per token of plain decoding pipelined as the engine runs it (each step built on
    the previous step's still-lazy token before the host reads that), after `context` tokens:
    the fastest of `repeats` runs of `steps` steps. Measured beside c(q), so both see the
    machine in the same state; each then has its own drift factor (see AdaptiveDraftLength)."""
    cache, _, logits = _scratch(target, context, slack=steps + 2)
    first = mx.argmax(logits[-1])
    mx.eval(first)
    times = []
    for _ in range(repeats + 1):
        _check(stop)
        t0 = time.perf_counter()
        y = first
        for _ in range(steps):
            logits, _ = target.forward(y.reshape(1), cache)
            ahead = mx.argmax(logits[-1])
            mx.async_eval(ahead)
            y.item()
            y = ahead
        y.item()
        times.append((time.perf_counter() - t0) / steps)
        target.trim(cache, context, have=context + steps)
    return min(times[1:])  # drop the warm-up


def smooth_monotone(costs: Sequence[float]) -> tuple[float, ...]:
    """The closest non-decreasing sequence in least squares (pooling adjacent violators: a run
    that falls is replaced by its mean), so the timings' steps are kept and a dip is not."""
    pools: list[list[float]] = []  # [sum, count] of each pool, their means non-decreasing
    for c in costs:
        pools.append([c, 1.0])
        while len(pools) > 1 and pools[-2][0] / pools[-2][1] > pools[-1][0] / pools[-1][1]:
            s, n = pools.pop()
            pools[-1][0] += s
            pools[-1][1] += n
    return tuple(max(s / n, 1e-6) for s, n in pools for _ in range(int(n)))


def smooth_linear(costs: Sequence[float]) -> tuple[float, ...]:
    """Least-squares line through (q, cost), with a slope of at least 0."""
    n = len(costs)
    xs = range(n)
    mx_, my = (n - 1) / 2, sum(costs) / n
    var = sum((x - mx_) ** 2 for x in xs) or 1.0
    slope = max(0.0, sum((x - mx_) * (c - my) for x, c in zip(xs, costs, strict=True)) / var)
    intercept = my - slope * mx_
    return tuple(max(intercept + slope * x, 1e-6) for x in xs)


def steps_off_line(costs: Sequence[float]) -> list[float]:
    """What a line cannot follow in verify costs: each c(q) less their least-squares line. A
    round's cost steps where its verify pass's does: priced by a line alone, shallow rounds
    overprice deep ones and a sampled turn stays shallow. The fitted round line carries them
    (AdaptiveDraftLength)."""
    return [c - v for c, v in zip(costs, smooth_linear(costs), strict=True)]


def shrunk_line(sums: Sequence[float], b0: float, weight: float) -> tuple[float, float]:
    """(a, b) of the weighted least-squares line t = a + b·x through the sums Σw, Σw·x, Σw·x²,
    Σw·t, Σw·x·t, its slope shrunk toward b0 with `weight` (in units of Σw(x − x̄)²: points
    all at one x keep b0 and fix the level), and at least 0."""
    w, sx, sxx, st, sxt = sums
    xbar, tbar = sx / w, st / w
    spread, cov = sxx - w * xbar**2, sxt - w * xbar * tbar  # Σw(x − x̄)², Σw(x − x̄)(t − t̄)
    b = max((cov + weight * b0) / (spread + weight), 0.0)
    return tbar - b * xbar, b


def remember(table: list[list[float]], k: int, seconds: float, keep: float) -> None:
    """A round (or cycle) at k took `seconds`: every k's (Σw, Σw·t) forgets `keep`, k's gains
    it (see `on_the_line`)."""
    for row in table:
        row[0], row[1] = keep * row[0], keep * row[1]
    table[k][0] += 1.0
    table[k][1] += seconds


def on_the_line(line: Sequence[float], table: Sequence[Sequence[float]],
                weight: float) -> list[float]:
    """Each k's cost: its own timed mean (Σw·t / Σw) shrunk toward the fitted line's value
    with `weight` (in rounds). The line carries the k's not timed lately and the slope the
    choice climbs by; the means keep what a line cannot follow. On a CPU a round's cost steps
    where the kernels' shapes change, and a line through such steps overprices the k's below
    a step."""
    return [(s + weight * v) / (w + weight) for v, (w, s) in zip(line, table, strict=True)]
