"""Several conversations verified in ONE target pass (engine/batch.py): rows of different
lengths, each committing its own accepted prefix (ragged), every cache of every conversation
equal to a recompute of its own committed sequence after every round, greedy output equal to
each conversation alone, a seeded sampled turn equal to itself alone, and one pass per round."""

from __future__ import annotations

import mlx.core as mx
import pytest
from helpers import PROMPT, assert_same_or_near_tie, checked, lockstep, run
from published import build_pair, write_checkpoint
from test_conversations import OTHER, drafter_of
from test_engine_sampling import (
    CFG,
    assert_both_paths_taken,
    blended_drafter_model,
    chi2_pvalue,
    target_joint,
)

from mlx_spec.drafters import DraftModelDrafter
from mlx_spec.engine import Engine
from mlx_spec.engine.batch import batch_key, batchable
from mlx_spec.engine.cycle import Batch, Row
from mlx_spec.engine.rounds import PrefillDue
from mlx_spec.engine.turn import steps
from mlx_spec.loading import load_target, make_drafter
from mlx_spec.recurrent import rollback_strategy
from mlx_spec.sampling import Sampler, SamplingConfig

PROMPTS = [PROMPT, OTHER, PROMPT[:5] + [3, 1, 4, 1, 5, 9, 2, 6], [7] * 3]


def near_copy(model_dirs, arch: str, noise: float):
    """The target's own weights with a little noise: a draft model that is right often but
    not always, so the rows of a batch accept different prefixes."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten

    model, _ = load_target(model_dirs(arch))
    mx.random.seed(3)
    model.model.update(tree_unflatten([
        (k, v + noise * v.std() * mx.random.normal(v.shape)) if v.ndim == 2 else (k, v)
        for k, v in tree_flatten(model.model.parameters())]))
    mx.eval(model.model.parameters())  # (not left lazy for another thread's stream)
    return model


@pytest.mark.parametrize(("arch", "which"), [("qwen3", "near"), ("gemma3_text", "near"),
                                             ("qwen3", "shared-kv"), ("gemma3_text", "ngram"),
                                             ("qwen3", "lookup")])
def test_batched_rounds_equal_each_conversation_alone(load, model_dirs, arch, which):
    target, tok = load(arch)
    drafter = (DraftModelDrafter(near_copy(model_dirs, arch, 0.3), target) if which == "near"
               else drafter_of(which, target, load))
    engine = Engine(target, tok, drafter, draft_length=3)
    alone = [run(engine.conversation(), prompt=p, max_tokens=32)[0] for p in PROMPTS]
    convs = [engine.conversation() for _ in PROMPTS]
    assert batchable(convs)
    # every round: its caches (sliding windows too) == a recompute of its own sequence
    committed = [checked(c) for c in convs]
    calls, drafted = [], []
    forward_rows = target.forward_rows
    target.forward_rows = lambda *a, **k: calls.append(a[0].shape) or forward_rows(*a, **k)
    if hasattr(drafter, "draft_rows"):  # the drafts batch too (a shared-kv head's do)
        draft_rows = drafter.draft_rows
        drafter.draft_rows = lambda *a: (lambda got: drafted.append(
            got is not None and len(got)) or got)(draft_rows(*a))
    try:
        ends, sizes, prefills = lockstep(convs, PROMPTS)
    finally:
        target.forward_rows = forward_rows
    for prompt, got, want in zip(PROMPTS, ends, alone, strict=True):
        assert_same_or_near_tie(target, prompt, list(got.tokens), list(want.tokens))
    batched = [s for s in calls if s[0] > 1]
    # ONE pass per batched round (and per prefill step of the prompts arriving together)
    assert len(batched) == sum(1 for s in sizes if s > 1) + len(prefills)
    assert max(sizes) == len(PROMPTS)
    if which in ("shared-kv", "near", "lookup"):  # drafts drafted together, all four rows
        assert max(drafted) == len(PROMPTS)  # (lookup: copied rows beside the head's)
    if which == "near":  # in one pass, rows commit different lengths (never the minimum)
        rounds = min(len(c) for c in committed)
        assert any(len({c[j] for c in committed}) > 1 for j in range(1, rounds))


@pytest.mark.parametrize("which", ["shared-kv", "near"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_draft_rows_draft_every_row_in_one_step_as_each_would_alone(load, model_dirs, which,
                                                                    temperature):
    """draft_rows (a shared-kv MTP head; a draft model, its rows' caches batched as the
    target's are): rows of different lengths and draft counts, each the drafts (and the q they
    report) it draws alone from the same random stream, up to the batched kernels' rounding;
    a draft model's caches hold after it what they hold after drafting alone."""
    target, tok = load("qwen3")
    drafter = (DraftModelDrafter(near_copy(model_dirs, "qwen3", 0.3), target) if which == "near"
               else drafter_of(which, target, load))
    engine = Engine(target, tok, drafter, draft_length=3)
    convs = [engine.conversation() for _ in PROMPTS]
    for conv, prompt in zip(convs, PROMPTS, strict=True):
        run(conv, prompt=prompt, max_tokens=5 + len(prompt) % 4)  # ragged committed lengths
    ks = [1, 4, 2, 3]
    cfg = SamplingConfig(temperature=temperature, top_p=0.95, seed=7)
    states = [c.drafter_state for c in convs]
    before = [getattr(s, "cached", None) for s in states]
    alone = [drafter.draft(s, c.draft_context(), k, Sampler(cfg))
             for s, c, k in zip(states, convs, ks, strict=True)]
    mx.eval([d.tokens for d in alone] + [d.probs for d in alone if d.probs is not None])
    after = [[mx.array(x) for x in kv.state[:2]] if which == "near" else None
             for kv in (s.cache[0] if which == "near" else None for s in states)]
    ends = [getattr(s, "cached", None) for s in states]
    for s, c, n in zip(states, convs, before, strict=True):
        if n is not None:  # back to before the draft: draft_rows starts where alone did
            drafter.commit(s, c.draft_context(), n)
    rows = drafter.draft_rows(states, [c.draft_context() for c in convs], ks,
                              [Sampler(cfg) for _ in ks])
    assert rows is not None and len({len(c.tokens) for c in convs}) > 1
    assert [getattr(s, "cached", None) for s in states] == ends
    if which == "near":  # each row's cache: what drafting alone left there
        for s, (keys, values), n in zip(states, after, ends, strict=True):
            k, v = s.cache[0].state[:2]
            assert mx.allclose(k[..., :n, :], keys[..., :n, :], atol=1e-4).item()
            assert mx.allclose(v[..., :n, :], values[..., :n, :], atol=1e-4).item()
    for one, row, k in zip(alone, rows, ks, strict=True):
        assert row.k == one.k == k and row.fed == one.fed
        assert row.tokens.tolist() == one.tokens.tolist()
        if temperature:
            assert mx.allclose(row.probs, one.probs, atol=1e-5).item()
        else:
            assert row.probs is None and one.probs is None


