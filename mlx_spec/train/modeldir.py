"""Build and save standard mlx-lm model directories (config, safetensors, tokenizer)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def build_model(config: dict[str, Any], *, seed: int = 0) -> nn.Module:
    """An mlx-lm model of config['model_type'] with seeded random weights."""
    mx.random.seed(seed)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    mx.eval(model.parameters())
    return model


def save_model_dir(
    out: Path, model: nn.Module, config: dict[str, Any], *, tokenizer_dir: Path | None = None,
    dtype: mx.Dtype | None = None,
) -> None:
    """Write `out/` so that `mlx_lm.load(out)` gives back this model (and tokenizer, if given)."""
    out.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(model.parameters()))
    if dtype is not None:
        weights = {
            k: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v
            for k, v in weights.items()
        }
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            if (tokenizer_dir / name).exists():
                shutil.copy(tokenizer_dir / name, out / name)
