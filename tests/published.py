"""Tiny random checkpoints written as their makers publish them: HF names and layouts (Qwen's
zero-centred norms, [C, 1, K] conv weights, unstacked experts), the MTP module inside the
checkpoint, or an MLX conversion without it plus an mlx-vlm-style sidecar head."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from mlx_spec.drafters import nextn
from mlx_spec.model import TargetModel
from mlx_spec.train.modeldir import TOKENIZER_FILES, build_model

VOCAB = 384
LINEAR = dict(linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
              linear_value_head_dim=16, linear_conv_kernel_dim=4)
BASE = dict(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
            rms_norm_eps=1e-6, vocab_size=VOCAB, max_position_embeddings=512,
            tie_word_embeddings=False)
CONFIGS = {
    # Qwen3.5 / 3.6: multimodal wrapper, text_config, GDN every layer but every 2nd (here)
    "qwen3_5": dict(model_type="qwen3_5", tie_word_embeddings=False, text_config=dict(
        BASE, **LINEAR, model_type="qwen3_5_text", num_hidden_layers=4, head_dim=32,
        full_attention_interval=2, mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1]})),
    # Qwen3-Next: flat config, MoE MLPs (the MTP layer too)
    "qwen3_next": dict(
        BASE, **LINEAR, model_type="qwen3_next", num_hidden_layers=4, head_dim=32,
        full_attention_interval=2, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1,
        shared_expert_intermediate_size=64, mlp_only_layers=[], moe_intermediate_size=32,
        rope_theta=10000.0, partial_rotary_factor=0.25, norm_topk_prob=True,
        num_nextn_predict_layers=1),
    # MiMo: a dense qwen2-style trunk with model.mtp_layers.*
    "mimo": dict(BASE, model_type="mimo", num_hidden_layers=2, rope_theta=10000.0,
                 num_nextn_predict_layers=1),
}
OUTPUT_PROJECTIONS = ("o_proj.weight", "out_proj.weight", "down_proj.weight")
ZERO_CENTRED_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight",
                      "model.norm.weight", ".q_norm.weight", ".k_norm.weight")


def text_args(model):
    return getattr(model, "language_model", model).args


def build_pair(arch: str, seed: int = 0, *, agree: bool = False, noise: float = 0.0):
    """(trunk model, MTP head) with random weights. agree=True builds a known-answer pair:
    every layer's output projection is zero, so the target predicts from the current token
    alone (h_t = norm(Emb(x_t))), and the head, fed x_{t+1}, passes norm(Emb(x_{t+1})) through
    unchanged: it must then predict exactly what the target will (acceptance ~100%).
    noise > 0 keeps that fraction of the trunk's output projections: a target that mostly, not
    always, agrees with the head (partial acceptance, so rollbacks land mid-round)."""
    config = CONFIGS[arch]
    model = build_model(config, seed=seed)
    target = TargetModel(model, 512)
    lay = nextn.layout_for(target)
    args = target.args
    rng = np.random.default_rng(seed + 100)
    final = mx.array(rng.uniform(0.5, 4.0, args.hidden_size).astype(np.float32))
    target.backbone.norm.weight = final  # sharp, uneven: a missed norm offset shows
    head = nextn.NextNHead(args.hidden_size, args.rms_norm_eps, lay.block(args),
                           hidden_first=lay.hidden_first)
    d = args.hidden_size
    for m in (head.enorm, head.hnorm, head.norm):
        m.weight = mx.array(rng.uniform(0.5, 2.0, d).astype(np.float32))
    if agree:
        for module, keep in ((model, noise), (head, 0.0)):
            params = [(k, keep * v if k.endswith(OUTPUT_PROJECTIONS) else v)
                      for k, v in tree_flatten(module.parameters())]
            module.update(tree_unflatten(params))
        eye, zero = mx.eye(d), mx.zeros((d, d))
        head.eh_proj.weight = mx.concatenate([zero, eye] if lay.hidden_first else [eye, zero], 1)
        head.enorm.weight = mx.ones(d)
        head.norm.weight = final
    mx.eval(model.parameters(), head.parameters())
    return model, head


# -- HF names ----------------------------------------------------------------------------------


def trunk_to_hf(arch: str, model) -> dict[str, mx.array]:
    """Undo mlx-lm's sanitize: the names and layouts of the published checkpoint."""
    out = {}
    for k, v in tree_flatten(model.parameters()):
        if arch == "qwen3_5":
            k = k.replace("language_model.model.", "model.language_model.")
            k = k.replace("language_model.lm_head.", "lm_head.")
        out.update(_to_hf(arch, k, v))
    return out


def head_to_hf(arch: str, head, target: TargetModel) -> dict[str, mx.array]:
    """The head's tensors under the published names of the checkpoint's MTP module."""
    lay = nextn.layout_for(target)
    prefix = lay.prefix(target.args)
    out = {}
    for k, v in tree_flatten(head.parameters()):
        stem, suffix = k.rsplit(".", 1)
        if stem in lay.names:
            name = prefix + lay.names[stem] + "." + suffix
            if lay.zero_centred and stem != "eh_proj":
                v = v - 1.0
            out[name] = v
        else:
            out.update(_to_hf(arch, prefix + lay.block_prefix + k[len("block."):], v,
                              norms=lay.zero_centred))
    return out


def _to_hf(arch, k, v, norms=None):
    zero_centred = arch in ("qwen3_5", "qwen3_next") if norms is None else norms
    if "conv1d.weight" in k:
        v = v.moveaxis(2, 1)
    if zero_centred and v.ndim == 1 and k.endswith(ZERO_CENTRED_NORMS):
        v = v - 1.0
    if ".switch_mlp." in k:
        return {k.replace(".switch_mlp.", f".experts.{e}."): v[e] for e in range(v.shape[0])}
    return {k: v}


# -- directories -------------------------------------------------------------------------------


def write_dir(out: Path, config: dict, weights: dict, tokenizer_dir: Path, fmt: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": fmt})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, out / name)
    return out


def write_checkpoint(out: Path, arch: str, model, head, tokenizer_dir: Path) -> Path:
    """The original checkpoint: HF layout, the MTP module inside it."""
    target = TargetModel(model, 512)
    weights = {**trunk_to_hf(arch, model), **head_to_hf(arch, head, target)}
    return write_dir(out, CONFIGS[arch], weights, tokenizer_dir, "pt")


def write_sidecar(out: Path, arch: str, head, *, bits: int | None = None,
                  tokenizer_dir: Path | None = None) -> Path:
    """An mlx-vlm-style sidecar: MLX names without `mtp.`, norms shifted, maybe quantized."""
    import mlx.nn as nn

    config = CONFIGS[arch]
    side = {"model_type": f"{arch}_mtp", "text_config": config.get("text_config", config),
            "tie_word_embeddings": False}
    lay = next(lay for lay in nextn.LAYOUTS if arch in lay.families)
    if bits:
        nn.quantize(head, group_size=32, bits=bits,
                    class_predicate=lambda p, m: isinstance(m, nn.Linear)
                    and m.weight.shape[-1] % 32 == 0)
        side["quantization"] = {"group_size": 32, "bits": bits, "mode": "affine"}
    weights = {}
    for k, v in tree_flatten(head.parameters()):
        stem, suffix = k.rsplit(".", 1)
        if stem in lay.names:
            weights[lay.names[stem] + "." + suffix] = v
        else:
            weights[lay.block_prefix + k[len("block."):]] = v
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(side, indent=2))
    return out
