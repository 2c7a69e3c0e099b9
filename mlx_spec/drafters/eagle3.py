"""EAGLE-3 heads in the speculators format (RedHatAI/*-speculator.eagle3) and the original one
(yuhuili/EAGLE3-*): one decoder layer over fused target features, its own KV cache.

Per committed position t the head reads the token x_{t+1} and the target's *taps* at t, the
inputs of three target layers (low, mid, high; `eagle_aux_hidden_state_layer_ids`, default
[2, L/2, L-3]), and predicts x_{t+2}:

    g    = fc(concat(a_low, a_mid, a_high))                   3·d_target → d
    x    = concat(input_layernorm(Emb(x_{t+1})), hidden_norm(g))   embeddings first
    r    = hidden_norm(g) if norm_before_residual else g      the residual is the hidden half
    h    = r + o_proj(attention(q, k, v of x))                RoPE at the head's own positions
    h'   = h + mlp(post_attention_layernorm(h))               pre-norm output: fed back as g
    logits over the draft vocabulary = lm_head(norm(h')); draft id i is target id i + d2t[i]

Later draft steps feed h' back in place of g (it skips fc). The cache pairs entry i with
(x_{i+1}, taps at i), the layout the MTP drafter's own-cache path already keeps (first = 1), so
commit and catch-up are that drafter's: entries a draft step built from h' are dropped even
when accepted, and rebuilt next round from the target's true taps, as vLLM does.

The draft vocabulary's logits are laid out at the target's width (-inf off the draft
vocabulary), so q is exactly what the sampler draws from and p is left as the target has it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.rope_utils import initialize_rope

from ..errors import ModelLoadError, TokenizerMismatchError
from ..model import TargetModel
from .weights import load_exactly, one_line_errors, read_safetensors


@dataclass(frozen=True)
class Eagle3Config:
    hidden_size: int
    target_hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    qk_norm: bool = False  # a qwen3-type layer
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    layer_ids: tuple[int, ...] | None = None  # target taps; None: [2, L/2, L-3]
    speculative_tokens: int | None = None

    @classmethod
    def from_dict(cls, raw: dict) -> Eagle3Config:
        layer = raw.get("transformer_layer_config") or raw  # speculators nests it; yuhuili not
        hidden = int(layer["hidden_size"])
        heads = int(layer["num_attention_heads"])
        spec = (raw.get("speculators_config") or {}).get("proposal_methods") or [{}]
        ids = raw.get("eagle_aux_hidden_state_layer_ids") or (
            raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        rope = layer.get("rope_parameters") or {}
        return cls(
            hidden_size=hidden,
            target_hidden_size=int(raw.get("target_hidden_size") or hidden),
            num_heads=heads,
            num_kv_heads=int(layer.get("num_key_value_heads") or heads),
            head_dim=int(layer.get("head_dim") or hidden // heads),
            intermediate_size=int(layer["intermediate_size"]),
            vocab_size=int(layer["vocab_size"]),
            draft_vocab_size=int(raw.get("draft_vocab_size") or layer["vocab_size"]),
            rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
            rope_theta=float(layer.get("rope_theta") or rope.get("rope_theta") or 10000.0),
            rope_scaling=layer.get("rope_scaling") or (rope if rope.get("rope_type") not in
                                                       (None, "default") else None),
            qk_norm=layer.get("model_type") == "qwen3",
            norm_before_residual=bool(raw.get("norm_before_residual", False)),
            norm_before_fc=bool(raw.get("norm_before_fc", False)),
            layer_ids=tuple(int(i) for i in ids) if ids else None,
            speculative_tokens=spec[0].get("speculative_tokens"),
        )

    def taps(self, target_layers: int) -> tuple[int, ...]:
        return self.layer_ids or (2, target_layers // 2, target_layers - 3)


def is_eagle3(path: str | Path) -> bool:
    try:
        raw = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    arch = " ".join(raw.get("architectures") or [])
    return raw.get("speculators_model_type") == "eagle3" or "Eagle3" in arch


class Attention(nn.Module):
    """Queries, keys and values from the 2d-wide concat; output back to d."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        d, h, kvh, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.h, self.kvh, self.hd = h, kvh, hd
        self.q_proj = nn.Linear(2 * d, h * hd, bias=False)
        self.k_proj = nn.Linear(2 * d, kvh * hd, bias=False)
        self.v_proj = nn.Linear(2 * d, kvh * hd, bias=False)
        self.o_proj = nn.Linear(h * hd, d, bias=False)
        if cfg.qk_norm:
            self.q_norm = nn.RMSNorm(hd, eps=cfg.rms_norm_eps)
            self.k_norm = nn.RMSNorm(hd, eps=cfg.rms_norm_eps)
        self.rope = initialize_rope(hd, cfg.rope_theta, False, cfg.rope_scaling)

    def __call__(self, x, cache, mask):
        B, L, _ = x.shape
        q = self.q_proj(x).reshape(B, L, self.h, self.hd)
        k = self.k_proj(x).reshape(B, L, self.kvh, self.hd)
        v = self.v_proj(x).reshape(B, L, self.kvh, self.hd).transpose(0, 2, 1, 3)
        if "q_norm" in self:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)
        q, k = self.rope(q, offset=cache.offset), self.rope(k, offset=cache.offset)
        k, v = cache.update_and_fetch(k, v)
        o = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.hd**-0.5, mask=mask)
        return self.o_proj(o.transpose(0, 2, 1, 3).reshape(B, L, -1))


