"""An independent NumPy reading of transformers 5.24's `Gemma4AssistantForCausalLM.forward`
(models/gemma4_assistant/modeling_gemma4_assistant.py, with the Gemma4Text layers, RMSNorm,
RoPE and eager attention of models/gemma4/modeling_gemma4.py and the proportional RoPE of
modeling_rope_utils.py). torch cannot be installed here (its CPU index is unreachable), so the
parity tests compare against this, written from those equations and sharing no code with
mlx_spec: float64 throughout, HF's masks applied as masks (not slices)."""

from __future__ import annotations

import numpy as np


def rms_norm(x, w=None, eps=1e-6):
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return y * w if w is not None else y


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def inv_freq(head_dim, params):
    base, factor = params["rope_theta"], params.get("factor", 1.0)
    if params.get("rope_type", "default") == "default":
        return 1.0 / base ** (np.arange(0, head_dim, 2) / head_dim)
    angles = int(params.get("partial_rotary_factor", 1.0) * head_dim // 2)
    rotated = 1.0 / base ** (np.arange(0, 2 * angles, 2) / head_dim)
    return np.concatenate([rotated, np.zeros(head_dim // 2 - angles)]) / factor


def rope(x, position, freqs):
    """x [..., D]: HF's rotate_half convention."""
    angle = position * freqs
    cos, sin = np.cos(np.concatenate([angle, angle])), np.sin(np.concatenate([angle, angle]))
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def forward(w: dict, config: dict, inputs_embeds, shared_kv: dict, position: int):
    """inputs_embeds [2·d_backbone]; shared_kv[type] = (k, v) [Hkv, L, D] over every committed
    position. Returns (logits [V], projected h [d_backbone])."""
    text = config["text_config"]
    eps, heads, window = text["rms_norm_eps"], text["num_attention_heads"], text["sliding_window"]
    rope_params = text["rope_parameters"]
    x = w["pre_projection.weight"] @ inputs_embeds
    for i, kind in enumerate(text["layer_types"]):
        p = f"model.layers.{i}."
        head_dim = text["global_head_dim"] if kind == "full_attention" else text["head_dim"]
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (w[p + "self_attn.q_proj.weight"] @ h).reshape(heads, head_dim)
        q = rope(rms_norm(q, w[p + "self_attn.q_norm.weight"], eps), position,
                 inv_freq(head_dim, rope_params[kind]))
        k, v = shared_kv[kind]
        k, v = np.repeat(k, heads // k.shape[0], 0), np.repeat(v, heads // v.shape[0], 0)
        scores = np.einsum("hd,hld->hl", q, k) * 1.0  # Gemma 4: scaling 1
        if kind == "sliding_attention":
            # bidirectional window |q_idx - kv_idx| <= window at q_idx 0, flipped on the kv axis
            n = k.shape[1]
            allowed = np.abs(0 - np.arange(n)) <= window
            scores = np.where(allowed[::-1][None], scores, -np.inf)
        a = np.exp(scores - scores.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = np.einsum("hl,hld->hd", a, v).reshape(-1)
        x = x + rms_norm(w[p + "self_attn.o_proj.weight"] @ o,
                         w[p + "post_attention_layernorm.weight"], eps)
        h = rms_norm(x, w[p + "pre_feedforward_layernorm.weight"], eps)
        m = w[p + "mlp.down_proj.weight"] @ (gelu_tanh(w[p + "mlp.gate_proj.weight"] @ h)
                                             * (w[p + "mlp.up_proj.weight"] @ h))
        x = x + rms_norm(m, w[p + "post_feedforward_layernorm.weight"], eps)
        x = x * w[p + "layer_scalar"]
    y = rms_norm(x, w["model.norm.weight"], eps)
    projected = w["post_projection.weight"] @ y
    head = w["model.embed_tokens.weight"]
    if not config["use_ordered_embeddings"]:
        return head @ y, projected
    centroid_logits = w["masked_embedding.centroids.weight"] @ y
    top = np.argsort(-centroid_logits)[: config["centroid_intermediate_top_k"]]
    per_cluster = w["masked_embedding.token_ordering"].reshape(config["num_centroids"], -1)
    ids = per_cluster[top].reshape(-1)
    selected = head[ids] @ y
    out = np.full(head.shape[0], selected.min() - 1.0)
    out[ids] = selected
    return out, projected
