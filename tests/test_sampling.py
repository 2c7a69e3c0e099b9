"""The acceptance rule is lossless (statistical checks), and logits processing is right."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import chisquare

from mlx_spec.coupling import (
    Verdict,
    acceptance_chances,
    categorical,
    greedy_verdict,
    rejection_sample,
)
from mlx_spec.sampling import Sampler, SamplingConfig, penalize, probabilities

V, K, N = 6, 3, 60_000


def _random_dists(rng, rows):
    x = rng.gamma(0.7, size=(rows, V))
    return x / x.sum(-1, keepdims=True)


def _round(p_np, q_np, seed, q_claimed=None):
    """N independent rounds of k=3 drafts from q; returns (n accepted, emitted token) arrays."""
    key_d, key_r = mx.random.split(mx.random.key(seed))
    p = mx.broadcast_to(mx.array(p_np, mx.float32), (N, K + 1, V))
    q = mx.broadcast_to(mx.array(q_np, mx.float32), (N, K, V))
    drafts = categorical(q, key_d)  # the drafts really are drawn from q
    claimed = q if q_claimed is None else mx.broadcast_to(mx.array(q_claimed, mx.float32), q.shape)
    n, token = rejection_sample(p, claimed, drafts, key_r)
    return np.array(n), np.array(token), np.array(drafts)


def _first_emitted(n, token, drafts):
    """The first token a round emits: draft 1 if accepted, else the corrected token."""
    return np.where(n > 0, drafts[:, 0], token)


def _chi2_p(samples, probs):
    counts = np.bincount(samples, minlength=len(probs))
    return chisquare(counts, probs * len(samples)).pvalue


def test_first_token_is_distributed_as_target():
    rng = np.random.default_rng(0)
    p, q = _random_dists(rng, K + 1), _random_dists(rng, K)
    n, token, drafts = _round(p, q, seed=1)
    pval = _chi2_p(_first_emitted(n, token, drafts), p[0])
    assert pval > 0.01, pval


def test_second_token_given_first_accepted_is_distributed_as_target():
    rng = np.random.default_rng(2)
    p, q = _random_dists(rng, K + 1), _random_dists(rng, K)
    n, token, drafts = _round(p, q, seed=3)
    sel = n >= 1  # position 2 is reached only after draft 1 was accepted
    second = np.where(n[sel] > 1, drafts[sel, 1], token[sel])
    assert _chi2_p(second, p[1]) > 0.01


def test_point_mass_drafts_ngram_style_are_exact():
    """A model-free drafter (n-gram) proposes x with q = one-hot(x): accept with p(x), else
    resample from p without x. Both paths are taken here since p(x) is far from 0 and 1."""
    rng = np.random.default_rng(10)
    p = _random_dists(rng, K + 1)
    x = int(np.argsort(p[0])[-2])  # the second most likely token: accepted sometimes
    q = np.zeros((K, V))
    q[:, x] = 1.0
    n, token, drafts = _round(p, q, seed=11)
    assert 0.05 < (n > 0).mean() < 0.95
    assert _chi2_p(_first_emitted(n, token, drafts), p[0]) > 0.01


def test_identical_draft_is_always_accepted_and_bonus_comes_from_p():
    rng = np.random.default_rng(4)
    p = _random_dists(rng, K + 1)
    n, token, _ = _round(p, p[:K], seed=5)
    assert (n == K).all()  # p/q = 1: nothing is ever rejected
    assert _chi2_p(token, p[K]) > 0.01


def test_acceptance_rate_matches_theory():
    # P(accept draft 1) = sum_x min(p(x), q(x))
    rng = np.random.default_rng(6)
    p, q = _random_dists(rng, K + 1), _random_dists(rng, K)
    n, _, _ = _round(p, q, seed=7)
    expected = np.minimum(p[0], q[0]).sum()
    assert abs((n > 0).mean() - expected) < 4 * np.sqrt(expected * (1 - expected) / N)


def test_acceptance_evidence_means_are_the_outcomes_probabilities():
    """Verdict.evidence, what the draft-length policy learns α from at T > 0: over many rounds
    its (tested, accepted) chances at position i average to P(n >= i) and P(n >= i + 1), the
    0/1 outcomes' own means, with less spread (the coin flips are averaged out)."""
    rng = np.random.default_rng(10)
    p, q = _random_dists(rng, K + 1), _random_dists(rng, K)
    key_d, key_r = mx.random.split(mx.random.key(11))
    pb = mx.broadcast_to(mx.array(p, mx.float32), (N, K + 1, V))
    qb = mx.broadcast_to(mx.array(q, mx.float32), (N, K, V))
    drafts = categorical(qb, key_d)
    n = np.array(rejection_sample(pb, qb, drafts, key_r)[0])
    odds, overlap = np.array(acceptance_chances(pb, qb, drafts))
    evidence = np.array([Verdict(0, 0, (), tuple(a), tuple(b)).evidence
                         for a, b in zip(odds, overlap, strict=True)])  # [N, K, 2]
    for i in range(K):
        for j, outcome in enumerate((n >= i, n >= i + 1)):
            chance = evidence[:, i, j]
            assert chance.std() <= outcome.std() + 1e-6
            assert abs(chance.mean() - outcome.mean()) < 4 * outcome.std() / np.sqrt(N) + 1e-6
    assert Verdict(0, 0).evidence is None  # greedy: the outcomes are the chances


