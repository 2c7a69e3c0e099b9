"""DFlash block drafters (z-lab's `DFlashDraftModel`, e.g. z-lab/Qwen3.5-4B-DFlash, and
speculators' `dflash` format): a small model that proposes a whole block of tokens in ONE
forward pass, conditioned on several of the target's hidden layers.

Per committed position p the drafter keeps, in every layer, keys and values of one context
feature, c_p = hidden_norm(fc(concat(h_l(p) for the tapped layers l))), the outputs of target
layers `target_layer_ids` (z-lab; speculators' ids name the same tensors one on, as layer
inputs). K/V come straight from c_p (k_norm(k_proj(c)), v_proj(c); no input norm, RoPE at p):
the features do not run through the layers, so a position's entries depend on that position
alone and never need rolling back, only appending as positions are committed.

A round with k drafts feeds the block [b, m, m, …, m] (the pending token b at position P, then k
mask tokens) through the layers: each block query attends to the context entries before P (in a
sliding layer, the last W of them) and to the block itself (bidirectionally in full-attention
layers; causally in sliding ones unless the config says otherwise, as speculators trains them).
Output slot i (1..k), through the final norm and the target's own head, is q_i, the draft
distribution of the token at P + i. q_i does not depend on the drafts d_1..d_{i-1}: it is a
proposal fixed by the committed prefix, so the rejection rule (coupling.py) stays exact.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.cache import KVCache
from mlx_lm.models.rope_utils import initialize_rope

from ..errors import ModelLoadError, TokenizerMismatchError
from ..model import TargetModel
from ..sampling import Sampler
from .base import Draft, DraftContext, Drafter
from .eagle3 import MLP
from .weights import load_exactly, one_line_errors, read_safetensors

FULL, SLIDING = "full_attention", "sliding_attention"


@dataclass(frozen=True)
class DFlashConfig:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    block_size: int
    mask_token_id: int
    taps: tuple[int, ...]  # target layers whose *inputs* are read (z-lab's ids + 1)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    causal: tuple[bool, ...] = ()  # per layer: causal inside the block?
    attention_bias: bool = False

    @classmethod
    def from_dict(cls, raw: dict) -> DFlashConfig:
        speculators = raw.get("speculators_model_type") == "dflash"
        layer = raw.get("transformer_layer_config") or raw
        extra = raw.get("dflash_config") or {}
        refuse_unknown(raw, layer)
        n = int(layer["num_hidden_layers"])
        types = tuple(layer.get("layer_types") or [FULL] * n)
        window = layer.get("sliding_window") if SLIDING in types else None
        if speculators:  # ids of HF hidden_states (layer inputs); sliding layers causal
            ids = [int(i) for i in raw["aux_hidden_state_layer_ids"]]
            non_causal = bool(raw.get("sliding_window_non_causal", False))
            causal = tuple(t == SLIDING and not non_causal for t in types)
        else:  # z-lab: layer outputs; `is_causal` for every layer where given
            ids = [int(i) + 1 for i in extra.get("target_layer_ids") or
                   raw["target_layer_ids"]]
            flag = raw.get("is_causal")
            causal = tuple(t == SLIDING if flag is None else bool(flag) for t in types)
        heads = int(layer["num_attention_heads"])
        rope = layer.get("rope_parameters") or {}
        return cls(
            hidden_size=int(layer["hidden_size"]), num_layers=n, num_heads=heads,
            num_kv_heads=int(layer.get("num_key_value_heads") or heads),
            head_dim=int(layer.get("head_dim") or int(layer["hidden_size"]) // heads),
            intermediate_size=int(layer["intermediate_size"]),
            vocab_size=int(layer["vocab_size"]),
            block_size=int(raw.get("block_size") or extra.get("block_size") or 16),
            mask_token_id=int(raw.get("mask_token_id", extra.get("mask_token_id", -1))),
            taps=tuple(ids), rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
            rope_theta=float(layer.get("rope_theta") or rope.get("rope_theta") or 10000.0),
            rope_scaling=layer.get("rope_scaling") or (rope if rope.get("rope_type") not in
                                                       (None, "default") else None),
            layer_types=types, sliding_window=int(window) if window else None, causal=causal,
            attention_bias=bool(layer.get("attention_bias", False)),
        )

    def window(self, layer: int) -> int | None:
        sliding = layer < len(self.layer_types) and self.layer_types[layer] == SLIDING
        return self.sliding_window if sliding else None

    def causal_in_block(self, layer: int) -> bool:
        return layer < len(self.causal) and self.causal[layer]


def refuse_unknown(raw: dict, layer: dict) -> None:
    """What this drafter cannot run is refused by name."""
    arch = " ".join(raw.get("architectures") or [])
    if "DFlash2" in arch or raw.get("speculators_model_type") == "dflash2":
        raise ModelLoadError("DFlash2 drafters (grouped dynamic convolutions, a candidate "
                             "selector) are not supported yet; DFlash ones are")
    extra = raw.get("dflash_config") or {}
    if extra.get("projector_type") == "dspark" or extra.get("markov_rank"):
        raise ModelLoadError("DSpark drafters are not supported")
    if (act := layer.get("hidden_act", "silu")) != "silu":
        raise ModelLoadError(f"DFlash layers with hidden_act {act!r} are not supported")
    if raw.get("draft_vocab_size") not in (None, layer.get("vocab_size")):
        raise ModelLoadError("DFlash drafters with a reduced draft vocabulary are not "
                             "supported")
    if raw.get("sample_from_anchor"):
        raise ModelLoadError("DFlash drafters that sample from the anchor (sample_from_anchor) "
                             "are not supported")
    if "mask_token_id" not in raw and "mask_token_id" not in extra:
        raise ModelLoadError("this DFlash config names no mask_token_id")


def is_dflash(path: str | Path) -> bool:
    try:
        raw = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    arch = " ".join(raw.get("architectures") or [])
    return ("DFlash" in arch or str(raw.get("speculators_model_type", "")).startswith("dflash"))


class Attention(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        d, h, kvh, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.h, self.kvh, self.hd = h, kvh, hd
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(d, h * hd, bias=bias)
        self.k_proj = nn.Linear(d, kvh * hd, bias=bias)
        self.v_proj = nn.Linear(d, kvh * hd, bias=bias)
        self.o_proj = nn.Linear(h * hd, d, bias=bias)
        self.q_norm = nn.RMSNorm(hd, eps=cfg.rms_norm_eps)
        self.k_norm = nn.RMSNorm(hd, eps=cfg.rms_norm_eps)
        self.rope = initialize_rope(hd, cfg.rope_theta, False, cfg.rope_scaling)

    def keys_values(self, x: mx.array, offset: int) -> tuple[mx.array, mx.array]:
        """k_norm(k_proj(x)) with RoPE from `offset`, and v_proj(x): [1, kvh, L, hd]."""
        B, L, _ = x.shape
        k = self.k_norm(self.k_proj(x).reshape(B, L, self.kvh, self.hd)).transpose(0, 2, 1, 3)
        v = self.v_proj(x).reshape(B, L, self.kvh, self.hd).transpose(0, 2, 1, 3)
        return self.rope(k, offset=offset), v

    def __call__(self, x: mx.array, context: KVCache, position: int, mask: mx.array):
        """The block x [1, B, d] at positions position.. over the context's entries."""
        B, L, _ = x.shape
        q = self.q_norm(self.q_proj(x).reshape(B, L, self.h, self.hd)).transpose(0, 2, 1, 3)
        q = self.rope(q, offset=position)
        k, v = self.keys_values(x, position)
        if context.offset:
            ck, cv = stored(context)
            k, v = mx.concatenate([ck, k], axis=2), mx.concatenate([cv, v], axis=2)
        o = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.hd**-0.5, mask=mask)
        return self.o_proj(o.transpose(0, 2, 1, 3).reshape(B, L, -1))


