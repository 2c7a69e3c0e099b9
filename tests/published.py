"""Tiny random checkpoints written as their makers publish them: HF names and layouts (Qwen's
zero-centred norms, [C, 1, K] conv weights, unstacked experts), the MTP module inside the
checkpoint, or an MLX conversion without it plus an mlx-vlm-style sidecar head."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from benchmarks.hybrid import agreeing_pair
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
    # GLM-4.5: DeepSeek's MTP layout (the module is layer N), gated MoE, partial RoPE, qk norm
    "glm4_moe": dict(
        BASE, model_type="glm4_moe", num_hidden_layers=2, moe_intermediate_size=32, head_dim=32,
        norm_topk_prob=True, n_group=1, topk_group=1, n_shared_experts=1, n_routed_experts=4,
        routed_scaling_factor=1.0, num_experts_per_tok=2, first_k_dense_replace=1,
        rope_theta=10000.0, rope_scaling=None, use_qk_norm=True, attention_bias=False,
        partial_rotary_factor=0.5, num_nextn_predict_layers=1),
    # DeepSeek-V3: MLA attention, MoE after the first layer, the MTP module as layer 61
    # (mlx-lm drops exactly `model.layers.61`, so the trunk has the published 61 layers)
    "deepseek_v3": dict(
        BASE, model_type="deepseek_v3", num_hidden_layers=61, num_key_value_heads=2,
        moe_intermediate_size=32, n_shared_experts=1, n_routed_experts=4,
        routed_scaling_factor=1.0, kv_lora_rank=24, q_lora_rank=None, qk_rope_head_dim=16,
        v_head_dim=32, qk_nope_head_dim=32, topk_method="noaux_tc", scoring_func="sigmoid",
        norm_topk_prob=True, n_group=1, topk_group=1, num_experts_per_tok=2, moe_layer_freq=1,
        first_k_dense_replace=1, rope_theta=10000.0, rope_scaling=None, attention_bias=False,
        num_nextn_predict_layers=1),
    # MiMo: a dense qwen2-style trunk with model.mtp_layers.*
    "mimo": dict(BASE, model_type="mimo", num_hidden_layers=2, rope_theta=10000.0,
                 num_nextn_predict_layers=1),
}
ZERO_CENTRED_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight",
                      "model.norm.weight", ".q_norm.weight", ".k_norm.weight")


def build_pair(arch: str, seed: int = 0, *, agree: bool = False, noise: float = 0.0):
    """(trunk model, MTP head) with random weights; agree=True: the known-answer pair of
    bench_hybrid.agreeing_pair (the head predicts what the target will, exactly at noise 0;
    noise > 0 keeps that share of the trunk's layers, so acceptance is partial)."""
    if agree:
        return agreeing_pair(CONFIGS[arch], seed=seed, noise=noise)
    model = build_model(CONFIGS[arch], seed=seed)
    target = TargetModel(model, 512)
    lay, args = nextn.layout_for(target), target.args
    head = nextn.NextNHead(args.hidden_size, args.rms_norm_eps, lay.block(args),
                           hidden_first=lay.hidden_first)
    rng = np.random.default_rng(seed + 100)
    for m in (head.enorm, head.hnorm, head.norm, target.backbone.norm):
        m.weight = mx.array(rng.uniform(0.5, 2.0, args.hidden_size).astype(np.float32))
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
    return _mla_to_hf(out)


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
    return _mla_to_hf(out)


def _mla_to_hf(weights: dict) -> dict:
    """DeepSeek MLA: mlx-lm splits kv_b_proj into embed_q [H, r, nope] and unembed_out
    [H, v, r]; the checkpoint stores kv_b_proj [H·(nope + v), r]."""
    for k in [k for k in weights if k.endswith("self_attn.embed_q.weight")]:
        base = k[: -len("embed_q.weight")]
        wk = weights.pop(k).swapaxes(-1, -2)
        wv = weights.pop(base + "unembed_out.weight")
        kv_b = mx.concatenate([wk, wv], axis=1)
        weights[base + "kv_b_proj.weight"] = kv_b.reshape(-1, kv_b.shape[-1])
    return weights


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


def write_dir(out: Path, config: dict, weights: dict, tokenizer_dir: Path | None,
              fmt: str) -> Path:
    """A checkpoint directory: weights, config, and the tokenizer (drafter heads have none)."""
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": fmt})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in TOKENIZER_FILES if tokenizer_dir is not None else ():
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, out / name)
    return out


def write_checkpoint(out: Path, arch: str, model, head, tokenizer_dir: Path) -> Path:
    """The original checkpoint: HF layout, the MTP module inside it."""
    target = TargetModel(model, 512)
    weights = {**trunk_to_hf(arch, model), **head_to_hf(arch, head, target)}
    return write_dir(out, CONFIGS[arch], weights, tokenizer_dir, "pt")


def write_sidecar(out: Path, arch: str, head, *, bits: int | None = None,
                  dtype: mx.Dtype | None = None) -> Path:
    """An mlx-vlm-style sidecar: MLX names without `mtp.`, norms shifted, maybe quantized (bits)
    or cast (dtype, e.g. bf16 as the `-bf16` repos)."""
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
    if dtype is not None:
        weights = {k: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v
                   for k, v in weights.items()}
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(side, indent=2))
    return out
