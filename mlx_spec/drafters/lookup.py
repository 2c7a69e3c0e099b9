"""Prompt lookup first: a round drafts from the conversation's own text when its suffix has
appeared before, and from a model drafter otherwise.

Code, edits, agents' tool loops and a small model's greedy loops repeat spans the context
already holds; there a copy (ngram.py) is right for many tokens at no device cost, while a model
drafter's accuracy falls with depth. Elsewhere the copy has nothing to offer and the model
drafts. Each round has one source, and the Draft carries that source's real q (a point mass
for a copy), so verification stays exact. Both keep their state every round: the model drafter
is committed to even after a copied round (its next draft catches up on what it did not read).
`auto` keeps a policy for each source (engine/schedule.py): copies cost no drafting and are
right far more often in a loop than elsewhere, so their k, and whether they pay at all, are
learned from their own rounds.
"""

from __future__ import annotations

from typing import Any

from ..sampling import Sampler
from .base import Draft, DraftContext, Drafter
from .ngram import NgramDrafter, NgramState, point_mass

MIN_MATCH = 3  # suffix tokens a copy must match: one or two repeat by chance in any text


class LookupState:
    """The model drafter's state and the n-gram index, side by side."""

    def __init__(self, inner: Any, index: NgramState):
        self.inner, self.index = inner, index

    def has_hidden(self, position: int) -> bool:
        return self.inner.has_hidden(position)

    def nbytes(self) -> int:
        return self.inner.nbytes()

    def arrays(self) -> list[Any]:
        return self.inner.arrays()


class LookupFirst(Drafter):
    copies = True

    def __init__(self, inner: Drafter, *, min_match: int = MIN_MATCH):
        self.inner = inner
        self.ngram = NgramDrafter(max_ngram=max(4, min_match), min_ngram=min_match)
        self.name = f"{inner.name}+lookup"
        self.needs_hidden = inner.needs_hidden

    # the model drafter's own declarations
    draft_length = property(lambda self: self.inner.draft_length)
    max_draft = property(lambda self: self.inner.max_draft)
    reads_target_kv = property(lambda self: self.inner.reads_target_kv)

    def new_state(self) -> LookupState:
        return LookupState(self.inner.new_state(), self.ngram.new_state())

    def commit(self, state: LookupState, ctx: DraftContext, valid: int) -> None:
        self.inner.commit(state.inner, ctx, valid)
        self.ngram.commit(state.index, ctx, valid)

    def copy_ready(self, state: LookupState, tokens: list[int]) -> bool:
        """Would the next draft be a copy?"""
        return bool(self.ngram.lookup(state.index, tokens, 1)[0])

    def draft(self, state: LookupState, ctx: DraftContext, k: int, sampler: Sampler) -> Draft:
        copy = self.ngram.lookup(state.index, ctx.tokens, k)[0] if ctx.copy else []
        if copy:
            return point_mass(copy, ctx.target.vocab_size, sampler)
        return self.inner.draft(state.inner, ctx, _model_k(k, ctx), sampler)

    def draft_rows(self, states: list[LookupState], ctxs: list[DraftContext], ks: list[int],
                   samplers: list[Sampler]) -> list[Draft] | None:
        """Copied rows from the index; the others in one batched chain of the model drafter
        (None, each drafting alone, where it cannot batch them)."""
        copies = [self.ngram.lookup(s.index, c.tokens, k)[0] if c.copy else []
                  for s, c, k in zip(states, ctxs, ks, strict=True)]
        rest = [r for r, copy in enumerate(copies) if not copy]
        drafted: list[Draft] = []
        if rest:
            drafted = self.inner.draft_rows([states[r].inner for r in rest],
                                            [ctxs[r] for r in rest],
                                            [_model_k(ks[r], ctxs[r]) for r in rest],
                                            [samplers[r] for r in rest])
            if drafted is None:
                return None
        by_row = dict(zip(rest, drafted, strict=True))
        return [by_row[r] if r in by_row else
                point_mass(copies[r], ctxs[r].target.vocab_size, samplers[r])
                for r in range(len(ks))]

    def nbytes(self) -> int:
        return self.inner.nbytes()


def _model_k(k: int, ctx: DraftContext) -> int:
    """What the model drafts where a copy was wanted and none is there (copies reach further)."""
    return k if ctx.model_max_draft is None else min(k, ctx.model_max_draft)