def test_negative_control_wrong_draft_probabilities_are_detected():
    """The same rule fed a draft distribution other than the one the drafts came from (as a
    drafter lying about q would) must fail the test: proves the test has power."""
    rng = np.random.default_rng(0)
    p, q = _random_dists(rng, K + 1), _random_dists(rng, K)
    uniform = np.full((K, V), 1.0 / V)
    n, token, drafts = _round(p, q, seed=1, q_claimed=uniform)
    assert _chi2_p(_first_emitted(n, token, drafts), p[0]) < 0.01


def test_negative_control_exact_match_sampling_is_not_p():
    """Also the 'accept if target sample == draft' shortcut with a resample from q ≠ p."""
    rng = np.random.default_rng(8)
    p, q = _random_dists(rng, 2), _random_dists(rng, 1)
    x = rng.choice(V, size=N, p=q[0])
    y = rng.choice(V, size=N, p=p[0])
    wrong = np.where(x == y, x, rng.choice(V, size=N, p=q[0]))
    assert _chi2_p(wrong, p[0]) < 0.01


def test_greedy_accepts_longest_matching_prefix():
    logits = mx.array(np.eye(5, 8) * 5.0)  # argmax of row i is i
    v = greedy_verdict(logits, [0, 1, 7, 3])
    assert (v.num_accepted, v.token) == (2, 2)
    v = greedy_verdict(logits, [0, 1, 2, 3])
    assert (v.num_accepted, v.token) == (4, 4)
    v = greedy_verdict(logits, [5, 1])
    assert (v.num_accepted, v.token) == (0, 0)


def test_top_k_top_p_min_p():
    logits = mx.log(mx.array([[0.5, 0.25, 0.15, 0.1]]))
    p = np.array(probabilities(logits, SamplingConfig(temperature=1.0, top_k=2)))[0]
    np.testing.assert_allclose(p, [2 / 3, 1 / 3, 0, 0], atol=1e-6)
    p = np.array(probabilities(logits, SamplingConfig(temperature=1.0, top_p=0.7)))[0]
    np.testing.assert_allclose(p, [2 / 3, 1 / 3, 0, 0], atol=1e-6)  # 0.5 < 0.7, 0.75 >= 0.7
    p = np.array(probabilities(logits, SamplingConfig(temperature=1.0, min_p=0.25)))[0]
    np.testing.assert_allclose(p, [0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0], atol=1e-6)
    p = np.array(probabilities(logits, SamplingConfig(temperature=0.5)))[0]
    ref = np.array([0.5, 0.25, 0.15, 0.1]) ** 2
    np.testing.assert_allclose(p, ref / ref.sum(), atol=1e-6)


def test_repetition_penalty_sees_each_rows_own_history():
    cfg = SamplingConfig(repetition_penalty=2.0, repetition_context=4)
    logits = mx.ones((3, 6))
    out = np.array(penalize(logits, history=[0, 1], rows=[2, 3], cfg=cfg))
    # row 0 after [0, 1]; row 1 after [0, 1, 2]; row 2 after [0, 1, 2, 3]
    np.testing.assert_allclose(out[0], [0.5, 0.5, 1, 1, 1, 1])
    np.testing.assert_allclose(out[1], [0.5, 0.5, 0.5, 1, 1, 1])
    np.testing.assert_allclose(out[2], [0.5, 0.5, 0.5, 0.5, 1, 1])
    neg = np.array(penalize(-mx.ones((1, 3)), history=[1], rows=[], cfg=cfg))
    np.testing.assert_allclose(neg[0], [-1, -2, -1])


def test_sampler_applies_the_same_processing_to_target_and_draft():
    cfg = SamplingConfig(temperature=0.7, top_k=3, repetition_penalty=1.3, seed=0)
    s = Sampler(cfg)
    logits = mx.random.normal((1, 10), key=mx.random.key(0))
    _, q = s.draft_token(logits[0], history=[1, 2], position=2)
    p = s.distribution(logits, history=[1, 2], rows=[])
    np.testing.assert_allclose(np.array(q), np.array(p[0]), atol=1e-6)


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5),
                                 dict(top_k=-1), dict(min_p=1.0), dict(repetition_penalty=0)])
