"""Where published checkpoints keep their MTP module, per model family: read from config.json
and safetensors headers alone (no MLX import, so hub/ reads these too; the blocks are built
by nextn.py from mlx-lm's own decoder-layer classes, imported only when one is built)."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any


@dataclass(frozen=True)
class Layout:
    """How one family stores its MTP module."""

    families: tuple[str, ...]  # target model_types (and sidecar model_types without `_mtp`)
    prefix: Callable[[Any], str]  # where the module lives in a checkpoint (from the text args)
    names: dict[str, str]  # NextNHead name -> published name, relative to the prefix
    block: Callable[[Any], Any]  # one decoder layer of the family
    trunk_layer: Callable[[Any], int]  # a trunk layer of the block's kind (to borrow sanitize)
    block_prefix: str = ""  # where the block's tensors are, relative to the prefix
    shared: tuple[str, ...] = ()  # tensors that duplicate the target's (embeddings, head)
    hidden_first: bool = False
    zero_centred: bool = False  # HF norms are x·(1+w)
    zero_first_embedding: bool = False  # the embedding at MTP position 0 is zeroed (DeepSeek)
    config_keys: tuple[str, ...] = field(default=("num_nextn_predict_layers",))


def _qwen35_block(args):
    from mlx_lm.models import qwen3_5

    return qwen3_5.DecoderLayer(args, layer_idx=args.full_attention_interval - 1)


def _qwen3_next_block(args):
    from mlx_lm.models import qwen3_next

    return qwen3_next.Qwen3NextDecoderLayer(args, layer_idx=args.full_attention_interval - 1)


def _deepseek_v3_block(args):
    from mlx_lm.models import deepseek_v3

    return deepseek_v3.DeepseekV3DecoderLayer(args, layer_idx=args.num_hidden_layers)


def _glm4_moe_block(args):
    from mlx_lm.models import glm4_moe

    return glm4_moe.DecoderLayer(args, layer_idx=args.num_hidden_layers)


def _mimo_block(args):
    from mlx_lm.models import mimo

    return mimo.TransformerBlock(args)


_QWEN = dict(
    prefix=lambda a: "mtp.",
    names={"enorm": "pre_fc_norm_embedding", "hnorm": "pre_fc_norm_hidden", "eh_proj": "fc",
           "norm": "norm"},
    block_prefix="layers.0.", trunk_layer=lambda a: a.full_attention_interval - 1,
    zero_centred=True, config_keys=("mtp_num_hidden_layers", "num_nextn_predict_layers"),
)
_DEEPSEEK = dict(
    prefix=lambda a: f"model.layers.{a.num_hidden_layers}.",
    names={"enorm": "enorm", "hnorm": "hnorm", "eh_proj": "eh_proj", "norm": "shared_head.norm"},
    shared=("embed_tokens", "shared_head.head"), trunk_layer=lambda a: a.num_hidden_layers - 1,
    zero_first_embedding=True,
)
LAYOUTS = (
    Layout(families=("qwen3_5", "qwen3_5_moe"), block=_qwen35_block, **_QWEN),
    Layout(families=("qwen3_next",), block=_qwen3_next_block, **_QWEN),
    Layout(families=("deepseek_v3",), block=_deepseek_v3_block, **_DEEPSEEK),
    Layout(families=("glm4_moe",), block=_glm4_moe_block, **_DEEPSEEK),
    Layout(
        families=("mimo",), prefix=lambda a: "model.mtp_layers.0.",
        names={"enorm": "token_layernorm", "hnorm": "hidden_layernorm", "eh_proj": "input_proj",
               "norm": "final_layernorm"},
        block=_mimo_block, trunk_layer=lambda a: 0, hidden_first=True,
        zero_first_embedding=True,
    ),
)


def checkpoint_prefix(config: dict[str, Any]) -> str | None:
    """Where a checkpoint with this config.json keeps its MTP module, or None when its family
    has no known layout or the config declares no MTP layer (read before any weight is)."""
    text = config.get("text_config", config)
    lay = next((lay for lay in LAYOUTS if config.get("model_type") in lay.families), None)
    if lay is None or not max(int(text.get(k) or config.get(k) or 0) for k in lay.config_keys):
        return None
    return lay.prefix(SimpleNamespace(**text))


def gemma4_text(text: dict[str, Any]) -> dict[str, Any]:
    """A Gemma 4 text config as mlx-lm reads it. transformers 5.23+ saves the full-attention
    layers' head size (and KV heads) only as per-layer overrides, `per_layer_config` {layer:
    {"head_dim", "num_key_value_heads"}}, with no top-level `global_head_dim`; mlx-lm would
    then take its default (512) and fail on the first full-attention q_proj."""
    per = text.get("per_layer_config") or {}
    if not per or "global_head_dim" in text:
        return text
    types = text.get("layer_types") or []
    full = [v for k, v in per.items()
            if int(k) < len(types) and types[int(k)] == "full_attention"] or list(per.values())
    out = dict(text)
    for key, theirs in (("global_head_dim", "head_dim"),
                        ("num_global_key_value_heads", "num_key_value_heads")):
        values = {v[theirs] for v in full if v.get(theirs) is not None}
        if len(values) == 1 and key not in text:
            out[key] = values.pop()
    return out


def mlx_lm_overrides(config: dict[str, Any]) -> dict[str, Any] | None:
    """What a config.json needs changed before mlx-lm reads it (None: nothing)."""
    kind = config.get("model_type")
    if kind == "gemma4_text" and (fixed := gemma4_text(config)) is not config:
        return fixed
    text = config.get("text_config")
    if kind == "gemma4" and text and (fixed := gemma4_text(text)) is not text:
        return {"text_config": fixed}
    return None


# -- finding the tensors -------------------------------------------------------------------------


def tensor_names(path: Path) -> dict[str, Path]:
    """Every tensor name in a directory's safetensors files (headers only: no weights read)."""
    names: dict[str, Path] = {}
    for f in sorted(path.glob("*.safetensors")):
        try:
            with f.open("rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
        except (OSError, ValueError, struct.error):
            continue
        names.update({k: f for k in header if k != "__metadata__"})
    return names
