"""A separate, smaller language model with the same tokenizer, run autoregressively.

Sharing a tokenizer is not sharing an embedding size: checkpoints pad their vocabularies to
different multiples (Qwen2.5-0.5B has 151,936 rows, Qwen2.5-7B 152,064, both for 151,665 real
tokens). Compatibility is decided from the tokenizers (token -> id, special tokens included); the
draft's logits are then laid out at the target's width, with every id that is not a shared real
token at -inf, so the draft never proposes one and q is 0 there. p is left exactly as the target
computes it: rejection sampling needs nothing more (a target that puts mass on an id q cannot
reach takes it through the residual), and target-only output stays token-for-token the same.
"""

from __future__ import annotations

import mlx.core as mx

from .. import cache as kv
from ..errors import TokenizerMismatchError
from ..model import TargetModel
from ..rows import rows_of
from ..sampling import Sampler
from ..vocab import check_same
from .base import Draft, DraftContext, Drafter, draft_chain, draft_rows_chain

ROWS_CATCH_UP = 16  # the longest catch-up a row may bring into a batched draft


class DraftModelState:
    """The draft model's own cache for one conversation, and how many tokens it holds."""

    def __init__(self, cache: list):
        self.cache = cache
        self.cached = 0

    def has_hidden(self, position: int) -> bool:
        return False

    def nbytes(self) -> int:
        return kv.nbytes(self.cache)

    def arrays(self) -> list:
        return [c.state for c in self.cache]


class DraftModelDrafter(Drafter):
    name = "draft"
    needs_hidden = False

    def __init__(self, draft: TargetModel, target: TargetModel, *, slack: int = 16):
        shared = shared_vocabulary(draft, target)
        self.model = draft
        self.slack = slack
        self.width = target.vocab_size
        # added to the draft's logits (cut or padded to the target's width): -inf off the
        # shared real vocabulary; None when the two line up already
        self.impossible = None
        if shared < self.width or draft.vocab_size != self.width:
            ids = mx.arange(self.width)
            self.impossible = mx.where(ids < shared, 0.0, -mx.inf)
        self.new_state()  # refuses a draft model whose caches cannot roll back, at load

    def new_state(self) -> DraftModelState:
        cache = kv.make_cache(self.model.model, slack=self.slack)
        kv.check_rollback(cache)
        return DraftModelState(cache)

    def commit(self, state: DraftModelState, ctx: DraftContext, valid: int) -> None:
        n = min(state.cached, valid)
        if not kv.can_trim_to(state.cache, n, have=state.cached):
            # a sliding-window drafter rolled too far: recompute next round
            state.cache, state.cached = self.new_state().cache, 0
            return
        kv.trim_to(state.cache, n, have=state.cached)
        state.cached = n

    def _at_target_width(self, logits: mx.array) -> mx.array:
        if self.impossible is None:
            return logits
        n = logits.shape[-1]
        if n > self.width:
            logits = logits[..., : self.width]
        elif n < self.width:
            logits = mx.concatenate(
                [logits, mx.full((*logits.shape[:-1], self.width - n), -mx.inf, logits.dtype)],
                axis=-1)
        return logits + self.impossible.astype(logits.dtype)

    def draft(self, state: DraftModelState, ctx: DraftContext, k: int, sampler: Sampler
              ) -> Draft:
        def step(x) -> mx.array:
            logits, _ = self.model.forward(x, state.cache)
            state.cached += x.size if isinstance(x, mx.array) else len(x)
            return self._at_target_width(logits[-1])

        # catch up on committed tokens not yet seen (the pending one at least), then one step each
        behind = ctx.tokens[state.cached :]
        return draft_chain(step, behind, ctx, k, sampler, fed=len(behind))

    def draft_rows(self, states: list[DraftModelState], ctxs: list[DraftContext],
                   ks: list[int], samplers: list[Sampler]) -> list[Draft] | None:
        """Several conversations' drafts, each step of the draft model run once over all their
        rows (the server's batch) through their own caches (rows.py: ragged, masked, RoPE per
        row), the first step feeding each row its own catch-up; as `draft` for each row, up to
        the batched kernels' rounding. None (each drafts alone) for caches that do not batch
        (quantized, recurrent), or where a row has a long catch-up (a new prompt: padding the
        others to it would cost more than it saves)."""
        if any(type(c) not in (kv.KVCache, kv.WindowKVCache) for s in states for c in s.cache):
            return None
        behind = [ctx.tokens[s.cached :] for s, ctx in zip(states, ctxs, strict=True)]
        if max(len(b) for b in behind) > ROWS_CATCH_UP:
            return None
        layers = len(states[0].cache)

        def step(x: mx.array | None, live: list[bool]) -> mx.array:
            # only the rows still drafting go through (a done row's cache takes nothing more)
            ids = [r for r, on in enumerate(live) if on]
            rows = [mx.array(behind[r], dtype=mx.int32) if x is None else x[r : r + 1]
                    for r in ids]
            lengths = [t.shape[0] for t in rows]
            width = max(lengths)
            tokens = mx.stack([mx.pad(t, [(0, width - t.shape[0])]) for t in rows])
            caches = [rows_of([states[r].cache[i] for r in ids], lengths)
                      for i in range(layers)]
            logits, _ = self.model.forward_rows(tokens, caches)
            out = mx.zeros((len(live), logits.shape[-1]), logits.dtype)
            for j, (r, q) in enumerate(zip(ids, lengths, strict=True)):
                states[r].cached += q
                out[r] = logits[j, q - 1]
            return self._at_target_width(out)

        drafts = draft_rows_chain(step, ctxs, ks, samplers)
        return [Draft(d.tokens, d.probs, len(b)) for d, b in zip(drafts, behind, strict=True)]

    def nbytes(self) -> int:
        return self.model.nbytes()


def shared_vocabulary(draft: TargetModel, target: TargetModel) -> int:
    """How many ids (0..n-1) both tokenizers give the same token; TokenizerMismatchError, naming
    what differs, when they are not the same tokenizer. Without tokenizers (models built in
    code), the embedding sizes must match."""
    if draft.tokenizer is None or target.tokenizer is None:
        if draft.vocab_size != target.vocab_size:
            raise TokenizerMismatchError(
                f"draft model vocabulary ({draft.vocab_size}) differs from the target's "
                f"({target.vocab_size}); they must share a tokenizer")
        return target.vocab_size
    b = target.tokenizer.get_vocab()
    check_same(draft.tokenizer.get_vocab(), b, draft.name, target.name)
    n = max(b.values()) + 1
    if n > min(draft.vocab_size, target.vocab_size):
        raise TokenizerMismatchError(
            f"{draft.name}'s tokenizer has {n} tokens but the model only {draft.vocab_size} rows"
            if n > draft.vocab_size else
            f"{target.name}'s tokenizer has {n} tokens but the model only {target.vocab_size}")
    return n
