"""User settings: what applies to the next turn (Settings), and what changes the engine
(EngineChoice: drafter and draft length, read back from the engine's own EngineInfo)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from mlx_spec import DraftLength, EngineInfo, SamplingConfig


@dataclass(frozen=True)
class Settings:
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    system_prompt: str = ""
    max_tokens: int = 256

    def saved(self) -> dict[str, Any]:
        """What is remembered across runs (drafter and draft length come from the command
        line each run)."""
        return {"sampling": asdict(self.sampling), "system_prompt": self.system_prompt,
                "max_tokens": self.max_tokens}

    @classmethod
    def restore(cls, saved: dict[str, Any] | None) -> Settings:
        if not saved:
            return cls()
        try:
            return cls(SamplingConfig(**saved["sampling"]), system_prompt=saved["system_prompt"],
                       max_tokens=int(saved["max_tokens"]))
        except (KeyError, TypeError, ValueError):  # an older or hand-edited record: defaults
            return cls()


@dataclass(frozen=True)
class EngineChoice:
    """What needs the engine (and so an idle one) to change."""

    drafter: str  # a kind of mlx_spec.DRAFTERS; "none": speculation off
    draft_length: DraftLength  # tokens drafted per round, or "auto"

    @classmethod
    def of(cls, info: EngineInfo) -> EngineChoice:
        """What the engine runs now."""
        return cls(info.drafter, info.draft_length)
