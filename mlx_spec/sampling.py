"""The one sampler: logits processing, applied alike to the target and every drafter.

Everything that turns logits into a token goes through here, so p (target) and q (draft) always
see the same temperature, top-k, top-p, min-p and repetition penalty. What is then done with p
and q (accepting drafts losslessly: rejection sampling, or the drafter-invariant Gumbel coupling
for seeded requests) is coupling.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import mlx.core as mx

from .coupling import (
    Verdict,
    acceptance_chances,
    as_ids,
    categorical,
    greedy_verdict,
    gumbel_argmax,
    rejection_sample,
    resolve,
)


@dataclass(frozen=True)
class SamplingConfig:
    """How tokens are chosen. temperature 0 means greedy (argmax)."""

    temperature: float = 0.0
    top_p: float = 1.0  # nucleus: keep the smallest set with cumulative probability >= top_p
    top_k: int = 0  # keep the k most likely tokens (0: all)
    min_p: float = 0.0  # drop tokens below min_p * p(most likely)
    repetition_penalty: float = 1.0  # CTRL-style: divide positive logits, multiply negative ones
    repetition_context: int = 64  # how many previous tokens the penalty looks at
    seed: int | None = None
    # how drafts are accepted at T > 0: "gumbel", drafter-invariant (the answer depends on the
    # seed alone); "leviathan", rejection sampling (accepts more, the answer depends on the
    # drafts); "auto": gumbel for a seeded request, leviathan otherwise
    coupling: str = "auto"

    def __post_init__(self) -> None:
        for name, ok, wanted in _VALID:
            value = getattr(self, name)
            if isinstance(value, float) and not math.isfinite(value) or not ok(value):
                raise ValueError(f"{name.replace('_', '-')} must be {wanted}, got {value}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def invariant(self) -> bool:
        """Drafter-invariant sampling (coupling.py): seeded T > 0, unless told otherwise."""
        if self.greedy:
            return False
        return self.coupling == "gumbel" or (self.coupling == "auto" and self.seed is not None)


_VALID = (  # (field, test, what it must be): NaN and infinities fail every test
    ("temperature", lambda v: v >= 0, "a number >= 0"),
    ("top_p", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("top_k", lambda v: v >= 0, ">= 0"),
    ("min_p", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("repetition_penalty", lambda v: v > 0, "a number > 0"),
    ("coupling", lambda v: v in COUPLINGS, "auto, gumbel or leviathan"),
)
COUPLINGS = ("auto", "gumbel", "leviathan")


Tokens = list[int] | mx.array  # host ints, or a (possibly lazy) int array on the device


def _length(tokens: Tokens) -> int:
    return tokens.size if isinstance(tokens, mx.array) else len(tokens)


def _ids(tokens: Tokens) -> mx.array:
    return (tokens if isinstance(tokens, mx.array) else mx.array(tokens)).astype(mx.int32)


def penalize(logits: mx.array, history: Tokens, rows: Tokens, cfg: SamplingConfig) -> mx.array:
    """Repetition penalty for n rows of logits [n, V].

    Row r is conditioned on history + rows[:r] (rows are the tokens fed after the history, so the
    draft tokens of a round), hence each row sees its own window of previous tokens. history and
    rows may be device arrays, still lazy: only their lengths are read here, so the penalty
    needs no host sync (drafts and pipelined plain steps chain on the device as without it).
    """
    n_hist, n_rows = _length(history), _length(rows)
    if cfg.repetition_penalty == 1.0 or (not n_hist and not n_rows):
        return logits
    n, window = logits.shape[0], cfg.repetition_context
    base = min(n_hist, window)  # seq = the last `window` history tokens, then the rows
    parts = ([_ids(history)[n_hist - base :]] if base else []) + ([_ids(rows)] if n_rows else [])
    seq = mx.concatenate(parts) if len(parts) > 1 else parts[0]
    positions, live = [], []
    for r in range(n):
        w = list(range(max(0, base + r - window), min(base + r, base + n_rows)))
        # left-pad with a token of the window itself, so duplicates get the same penalized value
        positions.append([w[0] if w else 0] * (window - len(w)) + w)
        live.append(bool(w))
    idx = mx.take(seq, mx.array(positions))  # [n, window] token ids, on the device
    picked = mx.take_along_axis(logits, idx, axis=-1)
    penalized = mx.where(
        picked > 0, picked / cfg.repetition_penalty, picked * cfg.repetition_penalty
    )
    picked = mx.where(mx.array(live)[:, None], penalized, picked)
    return mx.put_along_axis(logits, idx, picked, axis=-1)


CANDIDATES = 1024  # top-p looks among this many most likely tokens first (exact fall-back)


def tempered(logits: mx.array, cfg: SamplingConfig) -> mx.array:
    """(Already penalized) logits [n, V] scaled by 1/T, off the top k masked to -inf: their
    softmax is the sampled distribution whenever neither top-p nor min-p is on. Ties with the
    k-th largest stay in."""
    scaled = logits.astype(mx.float32) / cfg.temperature
    if not _top_k_on(cfg, scaled):
        return scaled
    return mx.where(scaled < _top_k(scaled, cfg.top_k)[2], -mx.inf, scaled)


def _top_k_on(cfg: SamplingConfig, logits: mx.array) -> bool:
    return 0 < cfg.top_k < logits.shape[-1]


TIE_ROOM = 2  # top-k selects TIE_ROOM·k candidates, so ties with the k-th rarely fall outside


def _top_k(scaled: mx.array, k: int) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """Each row's top k of scaled [n, V], ties with the k-th included, by one partial selection
    (no sort of a row): (values [n, m], their indices [n, m], kth [n, 1], exact). The m =
    TIE_ROOM·k candidates hold the k largest and room for ties (low-precision logits tie
    often); a candidate below the k-th reads -inf in values. exact is a lazy flag, false where
    some row has more tokens tied with its k-th than the candidates hold: that row needs the
    mask."""
    vocab = scaled.shape[-1]
    m = min(TIE_ROOM * k, vocab)
    top = mx.argpartition(scaled, kth=vocab - m, axis=-1)[..., vocab - m :]
    values = mx.take_along_axis(scaled, top, axis=-1)
    kth = mx.sort(values, axis=-1)[..., m - k : m - k + 1]
    inside = values >= kth
    exact = ((scaled >= kth).sum(axis=-1) == inside.sum(axis=-1)).all()
    return mx.where(inside, values, -mx.inf), top, kth, exact


def processed(logits: mx.array, cfg: SamplingConfig, *, full: bool = False
              ) -> tuple[mx.array, mx.array | None]:
    """Turn (already penalized) logits [n, V] into the distributions sampled from, without a
    host sync: (probs, exact). No full sort of a row at real vocabulary sizes (151,936 for
    Qwen, 262,144 for Gemma), and with top-k on no vocabulary-wide softmax either: one partial
    selection finds the survivors, and softmax, top-p and min-p run on those values alone,
    scattered back into a row of zeros (the other tokens' mass is exactly 0 after top-k).
    Without top-k, top-p looks among CANDIDATES most likely tokens when more could be in it
    (see nucleus_floor). exact is None when probs is exact by construction, else a lazy flag,
    false when some row was cut short: more ties with its k-th than _top_k's candidates hold,
    or a nucleus wider than its candidates. full: always exact (a mask, and a full sort where
    needed)."""
    if _top_k_on(cfg, logits) and not full:
        kept, top, exact = _survivors(logits, cfg)
        return mx.put_along_axis(mx.zeros(logits.shape, mx.float32), top, kept, axis=-1), exact
    probs = mx.softmax(tempered(logits, cfg), axis=-1)
    floor, exact = None, None
    if cfg.top_p < 1.0:
        floor, exact = nucleus_floor(probs, cfg, probs.shape[-1] if full else CANDIDATES)
    return _truncated(probs, cfg, floor), exact


def _survivors(logits: mx.array, cfg: SamplingConfig) -> tuple[mx.array, mx.array, mx.array]:
    """With top-k on: each row's candidates as (probabilities [n, m] after top-k, top-p and
    min-p, their token ids [n, m], exact) — the whole distribution, the rest have no mass."""
    values, top, _, exact = _top_k(logits.astype(mx.float32) / cfg.temperature, cfg.top_k)
    probs = mx.softmax(values, axis=-1)
    floor = _floor(probs, cfg.top_p) if cfg.top_p < 1.0 else None
    return _truncated(probs, cfg, floor), top, exact


def _truncated(probs: mx.array, cfg: SamplingConfig, floor: mx.array | None) -> mx.array:
    """probs [n, m] without the tokens below each row's nucleus floor [n, 1] (top-p) or below
    min_p of its most likely, renormalised."""
    if floor is not None:
        probs = mx.where(probs >= floor, probs, 0.0)
    if cfg.min_p > 0.0:
        probs = mx.where(probs < cfg.min_p * probs.max(axis=-1, keepdims=True), 0.0, probs)
    return probs / probs.sum(axis=-1, keepdims=True)


def probabilities(logits: mx.array, cfg: SamplingConfig) -> mx.array:
    """processed(), always exact: where a candidate set was used, one host sync checks it, and
    a row it did not cover is redone by a full sort."""
    probs, exact = processed(logits, cfg)
    if exact is not None and not bool(exact):
        return processed(logits, cfg, full=True)[0]
    return probs


def nucleus_floor(probs: mx.array, cfg: SamplingConfig, candidates: int = CANDIDATES
                  ) -> tuple[mx.array, mx.array | None]:
    """The smallest probability in each row's nucleus [n, 1]: sorted by probability, a token is
    in while the mass strictly above it is < top_p (so the top token always is); ties with the
    last one are in too. Only the most likely tokens can be in it, so only they are sorted: the
    top_k survivors when top-k is on (the rest have no mass), else the `candidates` most likely,
    which suffice exactly when they hold top_p of the mass. Returns (floor, exact): exact a lazy
    flag for that condition over all rows, None where no candidate set was needed."""
    vocab = probs.shape[-1]
    width = cfg.top_k if cfg.top_k and cfg.top_k < vocab else vocab
    if width > candidates:
        top = mx.topk(probs, candidates, axis=-1)
        return _floor(top, cfg.top_p), (top.sum(axis=-1) >= cfg.top_p).all()
    return _floor(mx.topk(probs, width, axis=-1) if width < vocab else probs, cfg.top_p), None


def _floor(candidates: mx.array, top_p: float) -> mx.array:
    desc = -mx.sort(-candidates, axis=-1)
    above = mx.cumsum(desc, axis=-1) - desc
    return mx.where(above < top_p, desc, mx.inf).min(axis=-1, keepdims=True)


class Sampler:
    """Owns the random stream and applies one SamplingConfig to target and drafts alike."""

    def __init__(self, cfg: SamplingConfig):
        self.cfg = cfg
        self._key = mx.random.key(cfg.seed if cfg.seed is not None else _fresh_seed())

    @property
    def uses_history(self) -> bool:
        """Only the repetition penalty looks at previous tokens."""
        return self.cfg.repetition_penalty != 1.0

    def next_key(self) -> mx.array:
        self._key, sub = mx.random.split(self._key)
        return sub

    def distribution(self, logits: mx.array, history: Tokens, rows: Tokens) -> mx.array:
        """Processed probabilities [n, V] for logits [n, V] (T > 0 only)."""
        return probabilities(penalize(logits, history, rows, self.cfg), self.cfg)

    def draft_token(self, logits: mx.array, history: Tokens, *, position: int
                    ) -> tuple[mx.array, mx.array | None]:
        """A drafter's choice from its last logits [V] for sequence position `position`:
        (token, q) — q is None when greedy; drafter-invariant, the Gumbel-max of q with the
        position's noise (the target's own at that position).

        q is processed() without its candidate check, so drafting never waits for the host: in
        a row whose CANDIDATES most likely tokens hold less than top_p of the mass, q's nucleus
        is cut at them. The draft is drawn from that q and reports it, so acceptance weighs
        it by its real probabilities, and the output distribution is the target's all the same
        (the rule is exact for any q; p, below, is always exact)."""
        logits = penalize(logits[None], history, [], self.cfg)
        if self.cfg.greedy:
            return mx.argmax(logits[0], axis=-1), None
        q = processed(logits, self.cfg)[0][0]
        if self.cfg.invariant:
            return gumbel_argmax(q[None], self.cfg.seed, position)[0], q
        return categorical(q, self.next_key()), q

    def sample_rows(self, logits: mx.array) -> mx.array:
        """One token per row of logits [B, V] of independent sequences (batched generation:
        no history, so no repetition penalty)."""
        if self.cfg.greedy:
            return mx.argmax(logits, axis=-1)
        return categorical(probabilities(logits, self.cfg), self.next_key())

    def next_token(self, logits: mx.array, history: Tokens, *, position: int
                   ) -> tuple[mx.array, mx.array | None]:
        """The target's own token from its logits [1, V] after history (plain decoding), for
        sequence position `position` (drafter-invariant: its Gumbel-max), lazy:
        the caller may build the next step on it before the host reads it. Returns (token,
        exact): exact None, or a lazy flag to read with the token — false, and the token must
        be redrawn by redraw(), where top-p's candidates did not cover the row."""
        logits = penalize(logits, history, [], self.cfg)
        if self.cfg.greedy:
            return mx.argmax(logits[0], axis=-1).astype(mx.int32), None
        if self.cfg.invariant:
            probs, exact = processed(logits, self.cfg)
            return gumbel_argmax(probs, self.cfg.seed, position)[0], exact
        # no drafts to weigh, so no vocabulary-wide probabilities needed: with top-k on, a draw
        # among the k survivors; with neither top-p nor min-p, the Gumbel-max draw of
        # categorical() on the tempered logits, a draw from their softmax
        if _top_k_on(self.cfg, logits):
            kept, top, exact = _survivors(logits, self.cfg)
            pick = categorical(kept[0], self.next_key())
            return top[0, pick].astype(mx.int32), exact
        if self.cfg.top_p == 1.0 and self.cfg.min_p == 0.0:
            choice = mx.random.categorical(tempered(logits, self.cfg)[0], key=self.next_key())
            return choice.astype(mx.int32), None
        probs, exact = processed(logits, self.cfg)
        return categorical(probs[0], self.next_key()).astype(mx.int32), exact

    def redraw(self, logits: mx.array, history: list[int], *, position: int) -> int:
        """next_token's token again, from the exact distribution (its candidate check failed:
        the first draw is discarded whatever it was, so this one is an exact draw)."""
        probs = processed(penalize(logits, history, [], self.cfg), self.cfg, full=True)[0]
        if self.cfg.invariant:
            return int(gumbel_argmax(probs, self.cfg.seed, position)[0].item())
        return int(categorical(probs[0], self.next_key()).item())

    def verdict(self, target_logits: mx.array, history: list[int], drafts: mx.array | list[int],
                q: mx.array | None) -> Verdict:
        """Decide a round: target_logits [k+1, V] for the positions after history, drafts[:i].
        drafts may still be lazy: the decision, drafts included, reaches the host in one sync
        (two in the rare round whose p needed the exact fall-back: decided again on it; the
        first decision is discarded whatever it was, so the second is an exact one)."""
        drafts = as_ids(drafts)
        logits = penalize(target_logits, history, drafts, self.cfg)
        if self.cfg.greedy:
            return replace(greedy_verdict(logits, drafts), read=logits)

        def decide(p: mx.array) -> tuple[mx.array, mx.array, mx.array | None]:
            if self.cfg.invariant:  # the target's own token at every row; drafts kept while equal
                mine = gumbel_argmax(p, self.cfg.seed, len(history))
                same = (drafts == mine[: drafts.shape[0]]).astype(mx.int32)
                n = mx.cumprod(same).sum() if drafts.shape[0] else mx.array(0)
                return n, mx.take(mine, n), None  # (acceptance read from outcomes, not odds)
            if drafts.shape[0] == 0:
                return mx.array(0), categorical(p[0], self.next_key()), None
            return (*rejection_sample(p, q, drafts, self.next_key()),
                    acceptance_chances(p, q, drafts))

        p, exact = processed(logits, self.cfg)
        n, token, chances = decide(p)
        verdict = resolve(n, token, drafts, exact, chances)
        if verdict is None:
            p = processed(logits, self.cfg, full=True)[0]
            n, token, chances = decide(p)
            verdict = resolve(n, token, drafts, chances=chances)
        return replace(verdict, read=p)


def _fresh_seed() -> int:
    import secrets

    return secrets.randbits(32)
