"""A separate, smaller language model with the same vocabulary, run autoregressively."""

from __future__ import annotations

from .. import cache as kv
from ..errors import TokenizerMismatchError
from ..model import TargetModel
from ..sampling import Sampler
from .base import Draft, DraftContext, draft_chain


class DraftModelDrafter:
    name = "draft"
    needs_hidden = False

    def __init__(self, draft: TargetModel, target: TargetModel, *, slack: int = 16):
        if draft.vocab_size != target.vocab_size:
            raise TokenizerMismatchError(
                f"draft model vocabulary ({draft.vocab_size}) differs from the target's "
                f"({target.vocab_size}); they must share a tokenizer"
            )
        self.model = draft
        self.slack = slack
        self.reset()

    def reset(self) -> None:
        self.cache = kv.make_cache(self.model.model, slack=self.slack)
        kv.check_rollback(self.cache)

    def commit(self, ctx: DraftContext, valid: int) -> None:
        n = min(kv.length(self.cache), valid)
        if not kv.can_trim_to(self.cache, n):
            self.reset()  # a sliding-window drafter rolled too far: recompute next round
            return
        kv.trim_to(self.cache, n)

    def draft(self, ctx: DraftContext, k: int, sampler: Sampler) -> Draft:
        # catch up on committed tokens not yet seen (the pending one at least), then one step each
        feed = ctx.tokens[kv.length(self.cache) :]
        return draft_chain(lambda x: self.model.forward(x, self.cache)[0][-1], feed, ctx, k,
                           sampler)

    def arrays(self) -> list:
        return [c.state for c in self.cache]

    def nbytes(self) -> int:
        return self.model.nbytes() + kv.nbytes(self.cache)
