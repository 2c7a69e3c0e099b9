"""Several conversations beside one set of weights: each keeps its own tokens, caches and
drafter state, so interleaving their turns changes nothing in any of them; what is shared (the
drafter's weights, the target's measured costs) is shared, and measured once."""

from __future__ import annotations

import pytest
from helpers import PROMPT, checked, run
from test_mtp import make_drafter

from mlx_spec.drafters import DraftModelDrafter, NgramDrafter
from mlx_spec.drafters.lookup import LookupFirst
from mlx_spec.engine import Engine, costs

OTHER = [(i * 17) % 250 + 9 for i in range(14)]


def drafter_of(which, target, load):
    if which == "draft":
        return DraftModelDrafter(load("qwen3", seed=1)[0], target)
    if which == "ngram":
        return NgramDrafter()
    if which == "lookup":  # copies where the text repeats, a shared-kv head elsewhere
        return LookupFirst(make_drafter(target, "shared-kv"))
    return make_drafter(target, which)


def two_turns(conv, first, more):
    """A turn on `first`, then one on what it became plus `more`: both turns' tokens."""
    a, _ = run(conv, prompt=first, max_tokens=24)
    b, _ = run(conv, prompt=conv.tokens + more, max_tokens=24)
    return list(a.tokens), list(b.tokens)


@pytest.mark.parametrize("which", ["draft", "shared-kv", "deepseek", "ngram", "lookup"])
def test_interleaved_conversations_equal_each_one_alone(load, which):
    target, tok = load("qwen3")
    engine = Engine(target, tok, drafter_of(which, target, load), draft_length=3)
    want_a = two_turns(engine.conversation(), PROMPT, [5, 6, 7])
    want_b = two_turns(engine.conversation(), OTHER, [8, 9])

    a, b = engine.conversation(), engine.conversation()
    assert a.drafter is b.drafter and a.drafter_state is not b.drafter_state
    checked(a), checked(b)  # every round: each one's caches == a recompute of its own tokens
    got_a1, _ = run(a, prompt=PROMPT, max_tokens=24)
    got_b1, _ = run(b, prompt=OTHER, max_tokens=24)
    got_a2, _ = run(a, prompt=a.tokens + [5, 6, 7], max_tokens=24)
    got_b2, _ = run(b, prompt=b.tokens + [8, 9], max_tokens=24)
    # same weights, same arithmetic: exact, not merely within a near-tie
    assert (list(got_a1.tokens), list(got_a2.tokens)) == want_a
    assert (list(got_b1.tokens), list(got_b2.tokens)) == want_b
    assert got_a2.stats.reused_tokens > len(PROMPT)  # a's second turn reused a's own cache


def test_costs_are_measured_once_per_engine_and_reach_every_conversation(load, monkeypatch):
    """Two `auto` conversations on one engine start on the same prior; one calibration (the
    engine idle between turns) reaches both policies at their next turn; each keeps its own
    acceptance evidence."""
    target, tok = load("llama")
    calls = []
    real = costs.measure_costs
    monkeypatch.setattr("mlx_spec.engine.engine.measure_costs",
                        lambda *a, **kw: calls.append(a) or real(*a, **kw))
    engine = Engine(target, tok, DraftModelDrafter(target, target), draft_length="auto")
    a, b = engine.conversation(), engine.conversation()
    run(a, max_tokens=8)
    run(b, max_tokens=8)
    assert calls == [] and not a.policy.measured and a.policy is not b.policy
    seen = a.policy.seen[:]
    assert engine.calibrate() and len(calls) == 1
    run(a, prompt=a.tokens + [5], max_tokens=8)
    run(b, prompt=b.tokens + [6], max_tokens=8)
    assert a.policy.measured and b.policy.measured and len(calls) == 1
    assert a.policy.costs == engine.costs(8).verify
    assert sum(a.policy.seen) > 0.3 * sum(seen)  # the evidence survived the recalibration


def test_a_target_only_conversation_shares_the_weights(load):
    target, tok = load("llama")
    engine = Engine(target, tok, DraftModelDrafter(target, target), draft_length=4)
    spec, plain = engine.conversation(), engine.conversation(drafter=None)
    s, _ = run(spec, max_tokens=16)
    p, _ = run(plain, max_tokens=16)
    assert plain.drafter is None and plain.target is spec.target
    assert s.stats.drafted > 0 and p.stats.drafted == 0
    assert list(s.tokens) == list(p.tokens)  # the target drafting for itself: identical
