"""Shared scaffolding: a fixed-length run, the per-round state check (every cache and drafter
state == a recompute), and the near-tie analysis of greedy divergences."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import QuantizedKVCache

from mlx_spec import cache as kv
from mlx_spec.cache import RecurrentCache, WindowKVCache
from mlx_spec.drafters import DraftContext, DraftModelDrafter
from mlx_spec.drafters.dflash import DFlashDrafter, stored
from mlx_spec.drafters.lookup import LookupFirst
from mlx_spec.drafters.mtp import MTPDrafter
from mlx_spec.engine import Engine
from mlx_spec.engine.costs import TargetCosts
from mlx_spec.engine.cycle import Batch
from mlx_spec.events import TurnEnd
from mlx_spec.sampling import SamplingConfig

PROMPT = [(i * 29) % 300 + 5 for i in range(20)]
MAX = 40


def run(engine, prompt=PROMPT, max_tokens=MAX, **kw):
    """A fixed-length turn (random models: end tokens ignored): (TurnEnd, its token events)."""
    events = list(engine.generate(prompt, max_tokens=max_tokens, ignore_eos=True, **kw))
    end = events[-1]
    assert isinstance(end, TurnEnd)
    return end, events[:-1]


def checked(conv):
    """Wrap Conversation.commit: after every round the target's caches (KV, window, conv,
    recurrent) and the drafter's own state equal a from-scratch recompute of the committed
    sequence. Returns the list of tokens committed per round."""
    original = conv.commit
    rounds = []

    def commit(new, valid, hidden, *, ahead=False):
        original(new, valid, hidden, ahead=ahead)
        committed = conv.tokens[:-1]
        assert conv.cached == len(committed) + ahead
        rounds.append(len(new))
        if ahead:  # a plain step already runs on the new pending token: checked next commit
            return
        assert_cache_equals_recompute(conv.target, conv.cache, committed)
        d, s = conv.drafter, conv.drafter_state
        if isinstance(d, LookupFirst):  # its n-gram index, then the model drafter inside
            fresh = d.ngram.new_state()
            d.ngram.commit(fresh, DraftContext(conv.target, conv.tokens, []), 0)
            assert s.index.index == fresh.index and s.index.indexed == fresh.indexed
            d, s = d.inner, s.inner
        if isinstance(d, MTPDrafter):  # its copy of the target's hidden states, its own cache
            fresh = kv.make_cache(conv.target.model)
            _, h = conv.target.forward(committed, fresh, hidden=d.needs_hidden)
            assert s.hist.n == len(committed)
            base = s.hist.base  # the rows it keeps (older ones it will never read again)
            assert s.hist.buf is None or s.hist.buf.shape[0] <= 2 * (s.hist.n - base) + 512
            np.testing.assert_allclose(np.array(s.hist.rows(base, s.hist.n)),
                                       np.array(h[base:]), atol=2e-4)
            if s.cache:
                assert_head_cache_equals_recompute(d, s, conv.tokens)
        elif isinstance(d, DraftModelDrafter):  # (empty until it first drafts: lookup copied)
            if s.cached:
                assert_cache_equals_recompute(d.model, s.cache, conv.tokens[: s.cached])
            else:
                assert all(c.offset == 0 for c in s.cache)
        elif isinstance(d, DFlashDrafter):  # one context entry per committed position
            _, taps = conv.target.forward(committed, kv.make_cache(conv.target.model),
                                          hidden=d.needs_hidden)
            fresh = d.new_state()
            d.head.extend(fresh.context, taps)
            assert s.cached == len(committed)
            for mine, want in zip(s.context, fresh.context, strict=True):
                for a, b in zip(stored(mine), stored(want), strict=True):
                    np.testing.assert_allclose(np.array(a), np.array(b), atol=2e-4, rtol=1e-3)

    conv.commit = commit
    return rounds


def assert_head_cache_equals_recompute(d, state, tokens, atol=2e-4):
    """An own-cache MTP head's cache (in its conversation state) == a recompute from the
    target's hidden states: entry e pairs token e + first with h_{e + first - 1}."""
    n, f = state.cached, d.first
    assert f + n <= len(tokens)
    if n == 0:
        return
    ref = d.new_state().cache
    _, h = d.target.forward(tokens[:-1], kv.make_cache(d.target.model), hidden=d.needs_hidden)
    rows = h[max(f - 1, 0) : f + n - 1]
    if f == 0:  # entry 0 pairs token 0 with zeros
        rows = mx.concatenate([mx.zeros_like(h[:1]), rows])
    emb = d._embed(tokens[f : f + n], 0)
    if d.cfg.kind == "eagle3":  # one cache per layer, its masks its own
        d.head(emb, rows[None], ref)
    else:
        d.head(emb, rows[None], ref[0], create_causal_mask(n, 0) if n > 1 else None)
    assert len(ref) == len(state.cache)
    for mine, fresh in zip(state.cache, ref, strict=True):
        for got, want in zip(mine.keys_and_values(), fresh.keys_and_values(), strict=True):
            np.testing.assert_allclose(np.array(got.astype(mx.float32)),
                                       np.array(want.astype(mx.float32)), atol=atol, rtol=1e-3)


