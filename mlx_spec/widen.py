"""Function-preserving widening: a trained small qwen3/llama model inside a wide, deep one.

The benchmark needs a target in the memory-bound regime (≥ 100M parameters, f32) *with real,
trained acceptance*. We zero-pad the trained demo target: its weights go to the top-left corners,
extra hidden units, FFN units and whole layers are zero, so they add exactly 0 to the residual
stream, while every matmul still runs at full size (a realistic cost).

RMSNorm over the wide stream sees the small stream plus zeros, so rms_wide = rms_small·√(d/D);
multiplying the norm weights by √(d/D) makes each norm's output equal the small model's (in
its first d units). Attention geometry (heads, head_dim) is kept, so the small model's last
layer K/V are unchanged and a shared-KV MTP head reads them as before (at kv_layer = its index).
"""

from __future__ import annotations

import math
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from .drafters.mtp import MTPConfig, MTPDrafter, make_head
from .model import TargetModel
from .train.modeldir import build_model


def wide_config(config: dict[str, Any], hidden: int, layers: int, ffn: int) -> dict[str, Any]:
    return dict(config, hidden_size=hidden, num_hidden_layers=layers, intermediate_size=ffn,
                head_dim=config.get("head_dim") or config["hidden_size"] // config[
                    "num_attention_heads"])


def _pad(small: mx.array, shape: tuple[int, ...]) -> mx.array:
    out = mx.zeros(shape, mx.float32)
    idx = tuple(slice(0, n) for n in small.shape)
    out[idx] = small.astype(mx.float32)
    return out


def widen_target(small: TargetModel, config: dict[str, Any], *, hidden: int = 1024,
                 layers: int = 12, ffn: int = 2816) -> tuple[TargetModel, dict[str, Any]]:
    """A wide model computing the same function as `small` (up to float rounding)."""
    cfg = wide_config(config, hidden, layers, ffn)
    wide = build_model(cfg)
    scale = math.sqrt(config["hidden_size"] / hidden)
    small_w = dict(tree_flatten(small.model.parameters()))
    new = {}
    for name, w in tree_flatten(wide.parameters()):
        if name in small_w:
            s = _pad(small_w[name], w.shape)
            is_norm = name.endswith("norm.weight") and not name.endswith(("q_norm.weight",
                                                                          "k_norm.weight"))
            new[name] = s * scale if is_norm else s
        else:  # a whole extra layer: zero (its norm weights too, so it adds exactly 0)
            new[name] = mx.zeros(w.shape, mx.float32)
    wide.update(tree_unflatten(list(new.items())))
    mx.eval(wide.parameters())
    return TargetModel(wide, context_length=small.context_length,
                       name=f"{small.name}-wide{hidden}x{layers}"), cfg


def widen_mtp(drafter: MTPDrafter, wide: TargetModel, small_layers: int) -> MTPDrafter:
    """The same shared-KV head, re-wired to the wide target's (zero-padded) hidden stream."""
    c = drafter.cfg
    d, D = c.target_hidden_size, wide.hidden_size
    cfg = MTPConfig(**{**c.__dict__, "target_hidden_size": D, "kv_layer": small_layers - 1})
    head = make_head(cfg)
    w = dict(tree_flatten(drafter.head.parameters()))
    pre = w["pre_projection.weight"]  # [h, 2d]: columns = [embedding | hidden]
    wide_pre = mx.zeros((pre.shape[0], 2 * D))
    wide_pre[:, :d] = pre[:, :d]
    wide_pre[:, D : D + d] = pre[:, d:]
    w["pre_projection.weight"] = wide_pre
    w["post_projection.weight"] = _pad(w["post_projection.weight"], (D, pre.shape[0]))
    w["norm.weight"] = _pad(w["norm.weight"], (D,)) * math.sqrt(d / D)
    head.update(tree_unflatten(list(w.items())))
    mx.eval(head.parameters())
    return MTPDrafter(head, cfg, wide)


def quantized(target: TargetModel, config: dict[str, Any], bits: int = 4) -> TargetModel:
    from mlx_lm.utils import quantize_model

    model = build_model(config)
    model.update(target.model.parameters())
    model, _ = quantize_model(model, dict(config), group_size=64, bits=bits)
    return TargetModel(model, context_length=target.context_length,
                       name=f"{target.name}-{bits}bit")


def parameter_count(model: nn.Module) -> int:
    return sum(v.size for _, v in tree_flatten(model.parameters()))
