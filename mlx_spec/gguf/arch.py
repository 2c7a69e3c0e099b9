"""What each GGUF architecture is in mlx-lm's terms: its config.json, its tensor names, and what
llama.cpp's converter did to the weights that must be undone (rotary row order, norm offsets)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import UnsupportedModelError
from .read import GGUFFile

# blk.N.<gguf name> -> model.layers.N.<mlx-lm name>, shared by every architecture below
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Gemma 3 normalises four times a layer: before and after attention, before and after the MLP
GEMMA3_NAMES = {**LAYER_NAMES, "post_attention_norm": "post_attention_layernorm",
                "ffn_norm": "pre_feedforward_layernorm",
                "post_ffw_norm": "post_feedforward_layernorm"}
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
             "output": "lm_head"}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")


@dataclass(frozen=True)
class Arch:
    """One architecture: mlx-lm's model_type, the layer names, and the converter's edits."""

    model_type: str
    layer_names: dict[str, str]
    rotary_permuted: bool = False  # llama.cpp reorders q/k rows for its interleaved rotary
    norm_offset: float = 0.0  # llama.cpp stored norm weights as w + offset (Gemma: 1 + w)


ARCHS = {
    "llama": Arch("llama", LAYER_NAMES, rotary_permuted=True),
    "qwen2": Arch("qwen2", LAYER_NAMES),
    "qwen3": Arch("qwen3", LAYER_NAMES),
    "gemma3": Arch("gemma3_text", GEMMA3_NAMES, norm_offset=1.0),
}


def arch_of(f: GGUFFile) -> Arch:
    if f.arch not in ARCHS:
        raise UnsupportedModelError(
            f"{f.path.name}: architecture {f.arch!r} is not supported "
            f"(supported: {', '.join(ARCHS)})")
    if any(t.name == "rope_freqs.weight" for t in f.tensors):
        raise UnsupportedModelError(f"{f.path.name}: per-frequency rotary scaling "
                                    "(rope_freqs, Llama 3.1 style) is not supported yet")
    return ARCHS[f.arch]


def config_for(f: GGUFFile, arch: Arch, eos_ids: list[int]) -> dict[str, Any]:
    """config.json for mlx-lm, from the header's hyper-parameters."""
    heads = int(f.arch_key("attention.head_count"))
    d = int(f.arch_key("embedding_length"))
    names = {t.name for t in f.tensors}
    vocab = next(t for t in f.tensors if t.name == "token_embd.weight").shape[-1]
    config: dict[str, Any] = {
        "model_type": arch.model_type,
        "hidden_size": d,
        "num_hidden_layers": int(f.arch_key("block_count")),
        "intermediate_size": int(f.arch_key("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(f.arch_key("attention.head_count_kv", heads)),
        "head_dim": int(f.arch_key("attention.key_length", d // heads)),
        "rms_norm_eps": float(f.arch_key("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(f.arch_key("rope.freq_base", 10000.0)),
        "vocab_size": int(vocab),
        "max_position_embeddings": int(f.arch_key("context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in names,
        "eos_token_id": eos_ids,
    }
    scaling = f.arch_key("rope.scaling.type")
    if scaling not in (None, "none"):
        config["rope_scaling"] = {"type": scaling,
                                  "factor": float(f.arch_key("rope.scaling.factor", 1.0))}
    if arch.model_type == "gemma3_text":
        # llama.cpp fixes these for Gemma 3 rather than storing them: local layers rotate at
        # base 10k, every 6th layer is global (unless the header says otherwise), queries are
        # scaled by 1/sqrt(head_dim)
        config.update(sliding_window=int(f.arch_key("attention.sliding_window", 512)),
                      sliding_window_pattern=int(f.arch_key("attention.sliding_window_pattern",
                                                            6)),
                      rope_local_base_freq=10000.0,
                      query_pre_attn_scalar=config["head_dim"])
    return config


def mlx_name(arch: Arch, gguf_name: str) -> str | None:
    """The mlx-lm tensor name for a GGUF one (None: a tensor mlx-lm does not use)."""
    if m := _BLOCK.match(gguf_name):
        layer, part, kind = m.groups()
        if part not in arch.layer_names:
            return None
        return f"model.layers.{layer}.{arch.layer_names[part]}.{kind}"
    stem, _, kind = gguf_name.rpartition(".")
    return f"{TOP_NAMES[stem]}.{kind}" if stem in TOP_NAMES else None


def undo_conversion(arch: Arch, gguf_name: str, w: np.ndarray, config: dict) -> np.ndarray:
    """The weight as the original checkpoint had it (w decoded, rows = output features)."""
    part = gguf_name.split(".")[-2]
    if arch.rotary_permuted and part in ("attn_q", "attn_k"):
        heads = config["num_attention_heads" if part == "attn_q" else "num_key_value_heads"]
        w = unpermute_rotary(w, heads)
    if arch.norm_offset and part.endswith("norm"):
        w = w - np.float32(arch.norm_offset)
    return w


def unpermute_rotary(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter turns each head's rows from halves (x0..x_{h/2-1} | x_{h/2}..)
    into interleaved pairs (x0, x_{h/2}, x1, …) for its rotary kernel; this is the inverse.
    Within a head of h rows: converted row 2i+j came from original row j·h/2 + i."""
    rows = w.shape[0]
    half = rows // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
