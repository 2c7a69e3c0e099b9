"""Where the bundled offline demo pair lives (repo checkout or installed wheel)."""

from __future__ import annotations

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
