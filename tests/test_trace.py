"""A traced turn records what each round did — its drafts, the verdicts, p and q — and those
figures are the ones the acceptance test read: p is the target's distribution at that position
(checked against a from-scratch forward), q the drafter's (equal to p when the drafter is the
target itself). Tracing changes no token, and an untraced turn does none of its work. The record
round-trips through JSON and renders as a page with the rejected drafts struck out."""

from __future__ import annotations

import json
import shutil
import subprocess

import mlx.core as mx
import numpy as np
import pytest
from helpers import PROMPT, conversation

from mlx_spec import cache as kv
from mlx_spec.drafters import DraftModelDrafter
from mlx_spec.engine import inspect
from mlx_spec.errors import MlxSpecError
from mlx_spec.events import Kind, RoundTrace, TokenEvent, TurnEnd
from mlx_spec.sampling import SamplingConfig
from mlx_spec.trace import Recorder, engine_fields, from_dict, load_trace, to_dict
from mlx_spec.trace_html import render, save_trace

MAX = 32


@pytest.fixture(scope="module")
def models(load):
    target, tok = load("llama")
    other, _ = load("llama", seed=1)  # a drafter that disagrees often: rejections
    same, _ = load("llama")  # the target drafting for itself: q = p
    return target, tok, other, same


def turn(models, drafter_model, *, trace: bool, k: int = 3, **sampling):
    target, tok, _, _ = models
    conv = conversation(target, tok, DraftModelDrafter(drafter_model, target), draft_length=k)
    return list(conv.generate(PROMPT, max_tokens=MAX, ignore_eos=True, trace=trace,
                              sampling=SamplingConfig(**sampling)))


def recorded(events) -> Recorder:
    r = Recorder()
    for e in events:
        r.add(e)
    return r


def test_untraced_turns_do_no_trace_work_and_tracing_changes_no_token(models, monkeypatch):
    traced = turn(models, models[2], trace=True)

    def refuse(*a, **k):
        raise AssertionError("an untraced turn looked at its rows")

    monkeypatch.setattr(inspect, "rows", refuse)
    plain = turn(models, models[2], trace=False)
    assert not [e for e in plain if isinstance(e, RoundTrace)]
    tokens = [(e.token, e.kind) for e in plain if isinstance(e, TokenEvent)]
    assert [(e.token, e.kind) for e in traced if isinstance(e, TokenEvent)] == tokens


def test_every_token_belongs_to_a_round_that_says_why(models):
    events = turn(models, models[2], trace=True)
    rec = recorded(events)
    assert rec.end is not None and len(rec.tokens) == MAX
    assert all(t.round >= 0 for t in rec.tokens)
    assert sum(r.emitted for r in rec.rounds) == MAX
    assert len(rec.rounds) == rec.end.stats.target_passes
    rejected = 0
    for i, r in enumerate(rec.rounds):
        mine = [t for t in rec.tokens if t.round == i]
        assert len(mine) == r.emitted and len(r.drafted) == r.k
        if not r.rows:  # a pipelined plain step: its logits are never read
            assert r.k == 0 and mine[0].kind == Kind.TARGET
            continue
        assert len(r.rows) == r.k + 1
        assert [row.verdict for row in r.rows[: r.k]] == (
            ["accepted"] * r.accepted + ["rejected", "untested"][: r.k - r.accepted]
            + ["untested"] * max(0, r.k - r.accepted - 2))
        for j, t in enumerate(mine):
            assert t.token == r.rows[j].token
            if j < r.accepted:
                assert t.kind == Kind.ACCEPTED and t.token == r.drafted[j]
        if r.accepted < r.k and len(mine) > r.accepted:
            fix = mine[r.accepted]
            assert fix.kind == Kind.CORRECTED and fix.token != r.drafted[r.accepted]
            assert [x.draft for x in r.rejected] == list(r.drafted[r.accepted:])
            rejected += 1
    assert rejected, "the disagreeing drafter was never rejected: nothing was tested"


def test_greedy_p_is_the_targets_softmax_at_that_position(models):
    """Every row's p against one forward of the committed sequence from scratch: a p read
    from the wrong row or position fails here."""
    target = models[0]
    rec = recorded(turn(models, models[2], trace=True))
    seq = PROMPT + [t.token for t in rec.tokens]
    logits, _ = target.forward(seq[:-1], kv.make_cache(target.model))
    ref = np.array(mx.softmax(logits.astype(mx.float32), axis=-1))
    at = len(PROMPT) - 1  # the row predicting the answer's first token
    checked = 0
    for r in rec.rounds:
        assert r.rule == "argmax"
        if not r.rows:  # a pipelined plain step
            at += r.emitted
            continue
        for j, row in enumerate(r.rows[: r.emitted]):
            want = ref[at + j]
            assert row.p_token == pytest.approx(float(want[row.token]), abs=2e-5)
            assert row.top_p[0].token == int(want.argmax()) == row.token  # greedy: the argmax
            if row.draft is not None:
                assert row.p == pytest.approx(float(want[row.draft]), abs=2e-5)
            assert row.q is None and row.top_q == ()  # a greedy drafter reports no q
            checked += 1
        at += r.emitted
    assert checked > MAX // 2


