"""Where the bundled offline demo pair lives (repo checkout or installed wheel)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEMO_TARGET = "demo-target-q8"  # the product's target is quantized
DEMO_TARGET_F32 = "demo-target"
DEMO_DRAFT = "demo-draft"


def assets_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "_assets", here.parent / "assets"):
        if (candidate / "models").is_dir():
            return candidate
    return here.parent / "assets"


def demo_model(name: str = DEMO_TARGET) -> Path:
    return assets_dir() / "models" / name


@dataclass(frozen=True)
class DemoVariant:
    """The bundled target a first run opens: its directory and the dtype it computes in."""

    name: str  # a directory under assets/models
    dtype: str | None  # cast to this at load (None: as saved)


def demo_variant() -> DemoVariant:
    """The demo target that can pay on this device. On a GPU (Metal, CUDA) the 8-bit one: its
    matmul is memory-bound, so verifying k + 1 tokens costs about what one does. On MLX's CPU
    backend, quantized matmul is compute-bound (a 5-token verify costs ~3x one token) and bf16
    is slower still, so the bf16 target computed in f32 (memory-bound with OpenBLAS)."""
    import mlx.core as mx

    if mx.default_device() == mx.gpu:
        return DemoVariant(DEMO_TARGET, None)
    return DemoVariant(DEMO_TARGET_F32, "float32")
