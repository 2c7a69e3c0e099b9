"""Chained draft steps trained at once ("training-time test", as EAGLE-3 and HASS train), the
per-position acceptance they reach on held-out rows, and the per-position loss weights that
follow from it.

A drafter asked for k tokens runs k chained steps: step j reads the token drafted at step j − 1
and the state step j − 1 fed back. Training runs those `depth` steps over every anchor row of a
batch at once, each on its own chained outputs, exactly as drafting runs them; the tokens fed
are the data's, which is what drafting reads whenever the steps before were accepted (the only
case in which step j's draft is ever verified).

Every kind yields one `Step` per chained step: the draft logits, the teacher's distribution of
the token that step predicts, which rows count, and that token itself (for the acceptance).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import mlx.core as mx
import numpy as np


@dataclass
class Step:
    logits: mx.array  # [B, T, V] draft logits of step j at each anchor row
    p: mx.array  # [B, T, V] the target's distribution of the token step j predicts
    valid: mx.array  # [B, T] rows where that token exists (and the step is scored)
    y: mx.array  # [B, T] the data's token there (what the next step is fed)
    # a head with a reduced draft vocabulary: logits and p are over the draft ids, `want` is
    # the target's argmax (a target id) and `ids` maps a draft id to its target id
    want: mx.array | None = None
    ids: mx.array | None = None


def shift(a: mx.array, j: int) -> mx.array:
    """a[:, j:] padded with zeros back to length T."""
    if j == 0:
        return a
    pad = mx.zeros((a.shape[0], min(j, a.shape[1]), *a.shape[2:]), a.dtype)
    return mx.concatenate([a[:, j:], pad], axis=1)


def thinning(j: int) -> int:
    """Training scores step j at every thinning(j)-th anchor row (all rows at step 0). A
    step's logits and loss over the vocabulary are most of its cost; a deeper step weighs less
    (position_weights), and a strided subset of its rows is an unbiased estimate of the same
    gradient at a half or a quarter of that cost. Its chain still runs over every row."""
    return 1 if j == 0 else 2 if j < 4 else 4


def scored_step(logits, out: mx.array, p: mx.array, x: mx.array, j: int, ahead: int,
                thin: Callable[[int], int] | None, first_row: int = 0,
                want: mx.array | None = None, ids: mx.array | None = None) -> Step:
    """Step j at its scored anchor rows (every thin(j)-th; None: all): row i's output
    predicts the token at i + ahead + 1, whose teacher distribution is p at i + ahead (rows
    past the end are not valid)."""
    B, T = x.shape
    r = thin(j) if thin is not None else 1
    rows = np.arange(j % r, T, r)
    at, nxt = np.minimum(rows + ahead, T - 1), np.minimum(rows + ahead + 1, T - 1)
    valid = ((rows >= first_row) & (rows + ahead < T)).astype(np.float32)
    if r > 1:
        out = out[:, mx.array(rows)]
    at = mx.array(at)
    return Step(logits(out), p[:, at], mx.broadcast_to(mx.array(valid), (B, len(rows))),
                x[:, mx.array(nxt)], None if want is None else want[:, at], ids)


class ChainCache:
    """What an own-cache head's attention sees while training its chained steps: the entries
    of every step so far, side by side along the sequence axis (step m's entry for anchor row
    t at index m·T + t). `offset` is the step: RoPE then puts step m of row t at position
    t + m, where drafting from t puts it."""

    def __init__(self):
        self.keys = self.values = None
        self.offset = 0

    def update_and_fetch(self, k: mx.array, v: mx.array):
        if self.keys is None:
            self.keys, self.values = k, v
        else:
            self.keys = mx.concatenate([self.keys, k], axis=2)
            self.values = mx.concatenate([self.values, v], axis=2)
        return self.keys, self.values


def chain_mask(T: int, j: int) -> mx.array:
    """[T, (j+1)·T]: step j's query at anchor row t sees the committed entries <= t (step 0,
    built from the target's own states: causal) and its own chain's entries of steps 1..j (the
    diagonal of each later block) — what drafting from t has in the head's cache."""
    q = np.arange(T)[:, None]
    k = np.arange(T)[None]
    blocks = [k <= q] + [k == q] * j
    return mx.array(np.concatenate(blocks, axis=1))


def own_cache_steps(call: Callable, logits: Callable, emb: mx.array, g: mx.array, p: mx.array,
                    x: mx.array, depth: int, first: int, caches: list,
                    thin: Callable[[int], int] | None = None, want: mx.array | None = None,
                    ids: mx.array | None = None) -> Iterator[Step]:
    """The chained steps of a head with its own cache (DeepSeek-style MTP, EAGLE-3): entry i
    pairs token x_{i+first} (emb) with the target's state g_i and predicts x_{i+first+1};
    step j at row i reads x_{i+first+j} and step j − 1's output there. call(emb, g, caches,
    mask) -> the state fed back; logits(state) -> draft logits; caches: ChainCaches; thin:
    score step j at every thin(j)-th row only (None: all); want, ids: a reduced draft
    vocabulary's (Step)."""
    T = x.shape[1]
    for j in range(depth):
        for c in caches:
            c.offset = j
        out = call(shift(emb, first + j), g, caches, chain_mask(T, j))
        yield scored_step(logits, out, p, x, j, first + j, thin, want=want, ids=ids)
        g = out


