"""The draft-length policy replayed on recorded greedy acceptance: which k it picks, judged by
simulated time (deterministic for a seed), never by a clock."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from helpers import open_chat

from mlx_spec.bench.replay import RoundCosts, record, replay

# L(t) for 96 tokens of each of the bench's 3 prompts, demo MTP head on the demo f32 target
# (bench/replay.py: record; the widened bench target computes the same function)
BENCH_TABLES = json.loads((Path(__file__).parent / "reference" / "mtp_runs.json").read_text())
# the widened bench target's costs as the policy fitted them on the dev machine: a verify pass
# 51.5 ms + 1.9 ms per token, a draft 3.2 ms, a plain token 48 ms
BENCH_COSTS = RoundCosts(plain=0.048, verify=tuple(0.0515 + 0.0019 * q for q in range(9)),
                         draft=0.0032, overhead=0.001)


def rate(num_draft, tables=BENCH_TABLES, costs=BENCH_COSTS, seeds=range(8)) -> float:
    """Mean over seeds of the mean per-prompt rate (the bench's row rate)."""
    return statistics.mean(statistics.mean(replay(tables, costs, num_draft, seed=s))
                           for s in seeds)


def test_auto_keeps_up_with_the_best_fixed_k_on_the_bench_prompts():
    """One hopeless prompt, one easy and periodic (k = 2 lands every other round where the first
    draft fails), one where k = 2 is best: auto must pick its way through all three. (Before
    the fitted round line, the paced plain probes and the lighter depth shrinkage it replayed
    at 0.93 of k = 3.)"""
    fixed = {k: rate(k) for k in range(1, 9)}
    best = max(fixed, key=fixed.get)
    assert best == 3
    assert rate("auto") >= 0.95 * fixed[best], (rate("auto"), fixed)


def test_auto_drafts_deep_for_a_perfect_drafter_and_stays_off_for_a_hopeless_one():
    perfect = [[8] * 256] * 2
    assert rate("auto", perfect) >= 0.95 * max(rate(k, perfect) for k in range(1, 9))
    hopeless = [[0] * 256] * 2
    assert rate("auto", hopeless) >= 0.98 * rate(0, hopeless)


def test_a_recorded_table_predicts_the_engines_own_rounds():
    """The premise: at T = 0 the rounds' acceptance is a function of the committed text. A
    fixed-k turn on the real engine takes exactly the passes the table says."""

    engine = open_chat(drafter="mtp", num_draft=3)
    prompt = engine.tokenizer.encode("import os\n\n\ndef read_config(path):\n    ")
    runs = record(engine, prompt, 24)
    t = passes = 0
    while t < len(runs):
        t += min(runs[t], 3, len(runs) - t - 1) + 1
        passes += 1
    engine.reset()
    end = list(engine.generate(prompt, max_tokens=len(runs), ignore_eos=True))[-1]
    assert end.stats.target_passes == passes and end.stats.generated_tokens == len(runs)
    assert 0 < end.stats.accepted < end.stats.drafted  # both kinds of round happened
