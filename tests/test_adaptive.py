"""Adaptive draft length: k follows measured costs and acceptance, and output stays lossless."""

from __future__ import annotations

from helpers import PROMPT, assert_same_or_near_tie, run

from mlx_spec.adaptive import AdaptiveDraftLength, measure_verify_costs
from mlx_spec.drafters import DraftModelDrafter
from mlx_spec.engine import Engine


def feed(policy, rounds, alpha_hits):
    for _ in range(rounds):
        k = policy.choose()
        n = 0
        while n < k and alpha_hits(n):
            n += 1
        policy.observe(k, n, draft_seconds=0.01 * k)


def test_compute_bound_target_switches_speculation_off_and_probes():
    # verifying q tokens costs q times one token (4-bit matmul on a CPU): speculation cannot pay
    policy = AdaptiveDraftLength([1.0 * q for q in range(1, 10)], draft_cost=0.05)
    feed(policy, 3, lambda i: True)
    ks = [policy.choose() for _ in range(32)]
    assert ks.count(0) >= 30 and 1 in ks  # off, with an occasional probe round


def test_memory_bound_target_drafts_deep_when_acceptance_is_high():
    policy = AdaptiveDraftLength([1.0 + 0.03 * q for q in range(9)], draft_cost=0.02)
    feed(policy, 200, lambda i: True)
    assert policy.choose() == 8
    feed(policy, 400, lambda i: i == 0)  # now only the first draft is ever right
    assert policy.choose() in (1, 2)
    assert policy.alphas()[0] > 0.9 and policy.alphas()[1] < 0.1


def test_expected_tokens_formula():
    policy = AdaptiveDraftLength([1, 1, 1], prior=0.5, prior_weight=1.0)
    assert policy.expected_tokens(0) == 1
    assert abs(policy.expected_tokens(2) - (1 + 0.5 + 0.25)) < 1e-12


def test_measured_costs_and_auto_engine_is_lossless(load):
    target, tok = load("llama")
    costs = measure_verify_costs(target, 4, context=32, repeats=1)
    assert len(costs) == 5 and all(c > 0 for c in costs)
    baseline, _ = run(Engine(target, tok, None))
    engine = Engine(target, tok, DraftModelDrafter(target, target), num_draft="auto")
    end, _ = run(engine)
    assert end.stats.adaptive and engine.policy is not None
    assert_same_or_near_tie(target, PROMPT, list(end.tokens), list(baseline.tokens))