def shared_kv_steps(head, target, rope, embed_scale: float, x, h, p, k, v, depth: int,
                    thin: Callable[[int], int] | None = None) -> Iterator[Step]:
    """A shared-KV MTP head's chained steps: step j at row i reads token x_{i+j} and the
    previous step's h', queries at position i+j, and sees only the target K/V of positions < i
    (what is in the target's cache when drafting starts there)."""
    T = x.shape[1]
    emb = target.embed(x) * embed_scale
    rows = mx.arange(T)
    # row i sees target keys of positions < i (row 0, which has none, sees key 0; not scored)
    mask = (rows[None, :] < rows[:, None]) | ((rows[:, None] == 0) & (rows[None, :] == 0))
    g = mx.concatenate([mx.zeros_like(h[:, :1]), h[:, :-1]], axis=1)  # h_{i-1}
    for j in range(depth):
        out = head(shift(emb, j), g, k, v, rope, j, mask)
        yield scored_step(target.head, out, p, x, j, j, thin, first_row=1)
        g = out


def acceptance(steps: Iterator[Step]) -> tuple[np.ndarray, np.ndarray]:
    """Greedy per-position acceptance of chained steps: (hits, trials) per position. Position
    j is tried at an anchor row when every earlier draft there was right *and* the data went on
    with it (so the tokens fed are the ones drafting would have fed); it is a hit when its
    argmax is the target's."""
    hits, trials, alive = [], [], None
    for s in steps:
        want = mx.argmax(s.p, axis=-1) if s.want is None else s.want
        got = mx.argmax(s.logits, axis=-1)
        right = (got if s.ids is None else s.ids[got]) == want
        tried = s.valid > 0 if alive is None else alive & (s.valid > 0)
        trials.append(tried.sum())
        hits.append((tried & right).sum())
        alive = tried & right & (want == s.y)
        mx.eval(hits[-1], trials[-1], alive)
    return (np.array([int(a.item()) for a in hits]), np.array([int(a.item()) for a in trials]))


def position_weights(alpha: np.ndarray) -> np.ndarray:
    """Loss weights of the chained positions that maximise tokens per target pass.

    With α_i the probability that draft i is accepted given drafts 1..i−1 were, a round of k
    drafts emits E = 1 + Σ_{m=1..k} Π_{j≤m} α_j tokens per target pass. Its gradient w.r.t.
    position i's log-acceptance is

        ∂E/∂log α_i = Σ_{m≥i} Π_{j≤m} α_j,

    the expected number of accepted drafts that depend on draft i being right (itself and every
    one after it). Position i's loss (a soft cross-entropy: a smooth stand-in for −log α_i,
    the teacher's distribution against the head's) weighted by that, summed, has the gradient
    −Σ_i (∂E/∂log α_i) ∇log α_i = −∇E: descending it climbs tokens per pass. So a position
    weighs as much as the accepted tokens riding on it — little while the drafts before it
    are rarely right, more as they improve — rather than by a fixed decay. Normalised to 1 at
    the first position (the scale is the optimiser's business)."""
    reach = np.cumprod(alpha)  # Π_{j≤m} α_j: draft m accepted
    w = np.cumsum(reach[::-1])[::-1]  # Σ_{m≥i}
    return w / max(w[0], 1e-12)


class PositionWeights:
    """The per-position weights during a run, re-estimated from held-out acceptance every
    `every` steps (α_i smoothed as (hits + 1) / (trials + 2), so an unseen position reads
    1/2 rather than 0 or 1). `measure()` -> (hits, trials) on held-out rows, at every
    position up to `depth`.

    The weights handed to training stop before the first position under `floor`: a position
    that carries under that share of the first one's gradient is left out of the step (its
    chain's and its loss's cost) until the drafts before it earn it back — while the head
    learns its first drafts it trains a few positions, as it gets them right it trains all
    `depth`. Their number is the array's length (a new length re-traces the compiled step)."""

    def __init__(self, depth: int, measure: Callable[[], tuple[np.ndarray, np.ndarray]],
                 every: int, floor: float = 0.0):
        self.depth, self.measure, self.every, self.floor = depth, measure, max(1, every), floor
        self.at_step: int | None = None
        self.set(np.full(depth, 0.5))

    def set(self, alpha: np.ndarray) -> None:
        self.alpha = alpha
        self.full = position_weights(alpha)
        below = np.flatnonzero(self.full < self.floor)  # the weights fall with the position
        trained = max(1, int(below[0])) if len(below) else self.depth
        self.weights = mx.array(self.full[:trained].astype(np.float32))

    def at(self, step: int) -> mx.array:
        if self.at_step is None or step - self.at_step >= self.every:
            hits, trials = self.measure()
            self.set((hits + 1) / (trials + 2))
            self.at_step = step
        return self.weights

    def describe(self) -> dict:
        return {"alpha": [round(float(a), 3) for a in self.alpha],
                "weights": [round(float(w), 3) for w in self.full],
                "trained_positions": int(self.weights.shape[0]), "at_step": self.at_step}


def weighted_loss(steps: Iterator[Step], weights: mx.array, soft_ce: Callable) -> mx.array:
    """Σ_j weights[j] · soft_ce of step j (steps: len(weights) of them)."""
    total = 0.0
    for j, s in enumerate(steps):
        total = total + weights[j] * soft_ce(s.logits, s.p, s.valid)
    return total