def assert_turn_matches_fresh(engine, prompt, max_tokens):
    """A later turn of `engine`'s conversation equals target-only decoding of the same prompt
    from scratch (prefix reuse and rollback leave nothing behind). Returns that turn's end."""
    got, _ = run(engine, prompt=prompt, max_tokens=max_tokens)
    fresh, _ = run(Engine(engine.target, engine.tokenizer, None).conversation(), prompt=prompt,
                   max_tokens=max_tokens)
    assert_same_or_near_tie(engine.target, prompt, list(got.tokens), list(fresh.tokens))
    return got

# Batched verification runs other kernels than one-token decoding. Two greedy runs may only part
# at a near-tie: the top-2 logit gap at the divergence is below this (relative to the logit scale).
NEAR_TIE = {None: 2e-3, 8: 2e-2, 4: 5e-2}


def stored_kv(c):
    """(keys, values) in temporal order, as float arrays (dequantized if needed)."""
    k, v = c.keys_and_values() if hasattr(c, "keys_and_values") else c.state[:2]
    if isinstance(k, tuple | list):  # QuantizedKVCache: (w, scales, biases)
        k = mx.dequantize(*k, group_size=c.group_size, bits=c.bits)
        v = mx.dequantize(*v, group_size=c.group_size, bits=c.bits)
    return np.array(k.astype(mx.float32)), np.array(v.astype(mx.float32))


def assert_cache_equals_recompute(target, caches, tokens, atol=1e-4):
    """The cache after speculation equals a fresh prefill of exactly these tokens: every layer's
    K/V, and every recurrent layer's conv and delta-rule state. Quantized KV is compared with a
    fresh quantized cache, up to a quantization step."""
    bits = next((c.bits for c in caches if isinstance(c, QuantizedKVCache)), None)
    atol = atol if bits is None else max(atol, 0.05)
    fresh = kv.make_cache(target.model, slack=64, kv_bits=bits)
    if tokens:
        target.forward(tokens, fresh)
    for got, want in zip(caches, fresh, strict=True):
        if isinstance(got, RecurrentCache):
            assert len(got.cache) == len(want.cache)
            for a, b in zip(got.cache, want.cache, strict=True):
                assert (a is None) == (b is None)
                if a is not None:
                    np.testing.assert_allclose(np.array(a.astype(mx.float32)),
                                               np.array(b.astype(mx.float32)),
                                               atol=atol, rtol=1e-3)
            continue
        assert got.offset == len(tokens)
        gk, gv = stored_kv(got)
        wk, wv = stored_kv(want)
        if isinstance(got, WindowKVCache):  # only the window matters for future queries
            w = got.window - 1
            gk, gv, wk, wv = gk[..., -w:, :], gv[..., -w:, :], wk[..., -w:, :], wv[..., -w:, :]
        assert gk.shape == wk.shape, (gk.shape, wk.shape)
        np.testing.assert_allclose(gk, wk, atol=atol, rtol=1e-3)
        np.testing.assert_allclose(gv, wv, atol=atol, rtol=1e-3)


def first_divergence(a, b):
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None


def top2_gap(target, context):
    """Relative gap between the two best next-token logits after `context` (fresh forward)."""
    logits = np.array(target.model(mx.array(context)[None])[0, -1].astype(mx.float32))
    top = np.sort(logits)[-2:]
    return (top[1] - top[0]) / (np.abs(logits).max() + 1e-9)


# tallies printed at the end of the run (tests/conftest.py): how often greedy outputs were
# identical token for token, and how often they parted at a measured near-tie
IDENTITY = {"identical": 0, "near_tie": 0, "tokens": 0}


def assert_same_or_near_tie(target, prompt, got, want, bits=None):
    """got == want, except that they may part at a genuine near-tie (measured, not assumed)."""
    i = first_divergence(got, want)
    IDENTITY["tokens"] += len(want)
    if i is None:
        assert len(got) == len(want)
        IDENTITY["identical"] += 1
        return None
    gap = top2_gap(target, prompt + list(want[:i]))
    assert gap < NEAR_TIE[bits], f"diverged at {i} with top-2 gap {gap:.4g}: not a near-tie"
    IDENTITY["near_tie"] += 1
    return gap