def test_a_seeded_sampled_turn_is_the_same_inside_a_batch(load):
    target, tok = load("qwen3")
    engine = Engine(target, tok, drafter_of("draft", target, load), draft_length=3)
    cfgs = [SamplingConfig(temperature=1.0, top_p=0.9, seed=s) for s in (1, 2, 3)]
    alone = [run(engine.conversation(), prompt=p, max_tokens=24, sampling=c)[0]
             for p, c in zip(PROMPTS, cfgs, strict=False)]
    convs = [engine.conversation() for _ in cfgs]
    ends, sizes, _ = lockstep(convs, PROMPTS[:3], max_tokens=24, sampling=cfgs)
    assert max(sizes) == len(cfgs)
    for got, want in zip(ends, alone, strict=True):  # its own random stream, batch or not
        assert list(got.tokens) == list(want.tokens)


def test_quantized_caches_verify_one_at_a_time(load):
    target, tok = load("qwen3")
    quantized = Engine(target, tok, None, kv_bits=8)
    assert not batchable([quantized.conversation(), quantized.conversation()])


def test_sampling_inside_batches_has_the_target_distribution(load):
    """χ² under concurrency: two-token answers drawn three at a time beside a fourth request of
    another length, all verified in one pass per round, have the target's joint distribution."""
    target, tok = load("llama")
    drafter = DraftModelDrafter(blended_drafter_model(load, "llama"), target)
    engine = Engine(target, tok, drafter, draft_length=2)
    pairs, tally, sizes = [], [], []
    for base in range(0, 1200, 3):
        cfgs = [SamplingConfig(seed=base + i, **CFG) for i in range(3)]
        convs = [engine.conversation() for _ in range(4)]
        ends, seen, _ = lockstep(convs, [PROMPT] * 3 + [OTHER], max_tokens=2,
                                 sampling=cfgs + [SamplingConfig(seed=base, **CFG)])
        sizes += seen
        for end in ends[:3]:
            pairs.append(tuple(end.tokens))
            tally.append((end.stats.drafted, end.stats.accepted))
    assert max(sizes) == 4
    assert_both_paths_taken(tally)
    pval = chi2_pvalue(pairs, target_joint(target, SamplingConfig(**CFG), prompt=PROMPT))
    print(f"batched draft-model χ² p = {pval:.3f}")
    assert pval > 0.01


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0,
                                                                       top_p=0.9, seed=4)])
