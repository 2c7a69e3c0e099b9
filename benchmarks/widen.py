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

import itertools
import math
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from mlx_spec.drafters.eagle3 import Eagle3Config, Eagle3Head
from mlx_spec.drafters.mtp import MTPConfig, MTPDrafter, eagle3_drafter, make_head
from mlx_spec.model import TargetModel
from mlx_spec.train.modeldir import build_model


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
    w["pre_projection.weight"] = _place(pre, (pre.shape[0], 2 * D), d, D)
    w["post_projection.weight"] = _pad(w["post_projection.weight"], (D, pre.shape[0]))
    w["norm.weight"] = _pad(w["norm.weight"], (D,)) * math.sqrt(d / D)
    head.update(tree_unflatten(list(w.items())))
    mx.eval(head.parameters())
    return MTPDrafter(head, cfg, wide)


def widen_eagle3(head: Eagle3Head, wide: TargetModel, *, ffn: int | None = None) -> MTPDrafter:
    """An EAGLE-3 head for the widened target computing what `head` computes on the small one,
    at the width a head trained for the wide target has (its hidden size D, its FFN `ffn`):
    every d-wide axis padded to D, each tap of fc's input (3·d → 3·D) and each half of the
    first layer's concat(embedding, hidden) (2·d → 2·D) padded on its own, RMSNorm weights
    scaled by √(d/D). The taps keep their layer ids: the small target's layers are the wide
    one's first, and the zero layers after them leave its stream alone."""
    c = head.cfg
    d, D = c.hidden_size, wide.hidden_size
    cfg = Eagle3Config(**{**c.__dict__, "hidden_size": D, "target_hidden_size": D,
                          "intermediate_size": ffn or c.intermediate_size})
    big = Eagle3Head(cfg)
    small_w = dict(tree_flatten(head.parameters()))
    new = {}
    for name, w in tree_flatten(big.parameters()):
        s = small_w[name]
        if s.shape == w.shape:  # vocabulary map, q/k norms, per-head projections' outputs
            new[name] = s
            continue
        out = _place(s, w.shape, d, D)
        is_norm = s.ndim == 1 and "norm" in name  # (a bias is padded as it is)
        new[name] = out * math.sqrt(d / D) if is_norm else out
    big.update(tree_unflatten(list(new.items())))
    mx.eval(big.parameters())
    return eagle3_drafter(big, wide)


def _place(small: mx.array, shape: tuple[int, ...], d: int, D: int) -> mx.array:
    """`small` in a zero tensor of `shape`: an axis of m·d that becomes m·D (m concatenated
    d-wide parts: taps, or embedding and hidden) goes part by part to offsets 0, D, 2D…; any
    other axis to its start."""
    per_axis = []
    for n, N in zip(small.shape, shape, strict=True):
        m = N // D
        if n != N and N % D == 0 and n == m * d:
            per_axis.append([(slice(j * d, (j + 1) * d), slice(j * D, j * D + d))
                             for j in range(m)])
        else:
            per_axis.append([(slice(0, n), slice(0, n))])
    out = mx.zeros(shape, mx.float32)
    for parts in itertools.product(*per_axis):
        out[tuple(p[1] for p in parts)] = small[tuple(p[0] for p in parts)].astype(mx.float32)
    return out


def quantized(target: TargetModel, config: dict[str, Any], bits: int = 4) -> TargetModel:
    from mlx_lm.utils import quantize_model

    model = build_model(config)
    model.update(target.model.parameters())
    model, _ = quantize_model(model, dict(config), group_size=64, bits=bits)
    return TargetModel(model, context_length=target.context_length,
                       name=f"{target.name}-{bits}bit")


def parameter_count(model: nn.Module) -> int:
    return sum(v.size for _, v in tree_flatten(model.parameters()))


# -- hybrid (Gated DeltaNet) targets and their published MTP heads ----------------------------
#
# A GDN layer's channels are [q heads | k heads | v heads] (conv and in_proj_qkv rows), then z,
# b, a per v head. Widening adds whole *heads* after the existing ones in every segment: a new
# head's q, k, v, z, a, b are zero, so its delta-rule state stays exactly 0 and its output too
# (v head j reads k head j // r, so with r unchanged old heads keep their k heads). Per-head
# sizes (D_k, D_v) and the per-head gated norm are unchanged.


