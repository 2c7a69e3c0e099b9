"""A trained MTP head on disk (mtp_config.json + mtp.safetensors, written by `train-drafter`),
and the one loader for every MTP head directory: ours, a published sidecar, or the target's own
checkpoint with its MTP tensors (nextn.py)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..errors import ModelLoadError, TokenizerMismatchError, first_line
from ..model import TargetModel
from . import nextn
from .mtp import MTPConfig, MTPDrafter, make_head, nextn_drafter

CONFIG_FILE = "mtp_config.json"
WEIGHTS_FILE = "mtp.safetensors"


def save_mtp(out: Path, head: nn.Module, cfg: MTPConfig, extra: dict | None = None) -> None:
    """Weights, then the config, each written aside and renamed into place: a run killed
    while saving (train-drafter saves at every checkpoint) leaves the last whole head."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{WEIGHTS_FILE}.partial.safetensors"
    mx.save_safetensors(str(tmp), dict(tree_flatten(head.parameters())))
    tmp.replace(out / WEIGHTS_FILE)
    tmp = out / f".{CONFIG_FILE}.partial"
    tmp.write_text(json.dumps({**asdict(cfg), **(extra or {})}, indent=2))
    tmp.replace(out / CONFIG_FILE)


def load_mtp_drafter(path: str | Path, target: TargetModel) -> MTPDrafter:
    """An MTP drafter from a directory: a head trained by `train-drafter` (mtp_config.json), a
    published sidecar head (config.json with model_type `<family>_mtp`), or the target's own
    checkpoint with its MTP tensors (see nextn.py)."""
    path = Path(path).expanduser()
    if (path / CONFIG_FILE).exists() or not (path / "config.json").exists():
        return _load_own(path, target)
    try:
        if nextn.is_sidecar(path):
            head, lay = nextn.load_sidecar_head(target, path)
        else:
            head, lay = nextn.load_checkpoint_head(target, path)
    except (ModelLoadError, TokenizerMismatchError):
        raise
    except Exception as e:
        raise ModelLoadError(f"cannot load MTP head {path}: {first_line(e)}") from e
    return nextn_drafter(head, target, zero_first_embedding=lay.zero_first_embedding)


def _load_own(path: Path, target: TargetModel) -> MTPDrafter:
    try:
        raw = json.loads((path / CONFIG_FILE).read_text())
        fields = MTPConfig.__dataclass_fields__
        cfg = MTPConfig(**{k: v for k, v in raw.items() if k in fields})
        head = make_head(cfg)
        head.load_weights(str(path / WEIGHTS_FILE), strict=True)
        mx.eval(head.parameters())
    except FileNotFoundError as e:
        missing = Path(e.filename or CONFIG_FILE).name
        raise ModelLoadError(f"not an MTP head directory: {path} ({missing} missing)") from None
    except Exception as e:
        raise ModelLoadError(f"cannot load MTP head {path}: {first_line(e)}") from e
    return MTPDrafter(head, cfg, target)
