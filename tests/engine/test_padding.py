"""A verify pass run padded to a longer one the device measured cheaper (costs.pad_targets) is
the same round: greedy output equals target-only's and every state (KV, sliding window,
quantized KV, the drafter's) equals a recompute of the committed sequence after every round —
the padding's rows are never read and its cache entries are cut with the rejected drafts'."""

from __future__ import annotations

import pytest
from helpers import PROMPT, assert_same_or_near_tie, checked, conversation, padded, run

from mlx_spec.drafters import DraftModelDrafter
from mlx_spec.engine import Engine
from mlx_spec.engine.calibration import CalibrationStore
from mlx_spec.engine.costs import LONGEST_TIMED_PASS, TargetCosts, pad_targets
from mlx_spec.sampling import SamplingConfig


def test_a_longer_pass_is_taken_only_where_it_was_measured_cheaper():
    # q = 2 and 3 run as the 4-token pass (1.5 s against 2 and 3); q = 1 is cheapest alone;
    # a pass 3% (or 10%) cheaper is not a reason to pad (gain 0.85)
    assert pad_targets([1.0, 2.0, 3.0, 1.5]) == (1, 4, 4, 4)
    assert pad_targets([1.0, 0.97]) == (1, 2) == pad_targets([1.0, 0.9])
    costs = TargetCosts((1.0, 1.5, 1.5, 1.5), 1.0, pad_to=(1, 4, 4, 4))
    assert [costs.pass_size(q) for q in (1, 2, 3, 4, 5)] == [1, 4, 4, 4, 5]
    assert costs.up_to(1).pass_size(3) == 4  # the padding outlives a shorter draft range
    assert TargetCosts((1.0,), 1.0, measured=False).pass_size(3) == 3  # a prior pads nothing


@pytest.mark.parametrize("arch,kv_bits", [("llama", None), ("qwen3", None),
                                          ("gemma3_text", None), ("llama", 8)])
def test_padded_verify_passes_keep_greedy_identity_and_every_state(load, monkeypatch, arch,
                                                                   kv_bits):
    target, tok = load(arch)
    want, _ = run(conversation(target, tok, None, kv_bits=kv_bits))
    conv = conversation(target, tok, DraftModelDrafter(target, target), draft_length=4,
                        kv_bits=kv_bits)
    fed = padded(conv, monkeypatch)
    rounds = checked(conv)
    end, _ = run(conv)
    assert_same_or_near_tie(target, PROMPT, list(end.tokens), list(want.tokens))
    assert len(rounds) == end.stats.target_passes and end.stats.acceptance_rate > 0.9
    # every verify padded (1: a plain step)
    assert set(fed[-len(rounds):]) <= {LONGEST_TIMED_PASS, 1}
    assert fed.count(LONGEST_TIMED_PASS) >= len(rounds) - 1


def test_padded_sampled_rounds_keep_every_state(load, monkeypatch):
    """At T > 0 (rejections mid-round, corrections from p − q) with a drafter that disagrees."""
    target, tok = load("llama")
    other, _ = load("llama", seed=1)
    conv = conversation(target, tok, DraftModelDrafter(other, target), draft_length=4)
    padded(conv, monkeypatch)
    checked(conv)
    end, _ = run(conv, sampling=SamplingConfig(temperature=1.0, seed=3))
    assert len(end.tokens) == 40 and end.stats.accepted < end.stats.drafted


def test_calibration_times_passes_to_the_padding_reach(load, tmp_path):
    target, tok = load("llama")
    engine = Engine(target, tok, DraftModelDrafter(target, target), draft_length=2,
                    store=CalibrationStore(tmp_path))
    engine.calibrate(2)
    costs = engine.costs(2)
    assert len(costs.pad_to) == LONGEST_TIMED_PASS and costs.max_draft == 2
    assert all(q <= p <= LONGEST_TIMED_PASS for q, p in enumerate(costs.pad_to, 1))
    assert list(costs.verify) == sorted(costs.verify)