def test_bad_sampling_options_are_rejected(bad):
    with pytest.raises(ValueError):
        SamplingConfig(**bad)


def test_processing_at_a_real_vocabulary_size_equals_a_full_sort():
    """Top-k by partial selection and top-p among candidates give what sorting every row gives
    (the rule written out with full sorts here), at Qwen's vocabulary size."""
    import numpy as np

    from mlx_spec.sampling import CANDIDATES, SamplingConfig, probabilities

    def by_full_sort(logits, cfg):
        x = np.array(logits, dtype=np.float64) / cfg.temperature
        if cfg.top_k:
            kth = np.sort(x, axis=-1)[:, -cfg.top_k][:, None]
            x = np.where(x < kth, -np.inf, x)
        p = np.exp(x - x.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        if cfg.top_p < 1:
            desc = -np.sort(-p, axis=-1)
            above = np.cumsum(desc, axis=-1) - desc
            floor = np.where(above < cfg.top_p, desc, np.inf).min(axis=-1, keepdims=True)
            p = np.where(p >= floor, p, 0.0)
        return p / p.sum(axis=-1, keepdims=True)

    mx.random.seed(1)
    rows = [mx.random.normal((5, 151_936)) * scale for scale in (4.0, 0.5)]
    # peaked rows (nucleus among the candidates), flat ones (not), and coarse ones: many ties
    # with the k-th largest, which top-k keeps
    rows.append(mx.round(mx.random.normal((5, 151_936)) * 4) / 2)
    for scale, logits in zip((4.0, 0.5, 4.0), rows, strict=True):
        for cfg in (SamplingConfig(temperature=0.7, top_p=0.9, top_k=50),
                    SamplingConfig(temperature=0.7, top_p=0.9),
                    SamplingConfig(temperature=1.0, top_k=CANDIDATES + 5)):
            ours, want = np.array(probabilities(logits, cfg)), by_full_sort(logits, cfg)
            flipped = (ours > 0) != (want > 0)
            # the same tokens kept; a flat row's 100k-token nucleus may differ by float32
            # rounding in the last few tokens of its cumulative sum, and no more
            assert (np.where(flipped, np.maximum(ours, want), 0).sum(axis=-1) < 1e-4).all()
            assert flipped.sum() == 0 or scale < 1
            np.testing.assert_allclose(ours, want, atol=1e-5)


@pytest.mark.parametrize("coupling", ["leviathan", "gumbel"])
@pytest.mark.parametrize("top_k", [0, 3])
def test_plain_decoding_samples_the_processed_distribution(top_k, coupling):
    """next_token draws from the tempered (top-k masked) logits directly, without building
    probabilities: its tokens must still follow probabilities() — and never leave the top k.
    Drafter-invariant (gumbel): one draw per sequence position, each keyed by it."""
    rng = np.random.default_rng(7)
    logits = mx.array(rng.normal(size=(1, V)) * 2, mx.float32)
    cfg = SamplingConfig(temperature=0.8, top_k=top_k, seed=11, coupling=coupling)
    sampler = Sampler(cfg)
    draws = np.array([sampler.next_token(logits, [], position=i)[0].item()
                      for i in range(6000)])
    probs = np.array(probabilities(logits, cfg)[0], dtype=np.float64)
    probs /= probs.sum()
    assert set(np.unique(draws)) <= set(np.flatnonzero(probs > 0))
    live = probs > 0
    counts = np.bincount(draws, minlength=V)[live]
    assert chisquare(counts, probs[live] * len(draws)).pvalue > 0.01


def _flat_rows(rows):
    """Near-flat logits over V tokens: 4 candidates hold far less than top_p = 0.9 of a row."""
    return mx.array(np.tile(np.linspace(0.0, 0.6, V * 2), (rows, 1)), mx.float32)


@pytest.mark.parametrize("coupling", ["leviathan", "gumbel"])
def test_top_p_past_its_candidates_is_checked_without_a_sync_and_decided_exactly(monkeypatch,
                                                                                 coupling):
    """A nucleus wider than the candidate set: processed() says so in a lazy flag (no host
    sync); plain decoding redraws such a token from the exact p, a round is decided again on
    it, and the draft's q — cut at the candidates, but really what the draft was drawn from —
    leaves the output distributed as p (χ² on the first token each emits)."""
    from mlx_spec import sampling

    monkeypatch.setattr(sampling, "CANDIDATES", 4)
    logits = _flat_rows(2)
    cfg = SamplingConfig(temperature=1.0, top_p=0.9, seed=5, coupling=coupling)
    probs, exact = sampling.processed(logits, cfg)
    assert exact is not None and not bool(exact) and int((np.array(probs[0]) > 0).sum()) == 4
    p = np.array(sampling.processed(logits, cfg, full=True)[0][0], dtype=np.float64)
    assert (p > 0).sum() > 4
    np.testing.assert_allclose(np.array(probabilities(logits, cfg)[0]), p, atol=1e-6)
    _assert_cut_rows_are_drawn_exactly(logits, cfg, p, cut=4)


@pytest.mark.parametrize("coupling", ["leviathan", "gumbel"])
def test_top_k_ties_are_kept_or_flagged_never_dropped(coupling):
    """Top-k keeps every token tied with the k-th largest (low-precision logits tie often). The
    partial selection takes 2k candidates, so ties within them are kept at once; where more tie
    than that, processed() flags the row (lazily, no sync) and the exact p keeps them all:
    plain decoding redraws and a round is decided again on it, and the draft's q (cut at the
    candidates, but what the draft was drawn from) leaves the output distributed as p."""
    from mlx_spec import sampling

    tied = mx.array([[3.0, 2.0, 1.0, 1.0, 1.0, 0.0]], mx.float32)
    probs, exact = sampling.processed(tied, SamplingConfig(temperature=1.0, top_k=3))
    assert bool(exact) and int((np.array(probs[0]) > 0).sum()) == 5
    logits = mx.array([[3.0, 1.0, 1.0, 1.0, 1.0, 0.0]] * 2, mx.float32)
    # 2k = 4 candidates, 5 tokens kept
    cfg = SamplingConfig(temperature=1.0, top_k=2, seed=9, coupling=coupling)
    probs, exact = sampling.processed(logits, cfg)
    assert not bool(exact) and int((np.array(probs[0]) > 0).sum()) == 4
    p = np.array(probabilities(logits, cfg)[0], dtype=np.float64)
    assert (p > 0).sum() == 5 and np.isclose(p[1], p[4])
    _assert_cut_rows_are_drawn_exactly(logits, cfg, p, cut=4)


def _assert_cut_rows_are_drawn_exactly(logits, cfg, p, cut):
    """logits' rows are ones processed() flags as cut short (at `cut` tokens; p the exact
    distribution): plain decoding's redraw and a round decided on a draft from the cut q both
    emit p (χ² on the first token each emits)."""
    p = p / p.sum()
    sampler = Sampler(cfg)
    plain, spec = [], []
    for i in range(3000):  # position i (gumbel: each its own noise; a history of i tokens)
        token, ok = sampler.next_token(logits[:1], [], position=i)
        assert not bool(ok)
        plain.append(sampler.redraw(logits[:1], [], position=i))
        draft, q = sampler.draft_token(logits[0], [], position=i)
        assert int((np.array(q) > 0).sum()) == cut  # what the draft was really drawn from
        spec.append(sampler.verdict(logits, [0] * i, draft.reshape(1), q[None]).tokens[0])
    live = p > 0
    for draws in (plain, spec):
        counts = np.bincount(draws, minlength=len(p))
        assert counts[~live].sum() == 0
        assert chisquare(counts[live], p[live] * len(draws)).pvalue > 0.01


def test_repetition_penalty_on_lazy_device_tokens_matches_a_reference():
    """penalize() on device arrays (as drafts and pipelined plain steps hand it, still lazy)
    and on host ints both give what the definition says: row r penalizes each distinct token
    of (history + rows[:r])[-window:], windows cut or not."""
    import random

    rng = random.Random(0)
    for _ in range(40):
        window = rng.randint(1, 6)
        cfg = SamplingConfig(repetition_penalty=1.7, repetition_context=window)
        history = [rng.randrange(12) for _ in range(rng.randint(0, 9))]
        rows = [rng.randrange(12) for _ in range(rng.randint(0, 4))]
        logits = mx.random.normal((len(rows) + 1, 12), key=mx.random.key(rng.randrange(99)))
        want = np.array(logits)
        for r in range(len(rows) + 1):
            for t in set((history + rows[:r])[-window:]):
                want[r, t] = want[r, t] / 1.7 if want[r, t] > 0 else want[r, t] * 1.7
        lazy = (mx.array(history, dtype=mx.int32) + 0, mx.array(rows, dtype=mx.int32) * 1)
        for h, rs in ((history, rows), lazy):
            np.testing.assert_allclose(np.array(penalize(logits, h, rs, cfg)), want, rtol=1e-6)
