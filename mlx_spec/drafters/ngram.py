"""Prompt lookup: propose what followed the latest earlier occurrence of the current suffix.

When that occurrence is so recent that its continuation runs into the present (a loop), the copy
goes on overlapping itself, as an LZ77 match does: the text is taken to repeat with the period
between the two occurrences, so a loop of period 3 still yields k proposals, not 3.

Model-free, so its draft distribution is a point mass: q(x) = 1 for the proposed x. Rejection
sampling then accepts x with probability p(x) and resamples from p with x removed — still exact.
"""

from __future__ import annotations

import mlx.core as mx

from ..sampling import Sampler
from .base import Draft, DraftContext, Drafter, HostState


class NgramState(HostState):
    """n-gram -> end position of its latest occurrence that has a known continuation."""

    def __init__(self) -> None:
        self.index: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # positions < indexed have had their n-grams recorded


class NgramDrafter(Drafter):
    name = "ngram"
    needs_hidden = False

    def __init__(self, *, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def new_state(self) -> NgramState:
        return NgramState()

    def commit(self, state: NgramState, ctx: DraftContext, valid: int) -> None:
        if valid < state.indexed:  # the sequence changed below what we indexed: start over
            state.index.clear()
            state.indexed = 0
        tokens = ctx.tokens
        # record n-grams ending at every position that now has a continuation (all but the last)
        for end in range(state.indexed, len(tokens) - 1):
            for n in range(self.min_ngram, self.max_ngram + 1):
                if end + 1 >= n:
                    state.index[tuple(tokens[end + 1 - n : end + 1])] = end
        state.indexed = max(state.indexed, len(tokens) - 1)

    def lookup(self, state: NgramState, tokens: list[int], k: int) -> tuple[list[int], int]:
        """Up to k tokens continuing `tokens`, and the length of the suffix they were matched
        on (0: no match). Token L + j (L = len(tokens)) is predicted by the one a period p
        earlier, p the distance back to the matched occurrence: tokens[L + j - p] while that
        is written, else the proposal's own token j - p (the overlapping copy)."""
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            end = state.index.get(tuple(tokens[-n:])) if len(tokens) >= n else None
            if end is not None:
                period, out = len(tokens) - 1 - end, []
                for j in range(k):
                    src = len(tokens) + j - period
                    out.append(tokens[src] if src < len(tokens) else out[src - len(tokens)])
                return out, n
        return [], 0

    def draft(self, state: NgramState, ctx: DraftContext, k: int, sampler: Sampler) -> Draft:
        proposal, _ = self.lookup(state, ctx.tokens, k)
        return point_mass(proposal, ctx.target.vocab_size, sampler)

    def nbytes(self) -> int:
        return 0


def point_mass(proposal: list[int], vocab_size: int, sampler: Sampler) -> Draft:
    """A model-free proposal as a Draft: q(x) = 1 on each proposed token."""
    if not proposal:
        return Draft()
    probs = None
    if not sampler.cfg.greedy:
        probs = mx.zeros((len(proposal), vocab_size))
        probs[mx.arange(len(proposal)), mx.array(proposal)] = 1.0
    return Draft(mx.array(proposal, dtype=mx.int32), probs, copied=True)
