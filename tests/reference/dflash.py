"""An independent NumPy reading of a DFlash block drafter as speculators' DFlashDraftModel
trains it (its `_backbone_forward`, `Qwen3DFlashAttention`, `create_anchor_block_mask_mod`):
context features c = hidden_norm(fc(taps)); every layer's keys/values are [k_proj/v_proj(c) ;
k_proj/v_proj(block)] with k_norm on keys, RoPE at absolute positions; block queries see the
context before the anchor (the last W in a sliding layer) and their own block (causal in a
sliding layer unless non-causal). No cache: float64, from scratch, HF's rotate-half RoPE."""

from __future__ import annotations

import numpy as np

from reference.eagle3 import rms_norm, rope


def block_logits(w, raw: dict, taps, block_emb, head_w, final_norm_eps=None):
    """taps [P, n·D] for positions 0..P-1; block_emb [B, d] for positions P..P+B-1; head_w
    [V, d] (the target's head). Returns logits [B, V] (slot i: the token at P + i)."""
    layer_types = raw["layer_types"]
    eps, hd = raw["rms_norm_eps"], raw["head_dim"]
    heads, kv_heads = raw["num_attention_heads"], raw["num_key_value_heads"]
    causal_flag = raw.get("is_causal")
    c = rms_norm(taps @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
    P, B = taps.shape[0], block_emb.shape[0]
    pos_ctx, pos_blk = np.arange(P, dtype=np.float64), np.arange(P, P + B, dtype=np.float64)
    h = block_emb
    for i, kind in enumerate(layer_types):
        p = f"layers.{i}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)

        def proj(name, t, n, p=p):
            return (t @ w[p + f"self_attn.{name}.weight"].T).reshape(t.shape[0], n, hd)

        q = rms_norm(proj("q_proj", x, heads), w[p + "self_attn.q_norm.weight"], eps)
        k = np.concatenate([proj("k_proj", c, kv_heads), proj("k_proj", x, kv_heads)])
        k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        v = np.concatenate([proj("v_proj", c, kv_heads), proj("v_proj", x, kv_heads)])
        q = rope(q.transpose(1, 0, 2), pos_blk, raw["rope_theta"])
        k = rope(k.transpose(1, 0, 2), np.concatenate([pos_ctx, pos_blk]), raw["rope_theta"])
        v = v.transpose(1, 0, 2)
        k, v = np.repeat(k, heads // kv_heads, 0), np.repeat(v, heads // kv_heads, 0)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(hd)
        sliding = kind == "sliding_attention"
        ctx_ok = np.ones((B, P), bool)
        if sliding:
            ctx_ok &= np.arange(P)[None] >= P - raw["sliding_window"]
        causal = sliding if causal_flag is None else causal_flag
        own = np.tril(np.ones((B, B), bool)) if causal else np.ones((B, B), bool)
        s = np.where(np.concatenate([ctx_ok, own], 1)[None], s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = (a @ v).transpose(1, 0, 2).reshape(B, -1)
        h = h + o @ w[p + "self_attn.o_proj.weight"].T
        m = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = m @ w[p + "mlp.gate_proj.weight"].T, m @ w[p + "mlp.up_proj.weight"].T
        h = h + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    return rms_norm(h, w["norm.weight"], eps) @ head_w.T
