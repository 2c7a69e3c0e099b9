"""The draft-length cap for a batch (the server verifying several conversations in one pass):
each row's policy learns acceptance, the cap prices the cycle at its total tokens."""

from __future__ import annotations

import pytest
from test_adaptive import feed

from mlx_spec.engine.adaptive import AdaptiveDraftLength
from mlx_spec.engine.batch_length import BatchDraftLength

MEMORY_BOUND = [1.0 + 0.03 * q for q in range(9)]  # one row: each verified token +3%


def test_a_batch_of_one_is_not_capped_and_chooses_as_alone():
    """B = 1: no cap, so the policy's choices are exactly those of a policy on its own."""
    import random

    batch = BatchDraftLength()
    alone, served = (AdaptiveDraftLength(MEMORY_BOUND, draft_cost=0.02) for _ in range(2))
    rng = random.Random(0)
    for _ in range(300):
        cap = batch.cap([served], MEMORY_BOUND)
        assert cap is None
        k = alone.choose()
        assert served.choose(cap=cap) == k
        n = 0
        while n < k and rng.random() < 0.7:
            n += 1
        for p in (alone, served):
            p.observe(k, n, draft_seconds=0.02 * k, round_seconds=1.0 + 0.05 * k)


def serve_cycles(policies, batch, cycle_seconds, cycles, rng, costs=MEMORY_BOUND):
    """Cycles as the scheduler runs them: the cap (the calibrated one-row costs: `costs`), each
    row's choice under it, the cycle timed by cycle_seconds(B, widest k) and observed; every
    draft accepted with probability 0.7. Returns the caps."""
    caps = []
    for _ in range(cycles):
        cap = batch.cap(policies, costs)
        caps.append(cap)
        ks = []
        for p in policies:
            ks.append(p.choose(cap=cap))
        t = cycle_seconds(len(policies), max(ks))
        batch.observe(len(policies), max(ks), t)
        for p, k in zip(policies, ks, strict=True):
            if k:
                n = 0
                while n < k and rng.random() < 0.7:
                    n += 1
                p.observe(k, n, draft_seconds=0.01 * k, round_seconds=t)
            else:
                p.observe_plain(t)
    return caps


def test_a_batch_whose_pass_is_compute_bound_turns_speculation_off():
    """Each row alone would draft (one row's pass is memory-bound: +3% a token, drafts accepted
    70%). Four rows verified together cost what 4·(k+1) tokens cost, compute-bound (each token
    a quarter of a one-token pass, as much as it adds in tokens): the cycles' measured line
    soon says no common k beats plain decoding's 4 tokens a pass, and the cap stays 0
    (speculation off for the batch), but for a rare cycle trying k = 1 again: each such probe
    loses ~1/6 of a cycle (6.8 tokens in 2.04 s against 4 in 1 s), so the 1% budget spaces
    them ~17 cycles apart."""
    import random

    rng = random.Random(1)
    policies = [AdaptiveDraftLength(MEMORY_BOUND, draft_cost=0.01) for _ in range(4)]
    feed(policies[0], 50, lambda i: rng.random() < 0.7)
    assert policies[0].choose() > 0  # alone: it pays
    batch = BatchDraftLength()
    caps = serve_cycles(policies, batch, lambda b, k: 0.25 * b * (k + 1) + 0.01 * b * k, 300,
                        rng)
    assert caps[0] == 0 and caps[1] > 0  # a plain cycle first, then the calibrated line's b0
    assert max(caps[-200:]) <= 1 and 1 <= caps[-200:].count(1) <= 200 // 15, caps
    for p in policies:
        assert p.choose(cap=0) == 0  # a cap of 0: every row's round is plain


def test_a_batch_whose_pass_stays_memory_bound_keeps_speculating():
    """The same rows where 4·(k+1) tokens still cost the calibrated line (memory-bound): the
    batch keeps drafting, shallower than one row alone would, its probes one draft below the
    best rare."""
    import random

    rng = random.Random(2)
    policies = [AdaptiveDraftLength(MEMORY_BOUND, draft_cost=0.01) for _ in range(4)]
    line = lambda b, k: 1.0 + 0.03 * (b * (k + 1) - 1) + 0.01 * b * k  # noqa: E731
    caps = serve_cycles(policies, BatchDraftLength(), line, 300, rng)
    assert min(caps[-100:]) >= 1 and sum(c >= 2 for c in caps[-100:]) >= 80, caps[-100:]


