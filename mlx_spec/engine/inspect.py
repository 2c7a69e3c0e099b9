"""What a traced round records about each row of its verify pass: p and q of the drafts, the
top-5 of each, and the verdicts (events.RoundTrace, events.Row).

Only a traced turn calls this: it adds one small device computation per round (a softmax and a
partial selection over the k + 1 rows the pass already produced) and one host read of its
[k + 1, ~12] result, never anything per token. An untraced turn does none of it.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx

from ..events import Choice, Row
from ..sampling import Sampler, Verdict, penalize, processed

TOP = 5


def rule(sampler: Sampler) -> str:
    """The acceptance test a round ran under these settings (see events.RoundTrace)."""
    if sampler.cfg.greedy:
        return "argmax"
    return "gumbel" if sampler.cfg.invariant else "p/q"


def look(sampler: Sampler, logits: mx.array, history: list[int], drafts: mx.array,
         q: mx.array | None) -> list[mx.array]:
    """The lazy arrays a round's rows are read from: p over the rows [k+1, V] (the test's
    distribution, or the plain softmax when greedy: see events.Row), its top-5, q's top-5 and
    q at the drafts. Built before the commit (the penalty reads the history as it was)."""
    logits = penalize(logits, history, drafts, sampler.cfg)
    if sampler.cfg.greedy:
        p = mx.softmax(logits.astype(mx.float32), axis=-1)
    else:
        p = processed(logits, sampler.cfg, full=True)[0].astype(mx.float32)
    out = list(_top(p))
    out.append(p)
    if q is not None and q.shape[0]:
        q = q.astype(mx.float32)
        out += [*_top(q), mx.take_along_axis(q, drafts.reshape(-1, 1).astype(mx.int32),
                                             axis=-1).reshape(-1)]
    return out


def _top(probs: mx.array) -> tuple[mx.array, mx.array]:
    """The TOP most likely tokens of each row (unsorted) and their probabilities."""
    n = min(TOP, probs.shape[-1])
    ids = mx.argpartition(-probs, kth=n - 1, axis=-1)[:, :n]
    return ids, mx.take_along_axis(probs, ids, axis=-1)


def read(arrays: list[mx.array], verdict: Verdict, emitted: list[int],
         text: Callable[[int], str]) -> tuple[Row, ...]:
    """The rows of a round from look()'s arrays (evaluated here: the round's one extra host
    read). emitted: the round's tokens as committed (the turn may have cut them short)."""
    p_ids, p_top, p = arrays[:3]
    drafts = list(verdict.drafted)
    k, n = len(drafts), verdict.num_accepted
    # p at every draft and every emitted token, gathered on the device: [k+1] rows at most
    at = mx.array([[i, t] for i, t in enumerate(drafts)] +
                  [[i, t] for i, t in enumerate(emitted)] or [[0, 0]], dtype=mx.int32)
    p_at = p[at[:, 0], at[:, 1]]
    small = [p_ids, p_top, p_at, *arrays[3:]]
    mx.eval(*small)
    p_ids, p_top, p_at = p_ids.tolist(), p_top.tolist(), p_at.tolist()
    q_ids = q_top = q_at = None
    if len(arrays) > 3:
        q_ids, q_top, q_at = (a.tolist() for a in arrays[3:])
    p_draft, p_emit = p_at[:k], p_at[k:k + len(emitted)]
    rows = []
    for i in range(k + 1):
        draft = drafts[i] if i < k else None
        token = emitted[i] if i < len(emitted) else None
        verdict_i = ("" if draft is None else "accepted" if i < n else
                     "rejected" if i == n else "untested")
        rows.append(Row(
            draft=draft, draft_text=text(draft) if draft is not None else "",
            verdict=verdict_i,
            p=p_draft[i] if draft is not None else None,
            q=q_at[i] if draft is not None and q_at is not None else None,
            token=token, token_text=text(token) if token is not None else "",
            p_token=p_emit[i] if token is not None else None,
            top_p=_choices(p_ids[i], p_top[i], text),
            top_q=_choices(q_ids[i], q_top[i], text) if q_ids is not None and i < k else (),
        ))
    return tuple(rows)


def _choices(ids: list[int], probs: list[float], text: Callable[[int], str]
             ) -> tuple[Choice, ...]:
    ranked = sorted(zip(probs, ids, strict=True), reverse=True)
    return tuple(Choice(t, text(t), pr) for pr, t in ranked)
