"""Prompt lookup first (drafters/lookup.py) and the n-gram copy it uses: copies overlap
themselves in a loop; the wrapped drafter keeps every losslessness rule (greedy identity, every
state equal to a recompute, T > 0 distributed as the target) with copied and modelled rounds
mixed; and a copy is right where the answer is known."""

from __future__ import annotations

import mlx.core as mx
import pytest
from helpers import (
    PROMPT,
    assert_same_or_near_tie,
    checked,
    conversation,
    open_chat,
    run,
)
from test_engine_sampling import (
    CFG,
    assert_both_paths_taken,
    chi2_pvalue,
    sample_pairs,
    target_joint,
)
from test_mtp import make_drafter as make_head

from mlx_spec.drafters import DraftContext, DraftModelDrafter, NgramDrafter
from mlx_spec.drafters.lookup import LookupFirst
from mlx_spec.kinds import kind_of
from mlx_spec.sampling import SamplingConfig


def indexed(tokens: list[int], **kw) -> tuple[NgramDrafter, object]:
    d = NgramDrafter(**kw)
    s = d.new_state()
    d.commit(s, DraftContext(None, tokens, []), 0)
    return d, s


def test_a_copy_overlaps_itself_in_a_loop():
    """Period 3 (a b c a b c a b): the latest match of "a b" is 3 back, so the copy runs
    c a b c a b … for all k, past the end of what was written."""
    d, s = indexed([7, 1, 2, 3, 1, 2, 3, 1, 2])
    assert d.lookup(s, [7, 1, 2, 3, 1, 2, 3, 1, 2], 8) == ([3, 1, 2, 3, 1, 2, 3, 1], 3)
    # a match far back copies what followed it, and no more than k
    d, s = indexed([5, 6, 7, 8, 9, 10, 11, 0, 5, 6])
    assert d.lookup(s, [5, 6, 7, 8, 9, 10, 11, 0, 5, 6], 3) == ([7, 8, 9], 2)
    # nothing repeats: no copy
    d, s = indexed([1, 2, 3, 4], min_ngram=3)
    assert d.lookup(s, [1, 2, 3, 4], 4) == ([], 0)


def test_lookup_first_takes_its_kind_from_the_drafter_inside(load):
    target, _ = load("qwen3")
    d = LookupFirst(make_head(target, "shared-kv"))
    assert d.name == "mtp+lookup" and kind_of(d.name) == "mtp" and d.needs_hidden is True


def looping_prompt() -> list[int]:
    """The prompt, then a block of it twice: the target's context repeats, and (random
    models loop) so do its continuations."""
    return PROMPT + PROMPT[4:12] + PROMPT[4:12]


@pytest.mark.parametrize("inner", ["mtp", "deepseek", "draft"])
@pytest.mark.parametrize("k", [2, 8])
def test_greedy_identity_and_every_state_with_copied_and_modelled_rounds(load, inner, k):
    target, tok = load("qwen3")
    prompt = looping_prompt()
    baseline, _ = run(conversation(target, tok, None), prompt=prompt, max_tokens=60)
    model = (DraftModelDrafter(load("qwen3", seed=1)[0], target) if inner == "draft"
             else make_head(target, "shared-kv" if inner == "mtp" else "deepseek"))
    d = LookupFirst(model)
    sources = {"copy": 0, "model": 0}
    lookup, modelled = d.ngram.lookup, model.draft

    def counted_lookup(*a):
        out = lookup(*a)
        sources["copy"] += bool(out[0])
        return out

    def counted_draft(*a):
        sources["model"] += 1
        return modelled(*a)

    d.ngram.lookup, model.draft = counted_lookup, counted_draft
    engine = conversation(target, tok, d, draft_length=k)
    checked(engine)  # the n-gram index and the model drafter's state, every round
    end, _ = run(engine, prompt=prompt, max_tokens=60)
    assert_same_or_near_tie(target, prompt, list(end.tokens), list(baseline.tokens))
    assert sources["copy"] > 0 and sources["model"] > 0, sources
    # a later turn that rewrites the history: the index and the model state follow it back
    turn2 = prompt + list(end.tokens)[:5] + [9, 10]
    got, _ = run(engine, prompt=turn2, max_tokens=10)
    fresh, _ = run(conversation(target, tok, None), prompt=turn2, max_tokens=10)
    assert_same_or_near_tie(target, turn2, list(got.tokens), list(fresh.tokens))