def stored(cache: KVCache) -> tuple[mx.array, mx.array]:
    """The cache's entries [1, kvh, offset, hd] (its buffers run ahead of it)."""
    n = cache.offset
    return cache.keys[..., :n, :], cache.values[..., :n, :]


class Layer(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = nn.RMSNorm(d, eps=eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = nn.RMSNorm(d, eps=eps)
        self.mlp = MLP(d, cfg.intermediate_size)

    def __call__(self, h, context, position, mask):
        h = h + self.self_attn(self.input_layernorm(h), context, position, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashHead(nn.Module):
    """The checkpoint's module tree: fc, hidden_norm, layers, norm (embeddings and the head
    are the target's unless the checkpoint has its own)."""

    def __init__(self, cfg: DFlashConfig, target_hidden: int, *, own: tuple[str, ...] = ()):
        """own: "embed_tokens" / "lm_head" where the checkpoint carries its own (speculators
        saves copies; z-lab's checkpoints read the target's)."""
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(len(cfg.taps) * target_hidden, cfg.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.layers = [Layer(cfg) for _ in range(cfg.num_layers)]
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        if "embed_tokens" in own:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        if "lm_head" in own:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def extend(self, context: list[KVCache], taps: mx.array) -> None:
        """Append positions' entries: taps [m, n·D] of the next m committed positions."""
        c = self.hidden_norm(self.fc(taps[None]))
        for layer, cache in zip(self.layers, context, strict=True):
            cache.update_and_fetch(*layer.self_attn.keys_values(c, cache.offset))

    def block(self, x: mx.array, context: list[KVCache]) -> mx.array:
        """The block's embeddings x [1, B, d], its first token at position P = the context's
        length: the final-normed outputs [1, B, d]."""
        P, B = context[0].offset, x.shape[1]
        for i, (layer, cache) in enumerate(zip(self.layers, context, strict=True)):
            x = layer(x, cache, P, self.mask(i, P, B))
        return self.norm(x)

    def mask(self, layer: int, P: int, B: int) -> mx.array:
        """[B, P + B]: the context before P (its last W in a sliding layer), then the block
        (bidirectional, or causal)."""
        window = self.cfg.window(layer)
        ctx = mx.arange(P)[None] >= P - window if window else mx.ones((1, P), mx.bool_)
        own = (mx.arange(B)[None] <= mx.arange(B)[:, None] if self.cfg.causal_in_block(layer)
               else mx.ones((B, B), mx.bool_))
        return mx.concatenate([mx.broadcast_to(ctx, (B, P)), own], axis=1)


class DFlashState:
    """One conversation: every layer's context entries for committed positions [0, cached)."""

    def __init__(self, layers: int):
        self.context = [KVCache() for _ in range(layers)]

    @property
    def cached(self) -> int:
        return self.context[0].offset

    def has_hidden(self, position: int) -> bool:
        return position < self.cached

    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.context)

    def arrays(self) -> list[Any]:
        return [stored(c) for c in self.context if c.offset]


class DFlashDrafter(Drafter):
    """A DFlash block drafter on `target` (see the module doc)."""

    name = "draft-dflash"  # (a --draft-model kind)

    def __init__(self, head: DFlashHead, target: TargetModel):
        self.head, self.target, self.cfg = head, target, head.cfg
        self.needs_hidden = head.cfg.taps
        self.max_draft = head.cfg.block_size - 1  # a block is the pending token and the drafts

    def new_state(self) -> DFlashState:
        return DFlashState(self.cfg.num_layers)

    def commit(self, state: DFlashState, ctx: DraftContext, valid: int) -> None:
        """Entries for every committed position that has the target's taps: those of positions
        before `valid` stay (their tokens are unchanged: an entry reads its position's prefix
        alone), later ones go, and the rows handed in fill in from there."""
        end = len(ctx.tokens) - 1  # the pending token has no taps yet
        keep = min(state.cached, valid, end)
        if ctx.hidden is not None:
            keep = min(keep, ctx.hidden_start + ctx.hidden.shape[0])
        drop = state.cached - keep
        for c in state.context:
            c.trim(drop)
        if ctx.hidden is None or ctx.hidden_start > keep:
            return  # (a gap: the next prefill hands the rows in again, see has_hidden)
        rows = ctx.hidden[keep - ctx.hidden_start : end - ctx.hidden_start]
        if rows.shape[0]:
            self.head.extend(state.context, rows)

    def draft(self, state: DFlashState, ctx: DraftContext, k: int, sampler: Sampler) -> Draft:
        P = len(ctx.tokens) - 1
        k = min(k, self.max_draft)
        if k <= 0 or state.cached != P:
            return Draft()
        block = mx.array([ctx.tokens[-1]] + [self.cfg.mask_token_id] * k)[None]
        embed = self.head.embed_tokens if "embed_tokens" in self.head else self.target.embed
        out = self.head.block(embed(block), state.context)
        head = self.head.lm_head if "lm_head" in self.head else self.target.head
        logits = head(out)[0, 1:]  # slot i: the token at P + i
        seen = (mx.array(ctx.tokens[-sampler.cfg.repetition_context :], dtype=mx.int32)
                if sampler.uses_history else [])
        tokens, probs = [], []
        for i in range(k):  # each from its own q_i (a penalty reads the drafts before it)
            token, q = sampler.draft_token(logits[i], seen, position=len(ctx.tokens) + i)
            if sampler.uses_history:
                seen = mx.concatenate([seen, token.reshape(1).astype(mx.int32)])
            tokens.append(token)
            if q is not None:
                probs.append(q)
        return Draft(mx.stack(tokens).astype(mx.int32), mx.stack(probs) if probs else None)

    def nbytes(self) -> int:
        return sum(v.nbytes for _, v in tree_flatten(self.head.parameters()))


def load_dflash(path: str | Path, target: TargetModel) -> DFlashDrafter:
    path = Path(path).expanduser()
    with one_line_errors("DFlash drafter", path):
        cfg = DFlashConfig.from_dict(json.loads((path / "config.json").read_text()))
        check_fits(cfg, target)
        weights = {k.removeprefix("model."): v for k, v in read_safetensors(path).items()
                   if not k.startswith(("rotary_emb", "verifier_", "d2t", "t2d"))}
        own = tuple(m for m in ("embed_tokens", "lm_head") if f"{m}.weight" in weights)
        head = DFlashHead(cfg, target.hidden_size, own=own)
        load_exactly(head, weights, f"DFlash drafter {path}")
    return DFlashDrafter(head, target)


def check_fits(cfg: DFlashConfig, target: TargetModel) -> None:
    layers = len(target.backbone.layers)
    if cfg.vocab_size != target.vocab_size:
        raise TokenizerMismatchError(f"DFlash drafter vocabulary ({cfg.vocab_size}) differs "
                                     f"from the target's ({target.vocab_size})")
    if cfg.hidden_size != target.hidden_size:
        raise ModelLoadError(f"this DFlash drafter is {cfg.hidden_size} wide; {target.name} is "
                             f"{target.hidden_size} (pick the drafter trained for this model)")
    if any(not 0 < i <= layers for i in cfg.taps):
        raise ModelLoadError(f"this DFlash drafter reads target layers "
                             f"{[i - 1 for i in cfg.taps]}; {target.name} has {layers}")
    if not target.exposes_taps(cfg.taps):
        raise ModelLoadError(f"{target.args.model_type}: the target layers DFlash reads are "
                             "not reachable (a llama-style trunk is needed)")