class MLP(nn.Module):
    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)

    def __call__(self, x):
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class FirstLayer(nn.Module):
    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = nn.RMSNorm(d, eps=eps)
        self.hidden_norm = nn.RMSNorm(d, eps=eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = nn.RMSNorm(d, eps=eps)
        self.mlp = MLP(d, cfg.intermediate_size)
        self.norm_before_residual = cfg.norm_before_residual

    def __call__(self, emb, g, cache, mask):
        e, gn = self.input_layernorm(emb), self.hidden_norm(g)
        h = (gn if self.norm_before_residual else g) + self.self_attn(
            mx.concatenate([e, gn], axis=-1), cache, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(nn.Module):
    """The speculators module tree; `embed_tokens` only when the checkpoint carries its own."""

    def __init__(self, cfg: Eagle3Config, *, own_embedding: bool = False):
        super().__init__()
        d, n_taps = cfg.hidden_size, len(cfg.layer_ids or (0, 0, 0))
        self.cfg = cfg
        self.input_dim = n_taps * cfg.target_hidden_size
        if cfg.norm_before_fc:
            self.input_norm = nn.RMSNorm(self.input_dim, eps=cfg.rms_norm_eps)
        self.fc = nn.Linear(self.input_dim, d, bias=False)
        self.layers = [FirstLayer(cfg)]
        self.norm = nn.RMSNorm(d, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(d, cfg.draft_vocab_size, bias=False)
        self.d2t = mx.zeros((cfg.draft_vocab_size,), mx.int32)
        if own_embedding:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, d)

    def __call__(self, emb, h, cache=None, mask=None):
        """emb [1, L, d]; h: the target's taps [1, L, 3·d_target] (through fc) or the head's
        own previous output [1, L, d]. Returns the pre-norm output h' [1, L, d]."""
        if h.shape[-1] == self.input_dim:
            h = self.fc(self.input_norm(h) if "input_norm" in self else h)
        return self.layers[0](emb, h, cache, mask)

    def logits(self, h: mx.array, width: int) -> mx.array:
        """Draft-vocabulary logits at the target's width: -inf off the draft vocabulary."""
        small = self.lm_head(self.norm(h))
        ids = mx.arange(small.shape[-1]) + self.d2t
        out = mx.full((*small.shape[:-1], width), -mx.inf, small.dtype)
        return mx.put_along_axis(out, mx.broadcast_to(ids, small.shape), small, axis=-1)


def load_eagle3(path: str | Path, target: TargetModel):
    """An MTP-style drafter around an EAGLE-3 head directory, fitted to `target`."""
    from .mtp import eagle3_drafter

    path = Path(path).expanduser()
    with one_line_errors("EAGLE-3 head", path):
        raw = json.loads((path / "config.json").read_text())
        cfg = Eagle3Config.from_dict(raw)
        weights = _sanitize(read_safetensors(path))
        layers = len(target.backbone.layers)
        cfg = Eagle3Config(**{**cfg.__dict__, "layer_ids": cfg.taps(layers)})
        check_fits(cfg, target)
        head = Eagle3Head(cfg, own_embedding="embed_tokens.weight" in weights)
        load_exactly(head, weights, f"EAGLE-3 head {path}")
    return eagle3_drafter(head, target)


def _sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    out = {}
    for k, v in weights.items():
        if k == "t2d" or k.startswith(("verifier_", "rotary_emb")) or "rotary_emb" in k:
            continue  # t2d is the inverse map (training only); verifier copies are not saved
        k = k.removeprefix("model.").replace("midlayer.", "layers.0.")  # the original naming
        out[k] = v.astype(mx.int32) if k == "d2t" else v
    return out


def check_fits(cfg: Eagle3Config, target: TargetModel) -> None:
    layers = len(target.backbone.layers)
    if cfg.target_hidden_size != target.hidden_size:
        raise ModelLoadError(
            f"this EAGLE-3 head reads a {cfg.target_hidden_size}-wide target; {target.name} is "
            f"{target.hidden_size} wide (pick the head trained for this model)")
    if cfg.vocab_size != target.vocab_size:
        raise TokenizerMismatchError(f"EAGLE-3 head vocabulary ({cfg.vocab_size}) differs from "
                                     f"the target's ({target.vocab_size})")
    if any(not 0 <= i <= layers for i in cfg.layer_ids or ()):
        raise ModelLoadError(f"EAGLE-3 head taps layers {list(cfg.layer_ids)}; {target.name} "
                             f"has {layers}")
    if not target.exposes_taps(tuple(cfg.layer_ids)):
        raise ModelLoadError(f"{target.args.model_type}: the layer inputs EAGLE-3 reads are not "
                             "reachable (a llama-style trunk is needed)")