def test_sampled_q_is_the_drafters_distribution(models):
    """The target drafting for itself at T = 1 (rejection sampling): q of every draft equals
    its p, min(1, p/q) = 1 and every draft is accepted — a q read from a shifted row, or p and
    q processed differently, would not be."""
    events = turn(models, models[3], trace=True, temperature=1.0, top_k=40,
                  coupling="leviathan", seed=5)
    rounds = [e for e in events if isinstance(e, RoundTrace)]
    drafted = 0
    for r in rounds:
        assert r.rule == "p/q"
        for row in r.rows[: r.k]:
            assert row.q == pytest.approx(row.p, rel=1e-3, abs=1e-6) and row.q > 0
            assert row.chance == pytest.approx(1.0, abs=1e-3)
            assert row.verdict == "accepted"
            assert [c.token for c in row.top_q[:3]] == [c.token for c in row.top_p[:3]]
            drafted += 1
    assert drafted > MAX // 2


def test_seeded_rounds_say_gumbel_and_drafts_have_their_q(models):
    events = turn(models, models[2], trace=True, temperature=0.8, seed=3)
    rounds = [e for e in events if isinstance(e, RoundTrace)]
    assert {r.rule for r in rounds} == {"gumbel"}
    assert all(row.q > 0 for r in rounds for row in r.rows[: r.k])  # drawn from q


def test_the_record_round_trips_and_renders(models, tmp_path):
    events = turn(models, models[2], trace=True)
    trace = recorded(events).trace(engine=engine_fields("tiny", "draft", 3),
                                   sampling=SamplingConfig(),
                                   messages=[{"role": "user", "content": "<b>hi</b>"}])
    assert from_dict(json.loads(json.dumps(to_dict(trace)))) == trace
    assert load_trace(save_trace(trace, tmp_path / "t.json")) == trace
    page = render(trace)
    assert "&lt;b&gt;hi&lt;/b&gt;" in page and "<b>hi</b>" not in page
    answer = page.split("<div class='answer'>", 1)[1].split("</div>", 1)[0]
    ghosts = answer.count("class='ghost'>")
    corrected = sum(t.kind == "corrected" for t in trace.tokens)
    assert corrected and ghosts == corrected  # a ghost before every correction
    assert save_trace(trace, tmp_path / "t.html").read_text() == page
    with pytest.raises(MlxSpecError, match="not an mlx-spec trace"):
        from_dict({"format": "other"})
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(MlxSpecError, match="cannot read the trace"):
        load_trace(tmp_path / "bad.json")


def test_a_plain_step_is_a_round_of_no_drafts(models):
    target, tok, _, _ = models
    conv = conversation(target, tok, None)
    events = list(conv.generate(PROMPT, max_tokens=8, ignore_eos=True, trace=True))
    rounds = [e for e in events if isinstance(e, RoundTrace)]
    assert len(rounds) == 8 and all(r.k == 0 and r.emitted == 1 for r in rounds)
    assert isinstance(events[-1], TurnEnd)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium (CI installs it)")
def test_the_page_opens_in_chromium(models, tmp_path):
    """A real browser runs the page's script: the token named in the address shows its
    round and its p in the details box."""
    trace = recorded(turn(models, models[2], trace=True)).trace()
    page = save_trace(trace, tmp_path / "t.html")
    out = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
         f"file://{page}#t=3"], capture_output=True, text=True, timeout=120)
    dom = out.stdout
    assert "id=\"tip\"" in dom and "round " in dom.split("id=\"tip\"", 1)[1][:400], out.stderr


@pytest.mark.parametrize("logits", [True, False])
def test_both_ways_to_the_top_five_agree(monkeypatch, logits):
    """Small rows take numpy's argpartition, large ones n masked argmaxes in a kept buffer
    (no 1 MB temporaries): the same ids, most likely first, and the same probabilities."""
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(5, 3000)).astype(np.float32)
    if not logits:
        scores = np.exp(scores) / np.exp(scores).sum(-1, keepdims=True)
    ids, at = [7, 11, 2999], [0, 3, 4]
    small = inspect._probs(scores, ids, at, logits)
    monkeypatch.setattr(inspect, "SMALL", 0)
    large = inspect._probs(scores, ids, at, logits)
    assert small[0] == large[0] and np.allclose(small[1], large[1]) and small[2] == large[2]
    want = np.exp(scores) / np.exp(scores).sum(-1, keepdims=True) if logits else scores
    assert np.allclose(large[1], np.sort(want, -1)[:, ::-1][:, :5], rtol=1e-5)
    assert np.allclose(large[2], want[at, ids], rtol=1e-5)
