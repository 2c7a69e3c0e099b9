"""Curated target + drafter pairs (presets.toml), and whether one fits this machine.

The table is data: each entry says what was checked about its repos and where. A preset whose
drafter kind the engine cannot load yet is listed and marked, never hidden.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ..errors import MlxSpecError

PRESETS_FILE = Path(__file__).with_name("presets.toml")
PRESETS_ENV = "MLX_SPEC_PRESETS"  # a presets file of one's own instead of the bundled one
# drafter kinds the engine loads today
LOADABLE = {"mtp", "draft", "gemma-assistant", "eagle3", "dflash", "none"}
# Metal's recommended working set is about 2/3 of unified memory on 8-32 GB Macs (Rapid-MLX's
# guide derives 10.3 GB on 18 GB from max_recommended_working_set_size); iogpu.wired_limit_mb
# raises it. A pair "fits" when its estimated RAM is within that share.
GPU_SHARE = 2 / 3


@dataclass(frozen=True)
class Preset:
    name: str
    title: str
    tier_gb: int  # the smallest Mac (unified memory, GB) it is meant for
    target: str  # hub repo id
    drafter_kind: str  # mtp | draft | gemma-assistant | eagle3 | dflash | none
    download_gb: float  # target + drafter, as listed on the hub
    ram_gb: float  # weights + KV for a few thousand tokens + runtime
    verified: str  # what was checked, and where
    drafter: str | None = None  # hub repo of the drafter (sidecar MTP head, draft model, ...)
    mtp_from: str | None = None  # original checkpoint to read the MTP head from
    shipped_head: str | None = None  # a head shipped with mlx-spec (assets/heads/NAME), found
    # by --drafter auto from the target's name and shapes: nothing to download
    note: str = ""

    @property
    def loadable(self) -> bool:
        return self.drafter_kind in LOADABLE

    @property
    def repos(self) -> tuple[str, ...]:
        return (self.target, *([self.drafter] if self.drafter else []))


class UnknownPresetError(MlxSpecError):
    pass


def presets() -> tuple[Preset, ...]:
    return _load(os.environ.get(PRESETS_ENV) or str(PRESETS_FILE))


@cache
def _load(path: str) -> tuple[Preset, ...]:
    try:
        raw = tomllib.loads(Path(path).read_text())
        return tuple(Preset(**entry) for entry in raw["preset"])
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError) as e:
        raise MlxSpecError(f"cannot read the presets file {path}: {e}") from e


def find(name: str) -> Preset | None:
    return next((p for p in presets() if p.name == name.lower()), None)


def looks_like_repo(name: str) -> bool:
    return name.count("/") == 1 and not name.startswith((".", "/", "~"))


def memory_bytes() -> int | None:
    """This machine's physical memory (macOS and Linux), or None if it cannot be read."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def fits(preset: Preset, memory: int | None = None) -> bool | None:
    """Does the pair fit in the memory the GPU may use here? None when memory is unknown."""
    memory = memory if memory is not None else memory_bytes()
    if memory is None:
        return None
    return preset.ram_gb * 1e9 <= GPU_SHARE * memory
