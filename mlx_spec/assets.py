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


def heads_dir() -> Path:
    """Drafter heads shipped with the wheel, one directory each (assets/heads/NAME/)."""
    return assets_dir() / "heads"


def shipped_head(target) -> Path | None:
    """A shipped head trained for `target`'s model (shipped_head_for)."""
    return shipped_head_for(target.name, target.hidden_size, len(target.backbone.layers),
                            target.vocab_size)


def shipped_head_for(name: str, hidden_size: int, num_layers: int,
                     vocab_size: int) -> Path | None:
    """The shipped head whose `shipped.json` names a piece of the model's name (a GGUF
    file's, a hub repo's, a directory's: "smollm2-135m") and the shapes the head reads (width,
    layers, vocabulary) — so a fine-tune or another size with a similar name is not handed a
    head that would read the wrong states."""
    import json

    for file in sorted(heads_dir().glob("*/shipped.json")):
        try:
            want = json.loads(file.read_text())
        except (OSError, ValueError):
            continue
        if (want.get("name_contains", "\0") in name.lower()
                and (want.get("hidden_size"), want.get("num_layers"), want.get("vocab_size"))
                == (hidden_size, num_layers, vocab_size)):
            return file.parent
    return None
