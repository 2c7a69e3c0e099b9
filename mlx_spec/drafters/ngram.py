"""Prompt lookup: propose what followed the latest earlier occurrence of the current suffix.

Model-free, so its draft distribution is a point mass: q(x) = 1 for the proposed x. Rejection
sampling then accepts x with probability p(x) and resamples from p with x removed — still exact.
"""

from __future__ import annotations

import mlx.core as mx

from ..sampling import Sampler
from .base import Draft, DraftContext, HostState


class NgramState(HostState):
    """n-gram -> end position of its latest occurrence that has a known continuation."""

    def __init__(self) -> None:
        self.index: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # positions < indexed have had their n-grams recorded


class NgramDrafter:
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

    def draft(self, state: NgramState, ctx: DraftContext, k: int, sampler: Sampler) -> Draft:
        tokens = ctx.tokens
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            end = state.index.get(tuple(tokens[-n:])) if len(tokens) >= n else None
            if end is not None:
                proposal = tokens[end + 1 : end + 1 + k]
                break
        else:
            return Draft()
        probs = None
        if not sampler.cfg.greedy:
            probs = mx.zeros((len(proposal), ctx.target.vocab_size))
            probs[mx.arange(len(proposal)), mx.array(proposal)] = 1.0
        return Draft(mx.array(proposal, dtype=mx.int32), probs)

    def nbytes(self) -> int:
        return 0
