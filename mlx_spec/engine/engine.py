"""The engine: what every conversation on one model shares — the target and its tokenizer, the
drafter's weights, and the target's costs as measured on this machine."""

from __future__ import annotations

from typing import Any

from ..drafters.base import Drafter
from ..model import TargetModel
from ..spec import DraftLength, check_draft_length
from .conversation import Conversation
from .costs import TargetCosts, measure_costs

_SAME = object()  # conversation(drafter=...) not given: the engine's drafter


class Engine:
    """A target, an optional drafter (weights only) and the default draft length; each chat is
    a `Conversation` made by `conversation()`, with its own tokens, caches and drafter state."""

    def __init__(self, target: TargetModel, tokenizer: Any, drafter: Drafter | None = None, *,
                 draft_length: DraftLength = 4, kv_bits: int | None = None):
        """draft_length: tokens drafted per round, or "auto" (chosen each round, up to
        AUTO_MAX_DRAFT, from measured verify costs and online acceptance; see adaptive.py)."""
        check_draft_length(draft_length)
        self.target, self.tokenizer, self.drafter = target, tokenizer, drafter
        self.draft_length = draft_length
        self.kv_bits = kv_bits
        self.eos = frozenset(getattr(tokenizer, "eos_token_ids", None) or ())
        self._costs: dict[int, TargetCosts] = {}

    def conversation(self, *, drafter: Any = _SAME,
                     draft_length: DraftLength | None = None) -> Conversation:
        """A new, empty conversation on these weights (drafter=None: target-only)."""
        return Conversation(self, self.drafter if drafter is _SAME else drafter,
                            self.draft_length if draft_length is None else draft_length)

    def costs(self, max_draft: int) -> TargetCosts:
        """The target's verify costs for 1..max_draft + 1 tokens and its plain decoding cost,
        measured the first time they are asked for (a few timed target passes), then shared."""
        if max_draft not in self._costs:
            self._costs[max_draft] = measure_costs(self.target, max_draft)
        return self._costs[max_draft]
