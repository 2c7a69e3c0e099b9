"""An independent NumPy reading of the EAGLE-3 head as vLLM's llama_eagle3 and speculators'
Eagle3 model define it (fc over the fused taps, normed first if norm_before_fc / fc_norm;
layer 0 over concat(input_layernorm(emb), hidden_norm(g)) with the hidden half as residual;
plain decoder layers after it; final norm; lm_head over the draft vocabulary; target id =
draft id + d2t), with speculators' TTT mask for sliding layers. No cache: every call
recomputes the whole causal sequence, float64, HF's rotate-half RoPE."""

from __future__ import annotations

import numpy as np


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope(x, positions, theta):
    """x [H, L, D]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2) / d)
    angle = positions[:, None] * inv[None]
    angle = np.concatenate([angle, angle], -1)
    cos, sin = np.cos(angle), np.sin(angle)
    rotated = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], axis=-1)
    return x * cos + rotated * sin


def fuse(w, taps, cfg: dict | None = None):
    cfg = cfg or {}
    eps = cfg.get("transformer_layer_config", cfg).get("rms_norm_eps", 1e-5)
    if cfg.get("norm_before_fc"):
        taps = rms_norm(taps, w["input_norm.weight"], eps)
    if cfg.get("fc_norm"):
        parts = np.split(taps, len([k for k in w if k.startswith("fc_norm.")]), axis=-1)
        taps = np.concatenate([rms_norm(x, w[f"fc_norm.{i}.weight"], eps)
                               for i, x in enumerate(parts)], -1)
    return taps @ w["fc.weight"].T


def attention(w, p, layer: dict, x, window: int | None, true_entries: int):
    heads, kv_heads = layer["num_attention_heads"], layer["num_key_value_heads"]
    hd = layer.get("head_dim") or layer["hidden_size"] // heads
    n = x.shape[0]
    q = (x @ w[p + "self_attn.q_proj.weight"].T).reshape(n, heads, hd).transpose(1, 0, 2)
    k = (x @ w[p + "self_attn.k_proj.weight"].T).reshape(n, kv_heads, hd).transpose(1, 0, 2)
    v = (x @ w[p + "self_attn.v_proj.weight"].T).reshape(n, kv_heads, hd).transpose(1, 0, 2)
    pos = np.arange(n, dtype=np.float64)
    q, k = rope(q, pos, layer["rope_theta"]), rope(k, pos, layer["rope_theta"])
    k, v = np.repeat(k, heads // kv_heads, 0), np.repeat(v, heads // kv_heads, 0)
    s = q @ k.transpose(0, 2, 1) / np.sqrt(hd)
    qi, ki = np.arange(n)[:, None], np.arange(n)[None]
    visible = ki <= qi
    if window is not None:  # TTT: a draft entry keeps the last true entry's window
        visible &= ki > np.minimum(qi, true_entries - 1) - window
    s = np.where(visible[None], s, -np.inf)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    o = (a @ v).transpose(1, 0, 2).reshape(n, -1)
    return o @ w[p + "self_attn.o_proj.weight"].T


def mlp(w, p, eps, h):
    m = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
    gate, up = m @ w[p + "mlp.gate_proj.weight"].T, m @ w[p + "mlp.up_proj.weight"].T
    return h + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T


def forward(w, cfg: dict, emb, g, true_entries: int | None = None):
    """emb, g [L, d] (g: fused taps, or a fed-back state) → the states fed back [L, d]
    (normed if norm_output); the first `true_entries` entries are built from true taps."""
    layer = cfg.get("transformer_layer_config", cfg)  # the original format is flat
    eps, n = layer["rms_norm_eps"], emb.shape[0]
    true_entries = n if true_entries is None else true_entries
    types = layer.get("layer_types") or ["full_attention"] * layer.get("num_hidden_layers", 1)
    windows = [layer.get("sliding_window") if t == "sliding_attention" else None for t in types]
    p = "layers.0."
    e = rms_norm(emb, w[p + "input_layernorm.weight"], eps)
    gn = rms_norm(g, w[p + "hidden_norm.weight"], eps)
    residual = gn if cfg.get("norm_before_residual", False) else g
    h = residual + attention(w, p, layer, np.concatenate([e, gn], -1), windows[0],
                             true_entries)
    h = mlp(w, p, eps, h)
    for i in range(1, len(types)):
        p = f"layers.{i}."
        h = h + attention(w, p, layer, rms_norm(h, w[p + "input_layernorm.weight"], eps),
                          windows[i], true_entries)
        h = mlp(w, p, eps, h)
    return rms_norm(h, w["norm.weight"], eps) if cfg.get("norm_output") else h


def target_logits(w, cfg: dict, h, vocab: int):
    """Draft logits at the target's width (-inf off the draft vocabulary)."""
    eps = cfg.get("transformer_layer_config", cfg)["rms_norm_eps"]
    s = h if cfg.get("norm_output") else rms_norm(h, w["norm.weight"], eps)
    small = s @ w["lm_head.weight"].T
    out = np.full(vocab, -np.inf)
    out[np.arange(small.shape[-1]) + w["d2t"]] = small
    return out
