"""Greedy speculation emits exactly the target's own greedy tokens, and the caches always equal a
recompute of the committed sequence — across architectures, precisions, drafters and k."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from helpers import (
    MAX,
    PROMPT,
    assert_same_or_near_tie,
    assert_turn_matches_fresh,
    checked,
    conversation,
    run,
    stored_kv,
)
from mlx_lm.generate import generate_step

from mlx_spec.drafters import DraftModelDrafter, NgramDrafter
from mlx_spec.events import Kind


def mlx_lm_greedy(target, prompt, n):
    out = []
    for tok, _ in generate_step(mx.array(prompt), target.model, max_tokens=n):
        out.append(int(tok))
    return out


@pytest.fixture(scope="module")
def baselines(load):
    """Target-only greedy tokens (ours) per (arch, bits), checked against mlx-lm's generate_step."""
    memo = {}

    def get(arch, bits):
        if (arch, bits) not in memo:
            target, tok = load(arch, bits=bits)
            end, _ = run(conversation(target, tok, None))
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
    engine = conversation(target, tok, DraftModelDrafter(draft, target), draft_length=k)
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
    engine = conversation(target, tok, NgramDrafter(), draft_length=4)
    checked(engine)
    end, _ = run(engine)
    assert_same_or_near_tie(target, PROMPT, list(end.tokens), baselines(arch, None))


def test_sliding_window_long_context_past_buffer_drop(load):
    """Prompt + output far past the window and past the point where old entries are dropped."""
    target, tok = load("gemma3_text")
    prompt = [(i * 13) % 300 + 5 for i in range(290)]
    ref, _ = run(conversation(target, tok, None), prompt=prompt, max_tokens=30)
    engine = conversation(target, tok, DraftModelDrafter(target, target), draft_length=4)
    checked(engine)
    end, _ = run(engine, prompt=prompt, max_tokens=30)
    assert_same_or_near_tie(target, prompt, list(end.tokens), list(ref.tokens))


def test_multi_turn_reuses_cache_and_matches_fresh_run(load):
    target, tok = load("llama")
    draft, _ = load("llama", seed=1)
    engine = conversation(target, tok, DraftModelDrafter(draft, target), draft_length=3)
    checked(engine)
    first, _ = run(engine, max_tokens=10)
    turn2 = PROMPT + list(first.tokens) + [7, 8, 9]
    second = assert_turn_matches_fresh(engine, turn2, 15)
    assert second.stats.reused_tokens == len(PROMPT) + len(first.tokens) - 1
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


def test_quantized_kv_cache_option(load):
    """kv_bits: the target's attention caches are QuantizedKVCache, they roll back like the
    others (== a recompute into a quantized cache), and speculation stays lossless against
    target-only decoding with the same quantized cache."""
    from mlx_lm.models.cache import QuantizedKVCache

    from mlx_spec import cache as kv

    target, tok = load("qwen3")
    draft, _ = load("qwen3", seed=1)
    plain, _ = run(conversation(target, tok, None, kv_bits=8))
    engine = conversation(target, tok, DraftModelDrafter(draft, target), draft_length=4, kv_bits=8)
    assert all(isinstance(c, QuantizedKVCache) for c in engine.cache)

    def commit(new, valid, hidden, original=engine.commit, ahead=False):
        original(new, valid, hidden, ahead=ahead)
        if ahead:  # a plain step runs ahead on the pending token: checked at the next commit
            return
        fresh = kv.make_cache(target.model, kv_bits=8)
        target.forward(engine.tokens[:-1], fresh)
        for got, want in zip(engine.cache, fresh, strict=True):
            assert got.offset == want.offset == len(engine.tokens) - 1
            for a, b in zip(stored_kv(got), stored_kv(want), strict=True):
                np.testing.assert_allclose(a, b, atol=0.05)  # up to a quantization step

    engine.commit = commit
    end, _ = run(engine)
    assert_same_or_near_tie(target, PROMPT, list(end.tokens), list(plain.tokens), bits=8)


