"""Choosing the draft length k each round to maximise expected tokens per second.

A round with k drafts emits E(k) = 1 + Σ_{i≤k} Π_{j≤i} α_j tokens on average (α_i: draft i is
accepted given drafts 1..i-1 were; the +1 is the target's own token) and costs T(k); the policy
picks argmax_k E(k) / T(k), with k = 0 (plain decoding, E = 1, T(0) = r0·p) when speculation
cannot pay. T(k) = o + k·d + r·c(k+1) from the calibrated verify costs c(q) until fused rounds
have run, then r times a least-squares line a + b·k through their times (with forgetting) plus
the calibrated passes' steps (on a CPU a pass steps where kernel shapes change), its slope
shrunk toward the model's, each k's own timed mean shrunk toward that (costs.on_the_line).
o, d, r and r0 are fitted online: d and r from the rounds timed in parts (`split()`), r0 from
whole plain runs (`observe_plain`). On a prior (costs not calibrated on this target), r·c(q) is
the line fitted to those rounds' own verify passes once two lengths q have been timed
(`_learn_shape`): the prior's scale and shape both give way.

Each α_i is shrunk toward its neighbour (α_1 toward the drafter's long-run record); the on/off
decision reads them one standard error high while speculation is on and as estimated while it
is off (hysteresis). Evidence ages with every emitted token (`age`), a new turn keeps `carry`
of it (`new_turn`); probes keep α_1 measured while off, and one draft past the choice is tried
now and then while on. docs/DESIGN.md ("Draft length") gives the reasons and the measurements
behind each rule.

Several conversations verified in one pass (the server): `BatchDraftLength` (batch_length.py)
caps every row's k at the common k that maximises the batch's tokens per second, the pass
priced at its total tokens; alone (no cap), a policy chooses as above.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import accumulate
from operator import mul

from .costs import on_the_line, remember, shrunk_line, smooth_linear, steps_off_line

OPENING_PLAIN = 2  # plain tokens a policy on a prior opens with (see AdaptiveDraftLength.opening)
# ... owed until speculation's lead would hold even if plain decoding cost this share of its
# bound c(1) (pipelined, it reads 0.72 of a synced one-token pass on the demo q8, ~0.9 on f32)
PLAIN_FLOOR = 0.7
# how much dearer than a round at the deepest measured depth (+ 1) a round past it may be
GUESS = 0.1


def expected_by_k(alphas: Sequence[float]) -> list[float]:
    """E(k) = 1 + Σ_{m≤k} Π_{j≤m} α_j for k = 0..len(alphas), in one pass: the tokens a round
    of k drafts emits, α_j the chance draft j is accepted given the ones before it were."""
    return list(accumulate(accumulate(alphas, mul), initial=1.0))


class AdaptiveDraftLength:
    """Online per-position acceptance + costs fitted from the rounds → k for the next round."""

    def __init__(self, verify_costs: Sequence[float], *, plain_cost: float | None = None,
                 draft_cost: float | None = None,
                 prior: float = 0.6, prior_weight: float = 2.0, depth_weight: float = 0.5,
                 decay: float = 0.96,
                 carry: float = 0.3, probe_every: int = 16, explore_every: int = 8,
                 split_every: int = 8, plain_every: int = 32, plain_probe: int = 4,
                 optimism: float = 1.0, probe_budget: float = 0.01, fit_keep: float = 0.97,
                 slope_weight: float = 4.0, shape_weight: float = 0.5,
                 long_keep: float = 0.99, table_weight: float = 8.0, measured: bool = True):
        """measured: False when the costs are a prior (not calibrated on this target): then the
        policy opens with rounds timed in parts, whose verify passes replace the prior's scale
        and, once two lengths are timed, its shape (see `_learn_shape`), and a short plain run
        that sets T(0) outright once measuring it could matter (see `opening`)."""
        self.measured = measured
        self.costs = tuple(verify_costs)
        # on a prior: its shape as a slope per token relative to c(1), and the split rounds'
        # verify passes (q = k + 1, seconds) as the sums Σw, Σw·q, Σw·q², Σw·v, Σw·q·v
        self.prior_slope = (self.costs[-1] / self.costs[0] - 1) / max(len(self.costs) - 1, 1)
        self.shape, self.shape_weight = [0.0] * 5, shape_weight
        self.max_draft = len(self.costs) - 1
        self.plain_timed = False  # has a plain run refined r0 yet?
        self.opening_due = False  # on a prior: plain tokens owed once its shape is known
        self.shaped = False  # has a prior's shape been replaced by measured passes?
        self.opening_rounds = 0  # drafting rounds while the opening was due
        self.scaled = False  # has a prior's scale been replaced by a measured pass?
        # α_i as (accepted, seen) with exponential forgetting; priors enter in alphas()
        self.accepted = [0.0] * self.max_draft
        self.seen = [0.0] * self.max_draft
        self.prior, self.prior_weight, self.depth_weight = prior, prior_weight, depth_weight
        self.long, self.long_keep = (0.0, 0.0), long_keep  # α_1's long-run (accepted, seen)
        self.optimism = optimism  # standard errors added to each α for the on/off decision
        self.draft_cost = draft_cost if draft_cost is not None else 0.1 * self.costs[0]
        self.overhead = 0.0  # o: seconds per round outside drafting and verifying
        # the fused rounds' times at r = 1 against k, forgetting `fit_keep` per round: the sums
        # Σw, Σw·k, Σw·k², Σw·t, Σw·k·t of a weighted least-squares line (see fitted_line)
        self.fit = [0.0] * 5
        # the same rounds' (Σw, Σw·t) at each k, for the k's the line misprices (on_the_line)
        self.timed = [[0.0, 0.0] for _ in range(self.max_draft + 1)]
        self.table_weight = table_weight
        self.fit_keep, self.slope_weight = fit_keep, slope_weight
        # p: plain decoding's calibrated seconds per token; pipelined, it cannot cost more than
        # a synced one-token pass, so a timing disturbed upward is capped at c(1)
        self.plain_cost = min(plain_cost or self.costs[0], self.costs[0])
        self.slowdown = 1.0  # r: measured verify time / calibrated c(k+1)
        self.r_timed = False  # has a timed verify pass set r yet?
        self.plain_drift = 1.0  # r0: measured plain token time / calibrated p
        self.plain_left = 0  # tokens left of a plain probe (see choose)
        self.decay, self.carry = decay, carry
        self.probe_every, self.explore_every = probe_every, explore_every
        self.rounds_off = self.rounds_on = self.rounds_drafted = 0
        self.on = True  # speculating (see choose: the on/off decision has hysteresis)
        self.split_every = split_every
        self.plain_every, self.plain_probe = plain_every, plain_probe
        self.plain_gap, self.since_plain = plain_every, 0  # rounds between plain probes
        self.probe_gap = probe_every  # rounds between probes while off (see choose)
        self.probe_budget = probe_budget  # a probe's loss, as a share of the time between
        self.batched = False  # the last choice was made under a cap (its round is batched)
        if not measured:
            self.opening()

    def alphas(self) -> list[float]:
        """α_1 shrunk toward baseline() (weight `prior_weight`, in rounds), each deeper α_i
        toward the estimate before it (weight `depth_weight`)."""
        out, mean = [], self.baseline()
        for a, s, w in zip(self.accepted, self.seen, self._weights(), strict=True):
            mean = (a + w * mean) / (s + w)
            out.append(mean)
        return out

    def baseline(self) -> float:
        """What α_1 falls back to as its evidence fades: the drafter's long-run first-draft
        acceptance (forgetting `long_keep` per tested round) less what α_1's own evidence
        already holds (no round counted twice), shrunk toward the prior."""
        a = max(self.long[0] - self.accepted[0], 0.0)
        s = max(self.long[1] - self.seen[0], a)
        return (a + self.prior_weight * self.prior) / (s + self.prior_weight)

    def optimistic(self, alphas: list[float]) -> list[float]:
        """Each α_i (as alphas() gives them) one `optimism` standard error higher:
        √(α(1 − α)/n), n its evidence (what it has seen, plus its shrinkage's weight)."""
        return [min(1.0, a + self.optimism * (a * (1 - a) / (s + w)) ** 0.5)
                for a, s, w in zip(alphas, self.seen, self._weights(), strict=True)]

    def _weights(self) -> list[float]:
        return [self.prior_weight] + [self.depth_weight] * (self.max_draft - 1)

    def expected_tokens(self, k: int) -> float:
        return expected_by_k(self.alphas())[k]

    def expected(self) -> list[float]:
        """E(k) for k = 0..max_draft, from the estimates themselves."""
        return expected_by_k(self.alphas())

    def model_cost(self, k: int) -> float:
        """T(k) from the fitted terms (k >= 1)."""
        return max(self.overhead + k * self.draft_cost + self.slowdown * self.costs[k], 1e-6)

    def round_cost(self, k: int) -> float:
        """T(k): plain decoding's r0·p for k = 0; else r times the line fitted to the fused
        rounds (the model itself until one has run)."""
        return self.round_costs(k)[k]

    def round_costs(self, top: int) -> list[float]:
        """T(k) for k = 0..top, the line solved once; each k's timed mean shrunk toward it."""
        plain = self.plain_drift * self.plain_cost
        if self.fit[0] <= 0.0:
            return [plain] + [self.model_cost(k) for k in range(1, top + 1)]
        a, b = self.fitted_line()
        line = [a + b * k + s for k, s in enumerate(self.steps()[: top + 1])]
        own = on_the_line(line, self.timed[: top + 1], self.table_weight)
        return [plain] + [max(self.slowdown * t, 1e-6) for t in own[1:]]

    def fitted_line(self) -> tuple[float, float]:
        """(a, b) of T(k)/r = a + b·k + s(k) (s: steps) fitted to the fused rounds, b shrunk
        toward the model's b0 = d/r + c' (c's line) by `slope_weight` rounds one k apart: rounds
        all at one k fix the level, rounds at other k (exploration, climbs) correct b."""
        line = smooth_linear(self.costs)
        b0 = self.draft_cost / self.slowdown + (line[-1] - line[0]) / max(self.max_draft, 1)
        return shrunk_line(self.fit, b0, self.slope_weight)

    def steps(self) -> list[float]:
        """s(k): c's steps off its line (costs.steps_off_line); 0 on a prior (not ours)."""
        return steps_off_line(self.costs) if self.measured else [0.0] * (self.max_draft + 1)

    def rate(self, k: int) -> float:
        """Expected tokens per second with k drafts."""
        return self.expected_tokens(k) / self.round_cost(k)

    def choose(self, limit: int | None = None, *, cap: int | None = None) -> int:
        """The next round's k, at most `limit`; cap: the most drafts the batch this round
        verifies in allows (BatchDraftLength; None: verified alone, this policy decides)."""
        top = self.max_draft if limit is None else min(self.max_draft, limit)
        self.batched = cap is not None
        if cap is not None:
            # in a batch the batch has priced the cycle (BatchDraftLength: its pass, every
            # row's drafting, every row's acceptance): this row drafts up to the cap, as deep
            # as its evidence reaches; its own costs are a lone row's and stay untouched, its
            # on/off state kept for when it is alone again. A cap of 0: plain, no probe (it
            # would widen every row's pass)
            return min(top, cap, self.max_draft_now())
        cost = self.round_costs(top)
        alphas = self.alphas()
        expected = expected_by_k(alphas)
        # hysteresis: staying on reads each α one standard error high (a few rejections are
        # thin evidence); turning on reads the estimates themselves, so one lucky probe, whose
        # untried deeper positions would read ~1 optimistically, cannot switch it on
        reading = expected_by_k(self.optimistic(alphas)) if self.on else expected
        if max(range(top + 1), key=lambda k: reading[k] / cost[k]) == 0:
            self.on = False
            self.rounds_off += 1
            if self.rounds_off >= self.probe_gap and top >= 1:
                # probe: keep α_1 and d measured while speculation is off. Where it could not
                # pay even if every draft were accepted (a quantized target on a CPU), each
                # probe doubles the wait, so probes cost less and less. Elsewhere the wait is
                # what keeps a probe's loss against plain decoding (T(1)/T(0) − E(1) plain
                # tokens' worth) under `probe_budget` of the plain tokens between probes
                self.rounds_off = 0
                most = 64 * self.probe_every
                if self._cost_bound(cost):
                    self.probe_gap = min(2 * self.probe_gap, most)
                else:
                    loss = max(0.0, cost[1] / cost[0] - expected[1])
                    self.probe_gap = min(max(self.probe_every,
                                             math.ceil(loss / self.probe_budget)), most)
                return 1
            return 0
        best = max(range(1, self.max_draft_now(cost, top) + 1), key=lambda k: expected[k] / cost[k])
        self.on = True
        if self.rounds_off or self.probe_gap != self.probe_every:
            self.rounds_off, self.probe_gap = 0, self.probe_every  # on again: probes reset
        if self.plain_left:
            self.plain_left -= 1
            return 0
        self.rounds_on += 1
        self.since_plain += 1
        # plain probe: measure what k = 0 costs now. Its tokens come at plain decoding's rate:
        # m of them lose m·T(0)·(1 − 1/lead) against speculating, so they wait as many rounds
        # as keep that within `probe_budget` of the time between probes (where speculation
        # leads by far, a drift in r0 could not flip the choice anyway)
        lead = expected[best] / cost[best] * cost[0]
        loss = self.plain_probe * cost[0] * max(0.0, 1 - 1 / lead)
        self.plain_gap = min(max(self.plain_every, math.ceil(
            loss / (self.probe_budget * cost[best]))), 64 * self.plain_every)
        if self.since_plain >= self.plain_gap:
            self.since_plain = 0
            self.plain_left = self.plain_probe - 1
            return 0
        # explore: measure the position just past the current choice; every other round while
        # the policy is new (its first estimates come from a handful of rounds), then rarely
        every = 2 if self.rounds_on <= 16 else self.explore_every
        if self.rounds_on % every == 0 and best < top:
            return best + 1
        return best

    def max_draft_now(self, cost: Sequence[float] | None = None, top: int | None = None) -> int:
        """The deepest k to draft now: one past the deepest position measured. A climb goes
        one depth at a time: a k past the measured depths (plus one) is an estimate built on
        estimates, so one lucky round cannot send k from 3 to 7 — where such a guess is dear.
        Given the round costs T(0..top): deeper still, as far as a round costs at most GUESS
        more than one at that depth. Where verifying more tokens is nearly free (a memory-bound
        target), a wrong guess costs little and the climb cost much: deep positions are measured
        only in rounds that get there, their evidence ages with the text, and a climb one depth
        a round started after every phase change of a looping text (DESIGN.md, "Measurements")."""
        measured = next((i for i, s in enumerate(self.seen) if s < 1.0), self.max_draft)
        top = self.max_draft if top is None else min(top, self.max_draft)
        reach = min(top, measured + 1)
        if cost is None:
            return reach
        return max(k for k in range(reach, top + 1) if cost[k] <= (1 + GUESS) * cost[reach])

    def split(self) -> bool:
        """Should this drafting round be timed in parts (the draft synced before the verify)?
        The first few, then one in `split_every`: d and r stay measured, the rest run fused.
        Never in a batch: its times are the batch's, not this row's (see observe)."""
        if self.batched:
            return False
        self.rounds_drafted += 1
        return self.rounds_drafted <= 3 or self.rounds_drafted % self.split_every == 0

    def observe(self, k: int, n: int, draft_seconds: float | None = None, *,
                verify_seconds: float | None = None, round_seconds: float | None = None,
                fed: int = 1, evidence: Sequence[tuple[float, float]] | None = None) -> None:
        """A round drafted k tokens, the target accepted n; its timings, how many tokens the
        drafter was fed before drafting (its catch-up), and per position the chances it was
        tested and accepted (Verdict.evidence; None: n's 0/1 outcomes). A fused round (draft
        and verify one device graph, one host sync) has only its round time: it refines the
        fixed cost o and the fitted line. A round verified in a batch (chosen under a cap)
        teaches acceptance only: its times are the batch's (BatchDraftLength learns them)."""
        if self.batched:
            draft_seconds = verify_seconds = round_seconds = None
        if verify_seconds is not None and verify_seconds > 0:
            ratio = verify_seconds / self.costs[k]
            if not self.measured and not self.scaled:  # a prior's scale: replace it
                self._rescale(ratio)
                ratio = 1.0
            # the first timed pass sets r outright: fused rounds are stored in units of r
            # (fit), so r must be near its level before they come, not 0.9^n of the way from
            # 1 (the loop's verify can cost well over the calibrated pass: 1.4x on the tiny
            # demo target, where a fused round then read 1.4x dearer than it ran)
            keep = 0.9 if self.r_timed else 0.0
            self.slowdown = keep * self.slowdown + (1 - keep) * ratio
            self.r_timed = True
            if not self.measured:  # and its shape, once two lengths are timed
                self._learn_shape(k + 1, verify_seconds)
        if k and draft_seconds is not None and fed <= self.max_draft + 1:  # not a catch-up
            self.draft_cost = 0.8 * self.draft_cost + 0.2 * draft_seconds / k
        if round_seconds is not None and draft_seconds is None and fed <= self.max_draft + 1:
            # o is what the model leaves unexplained (it may be < 0: overlap the sync saves);
            # only fused rounds, the loop as it runs (a split round pays a sync of its own)
            rest = round_seconds - k * self.draft_cost - self.slowdown * self.costs[k]
            self.overhead = 0.9 * self.overhead + 0.1 * rest
            if k:
                t = round_seconds / self.slowdown
                u = t - self.steps()[k]  # on the line (fitted_line)
                self.fit = [self.fit_keep * f + x
                            for f, x in zip(self.fit, (1.0, k, k * k, u, k * u), strict=True)]
                remember(self.timed, k, t, self.fit_keep)
        if k == 0:
            return
        # evidence ages with the text, by the round's tokens, at every position, tested or
        # not: a position the current k does not reach must not keep what it showed on text
        # long gone (after a hard turn, an easy one would climb back one stale depth at a time)
        self.age(n + 1)
        # greedy: position i was tested only if 1..i-1 were accepted
        evidence = evidence or [(1.0, float(i < n)) for i in range(min(k, n + 1))]
        a, s = self.long
        self.long = (self.long_keep * a + evidence[0][1], self.long_keep * s + 1)
        for i, (tested, hit) in enumerate(evidence):
            self.seen[i] += tested
            self.accepted[i] += hit
        self.opening_rounds += self.opening_due
        if self.opening_due and (not self.shaped and self.opening_rounds >= 3
                                 or self.shaped and PLAIN_FLOOR * self._lead() < 1):
            self.opening_due, self.plain_left = False, OPENING_PLAIN

    def observe_plain(self, seconds: float, tokens: int = 1) -> None:
        """A run of plain decoding took `seconds` for its `tokens` tokens, its first step
        included: it refines r0, plain decoding's own drift (apart from r: a calibration error
        between p and c must not leak across). A whole run: where a step runs inside the call
        that builds it (MLX on a CPU), a run's last token reads as free: timed per token, a
        short probe makes plain decoding look cheaper than it is."""
        if tokens <= 0 or self.batched:  # a batch's plain cycles: the batch's time
            return
        self.opening_due = False  # T(0) is measured now
        if not self.plain_timed and not self.measured:  # a prior's scale: replace it
            self.plain_drift = seconds / tokens / self.plain_cost
        self.plain_timed = True
        keep = 0.9**tokens
        self.plain_drift = keep * self.plain_drift + (1 - keep) * seconds / tokens / self.plain_cost

    def _rescale(self, ratio: float) -> None:
        """A prior's first measured pass: scale its costs to it (and what starts from them: p,
        d's starting value), so from here the policy runs in measured units, as a calibrated
        one does (its shape follows from the next length timed, see _learn_shape). Where plain
        runs came first (a prior that starts with speculation off), r0 is already in measured
        seconds: T(0) = r0·p must not scale with p."""
        self.costs = tuple(c * ratio for c in self.costs)
        self.plain_cost *= ratio
        if self.plain_timed:
            self.plain_drift /= ratio
        self.draft_cost *= ratio
        self.scaled = True

    def _learn_shape(self, q: int, seconds: float) -> None:
        """On a prior: a verify pass over q tokens took `seconds`. Once two lengths q are
        timed, r·c(q) becomes the weighted least-squares line v(q) = a + b·q through every
        such pass (forgetting `fit_keep` per pass): c(q) = v(q) / r, so T(k)'s model and the
        fused line's slope target d/r + c' (see fitted_line) read measured passes, while r,
        p·r0 and the fused rounds' fit keep their meaning. The slope is shrunk toward the
        prior's relative slope s0 (b0 = s0·v̄ / (1 + s0·(q̄ − 1)): its line through the mean)
        with weight `shape_weight`, in Σw(q − q̄)² (two passes one q apart weigh ½: as much
        as the prior; after q = 2, 3, 4 they hold 4/5 of the slope, once a deep round is
        timed nearly all). Shrunk harder, a linear cost (a quantized target on a CPU) read
        too flat and skipped the opening's plain tokens where speculation loses (replayed).
        a ≥ 0: no pass costs less than nothing at q = 0."""
        self.shape = [self.fit_keep * f + x
                      for f, x in zip(self.shape, (1.0, q, q * q, seconds, q * seconds),
                                      strict=True)]
        w, sq, sqq, sv, sqv = self.shape
        qbar, vbar = sq / w, sv / w
        spread, cov = sqq - w * qbar**2, sqv - w * qbar * vbar  # Σw(q − q̄)², Σw(q − q̄)(v − v̄)
        if spread < 1e-6:  # one length so far: _rescale has set the scale
            return
        b0 = self.prior_slope * vbar / (1 + self.prior_slope * (qbar - 1))
        b = max((cov + self.shape_weight * b0) / (spread + self.shape_weight), 0.0)
        a = vbar - b * qbar
        if a < 0:  # the line through the origin and the passes' mean
            a, b = 0.0, vbar / qbar
        self.costs = tuple(max(a + b * q, 1e-6) / self.slowdown
                           for q in range(1, len(self.costs) + 1))
        self.shaped = True
        if not self.plain_timed:  # p ≤ c(1), as at a calibration (r0 = 1 until timed)
            self.plain_cost = min(self.plain_cost, self.slowdown * self.costs[0])

    def _lead(self) -> float:
        """How far speculation leads plain decoding, read as the on/off decision reads it
        (α one standard error high while on): max_k (E(k)/T(k)) · T(0)."""
        cost, alphas = self.round_costs(self.max_draft), self.alphas()
        expected = expected_by_k(self.optimistic(alphas) if self.on else alphas)
        return max(expected[k] / cost[k] for k in range(1, self.max_draft + 1)) * cost[0]

    def opening(self) -> None:
        """On a prior: the first drafting rounds are timed in parts (the first verify pass
        scales the prior to measured seconds, and brings the turn's first token: no pass is
        spent before it; the next, at another length, gives c its measured shape). Then
        OPENING_PLAIN plain tokens, timed whole (they set r0 outright), as soon as measuring
        T(0) could matter: when speculation would no longer lead if plain decoding cost
        only PLAIN_FLOOR of its bound c(1). Until then they would only cost time (2 passes
        for 2 tokens, ~2% of a 96-token turn drafting 4 a pass, on the hybrid bench target)
        and T(0) could not flip the choice. Where the lead is thin or negative (a quantized
        target on a CPU, whose cost grows linearly), they come at once, so T(k) and T(0) are
        both measured where the next choice is made and the prior cannot keep speculation
        on where it loses; the fitted line takes over from there. A plain run timed
        otherwise (speculation switched off) settles them too."""
        self.opening_due = True

    def recalibrate(self, verify_costs: Sequence[float], plain_cost: float) -> None:
        """Measured costs replace the prior this policy started from: the timing fits start
        again from them (as a new policy's would), the acceptance evidence is kept."""
        self.costs = tuple(verify_costs)
        self.plain_cost = min(plain_cost, self.costs[0])
        self.slowdown = self.plain_drift = 1.0
        self.r_timed = False
        self.fit, self.overhead, self.rounds_drafted = [0.0] * 5, 0.0, 0
        self.timed = [[0.0, 0.0] for _ in range(self.max_draft + 1)]
        self.shape = [0.0] * 5
        self.draft_cost = 0.1 * self.costs[0]
        self.measured, self.plain_timed = True, False
        self.opening_due, self.plain_left, self.shaped = False, 0, False

    def new_turn(self) -> None:
        """A new prompt: keep `carry` of the acceptance evidence (what the drafter did on the
        last turn's text says less about this one's), and where speculation was off, probe
        this turn's text at once — unless it could not pay even if every draft were accepted
        (there the probes keep spacing out)."""
        self._fade(self.carry)
        if not self.on and not self._cost_bound(self.round_costs(self.max_draft)):
            self.rounds_off = self.probe_gap

    @staticmethod
    def _cost_bound(cost: Sequence[float]) -> bool:
        """No k pays even if every draft is accepted: (k + 1) / T(k) <= 1 / T(0) for all k."""
        return all((k + 1) / cost[k] <= 1 / cost[0] for k in range(1, len(cost)))

    def age(self, tokens: int = 1) -> None:
        """Plain tokens age the acceptance evidence as rounds do: while speculation is off,
        what the drafter did on text long gone fades, so it is tried again."""
        self._fade(self.decay**tokens)

    def _fade(self, keep: float) -> None:
        """Keep `keep` of every position's acceptance evidence."""
        self.accepted = [keep * a for a in self.accepted]
        self.seen = [keep * s for s in self.seen]
