"""Measured costs kept per model and device, so no first answer waits for a calibration.

A calibration (the target's verify costs, its plain decoding cost, the target-only baseline
speed) is saved under MLX_SPEC_HOME/calibration/, one JSON file per key. The key is what changes
the costs: the model directory's files (names, sizes, modification times), the device and MLX
version, the matmul library in use (OpenBLAS preloaded or not), the quantization and the KV
cache's bits. Without one, `prior()` gives costs to start from: the newest calibration on this
device scaled by model size, else a memory-bound line; the policy refines either online, and a
full calibration runs when the engine is idle (Engine.calibrate), never before a first token.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..model import TargetModel
from ..paths import data_dir
from .costs import TargetCosts

VERSION = 3  # of what is measured and how: a change invalidates every saved calibration
# (2: verify costs kept in steps, not a line: costs.smooth_monotone; 3: timed to 16 tokens,
# with the pass sizes a verify runs as: costs.pad_targets)
PRIOR_SLOPE = 0.05  # the generic prior: c(q) = c(1)·(1 + 0.05·(q − 1)), memory-bound
PRIOR_BANDWIDTH = 100e9  # bytes per second the generic prior reads the weights at


@dataclass(frozen=True)
class Calibration:
    """What is saved for one key: costs and the target-only baseline (either may be missing
    until measured), what they were measured on, and when."""

    key: str
    model: str
    device: str
    target_bytes: int
    costs: TargetCosts | None = None
    baseline: dict[str, Any] | None = None  # Baseline's fields
    measured_at: float = 0.0

    def to_json(self) -> str:
        d = dict(version=VERSION, key=self.key, model=self.model, device=self.device,
                 target_bytes=self.target_bytes, measured_at=self.measured_at,
                 baseline=self.baseline,
                 costs=None if self.costs is None else dict(verify=list(self.costs.verify),
                                                            plain=self.costs.plain,
                                                            pad_to=list(self.costs.pad_to)))
        return json.dumps(d, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Calibration:
        d = json.loads(text)
        if d.get("version") != VERSION:
            raise ValueError(f"calibration version {d.get('version')}, not {VERSION}")
        costs = d.get("costs")
        return cls(key=str(d["key"]), model=str(d["model"]), device=str(d["device"]),
                   target_bytes=int(d["target_bytes"]), measured_at=float(d["measured_at"]),
                   baseline=d.get("baseline"),
                   costs=None if costs is None else TargetCosts(
                       tuple(float(c) for c in costs["verify"]), float(costs["plain"]),
                       pad_to=tuple(int(p) for p in costs["pad_to"])))


def device_name() -> str:
    """The device the costs belong to: MLX's device and chip, MLX's version, and (on Linux)
    whether OpenBLAS is preloaded, which changes f32 matmul's speed."""
    import mlx.core as mx

    chip = platform.machine()
    try:
        if mx.metal.is_available():
            chip = str(mx.metal.device_info().get("device_name", chip))
    except Exception:  # noqa: BLE001 - an older MLX without device_info: the machine type
        pass
    blas = Path(os.environ.get("LD_PRELOAD", "")).name.split(".")[0] or "-"
    return f"{mx.default_device()} {chip} x{os.cpu_count()} mlx {mx.__version__} blas {blas}"


def key_of(target: TargetModel, kv_bits: int | None) -> str | None:
    """The key of a target loaded from a directory (None for one built in code)."""
    path = Path(target.path) if target.path is not None else None
    if path is None or not path.is_dir():
        return None
    files = sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns)
                   for f in path.iterdir() if f.is_file())
    what = dict(files=files, device=device_name(), kv_bits=kv_bits, version=VERSION,
                quantization=target.config.get("quantization") if target.config else None)
    if target.cast:  # weights cast at load: another compute dtype, other costs
        what["cast"] = target.cast
    if target.ranks > 1:  # a split target's costs include the links between its machines
        what["split"] = target.split_label
        what["hosts"] = list(target.split_hosts)
    digest = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]
    return f"{path.name}-{digest}"


class CalibrationStore:
    """The saved calibrations, one file per key under `root`."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or data_dir() / "calibration"

    def load(self, key: str) -> Calibration | None:
        """The calibration saved for `key`; a corrupt file is reported in one line and
        ignored (the next save rewrites it)."""
        path = self.root / f"{key}.json"
        try:
            text = path.read_text()
        except OSError:
            return None
        try:
            found = Calibration.from_json(text)
        except (ValueError, KeyError, TypeError) as e:
            print(f"mlx-spec: warning: ignoring the unreadable calibration {path} "
                  f"({type(e).__name__}: {e}); it is measured again", file=sys.stderr)
            return None
        return found if found.key == key else None

    def save(self, calibration: Calibration) -> None:
        """Write atomically (a crash mid-write leaves the old file or none, never half)."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{calibration.key}.{os.getpid()}.tmp"
        tmp.write_text(calibration.to_json())
        tmp.replace(self.root / f"{calibration.key}.json")

    def all(self) -> list[Calibration]:
        """Every readable calibration, newest first."""
        found = []
        for path in sorted(self.root.glob("*.json")) if self.root.is_dir() else []:
            try:
                found.append(Calibration.from_json(path.read_text()))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return sorted(found, key=lambda c: c.measured_at, reverse=True)

    def prior(self, target: TargetModel, max_draft: int) -> TargetCosts:
        """Costs to start from where none were measured for this target: the newest
        calibration on this device, scaled by the ratio of the two targets' sizes; else a
        line for a memory-bound pass (weights read at PRIOR_BANDWIDTH, PRIOR_SLOPE more per
        token). Marked not measured: the policy refines them from its own rounds."""
        here, size = device_name(), max(target.nbytes(), 1)
        for c in self.all():
            if c.device == here and c.costs is not None and c.costs.max_draft >= max_draft:
                scale = size / max(c.target_bytes, 1)
                return TargetCosts(tuple(v * scale for v in c.costs.verify[: max_draft + 1]),
                                   c.costs.plain * scale, measured=False)
        one = 1e-3 + size / PRIOR_BANDWIDTH
        return TargetCosts(tuple(one * (1 + PRIOR_SLOPE * q) for q in range(max_draft + 1)),
                           one, measured=False)
