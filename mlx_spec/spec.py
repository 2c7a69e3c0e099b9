"""What to load: one frozen `LoadSpec`, validated once where it is made, carried unchanged from
the CLI, the presets, the app's settings and download screens, through the process boundary, to
the loader. No MLX import here: the UI process and `hub/` make these too."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from .errors import MlxSpecError
from .kinds import DRAFTERS

MAX_DRAFT = 16  # the longest fixed draft length anyone may ask for
AUTO_MAX_DRAFT = 8  # the longest draft `auto` may choose (its verify costs are measured to it)
KV_BITS = (4, 8)
SPLITS = ("pipeline", "tensor")

DraftLength = int | Literal["auto"]


def parse_draft_length(text: str | int | None) -> DraftLength | None:
    """A draft length from what a user typed: an integer 1..MAX_DRAFT, "auto", or None (the
    drafter's own length where its files give one, else auto). Raises MlxSpecError."""
    if text is None or text == "auto" or (isinstance(text, int) and not isinstance(text, bool)):
        check_draft_length(text)
        return text
    cleaned = str(text).strip().lower()
    if cleaned == "auto":
        return "auto"
    try:
        k = int(cleaned)
    except ValueError:
        raise MlxSpecError(f"draft length must be an integer 1..{MAX_DRAFT} or 'auto', "
                           f"got {text!r}") from None
    check_draft_length(k)
    return k


def check_draft_length(k: object) -> None:
    """The one rule for a draft length: None, "auto", or an int 1..MAX_DRAFT."""
    if k is None or k == "auto":
        return
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_DRAFT:
        raise MlxSpecError(f"draft length must be 1..{MAX_DRAFT} or 'auto', got {k!r}")


def auto_max_draft(drafter: object) -> int:
    """The longest draft `auto` may choose with this drafter: AUTO_MAX_DRAFT, or a block
    drafter's own block when longer (DFlash: block_size - 1, its `max_draft`)."""
    own = drafter.max_draft if drafter is not None else None
    return max(AUTO_MAX_DRAFT, min(MAX_DRAFT, own or 0))


def max_draft_for(k: DraftLength, ceiling: int = AUTO_MAX_DRAFT) -> int:
    """The longest draft a round may use: k itself when fixed, auto's ceiling otherwise."""
    return ceiling if k == "auto" else int(k)


@dataclass(frozen=True)
class LoadSpec:
    """A target, its drafter and the draft length: what `load_engine` starts from.

    model: a local model directory (or a hub repo id the loader fetches); None: the bundled demo.
    drafter: a kind of kinds.DRAFTERS, or "auto" (an MTP head beside the model, else
        draft_model, else none).
    draft_model / mtp: a draft model (or assistant, EAGLE-3 head, MTP sidecar) / an MTP head.
    draft_length: tokens drafted per round (1..MAX_DRAFT), "auto", or None (the drafter's own).
    kv_bits: quantize the target's KV cache to 4 or 8 bits (None: not).
    hostfile: split the target over the machines of this mlx hostfile (distributed/), by
        `split` ("pipeline" or "tensor"; None: pipeline where mlx-lm has it, else tensor).
    lookup: a model drafter's rounds copy from the conversation's own text first, where its
        last tokens appeared before (drafters/lookup.py)."""

    model: str | None = None
    drafter: str = "auto"
    draft_model: str | None = None
    mtp: str | None = None
    draft_length: DraftLength | None = None
    kv_bits: int | None = None
    hostfile: str | None = None
    split: str | None = None
    lookup: bool = False

    def __post_init__(self) -> None:
        for name in ("model", "draft_model", "mtp", "hostfile"):  # paths travel as text
            value = getattr(self, name)
            if isinstance(value, Path):
                object.__setattr__(self, name, str(value))
        if self.drafter != "auto" and self.drafter not in DRAFTERS:
            raise MlxSpecError(f"unknown drafter {self.drafter!r} (one of auto, "
                               f"{', '.join(DRAFTERS)})")
        check_draft_length(self.draft_length)
        if self.kv_bits is not None and self.kv_bits not in KV_BITS:
            raise MlxSpecError(f"kv bits must be 4 or 8, got {self.kv_bits!r}")
        if self.split is not None and self.split not in SPLITS:
            raise MlxSpecError(f"split must be one of {', '.join(SPLITS)}, got {self.split!r}")
        if self.split is not None and self.hostfile is None:
            raise MlxSpecError("--pipeline / --tensor split the target over machines: give "
                               "--hostfile too")

    def with_model(self, model: str | Path | None) -> LoadSpec:
        return replace(self, model=None if model is None else str(model))

    def completed_by(self, *, model: str | Path, drafter: str = "auto",
                     draft_model: str | Path | None = None,
                     mtp: str | Path | None = None) -> LoadSpec:
        """This spec on a pulled or remembered `model`, its drafter filling only what the user
        left unset: a drafter the user chose (a kind, a draft model or an MTP head) is kept."""
        spec = self.with_model(model)
        if self.drafter != "auto" or self.draft_model or self.mtp:
            return spec
        return replace(spec, drafter=drafter, draft_model=_text(draft_model), mtp=_text(mtp))

    @property
    def label(self) -> str:
        return self.model or "the demo pair"


def _text(path: str | Path | None) -> str | None:
    return None if path is None else str(path)
