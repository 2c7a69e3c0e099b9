"""User settings: sampling, draft length and drafter, system prompt, answer length."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from mlx_spec import SamplingConfig


@dataclass(frozen=True)
class Settings:
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    num_draft: int | str = 4  # tokens drafted per round, or "auto"
    drafter: str = "none"  # a drafter kind (EngineInfo.drafters), "none": speculation off
    system_prompt: str = ""
    max_tokens: int = 256

    def engine_part(self) -> tuple[int | str, str]:
        """What needs the engine (and so an idle one) to change."""
        return self.num_draft, self.drafter

    def saved(self) -> dict[str, Any]:
        """What is remembered across runs: sampling, system prompt, answer length. Drafter and
        draft length come from the command line each run."""
        return {"sampling": asdict(self.sampling), "system_prompt": self.system_prompt,
                "max_tokens": self.max_tokens}

    @classmethod
    def restore(cls, saved: dict[str, Any] | None, **engine_part: Any) -> Settings:
        if not saved:
            return cls(**engine_part)
        try:
            return cls(SamplingConfig(**saved["sampling"]), system_prompt=saved["system_prompt"],
                       max_tokens=int(saved["max_tokens"]), **engine_part)
        except (KeyError, TypeError, ValueError):  # an older or hand-edited record: defaults
            return cls(**engine_part)
