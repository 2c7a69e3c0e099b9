"""Greedy speculation emits exactly the target's own greedy tokens, and the caches always equal a
recompute of the committed sequence — across architectures, precisions, drafters and k."""

from __future__ import annotations

import mlx.core as mx
import pytest
from helpers import assert_cache_equals_recompute, assert_same_or_near_tie
from mlx_lm.generate import generate_step

from mlx_spec.drafters import DraftModelDrafter, NgramDrafter
from mlx_spec.engine import Engine
from mlx_spec.events import Kind, TurnEnd

PROMPT = [(i * 29) % 300 + 5 for i in range(20)]
MAX = 40


def run(engine, prompt=PROMPT, max_tokens=MAX, **kw):
    engine.eos = set()  # random models: compare fixed-length outputs
    events = list(engine.generate(prompt, max_tokens=max_tokens, **kw))
    end = events[-1]
    assert isinstance(end, TurnEnd)
    return end, events[:-1]


def mlx_lm_greedy(target, prompt, n):
    out = []
    for tok, _ in generate_step(mx.array(prompt), target.model, max_tokens=n):
        out.append(int(tok))
    return out


def checked(engine):
    """Wrap Engine.commit: after every round, target cache == recompute of tokens[:-1]."""
    original = engine.commit
    rounds = []

    def commit(new, valid, hidden):
        original(new, valid, hidden)
        assert_cache_equals_recompute(engine.target, engine.cache, engine.tokens[:-1])
        rounds.append(len(new))

    engine.commit = commit
    return rounds


@pytest.fixture(scope="module")
def baselines(load):
    """Target-only greedy tokens (ours) per (arch, bits), checked against mlx-lm's generate_step."""
    memo = {}

    def get(arch, bits):
        if (arch, bits) not in memo:
            target, tok = load(arch, bits=bits)
            end, _ = run(Engine(target, tok, None))
            ref = mlx_lm_greedy(target, PROMPT, MAX)
            assert_same_or_near_tie(target, PROMPT, list(end.tokens), ref, bits)
            memo[(arch, bits)] = list(end.tokens)
        return memo[(arch, bits)]

    return get


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3_text"])
@pytest.mark.parametrize("bits", [None, 4])
@pytest.mark.parametrize("which", ["self", "unrelated"])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_greedy_identity_draft_model(load, baselines, arch, bits, which, k):
    target, tok = load(arch, bits=bits)
    draft, _ = load(arch, seed=0 if which == "self" else 1, bits=bits)
    engine = Engine(target, tok, DraftModelDrafter(draft, target), num_draft=k)
    rounds = checked(engine)
    end, events = run(engine)
    assert_same_or_near_tie(target, PROMPT, list(end.tokens), baselines(arch, bits), bits)
    s = end.stats
    assert s.target_passes == len(rounds) and s.drafted > 0
    assert [e.token for e in events] == list(end.tokens)
    if which == "self":  # the target drafting for itself is (nearly) always right
        assert s.acceptance_rate > 0.9
        assert any(e.kind is Kind.BONUS for e in events)
    else:  # an unrelated random model is mostly corrected
        assert s.acceptance_rate < 0.5
        assert any(e.kind is Kind.CORRECTED for e in events)


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_greedy_identity_ngram(load, baselines, arch):
    target, tok = load(arch)
    engine = Engine(target, tok, NgramDrafter(), num_draft=4)
    checked(engine)
    end, _ = run(engine)
    assert_same_or_near_tie(target, PROMPT, list(end.tokens), baselines(arch, None))


def test_sliding_window_long_context_past_buffer_drop(load):
    """Prompt + output far past the window and past the point where old entries are dropped."""
    target, tok = load("gemma3_text")
    prompt = [(i * 13) % 300 + 5 for i in range(290)]
    ref, _ = run(Engine(target, tok, None), prompt=prompt, max_tokens=30)
    engine = Engine(target, tok, DraftModelDrafter(target, target), num_draft=4)
    checked(engine)
    end, _ = run(engine, prompt=prompt, max_tokens=30)
    assert_same_or_near_tie(target, prompt, list(end.tokens), list(ref.tokens))


def test_multi_turn_reuses_cache_and_matches_fresh_run(load):
    target, tok = load("llama")
    draft, _ = load("llama", seed=1)
    engine = Engine(target, tok, DraftModelDrafter(draft, target), num_draft=3)
    checked(engine)
    first, _ = run(engine, max_tokens=10)
    turn2 = PROMPT + list(first.tokens) + [7, 8, 9]
    second, _ = run(engine, prompt=turn2, max_tokens=15)
    assert second.stats.reused_tokens == len(PROMPT) + len(first.tokens) - 1
    fresh, _ = run(Engine(target, tok, None), prompt=turn2, max_tokens=15)
    assert_same_or_near_tie(target, turn2, list(second.tokens), list(fresh.tokens))
    # a prompt that rewrites history rolls back to the common prefix
    turn3 = PROMPT[:10] + [1, 2, 3]
    third, _ = run(engine, prompt=turn3, max_tokens=5)
    assert third.stats.reused_tokens == 10


def test_near_tie_allowance_has_teeth(load, baselines):
    """A divergence that is not at a near-tie must fail the identity check."""
    target, _ = load("llama")
    want = baselines("llama", None)
    wrong = list(want)
    wrong[5] = (wrong[5] + 1) % 300
    with pytest.raises(AssertionError, match="not a near-tie"):
        assert_same_or_near_tie(target, PROMPT, wrong, want)
