"""Tiny GGUF files written by the tests from a tiny mlx-lm model directory, the way llama.cpp's
converter lays them out (names, the llama rotary row order, Gemma's 1 + w norms, quantized
blocks by the `gguf` package's own quantizers), so a conversion back can be compared with the
model it came from."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from mlx_spec.gguf.arch import ARCHS, TOP_NAMES

GGUF_ARCH = {"llama": "llama", "qwen3": "qwen3", "gemma3_text": "gemma3"}


def permute_rotary(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's row order for its interleaved rotary (what arch.unpermute_rotary undoes)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape)


def write_gguf(model_dir: Path, out: Path, *, qtype: str = "F32",
               arch_name: str | None = None) -> Path:
    """model_dir (an mlx-lm directory with f32 weights) as a GGUF file at `out`. qtype: the type
    of every 2-D weight (F32, Q8_0, Q4_0, Q4_1); norms stay F32."""
    import mlx.core as mx

    config = json.loads((model_dir / "config.json").read_text())
    arch = ARCHS[GGUF_ARCH[config["model_type"]]]
    name = arch_name or GGUF_ARCH[config["model_type"]]
    weights = {k: np.array(v.astype(mx.float32)) for k, v in
               mx.load(str(next(model_dir.glob("*.safetensors")))).items()}
    w = GGUFWriter(str(out), name)
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_key_length(config.get("head_dim", config["hidden_size"]
                                // config["num_attention_heads"]))
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    default_theta = 1e6 if name == "gemma3" else 1e4  # mlx-lm's defaults where unset
    w.add_rope_freq_base(config.get("rope_theta", default_theta))
    if name == "gemma3":
        w.add_sliding_window(config["sliding_window"])
        w.add_uint32("gemma3.attention.sliding_window_pattern", config["sliding_window_pattern"])
    _add_tokenizer(w, model_dir)
    back = {v: k for k, v in arch.layer_names.items()}
    for key, value in sorted(weights.items()):
        gname = _gguf_name(key, back)
        if gname is None:
            continue
        part = gname.split(".")[-2]
        if arch.rotary_permuted and part in ("attn_q", "attn_k"):
            value = permute_rotary(value, config["num_attention_heads" if part == "attn_q"
                                                 else "num_key_value_heads"])
        if arch.norm_offset and part.endswith("norm"):
            value = value + np.float32(arch.norm_offset)
        kind = GGMLQuantizationType[qtype if value.ndim == 2 else "F32"]
        if kind == GGMLQuantizationType.F32:
            w.add_tensor(gname, value.astype(np.float32))
        else:
            w.add_tensor(gname, quantize(value, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _gguf_name(key: str, back: dict[str, str]) -> str | None:
    top = {f"{v}.weight": f"{k}.weight" for k, v in TOP_NAMES.items()}
    if key in top:
        return top[key]
    if not key.startswith("model.layers."):
        return None
    _, _, layer, rest = key.split(".", 3)
    stem, _, kind = rest.rpartition(".")
    return f"blk.{layer}.{back[stem]}.{kind}" if stem in back else None


def _add_tokenizer(w: GGUFWriter, model_dir: Path) -> None:
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    vocab = tok["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    special = {a["content"] for a in tok.get("added_tokens", []) if a.get("special")}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 1 for t in tokens])
    w.add_token_merges(merges)
    eos = config.get("eos_token")
    if eos in vocab:
        w.add_eos_token_id(vocab[eos])
    if template := config.get("chat_template"):
        w.add_chat_template(template)