def loop_start(text: list[int], period: int) -> int:
    """Where `text` becomes periodic with `period` through to its end."""
    s = len(text) - period
    while s > 0 and text[s - 1] == text[s - 1 + period]:
        s -= 1
    return s


@pytest.mark.parametrize("which", [1, 2])
def test_a_copy_of_a_loop_is_accepted_whole(which):
    """Known answer, on the bundled pair: the demo target's greedy continuations of these
    corpus prompts (the bench's) end in loops of period 4 and 3. Once the loop has run one
    period past its start, the suffix matches one period back and the overlapping copy is the
    target's own text: every round from there is 8 accepted + the bonus (the last may be cut
    by max_tokens). The MTP head alone does not get there (it fails deep in the loop)."""
    from mlx_spec.train.corpus import prompts_from_corpus

    conv = open_chat(drafter="mtp", draft_length=8, lookup=True)
    assert conv.drafter.name == "mtp+lookup"
    prompt = prompts_from_corpus(conv.tokenizer, 3)[which]
    rounds = checked(conv)
    end = list(conv.generate(prompt, max_tokens=96))[-1]
    text = list(prompt) + list(end.tokens)
    period = next((q for q in range(1, 9) if text[-24:] == text[-24 - q : -q]), None)
    assert period is not None, "the demo target's continuation no longer loops"
    due = loop_start(text, period) + period + 3  # a 3-token suffix seen one period back
    starts = [len(prompt) + sum(rounds[:i]) for i in range(len(rounds))]
    copied = [n for at, n in zip(starts, rounds, strict=True) if at >= due][:-1]
    assert len(copied) >= 3 and all(n == 9 for n in copied), (period, due, starts, rounds)
    alone = open_chat(drafter="mtp", draft_length=8)
    plain = list(alone.generate(prompt, max_tokens=96))[-1]
    assert list(plain.tokens) == list(end.tokens)
    assert end.stats.tokens_per_pass > plain.stats.tokens_per_pass


def copy_prompt(target) -> list[int]:
    """A prompt whose last 3 tokens appeared before, followed there by a token the target
    gives a middling probability here: the copy it proposes is accepted about half the time."""
    import numpy as np

    from mlx_spec.sampling import probabilities

    def p(ctx: list[int]) -> np.ndarray:
        return np.array(probabilities(target.model(mx.array(ctx)[None])[0, -1:],
                                      SamplingConfig(**CFG)))[0]

    head, tail = PROMPT[:6], PROMPT[6:12]
    for t in np.argsort(-p(head + tail + head))[:4]:
        prompt = head + [int(t)] + tail + head
        if 0.2 < p(prompt)[int(t)] < 0.8:
            return prompt
    raise AssertionError("no middling copy for this fixture")


def test_sampling_with_a_copied_round_matches_the_target_distribution(load):
    """T > 0: a copy is a point mass (q(x) = 1), accepted with probability p(x), else the
    target resamples from p without x: the first two tokens are distributed as the target's."""
    target, tok = load("qwen3")
    prompt = copy_prompt(target)
    engine = conversation(target, tok, LookupFirst(make_head(target, "shared-kv")),
                          draft_length=2)
    tally = []
    pairs = sample_pairs(engine, CFG, tally, prompt)
    assert_both_paths_taken(tally)
    pval = chi2_pvalue(pairs, target_joint(target, SamplingConfig(**CFG), prompt))
    print(f"lookup χ² p = {pval:.3f}")
    assert pval > 0.01


class Recorder:
    """A policy stand-in: a fixed choice; what it was told."""

    def __init__(self, k: int):
        self.k, self.observed, self.aged, self.plain = k, [], 0, []

    def choose(self, limit=None, *, cap=None):
        return min(self.k, limit)

    def split(self):
        return False

    def observe(self, k, n, draft_seconds=None, **kw):
        self.observed.append((k, n))

    def age(self, tokens=1):
        self.aged += tokens

    def observe_plain(self, seconds, tokens=1):
        self.plain.append(tokens)

    def new_turn(self):
        pass


