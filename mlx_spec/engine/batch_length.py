"""The server's cap on a batched cycle's draft length: several conversations verified in ONE
target pass price one more draft at the batch's tokens, not one row's (see the class)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .costs import on_the_line, remember, shrunk_line

if TYPE_CHECKING:
    from .adaptive import AdaptiveDraftLength


OPENING_DRAFTED = 2  # cycles each batch size drafts (k >= 1) after its plain one, whatever b0


class BatchDraftLength:
    """The most drafts a row may make in a cycle that verifies B >= 2 conversations in ONE
    target pass (the server's scheduler; alone, a policy is uncapped).

    Alone, a round of k drafts is priced by its own pass c(k+1), whose slope is small where
    the target is memory-bound. A batch shares one pass, and batch.py right-pads every row to
    the widest: a cycle whose rows draft up to k carries B·(k+1) tokens through the target, so
    one more draft each costs ~B tokens' worth and, once the pass is compute-bound, more than
    the B·α tokens it brings. A cycle (every row's drafting and host work, then the pass) costs

        T_B(k) = H + k·Σ_r d_r + V(B·(k+1))        (V(q): a pass over q tokens)

    and emits N_B(k) = Σ_r E_r(k) tokens, E_r from row r's own acceptance estimates (the
    policy's expectation, `AdaptiveDraftLength.expected`, at most as deep as the row's
    evidence reaches); N_B(0) = B: every row plain, the batch's B tokens at the cost of a
    B-token pass. The cap is argmax_k N_B(k) / T_B(k): k = 0, speculation off for the cycle,
    wherever no common k beats plain decoding in tokens/second.

    One k for all rows, not one per row: with right-padding a row drafting less than the
    widest saves only its own drafting time. In a batch the cap is the decision: each row
    drafts min(cap, its policy's max_draft_now()), and its own policy learns acceptance from
    the round but not costs (a row's round takes the whole cycle: priced as one row's, a batch
    of rows that each pays would read as each losing, and every row would turn itself off).
    B = 1 is no cap: the policy alone, as it was.

    T_B is measured, not assumed. Each batch size B opens with a plain cycle, which times
    T_B(0) itself, then OPENING_DRAFTED cycles that draft (at least one each), so the line
    has a measured slope before b0 can keep speculation off; from then on T_B is a line
    a + b·k by least squares over the cycles timed at that size (forgetting `keep` per
    cycle), its slope shrunk toward the model's
    b0 = Σ_r d_r + B·s with weight `slope_weight` (s: the calibrated c's slope per token, so
    b0 extrapolates the one-row line c(1) + s·(q − 1) past its table, q ≤ max_draft + 1). Where
    the pass turns compute-bound its slope grows past b0, and the cycles drafted at that size
    correct it. Cycles all at one k would leave the slope at b0, so now and then a cycle runs
    one draft below the best (k = 1 where the best is 0: b0 can read too steep, the pass of
    B·(k+1) tokens on a CPU costing far less than B times one row's slope), as rarely as keeps
    its loss (1 − rate(other)/rate(best) of a cycle, as estimated) within `probe_budget` of
    the cycles between (at most one in `explore_every`). Each k's own timed mean is shrunk
    toward the line (costs.on_the_line): a pass over B·(k+1) tokens on a CPU steps with the
    kernels' shapes."""

    def __init__(self, *, keep: float = 0.99, slope_weight: float = 0.5,
                 explore_every: int = 8, probe_budget: float = 0.01, table_weight: float = 8.0):
        self.keep, self.slope_weight = keep, slope_weight
        self.explore_every, self.probe_budget = explore_every, probe_budget
        self.fits: dict[int, list[float]] = {}  # B → Σw, Σw·k, Σw·k², Σw·t, Σw·k·t
        self.since_probe = 0  # cycles since one ran below the best
        self.opened: dict[int, int] = {}  # B → drafted cycles its opening has issued
        self.timed: dict[int, list[list[float]]] = {}  # B → each k's (Σw, Σw·t)
        self.table_weight = table_weight

    def cap(self, policies: Sequence[AdaptiveDraftLength],
            verify_costs: Sequence[float]) -> int | None:
        """The cap for a cycle over these rows' policies (None for fewer than two rows);
        verify_costs: the calibrated c(q), q = 1..max_draft + 1 (its slope gives b0)."""
        if len(policies) < 2:
            return None
        if len(policies) not in self.fits:
            return 0  # a batch size's first cycle: plain, its time is T_B(0)
        top = min(p.max_draft for p in policies)
        tokens = self.expected_tokens(policies, top)
        drafting = sum(p.draft_cost for p in policies)
        seconds = self.cycle_costs(len(policies), top, drafting, verify_costs)
        rate = [n / t for n, t in zip(tokens, seconds, strict=True)]
        best = max(range(top + 1), key=rate.__getitem__)
        opened = self.opened.get(len(policies), 0)
        if opened < OPENING_DRAFTED and top:  # a new size's slope is b0 alone: time drafts
            self.opened[len(policies)] = opened + 1  # at once (issued, so a busy server
            return max(best, 1)  # whose cycles go untimed cannot stay in its opening)
        return self.explore(best, rate)

    @staticmethod
    def expected_tokens(policies: Sequence[AdaptiveDraftLength], top: int) -> list[float]:
        """N_B(k) = Σ_r E_r(min(k, reach_r)) for k = 0..top: under the cap each row drafts
        as deep as its evidence reaches (AdaptiveDraftLength.max_draft_now)."""
        rows = [p.expected() for p in policies]
        reach = [p.max_draft_now() for p in policies]
        return [sum(e[min(k, m)] for e, m in zip(rows, reach, strict=True))
                for k in range(top + 1)]

    def cycle_costs(self, rows: int, top: int, drafting: float,
                    verify_costs: Sequence[float]) -> list[float]:
        """T_B(k) for k = 0..top, the line fitted to this batch size's cycles (at least one
        timed); drafting: Σ_r d_r, the seconds one more common draft adds to the drafting."""
        c = verify_costs
        s = (c[-1] - c[0]) / max(len(c) - 1, 1)  # the calibrated line's slope per token
        a, b = shrunk_line(self.fits[rows], drafting + rows * s, self.slope_weight)
        table = self.timed[rows] + [[0.0, 0.0]] * (top + 1 - len(self.timed[rows]))
        own = on_the_line([a + b * k for k in range(top + 1)], table[: top + 1],
                          self.table_weight)
        return [max(t, 1e-6) for t in own]

    def explore(self, best: int, rate: Sequence[float]) -> int:
        """best, or now and then its neighbour (see the class: the line's slope needs two
        k's): best − 1, or k = 1 where speculation is off (else a slope the model's b0 set
        too steep would keep it off for good)."""
        if len(rate) < 2:
            return best
        self.since_probe += 1
        other = best - 1 if best else 1
        loss = max(0.0, 1 - rate[other] / rate[best])
        if self.since_probe >= max(self.explore_every, math.ceil(loss / self.probe_budget)):
            self.since_probe = 0
            return other
        return best

    def observe(self, rows: int, k: int, seconds: float) -> None:
        """A cycle verified `rows` rows, the widest with k drafts, in `seconds` (its drafting,
        host work and pass: the pass synced inside it)."""
        table = self.timed.setdefault(rows, [])
        table += [[0.0, 0.0] for _ in range(k + 1 - len(table))]
        remember(table, k, seconds, self.keep)
        fit = self.fits.get(rows, [0.0] * 5)
        self.fits[rows] = [self.keep * f + x
                           for f, x in zip(fit, (1.0, k, k * k, seconds, k * seconds),
                                           strict=True)]