def _gdn_segments(args) -> list[int]:
    kd = args.linear_num_key_heads * args.linear_key_head_dim
    return [kd, kd, args.linear_num_value_heads * args.linear_value_head_dim]


def _place_segments(small: mx.array, shape: tuple[int, ...], small_segs: list[int],
                    wide_segs: list[int]) -> mx.array:
    """Rows of `small` laid out in segments, each copied to the start of its wide segment."""
    out = mx.zeros(shape, mx.float32)
    s0 = w0 = 0
    for s, w in zip(small_segs, wide_segs, strict=True):
        idx = (slice(w0, w0 + s),) + tuple(slice(0, n) for n in small.shape[1:])
        out[idx] = small[s0 : s0 + s].astype(mx.float32)
        s0, w0 = s0 + s, w0 + w
    return out


def _widen_tensors(small_w: dict, wide_w: dict, small_args, wide_args, *,
                   concat_halves: tuple[str, ...] = ()) -> dict:
    d, D = small_args.hidden_size, wide_args.hidden_size
    scale = math.sqrt(d / D)
    out = {}
    for name, w in wide_w.items():
        if name not in small_w:  # a whole extra layer: exactly 0
            out[name] = mx.zeros(w.shape, mx.float32)
            continue
        s = small_w[name]
        leaf = name.rsplit(".", 2)[-2] if "." in name else name
        if name.endswith(("in_proj_qkv.weight", "conv1d.weight")):
            out[name] = _place_segments(s, w.shape, _gdn_segments(small_args),
                                        _gdn_segments(wide_args))
        elif name.endswith(concat_halves):  # [out, 2d]: columns [first | second] halves
            wide = mx.zeros(w.shape, mx.float32)
            wide[: s.shape[0], :d] = s[:, :d].astype(mx.float32)
            wide[: s.shape[0], D : D + d] = s[:, d:].astype(mx.float32)
            out[name] = wide
        elif leaf in ("q_norm", "k_norm") or name.endswith("linear_attn.norm.weight"):
            out[name] = s.astype(mx.float32)  # per-head norms: not over the residual stream
        elif name.endswith("norm.weight"):
            out[name] = _pad(s, w.shape) * scale
        else:
            out[name] = _pad(s, w.shape)
    return out


def widen_hybrid(small: TargetModel, config: dict[str, Any], *, hidden: int, layers: int,
                 ffn: int, head_factor: int) -> tuple[TargetModel, dict[str, Any]]:
    """A wide Qwen3.5-layout model computing the same function as `small`: hidden, FFN and
    layers as widen_target, and head_factor× the GDN heads (attention geometry kept)."""
    text = dict(config["text_config"])
    text.update(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=ffn,
                linear_num_key_heads=text["linear_num_key_heads"] * head_factor,
                linear_num_value_heads=text["linear_num_value_heads"] * head_factor)
    cfg = dict(config, text_config=text)
    wide = build_model(cfg)
    new = _widen_tensors(dict(tree_flatten(small.model.parameters())),
                         dict(tree_flatten(wide.parameters())), small.args,
                         wide.language_model.args)
    wide.update(tree_unflatten(list(new.items())))
    mx.eval(wide.parameters())
    return TargetModel(wide, context_length=small.context_length,
                       name=f"{small.name}-wide{hidden}x{layers}"), cfg


def widen_nextn(drafter: MTPDrafter, small: TargetModel, wide: TargetModel) -> MTPDrafter:
    """The same published-layout MTP head on the wide target's (zero-padded) stream."""
    from mlx_spec.drafters.nextn import NextNHead, layout_for

    lay = layout_for(wide)
    head = NextNHead(wide.hidden_size, wide.args.rms_norm_eps, lay.block(wide.args),
                     hidden_first=lay.hidden_first)
    new = _widen_tensors(dict(tree_flatten(drafter.head.parameters())),
                         dict(tree_flatten(head.parameters())), small.args, wide.args,
                         concat_halves=("eh_proj.weight",))
    head.update(tree_unflatten(list(new.items())))
    mx.eval(head.parameters())
    cfg = MTPConfig(**{**drafter.cfg.__dict__, "target_hidden_size": wide.hidden_size,
                       "hidden_size": wide.hidden_size})
    return MTPDrafter(head, cfg, wide)