def test_inter_token_latency_shows_the_bursts_of_speculation(load):
    """A perfect drafter at k=4 hands over five tokens per round at once: the median gap is a
    fraction of the tail; target-only tokens come one pass apart."""
    target, tok = load("llama")
    spec, _ = run(conversation(target, tok, DraftModelDrafter(target, target), draft_length=4),
                  max_tokens=40)
    plain, _ = run(conversation(target, tok, None), max_tokens=40)
    s, p = spec.stats, plain.stats
    assert 0 <= s.itl_p50_s <= s.itl_p90_s <= s.itl_max_s and s.itl_max_s > 0
    assert s.itl_p50_s < 0.5 * s.itl_max_s  # within a burst the gaps are near zero
    assert p.itl_p50_s > 0 and p.itl_p50_s <= p.itl_p90_s <= p.itl_max_s
    assert type(spec.stats).from_dict(spec.stats.to_dict()) == spec.stats


@pytest.mark.parametrize("drafter", ["none", "twin"])
def test_a_turn_ending_inside_a_round_commits_only_what_it_emitted(load, drafter):
    """max_tokens or an end token inside a round: the conversation holds exactly the emitted
    tokens, and the caches a recompute of them — also after plain decoding, whose pipelined
    step past the end is cut back (on a recurrent model: test_hybrid's plain decoding)."""
    from helpers import assert_cache_equals_recompute

    from mlx_spec.events import TurnEnd

    target, tok = load("llama")
    spec = None if drafter == "none" else DraftModelDrafter(target, target)
    engine = conversation(target, tok, spec, draft_length=4)
    end, _ = run(engine, max_tokens=7)  # a perfect drafter: rounds of 5, the second cut at 2
    assert list(end.tokens) == engine.tokens[len(PROMPT):] and len(end.tokens) == 7
    assert engine.cached == len(engine.tokens) - 1
    assert_cache_equals_recompute(target, engine.cache, engine.tokens[:-1])
    stop_token = end.tokens[3]
    engine.reset()
    engine.eos = {stop_token}
    events = list(engine.generate(PROMPT, max_tokens=40))
    first = list(end.tokens).index(stop_token)
    assert isinstance(events[-1], TurnEnd) and events[-1].finish_reason == "stop"
    assert engine.tokens == PROMPT + list(end.tokens[: first + 1])  # through the end token
    assert_cache_equals_recompute(target, engine.cache, engine.tokens[:-1])


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_repetition_penalty_on_the_device_matches_mlx_lm_and_speculation(load, arch):
    """A repetition penalty reads its window on the device (lazy drafts, a plain step's token
    not yet read): target-only plain decoding stays pipelined and equals mlx-lm's generate_step
    with the same penalty, and speculation (the target drafting for itself, every cache checked)
    equals target-only."""
    from mlx_lm.sample_utils import make_logits_processors

    from mlx_spec.sampling import SamplingConfig

    target, tok = load(arch)
    cfg = SamplingConfig(repetition_penalty=1.5, repetition_context=8)
    plain = conversation(target, tok, None)
    aheads = []
    original = plain.commit

    def commit(new, valid, hidden, *, ahead=False):
        aheads.append(ahead)
        original(new, valid, hidden, ahead=ahead)

    plain.commit = commit
    end, _ = run(plain, sampling=cfg)
    assert any(aheads)  # pipelined: steps were built ahead of the host reading their token
    processors = make_logits_processors(repetition_penalty=1.5, repetition_context_size=8)
    ref = [int(t) for t, _ in generate_step(mx.array(PROMPT), target.model, max_tokens=MAX,
                                            logits_processors=processors)]
    assert_same_or_near_tie(target, PROMPT, list(end.tokens), ref)
    assert list(end.tokens) != mlx_lm_greedy(target, PROMPT, MAX)  # the penalty has teeth
    draft, _ = load(arch)
    engine = conversation(target, tok, DraftModelDrafter(draft, target), draft_length=4)
    checked(engine)
    spec, _ = run(engine, sampling=cfg)
    assert_same_or_near_tie(target, PROMPT, list(spec.tokens), list(end.tokens))
    assert spec.stats.acceptance_rate > 0.9
