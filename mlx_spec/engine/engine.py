"""The engine: what every conversation on one model shares — the target and its tokenizer, the
drafter's weights, and the target's costs and target-only speed as measured on this machine
(saved per model and device, calibration.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, replace
from typing import Any

from .. import cache as kv
from ..cache import Growth
from ..drafters.base import Drafter
from ..events import Event
from ..model import TargetModel
from ..sampling import SamplingConfig
from ..spec import AUTO_MAX_DRAFT, DraftLength, auto_max_draft, check_draft_length
from ..stats import Baseline
from .calibration import Calibration, CalibrationStore, device_name, key_of
from .conversation import Conversation
from .costbook import CostBook
from .costs import Stopped, TargetCosts, measure_costs
from .turn import Turn, generate, steps

_SAME = object()  # conversation(drafter=...) not given: the engine's drafter


class Chat(Conversation):
    """A conversation as the engine hands it out: its state and verbs (Conversation), and its
    turns, which turn.py plays on it (the state never drives itself)."""

    def generate(self, prompt: list[int], *, max_tokens: int = 256,
                 sampling: SamplingConfig | None = None, stop: threading.Event | None = None,
                 ignore_eos: bool = False, trace: bool = False) -> Iterator[Event]:
        """Continue the conversation with `prompt` (the whole token sequence so far: a prefix
        shared with the previous turn is reused from the cache). Yields TokenEvents, then
        TurnEnd. ignore_eos: run to max_tokens through end-of-turn tokens (benchmarks, tests).
        trace: a RoundTrace before each round's tokens (what was drafted, p and q, times)."""
        return generate(self, prompt, max_tokens=max_tokens, sampling=sampling, stop=stop,
                        ignore_eos=ignore_eos, trace=trace)

    def steps(self, prompt: list[int], *, max_tokens: int = 256,
              sampling: SamplingConfig | None = None, stop: threading.Event | None = None,
              ignore_eos: bool = False, trace: bool = False) -> Turn:
        """`generate` played in rounds, each left to a driver (turn.steps, rounds.py)."""
        return steps(self, prompt, max_tokens=max_tokens, sampling=sampling, stop=stop,
                     ignore_eos=ignore_eos, trace=trace)


class Engine:
    """A target, an optional drafter (weights only) and the default draft length; each chat is
    a `Conversation` made by `conversation()`, with its own tokens, caches and drafter state."""

    def __init__(self, target: TargetModel, tokenizer: Any, drafter: Drafter | None = None, *,
                 draft_length: DraftLength = 4, kv_bits: int | None = None,
                 store: CalibrationStore | None = None):
        """draft_length: tokens drafted per round, or "auto" (chosen each round, up to
        `auto_max_draft`, from the target's costs and online acceptance; see adaptive.py).
        store: where calibrations are saved (default: MLX_SPEC_HOME/calibration)."""
        check_draft_length(draft_length)
        self.target, self.tokenizer, self.drafter = target, tokenizer, drafter
        self.draft_length = draft_length
        self.auto_max_draft = auto_max_draft(drafter)  # so costs are measured as far as auto goes
        self.kv_bits = kv_bits
        self.eos = frozenset(getattr(tokenizer, "eos_token_ids", None) or ())
        self.store = store or CalibrationStore()
        self.key = key_of(target, kv_bits)  # None: a target built in code, nothing is saved
        saved = self.store.load(self.key) if self.key else None
        self.costbook = CostBook(target, self.store, saved.costs if saved else None)
        self.baseline: Baseline | None = (Baseline.from_dict(saved.baseline)
                                          if saved and saved.baseline else None)

    def conversation(self, *, drafter: Any = _SAME,
                     draft_length: DraftLength | None = None) -> Chat:
        """A new, empty conversation on these weights (drafter=None: target-only)."""
        return Chat(self.target, self.tokenizer, self.costbook,
                    self.drafter if drafter is _SAME else drafter,
                    self.draft_length if draft_length is None else draft_length,
                    kv_bits=self.kv_bits, eos=self.eos)

    @property
    def calibrated(self) -> bool:
        """Are the costs `auto` reads measured (saved or calibrated here)?"""
        return self.costbook.reaches(self.auto_max_draft)

    def costs(self, max_draft: int) -> TargetCosts:
        """The target's verify costs for 1..max_draft + 1 tokens and its plain decoding cost
        (measured where known, else a prior: CostBook)."""
        return self.costbook.costs(max_draft)

    def calibrate(self, max_draft: int | None = None, *, stop: Any = None) -> bool:
        """Measure the costs (a few timed target passes on a scratch cache) and save them, to
        `max_draft` (default: as far as `auto` may draft). stop: an Event-like flag checked
        between passes; False when it stopped the work."""
        try:
            self.costbook.measured = measure_costs(
                self.target, max(max_draft or self.auto_max_draft, AUTO_MAX_DRAFT), stop=stop)
        except Stopped:
            return False
        self._save()
        return True

    def memory_growth(self) -> Growth:
        """What one conversation's caches take per token and fixed: measured on a two-token
        turn (the buffers' own sizes, cache.growth), the drafter's state counted in as its
        share of the target's at that point (a draft model's KV scales with the target's; a
        head's is a layer's). Run once, before serving; not on a target split over ranks."""
        chat = self.conversation()
        for _ in chat.generate([0, 0], max_tokens=2):
            pass
        target = kv.growth(chat.cache)
        drafter = chat.drafter_state.nbytes() if chat.drafter is not None else 0
        return target.scaled(1 + drafter / max(1, kv.nbytes(chat.cache)))

    def keep_baseline(self, measured: Baseline) -> Baseline:
        """A measured target-only speed joins the saved ones (the median of the last few
        sessions' is what speedups quote, see Baseline); saved beside the costs. Returns it."""
        known = self.baseline
        self.baseline = (known.joined(measured) if known and known.tok_s > 0
                         else replace(measured, samples=measured.measurements))
        self._save()
        return self.baseline

    def _save(self) -> None:
        if self.key is None:
            return
        baseline = None if self.baseline is None else asdict(self.baseline)
        self.store.save(Calibration(
            key=self.key, model=str(self.target.path), device=device_name(),
            target_bytes=self.target.nbytes(), costs=self.costbook.measured, baseline=baseline,
            measured_at=time.time()))