def test_the_schedule_asks_the_copies_policy_when_a_copy_is_ready():
    """A ready copy: the copies' policy chooses k (here 8, the model's 0 would have gone
    plain) and learns from the round; the model's only ages by the round's tokens. No copy,
    or copies that do not pay: the model's chooses, and its round may not copy."""
    from mlx_spec.engine.planner import Plain, Planner, Speculate

    model, copies, ready = Recorder(0), Recorder(8), [True]
    s = Planner(model, 8, drafting=True, copies=copies, copy_ready=lambda: ready[0])
    assert s.next(left=100, room=100) == Speculate(8)
    s.observe_round(8, 8, round_s=0.1, fed=1, copied=True)
    assert copies.observed == [(8, 8)] and model.observed == [] and model.aged == 9
    ready[0] = False
    assert s.next(left=100, room=100) == Plain()
    model.k = 3
    assert s.next(left=100, room=100) == Speculate(3, copy=False)
    s.observe_round(3, 1, round_s=0.1, fed=1)
    assert model.observed == [(3, 1)] and copies.aged == 2
    ready[0], copies.k = True, 0  # a copy is ready but copies do not pay: the model's round
    assert s.next(left=100, room=100) == Speculate(3, copy=False)
    s.observe_plain(0.01)
    s.end_plain_run()
    assert model.plain == copies.plain == [1]  # plain decoding's cost: both learn it


def test_a_round_the_engine_gave_the_model_is_not_copied(load):
    """DraftContext.copy False (the planner chose the model's round): the lookup drafter
    drafts with its model even where a copy is ready, alone and in batched rows."""
    from mlx_spec.sampling import Sampler

    target, tok = load("qwen3")
    d = LookupFirst(make_head(target, "shared-kv"))
    conv = conversation(target, tok, d, draft_length=4)
    conv.prefill(looping_prompt())  # its last 3 tokens appeared 8 before
    assert conv.copy_ready()
    ctx = conv.draft_context()
    assert d.draft(conv.drafter_state, ctx, 4, Sampler(SamplingConfig())).copied
    ctx = conv.draft_context(copy=False)
    assert not d.draft(conv.drafter_state, ctx, 4, Sampler(SamplingConfig())).copied
    rows = d.draft_rows([conv.drafter_state], [ctx], [4], [Sampler(SamplingConfig())])
    assert rows is not None and not rows[0].copied


def test_a_copys_k_that_meets_no_copy_is_drafted_to_the_models_own_reach(load):
    """Copies may reach 15 a round, the model 8: a copy's k chosen a token ahead that meets no
    copy when the round drafts is drafted by the model only as far as its own policy reaches
    (it had crashed the model policy's bookkeeping with k = 15)."""
    from mlx_spec.sampling import Sampler

    target, tok = load("qwen3")
    d = LookupFirst(make_head(target, "shared-kv"))
    conv = conversation(target, tok, d, draft_length="auto")
    conv.prefill(looping_prompt())
    ctx = conv.draft_context(copy=False)  # (as when no copy is there)
    assert ctx.model_max_draft == conv.max_draft == 8
    alone = d.draft(conv.drafter_state, ctx, 15, Sampler(SamplingConfig()))
    rows = d.draft_rows([conv.drafter_state], [ctx], [15], [Sampler(SamplingConfig())])
    assert alone.k == 8 and not alone.copied and rows is not None and rows[0].k == 8


def test_positions_drafted_past_the_first_ceiling_and_never_accepted_count_as_zero():
    """A turn's tallies start as long as the model's reach (8); a copy drafts 12, 3 accepted:
    both tallies grow to 12 (per_position, and the app's bars, had zipped 12 against 8)."""
    from mlx_spec.stats import Totals

    t = Totals(pos_drafted=[0] * 8, pos_accepted=[0] * 8)
    t.add_pass(8, 8, 0.0, 0.0)
    t.add_pass(12, 3, 0.0, 0.0)
    assert len(t.pos_drafted) == len(t.pos_accepted) == 12
    assert [round(a, 2) for _, a, _ in t.per_position()] == [1.0] * 3 + [0.5] * 5 + [0.0] * 4
