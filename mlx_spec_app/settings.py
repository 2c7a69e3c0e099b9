"""User settings, and switching the engine's drafter through the public API."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from mlx_spec import Engine, SamplingConfig, find_mtp_head, make_drafter

AUTO_MAX_DRAFT = 8  # the largest k "auto" may choose (the engine's own default)


@dataclass(frozen=True)
class Settings:
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    num_draft: int | str = 4  # tokens drafted per round, or "auto"
    drafter: str = "none"  # a drafter kind (see DrafterSwitch.kinds), "none": speculation off
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


def drafter_kind(engine: Engine) -> str:
    """The kind of the engine's current drafter ("mtp-deepseek" is an "mtp")."""
    return engine.drafter.name.split("-")[0] if engine.drafter is not None else "none"


class DrafterSwitch:
    """Drafters the user can pick, built once each and kept, so that switching back restores the
    same object (turning speculation off and on again costs nothing)."""

    def __init__(self, engine: Engine, *, model: str | None = None,
                 draft_model: str | None = None, mtp: str | None = None) -> None:
        self.engine = engine
        self.model, self.draft_model, self.mtp = model, draft_model, mtp
        self.loaded: dict[str, Any] = {"none": None}
        self.initial = drafter_kind(engine)
        self.loaded[self.initial] = engine.drafter

    def kinds(self) -> list[str]:
        """"none", what was loaded, "ngram" (needs no files), and whatever files are known."""
        kinds = ["none", self.initial, "ngram"]
        if self.mtp or find_mtp_head(self.model):
            kinds.append("mtp")
        if self.draft_model:
            kinds.append("draft")
        return list(dict.fromkeys(kinds))

    def select(self, kind: str) -> None:
        """Make `kind` the engine's drafter (loads it the first time). Raises MlxSpecError."""
        if kind == drafter_kind(self.engine):
            return
        if kind not in self.loaded:
            self.loaded[kind] = make_drafter(kind, self.engine.target, model_path=self.model,
                                             draft_model=self.draft_model, mtp=self.mtp)
        self.engine.set_drafter(self.loaded[kind])
