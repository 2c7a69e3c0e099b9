"""How drafts are accepted without changing the output distribution: the couplings of a
draft with the target's token.

Acceptance (Leviathan et al. 2023, Chen et al. 2023). For draft tokens x_1..x_k drawn from q_i and
target distributions p_1..p_{k+1}:
  * accept x_i with probability min(1, p_i(x_i) / q_i(x_i)), stopping at the first rejection;
  * at a rejection, sample from the residual norm(max(0, p_i - q_i));
  * if all k are accepted, sample the bonus token from p_{k+1}.
For any q the emitted token at each position is distributed exactly as p: P(emit x) =
q(x)·min(1, p/q) + (1 - Σ_y min(p(y), q(y)))·residual(x) = min(p, q)(x) + max(0, p - q)(x) = p(x).
Greedy decoding is the limit where p and q are one-hot: accept while the draft equals the target's
argmax, then emit the target's argmax.

Seeded requests use another exact coupling, drafter-invariant (Daliri, Musco & Suresh 2024,
"Coupling without communication and drafter-invariant speculative decoding"): the token at
sequence position t is argmax_v (log p_t(v) + g_t(v)), g_t i.i.d. Gumbel noise keyed by
(seed, t) alone — the Gumbel-max trick, so it is a draw from p_t — and a drafter drafts
argmax_v (log q_t(v) + g_t(v)) with the same noise: greedy decoding of noise-perturbed
log-probabilities. A draft is accepted iff it equals the target's token, and the emitted
sequence is then a function of (model, prompt, sampling settings, seed) alone: token for token
the target-only decoding with that seed, whatever drafter, k, batch or padding ran it. Lossless:
given everything emitted before position t, g_t has never decided an emitted token (a rejected
draft that read it is discarded with its context), so the token at t is a fresh Gumbel-max draw
from p_t. It accepts a draft with chance P(argmax(log q + g) = argmax(log p + g)) ≥
(1 − TV)/(1 + TV), where Leviathan's rule reaches 1 − TV; unseeded requests keep Leviathan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import mlx.core as mx

_MASK64 = (1 << 64) - 1


def position_key(seed: int, position: int) -> mx.array:
    """A random key for (seed, sequence position) alone (splitmix64 of the pair): a position's
    noise never depends on what was drawn before it, nor on how many draws that took."""
    x = (seed * 0x9E3779B97F4A7C15 + position + 1) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return mx.random.key(x ^ (x >> 31))


def gumbel_argmax(probs: mx.array, seed: int, position: int) -> mx.array:
    """Row i of probs [n, V] decided at sequence position `position` + i: argmax_v
    (log probs_i(v) + g(v)), g Gumbel noise keyed by (seed, position + i) — a draw from
    probs_i, the same for whoever (target or drafter) holds the same noise."""
    vocab = probs.shape[-1]
    noise = mx.stack([mx.random.gumbel(shape=(vocab,), key=position_key(seed, position + i))
                      for i in range(probs.shape[0])])
    return mx.argmax(mx.log(probs) + noise, axis=-1).astype(mx.int32)


def categorical(probs: mx.array, key: mx.array) -> mx.array:
    """One sample per row of probs [..., V] (zeros are never drawn)."""
    return mx.random.categorical(mx.log(probs), axis=-1, key=key)


@dataclass(frozen=True)
class Verdict:
    """What the target decided about a round's drafts."""

    num_accepted: int  # n: the first n drafts are kept
    token: int  # the target's own token after them: a correction (n < k) or the bonus (n == k)
    accepted: tuple[int, ...] = ()  # those n drafts, as host ints
    # T > 0 only (see acceptance_chances): per draft, min(1, p(x)/q(x)), and Σ min(p, q)
    odds: tuple[float, ...] = ()
    overlap: tuple[float, ...] = ()
    drafted: tuple[int, ...] = ()  # every draft of the round, rejected ones too (host ints)
    # the rows the test read, kept for a trace: the (penalized) logits [k+1, V] when greedy,
    # p [k+1, V] when sampling (evaluated with the decision: reading them costs no pass)
    read: mx.array | None = field(default=None, compare=False, repr=False)

    @property
    def tokens(self) -> list[int]:
        """The round's emitted tokens: the accepted drafts, then the target's own."""
        return [*self.accepted, self.token]

    @property
    def evidence(self) -> list[tuple[float, float]] | None:
        """Per draft position i, (the chance the round tested it, the chance it accepted it)
        given the drafts: (Π_{j<i} a_j, Π_{j<i} a_j · β_i), a_j = min(1, p_j(x_j)/q_j(x_j)),
        β_i = Σ min(p_i, q_i). What the draft-length policy learns α_i from at T > 0: their
        means are P(drafts 1..i-1 accepted) and P(1..i accepted), as the 0/1 outcomes' are,
        but every position of every round counts, past the first rejection too, and the coin
        flips are averaged out (Rao-Blackwell). None when greedy: the outcomes are the chances."""
        return chance_evidence(self.odds, self.overlap) if self.overlap else None