def test_target_only_turns_batch_their_plain_steps(load, sampling):
    """No drafter (or speculation off): plain tokens come as rounds of no drafts, verified in
    one pass for all; each turn equals its own pipelined plain decoding (seeded: the same
    draws)."""
    target, tok = load("qwen3")
    engine = Engine(target, tok, None)
    alone = [run(engine.conversation(), prompt=p, max_tokens=20, sampling=sampling)[0]
             for p in PROMPTS]
    convs = [engine.conversation() for _ in PROMPTS]
    for c in convs:
        checked(c)
    ends, sizes, _ = lockstep(convs, PROMPTS, max_tokens=20, sampling=[sampling] * len(PROMPTS))
    assert max(sizes) == len(PROMPTS) and len(sizes) == 20
    for prompt, got, want in zip(PROMPTS, ends, alone, strict=True):
        if sampling.greedy:
            assert_same_or_near_tie(target, prompt, list(got.tokens), list(want.tokens))
        else:
            assert got.tokens == want.tokens
        assert got.stats.target_passes == want.stats.target_passes == 20


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory, tokenizer_dir):
    """arch -> (target, tokenizer, its published nextn head as drafter), partly agreeing."""
    made = {}

    def get(arch):
        if arch not in made:
            model, head = build_pair(arch, agree=True, noise=0.15)
            root = write_checkpoint(tmp_path_factory.mktemp(arch) / "m", arch, model, head,
                                    tokenizer_dir)
            target, tok = load_target(root)
            made[arch] = target, tok, make_drafter("mtp", target, model_path=root)
        return made[arch]

    return get


@pytest.mark.parametrize(("arch", "strategy"), [("qwen3_5", "replay"), ("qwen3_next", "capture")])
def test_hybrid_targets_batch_their_recurrent_state(hybrid, arch, strategy):
    """Gated DeltaNet state in one pass: padded steps leave each row's state as it is, each
    row rolls back its own update; every cache == a recompute, greedy == alone."""
    target, tok, drafter = hybrid(arch)
    engine = Engine(target, tok, drafter, draft_length=3)
    with rollback_strategy(strategy):
        alone = [run(engine.conversation(), prompt=p, max_tokens=24)[0] for p in PROMPTS]
        convs = [engine.conversation() for _ in PROMPTS]
        assert batchable(convs)
        committed = [checked(c) for c in convs]
        ends, sizes, _ = lockstep(convs, PROMPTS, max_tokens=24)
    assert max(sizes) == len(PROMPTS)
    for prompt, got, want in zip(PROMPTS, ends, alone, strict=True):
        assert_same_or_near_tie(target, prompt, list(got.tokens), list(want.tokens))
    rounds = min(len(c) for c in committed)
    assert any(len({c[j] for c in committed}) > 1 for j in range(1, rounds))  # ragged


