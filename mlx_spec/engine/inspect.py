"""What a traced round records about each row of its verify pass: p and q of the drafts, the
top-5 of each, and the verdicts (events.RoundTrace, events.Row).

Only a traced turn calls this, after its round is decided. It reads what the round already
computed and evaluated — the rows the acceptance test read (Verdict.read: the logits when
greedy, p when sampling) and the drafter's q — as host views of the same memory, no device
work and no extra sync; the rest is numpy over k + 1 rows (a greedy row's normalizer, the
top-5s). An untraced turn does none of it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import mlx.core as mx
import numpy as np

from ..coupling import Verdict
from ..events import Choice, Row
from ..sampling import Sampler

TOP = 5
SMALL = 1 << 16  # rows this size or smaller: numpy's argpartition outright


def rule(sampler: Sampler) -> str:
    """The acceptance test a round ran under these settings (see events.RoundTrace)."""
    if sampler.cfg.greedy:
        return "argmax"
    return "gumbel" if sampler.cfg.invariant else "p/q"


def rows(sampler: Sampler, verdict: Verdict, q: mx.array | None, emitted: list[int],
         text: Callable[[int], str]) -> tuple[Row, ...]:
    """The round's rows. emitted: its tokens as committed (the turn may have cut them
    short). p is the test's distribution; when greedy, whose test is the argmax, the
    target's plain softmax of the logits it compared (events.Row)."""
    drafts, n = list(verdict.drafted), verdict.num_accepted
    k, m = len(drafts), len(emitted)
    p_ids, p_top, p_at = _probs(_host(verdict.read), drafts + emitted,
                                        list(range(k)) + list(range(m)), sampler.cfg.greedy)
    q_ids = q_top = q_at = None
    if q is not None and q.shape[0]:
        q_ids, q_top, q_at = _probs(_host(q), drafts, list(range(k)), False)
    out = []
    for i in range(k + 1):
        draft = drafts[i] if i < k else None
        token = emitted[i] if i < m else None
        out.append(Row(
            draft=draft, draft_text=text(draft) if draft is not None else "",
            verdict=("" if draft is None else "accepted" if i < n else
                     "rejected" if i == n else "untested"),
            p=p_at[i] if draft is not None else None,
            q=q_at[i] if draft is not None and q_at is not None else None,
            token=token, token_text=text(token) if token is not None else "",
            p_token=p_at[k + i] if token is not None else None,
            top_p=_choices(p_ids[i], p_top[i], text),
            top_q=_choices(q_ids[i], q_top[i], text) if q_ids is not None and i < k else (),
        ))
    return tuple(out)


def _probs(scores: np.ndarray, ids: list[int], at_rows: list[int], logits: bool
           ) -> tuple[list, list, list[float]]:
    """Each row's TOP most likely ids and their probabilities, and the probabilities of `ids`
    at rows `at_rows`, as host lists. logits: the rows are logits (p = softmax of each)."""
    # No temporary as large as the rows: a fresh one costs more in page faults than the
    # arithmetic on it (DESIGN.md "Traces"). Large rows' top-n: n argmaxes, each masked out.
    n, rows_at = min(TOP, scores.shape[-1]), np.arange(scores.shape[0])
    scratch = _scratch(scores.shape)
    if scores.size <= SMALL:  # one call: its index array is small
        top = np.argpartition(scores, scores.shape[-1] - n, axis=-1)[:, -n:]
        top = np.take_along_axis(top, np.argsort(-np.take_along_axis(scores, top, -1)), -1)
    else:
        np.copyto(scratch, scores)
        top = np.empty((scores.shape[0], n), np.int64)
        for j in range(n):
            top[:, j] = scratch.argmax(axis=-1)
            scratch[rows_at, top[:, j]] = -np.inf
    vals = scores[rows_at[:, None], top]
    at = scores[at_rows, ids] if ids else np.zeros(0, np.float32)
    if logits:  # p = exp(logit - logsumexp(row)); the first of the top is the row's peak
        peak = vals[:, :1]
        np.subtract(scores, peak, out=scratch)
        norm = peak + np.log(np.exp(scratch, out=scratch).sum(axis=-1, keepdims=True))
        vals = np.exp(vals - norm)
        at = np.exp(at - norm[at_rows, 0]) if ids else at
    return top.tolist(), vals.tolist(), at.tolist()


_LOCAL = threading.local()  # each engine thread's scratch buffer


def _scratch(shape: tuple[int, ...]) -> np.ndarray:
    """A float32 buffer of at least `shape`, kept for this thread's next round."""
    size = int(np.prod(shape))
    buf = getattr(_LOCAL, "buf", None)
    if buf is None or buf.size < size:
        buf = _LOCAL.buf = np.empty(size, np.float32)
    return buf[:size].reshape(shape)


def _host(a: mx.array) -> np.ndarray:
    """The rows as float32 numpy, a view of the evaluated array where it already is."""
    return np.asarray(a if a.dtype == mx.float32 else a.astype(mx.float32))


def _choices(ids: list[int], probs: list[float], text: Callable[[int], str]
             ) -> tuple[Choice, ...]:
    """Those tokens, most likely first, leaving out any the distribution gives nothing."""
    ranked = sorted(zip(probs, ids, strict=True), reverse=True)
    return tuple(Choice(t, text(t), pr) for pr, t in ranked if pr > 0)
