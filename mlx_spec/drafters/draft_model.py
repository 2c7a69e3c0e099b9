"""A separate, smaller language model with the same vocabulary, run autoregressively."""

from __future__ import annotations

import mlx.core as mx

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
        self.cached = 0  # tokens its cache holds

    def commit(self, ctx: DraftContext, valid: int) -> None:
        n = min(self.cached, valid)
        if not kv.can_trim_to(self.cache, n, have=self.cached):
            self.reset()  # a sliding-window drafter rolled too far: recompute next round
            return
        kv.trim_to(self.cache, n, have=self.cached)
        self.cached = n

    def _step(self, x) -> mx.array:
        logits, _ = self.model.forward(x, self.cache)
        self.cached += x.size if isinstance(x, mx.array) else len(x)
        return logits[-1]

    def draft(self, ctx: DraftContext, k: int, sampler: Sampler) -> Draft:
        # catch up on committed tokens not yet seen (the pending one at least), then one step each
        return draft_chain(self._step, ctx.tokens[self.cached :], ctx, k, sampler)

    def arrays(self) -> list:
        return [c.state for c in self.cache]

    def nbytes(self) -> int:
        return self.model.nbytes() + kv.nbytes(self.cache)