def loaded_pairs(pair_dir):
    """kind -> (target, tokenizer, drafter) over a fixture of (target dir, drafter dir), each
    loaded once through the CLI's path (`--draft-model DIR` tells the drafter's kind)."""
    from mlx_spec.loading import load_target, make_drafter

    loaded = {}

    def get(kind: str):
        if kind not in loaded:
            target_dir, drafter_dir = pair_dir(kind)
            target, tok = load_target(target_dir)
            loaded[kind] = target, tok, make_drafter("draft", target, draft_model=drafter_dir)
        return loaded[kind]

    return get


def open_chat(**spec):
    """A new conversation on load_engine(LoadSpec(**spec)): the CLI's loading path."""
    from mlx_spec.loading import load_engine
    from mlx_spec.spec import LoadSpec

    return load_engine(LoadSpec(**spec)).conversation()


def conversation(target, tokenizer, drafter=None, **engine_options):
    """A new conversation on an Engine over these weights (draft_length=, kv_bits=)."""
    return Engine(target, tokenizer, drafter, **engine_options).conversation()


def sampled_draft(target, drafter, tokens, k, seed):
    """The drafter's k drafts at T = 1 after `tokens` (the target's pass over all but the
    pending last one, its hidden states or taps committed to a fresh drafter state)."""
    from mlx_spec import cache as kv
    from mlx_spec.drafters import DraftContext
    from mlx_spec.sampling import Sampler, SamplingConfig

    cache, state = kv.make_cache(target.model), drafter.new_state()
    _, taps = target.forward(tokens[:-1], cache, hidden=drafter.needs_hidden)
    drafter.commit(state, DraftContext(target, tokens, cache, taps, 0), 0)
    return drafter.draft(state, DraftContext(target, tokens, cache), k,
                         Sampler(SamplingConfig(temperature=1.0, seed=seed)))


def assert_lossless_behind_lookup(target, tokenizer, drafter, k, max_tokens=40):
    """`drafter` behind prompt lookup (the CLI's default), on a prompt whose last 3 tokens
    appeared before (copies are ready from the start): greedy output equals target-only and
    every state equals a recompute after every round, copied or drafted."""
    prompt = PROMPT + PROMPT[4:12] + PROMPT[4:12]
    want, _ = run(conversation(target, tokenizer, None), prompt=prompt, max_tokens=max_tokens)
    wrapped = drafter if isinstance(drafter, LookupFirst) else LookupFirst(drafter)
    engine = conversation(target, tokenizer, wrapped, draft_length=k)
    checked(engine)
    got, _ = run(engine, prompt=prompt, max_tokens=max_tokens)
    assert_same_or_near_tie(target, prompt, list(got.tokens), list(want.tokens))


def padded(conv, monkeypatch, size: int = 16) -> list[int]:
    """Make every verify pass of `conv` run as `size` tokens (as if measured cheapest) and
    record the length of every pass over its cache."""
    conv.costbook.measured = TargetCosts((1.0,) * size, 1.0, pad_to=(size,) * size)
    fed, forward = [], conv.target.forward

    def counted(tokens, cache, **kw):
        if cache is conv.cache:  # the conversation's passes (a drafter may share the weights)
            fed.append(len(tokens))
        return forward(tokens, cache, **kw)

    monkeypatch.setattr(conv.target, "forward", counted)
    return fed


def lockstep(convs, prompts, *, max_tokens=32, sampling=None, rows=None):
    """Drive the turns together as the server does (cycle.Batch.step: every round's drafts
    together, one pass per cycle, prompt chunks of turns arriving together in one pass).
    rows: the batch's rows, made here from convs and prompts if not given. Returns each turn's
    TurnEnd, the rounds of every cycle that verified any, and the rows of every prefill pass."""
    batch = Batch(convs[0].costbook)
    sampling = sampling or [SamplingConfig()] * len(convs)
    rows = rows or [batch.start(c, p, max_tokens=max_tokens, sampling=s, ignore_eos=True)
                    for c, p, s in zip(convs, prompts, sampling, strict=True)]
    ends, sizes, prefills = [None] * len(rows), [], []
    live = list(range(len(rows)))
    while live:
        cycle = batch.step([rows[i] for i in live])
        if cycle.rounds:
            sizes.append(cycle.rounds)
        if cycle.prefilled:
            prefills.append(cycle.prefilled)
        for i, out in zip(list(live), cycle.produced, strict=True):
            assert out.error is None, out.error
            if out.over:
                ends[i] = out.events[-1]
                live.remove(i)
    return ends, sizes, prefills
