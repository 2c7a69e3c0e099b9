"""How well an engine's drafter does on some prompts: the one acceptance measurement, shared by
the trainer's held-out scores (train/distill.py) and the benchmark's evaluation."""

from __future__ import annotations

from collections.abc import Sequence

from ..events import TurnEnd
from ..sampling import SamplingConfig
from ..spec import DraftLength
from ..stats import Totals
from .engine import Engine


def measure_acceptance(engine: Engine, prompts: Sequence[list[int]], *, max_tokens: int,
                       temperature: float = 0.0, draft_length: DraftLength | None = None,
                       ignore_eos: bool = False, coupling: str = "leviathan") -> Totals:
    """Each prompt answered on a fresh conversation of `engine` (draft_length: the engine's
    own unless given), prompt i drawn with seed i, up to `max_tokens` (or its end of turn,
    unless ignore_eos); the turns summed: tokens per target pass, acceptance, and acceptance
    per draft position (Totals). coupling: how drafts are accepted at T > 0 (the seeds are for
    repeatability; "leviathan" measures what an unseeded request gets)."""
    conv = engine.conversation(draft_length=draft_length)
    totals = Totals()
    for i, ids in enumerate(prompts):
        conv.reset()
        cfg = SamplingConfig(temperature=temperature, seed=i, coupling=coupling)
        for event in conv.generate(ids, max_tokens=max_tokens, sampling=cfg,
                                   ignore_eos=ignore_eos):
            if isinstance(event, TurnEnd):
                totals.add(event.stats)
    return totals