def test_a_long_prefill_lets_running_rounds_through(load, monkeypatch):
    """A conversation arriving with a long prompt prefills a chunk at a time: the running
    one's rounds are verified between its chunks, and both equal their turns alone."""
    from mlx_spec.engine import conversation

    monkeypatch.setattr(conversation, "PREFILL_CHUNK", 8)
    target, tok = load("qwen3")
    engine = Engine(target, tok, drafter_of("ngram", target, load), draft_length=3)
    long = (OTHER * 4)[:50]
    alone = [run(engine.conversation(), prompt=p, max_tokens=24)[0] for p in (PROMPT[:6], long)]
    convs = [engine.conversation() for _ in range(2)]
    batch = Batch(engine.costbook)
    first = batch.start(convs[0], PROMPT[:6], max_tokens=24, ignore_eos=True)
    batch.step([first])  # the short one is already running
    chunks = []
    second = Row(convs[1], _counting(steps(convs[1], long, max_tokens=24, ignore_eos=True),
                                     chunks))
    ends, sizes, _ = lockstep(convs, None, rows=[first, second])
    assert len(chunks) == 7  # 49 prompt tokens before the pending one, 8 at a time
    assert sizes[:6] == [1] * 6 and max(sizes) == 2  # its rounds ran during the long prefill
    for got, want in zip(ends, alone, strict=True):
        assert got.tokens == want.tokens


@pytest.mark.parametrize("which", ["shared-kv", "draft", "qwen3_5"])
def test_prompts_that_arrive_together_prefill_in_one_pass(load, hybrid, monkeypatch, which):
    """Four prompts of different lengths (1 to 3 chunks of 8) prefilled together, ragged, each
    step's chunks in one target pass: every cache (KV, a hybrid's recurrent state, the
    drafter's own: an MTP head's copy of the hidden states, a draft model's cache) equals a
    recompute of its committed sequence after every round, and each turn's tokens equal its
    turn alone."""
    from mlx_spec.engine import conversation as conversation_module

    monkeypatch.setattr(conversation_module, "PREFILL_CHUNK", 8)
    if which == "qwen3_5":
        target, tok, drafter = hybrid(which)
    else:
        target, tok = load("qwen3")
        drafter = drafter_of(which, target, load)
    engine = Engine(target, tok, drafter, draft_length=3)
    prompts = [(OTHER * 3)[:22], PROMPT[:7], (PROMPT * 3)[:19], [7] * 12]
    alone = [run(engine.conversation(), prompt=p, max_tokens=16)[0] for p in prompts]
    convs = [engine.conversation() for _ in prompts]
    for c in convs:
        checked(c)
    ends, _, prefills = lockstep(convs, prompts, max_tokens=16)
    assert prefills == [4, 3, 2]  # chunks of 8 of 21, 6, 18 and 11 tokens before the pending one
    for prompt, got, want in zip(prompts, ends, alone, strict=True):
        assert_same_or_near_tie(target, prompt, list(got.tokens), list(want.tokens))


def _counting(turn, chunks):
    """The turn, counting the prompt chunks it asks for."""
    reply = None
    while True:
        item = turn.send(reply)
        if isinstance(item, PrefillDue):
            chunks.append(len(item.chunk))
        reply = yield item


def test_a_cycle_asks_once_whether_its_rows_batch(load, monkeypatch):
    """Whether the rows verify (and prefill) in one pass is asked once a cycle, by the cycle
    (each row's batch key), and handed down: never again inside the pass, nor for the next
    cycle's draft-length cap, nor for a subset of the rows."""
    from mlx_spec.engine import batch as batch_module
    from mlx_spec.engine import cycle as cycle_module

    asked = {"cycle": 0, "batch": 0, "steps": 0}

    def counting(where, real):
        def ask(convs):
            asked[where] += 1
            return real(convs)
        return ask

    n_rows = len(PROMPTS)
    monkeypatch.setattr(cycle_module, "batch_key", counting("cycle", batch_key))
    monkeypatch.setattr(batch_module, "batchable", counting("batch", batchable))
    step = Batch.step

    def counted(self, rows):
        asked["steps"] += 1
        return step(self, rows)

    monkeypatch.setattr(Batch, "step", counted)
    target, tok = load("qwen3")
    engine = Engine(target, tok, drafter_of("ngram", target, load))
    convs = [engine.conversation() for _ in PROMPTS]
    lockstep(convs, PROMPTS, max_tokens=12)
    assert asked["batch"] == 0
    assert 0 < asked["cycle"] <= n_rows * asked["steps"]  # each row's key once a cycle at most