def test_a_batch_whose_model_reads_too_steep_finds_that_drafting_pays():
    """The calibrated one-row line says each verified token costs 30% of a pass, so the model's
    slope b0 = B·s prices one more draft in each of four rows at 1.2 passes: speculation off.
    The batch's real pass costs the same at any k (a CPU's matmul over 4·(k+1) tokens is no
    dearer than over 4): the cap's own probes at k = 1 measure it, and the batch drafts."""
    import random

    rng = random.Random(3)
    steep = [1.0 + 0.3 * q for q in range(9)]
    policies = [AdaptiveDraftLength(steep, draft_cost=0.01) for _ in range(4)]
    caps = serve_cycles(policies, BatchDraftLength(), lambda b, k: 1.0 + 0.01 * k, 300, rng,
                        costs=steep)
    fresh = BatchDraftLength()  # the model's b0 alone, after the plain cycle, says off
    fresh.observe(4, 0, 1.0)
    rows = [AdaptiveDraftLength(steep, draft_cost=0.01) for _ in range(4)]
    rates = [n / t for n, t in zip(fresh.expected_tokens(rows, 8),
                                   fresh.cycle_costs(4, 8, 0.04, steep), strict=True)]
    assert max(range(9), key=rates.__getitem__) == 0
    assert caps[:3] == [0, 1, 1]  # the plain cycle, then the opening's drafted cycles
    assert sum(c >= 2 for c in caps[-100:]) >= 90, caps[-100:]


def test_a_row_in_a_batch_learns_acceptance_but_not_the_batch_s_times():
    """A row whose rounds are verified in a batch takes the cycle's whole time per round (here
    3x what its own pass costs alone): its own costs stay a lone row's, its acceptance is
    learnt, and under a cap it drafts min(cap, its reach) whatever its own prices say. Once
    the cap is lifted it chooses exactly as a lone row that saw the same acceptance (and none
    of the batch's times) does."""
    alone = AdaptiveDraftLength(MEMORY_BOUND, draft_cost=0.02)  # the same rounds, untimed
    row = AdaptiveDraftLength(MEMORY_BOUND, draft_cost=0.02)
    before = [row.round_cost(k) for k in range(9)]
    for _ in range(40):
        k = row.choose(cap=8)
        assert k == min(8, row.max_draft_now()) and not row.split()
        row.observe(k, k, draft_seconds=0.5, verify_seconds=3.0, round_seconds=3.0)
        row.observe_plain(3.0)
        alone.observe(k, k)
    assert [row.round_cost(k) for k in range(9)] == before
    assert row.alphas()[0] > 0.9 and row.max_draft_now() == 8
    assert row.alphas() == alone.alphas()
    # alone again: its own prices (a verified token +3%, a draft 2%) and α ≈ 1 to depth 8, so
    # the deepest k pays most, as it does for the lone row; not a batch row any more
    k = row.choose()
    assert not row.batched and k == alone.choose() == 8


def test_the_batch_cap_prices_the_cycle_at_its_total_tokens():
    """A batch size's first cycle is plain (it times T_B(0)); then T_B(k) = T_B(0) + k·b0,
    b0 = Σd + B·s (s the calibrated slope per token: one more draft in each of B rows is B
    more tokens in the pass) until cycles at other k move the slope; N_B(k) = Σ E_r(k), a row
    counting as deep as its evidence reaches, whether its own policy (alone) is on or off."""
    on, off = (AdaptiveDraftLength([1.0] * 3, prior=0.5, prior_weight=1.0) for _ in range(2))
    batch = BatchDraftLength()
    assert batch.cap([on, off], [1.0] * 3) == 0
    batch.observe(3, 0, 2.0)
    assert batch.cycle_costs(3, 2, 0.3, [1.0, 1.5]) == pytest.approx([2.0, 3.8, 5.6])
    off.on = False
    # α = 0.5 each (the prior), nothing measured: each reaches one draft
    assert BatchDraftLength.expected_tokens([on, off], 2) == [2.0, 3.0, 3.0]
    for p in (on, off):  # one draft accepted: α_1 = α_2 = 0.75, and each reaches two
        p.observe(1, 1)
    assert BatchDraftLength.expected_tokens([on, off], 2) == pytest.approx([2.0, 3.5, 4.625])
