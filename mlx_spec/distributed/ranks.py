"""What every rank does the same way: join the group, agree on versions and model files, load
its part of the target, and say how that went — each step one all_gather of a short text, so
every rank sees every answer and all of them reach the same verdict without another message."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import mlx.core as mx

from ..errors import ModelLoadError
from ..model import TargetModel
from .link import gather_text
from .target import split_target


def versions() -> str:
    def v(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "?"

    return f"mlx-spec {v('mlx-spec')}, mlx {mx.__version__}, mlx-lm {v('mlx-lm')}"


def model_files(path: Path) -> str:
    """A digest of what decides the weights: config.json and each weight file's name and
    size (reading 100s of GB to hash them would cost minutes on every launch)."""
    files = sorted((f.name, f.stat().st_size) for f in path.glob("*.safetensors"))
    config = (path / "config.json").read_bytes() if (path / "config.json").exists() else b""
    blob = json.dumps(files).encode() + config
    return hashlib.sha256(blob).hexdigest()[:12]


def agree(group: mx.distributed.Group, hosts: list[str], model: Path | None) -> None:
    """Refuse, on every rank alike, a group whose versions or model files differ."""
    mine = json.dumps({"versions": versions(),
                       "model": model_files(model) if model and model.is_dir() else "missing"})
    problem = verdict([json.loads(a) for a in gather_text(group, mine)], hosts, model)
    if problem:
        raise ModelLoadError(problem)


def verdict(answers: list[dict], hosts: list[str], model: Path | str | None) -> str | None:
    """The first problem among every rank's answer, compared with rank 0's (None: none)."""
    first = answers[0]
    for rank, a in enumerate(answers[1:], 1):
        if a["versions"] != first["versions"]:
            return (f"rank {rank} ({hosts[rank]}) runs {a['versions']}; this machine runs "
                    f"{first['versions']}: install the same versions on every host")
        if a["model"] == "missing":
            return (f"rank {rank} ({hosts[rank]}) has no model at {model}: copy it there "
                    "(the same path on every host)")
        if a["model"] != first["model"]:
            return (f"rank {rank} ({hosts[rank]}) has different model files at {model} than "
                    "this machine: copy the same files to every host")
    return None


def load_part(group: mx.distributed.Group, hosts: list[str], load: Callable[[], TargetModel],
              mode: str) -> TargetModel:
    """This rank's part of the target (`load`: the whole of it, lazily, as loading.load_target
    gives it); every rank's load verdict is shared, so a failure on any rank fails them all,
    with its one line on rank 0."""
    from ..cache import check_rollback

    target, error = None, ""
    try:
        target = load()
        split_target(target, group, mode)
        try:
            check_rollback(target.make_cache())
            rollback = "1"
        except Exception:  # noqa: BLE001 - a layer kind that cannot roll back: said below
            rollback = "0"
    except Exception as e:  # noqa: BLE001 - any load failure: one line to rank 0
        from ..errors import user_message

        error = user_message(e, "cannot load its part of the target")
    answers = gather_text(group, f"error {error}" if error else f"ok {rollback}")
    for rank, a in enumerate(answers):
        if a.startswith("error"):
            raise ModelLoadError(f"rank {rank} ({hosts[rank]}): {a[6:]}")
    assert target is not None
    target.rollback_everywhere = all(a == "ok 1" for a in answers)
    return target