def chance_evidence(odds: Sequence[float], overlap: Sequence[float]
                    ) -> list[tuple[float, float]]:
    """Per position i, (Π_{j<i} odds_j, Π_{j<i} odds_j · overlap_i): see Verdict.evidence."""
    out, reach = [], 1.0
    for a, beta in zip(odds, overlap, strict=True):
        out.append((reach, reach * beta))
        reach *= a
    return out


def as_ids(drafts: mx.array | list[int]) -> mx.array:
    return drafts if isinstance(drafts, mx.array) else mx.array(drafts, dtype=mx.int32)


def resolve(n: mx.array, token: mx.array, drafts: mx.array,
             exact: mx.array | None = None, chances: mx.array | None = None) -> Verdict | None:
    """The round's one host sync: n, the token and the (possibly still lazy) drafts together,
    with the candidate check of p (processed) where there is one: None if it failed; and the
    drafts' acceptance chances [2, k] where given (acceptance_chances)."""
    parts = [n.reshape(1), token.reshape(1), drafts.reshape(-1)]
    if exact is not None:
        parts.insert(0, exact.reshape(1))
    ints = mx.concatenate([a.astype(mx.int32) for a in parts])
    mx.eval(ints, *([] if chances is None else [chances]))
    out = ints.tolist()
    if exact is not None and not out.pop(0):
        return None
    odds, overlap = chances.tolist() if chances is not None else ((), ())
    return Verdict(out[0], out[1], tuple(out[2 : 2 + out[0]]), tuple(odds), tuple(overlap),
                   tuple(out[2:]))


def greedy_verdict(target_logits: mx.array, drafts: mx.array | list[int]) -> Verdict:
    """Longest prefix of drafts equal to the target's argmax, then the target's argmax.

    target_logits [k+1, V]: row i is the target's prediction after drafts[:i]. Computed on the
    device, so lazy drafts never need a host round trip before the verify pass."""
    drafts = as_ids(drafts)
    best = mx.argmax(target_logits, axis=-1).astype(mx.int32)
    k = drafts.shape[0]
    if k == 0:
        return resolve(mx.array(0), best[0], drafts)
    same = (drafts.astype(mx.int32) == best[:k]).astype(mx.int32)
    n = mx.cumprod(same).sum()  # length of the agreeing prefix
    return resolve(n, mx.take(best, n), drafts)


def rejection_sample(
    p: mx.array, q: mx.array, drafts: mx.array, key: mx.array
) -> tuple[mx.array, mx.array]:
    """Modified rejection sampling, batched over any leading dims.

    p [..., k+1, V] target probabilities, q [..., k, V] draft probabilities, drafts [..., k] with
    drafts[i] ~ q[i]. Returns (n, token): n accepted drafts, and the token emitted after them.
    """
    accept_key, sample_key = mx.random.split(key)
    px, qx = _at_drafts(p, q, drafts)
    u = mx.random.uniform(shape=drafts.shape, key=accept_key)
    # u < p/q, written without the division; q(x) > 0 because x was drawn from q
    accepted = (u * qx < px).astype(mx.int32)
    n = mx.cumprod(accepted, axis=-1).sum(axis=-1)  # length of the accepted prefix
    # Row i < k: residual max(0, p_i - q_i); row k: the bonus distribution p_k (q padded with 0).
    q_pad = mx.concatenate([q, mx.zeros_like(p[..., :1, :])], axis=-2)
    residual = mx.maximum(p - q_pad, 0.0)
    mass = residual.sum(axis=-1, keepdims=True)
    # mass 0 means p == q at that row, where rejection has probability 0; fall back to p anyway
    residual = mx.where(mass > 0, residual / mx.maximum(mass, 1e-30), p)
    candidates = categorical(residual, sample_key)  # [..., k+1]
    token = mx.take_along_axis(candidates, n[..., None], axis=-1)[..., 0]
    return n, token


def _at_drafts(p: mx.array, q: mx.array, drafts: mx.array) -> tuple[mx.array, mx.array]:
    """(p_i(x_i), q_i(x_i)) for drafts [..., k] x_i."""
    px = mx.take_along_axis(p[..., : drafts.shape[-1], :], drafts[..., None], axis=-1)[..., 0]
    return px, mx.take_along_axis(q, drafts[..., None], axis=-1)[..., 0]


def acceptance_chances(p: mx.array, q: mx.array, drafts: mx.array) -> mx.array:
    """[2, ..., k] for p [..., k+1, V], q [..., k, V], drafts [..., k]: first,
    min(1, p_i(x_i)/q_i(x_i)), the chance draft x_i is accepted once 1..i-1 were; second,
    Σ_y min(p_i(y), q_i(y)), the chance a draft drawn from q_i would be (the first's mean over
    x_i ~ q_i). Not the decision: what the draft-length policy learns from (Verdict.evidence)."""
    px, qx = _at_drafts(p, q, drafts)
    overlap = mx.minimum(p[..., : drafts.shape[-1], :], q).sum(axis=-1)
    return mx.stack([mx.minimum(px / qx, 1.0), overlap])
