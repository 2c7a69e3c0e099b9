"""Multi-token-prediction heads that read the target's own state.

Two kinds behind one drafter class:

* shared-kv (the product's drafter, as Gemma 4's assistant drafters do): a few small layers whose
  attention owns no K/V. Queries attend straight over the target's cache of one layer (no copy,
  unified memory). Input per step: concat(embed(last token) · scale, h) → pre-projection →
  layers → post-projection → h'. h' is fed back as the next step's h, and the target's own
  (shared) LM head turns h' into logits. The drafter keeps no cache at all.
* deepseek (DeepSeek-V3 / Qwen3.5 style MTP module): h' = Block(Linear(concat(RMSNorm(emb),
  RMSNorm(h)))), a full transformer block with its own one-layer KV cache, again on the shared head.
  Trained by us (a llama block), or published with the model (kind "nextn", nextn.py: the block is
  the target family's own decoder layer, loaded from the checkpoint or a sidecar directory).

Both need the target's final hidden state h_t at every committed position t: the verify pass
already computed it (hidden[i] predicted token i+1), so drafting costs no extra target pass. The
head predicts token t+2 from h_t and token t+1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models import llama
from mlx_lm.models.base import create_causal_mask, scaled_dot_product_attention

from .. import cache as kv
from ..errors import ModelLoadError, TokenizerMismatchError
from ..model import TargetModel
from ..sampling import Sampler
from .base import Draft, DraftContext, Drafter, draft_chain, draft_rows_chain
from .hidden import HiddenHistory
from .nextn import NextNHead


@dataclass(frozen=True)
class MTPConfig:
    kind: str  # "shared-kv" | "deepseek" (ours) | "nextn" (published with the model) | "eagle3"
    target_hidden_size: int
    vocab_size: int
    hidden_size: int  # the head's own width (shared-kv); = target_hidden_size for deepseek
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 1  # deepseek only (shared-kv uses the target's K/V heads)
    head_dim: int = 64  # shared-kv: must equal the target's head_dim
    intermediate_size: int = 512
    kv_layer: int = -1  # shared-kv: which target layer's K/V the queries read
    embed_scale: float = 1.0  # e.g. sqrt(d) for Gemma, whose embeddings are scaled in the model
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0  # deepseek only
    zero_first_embedding: bool = False  # nextn: DeepSeek / MiMo zero the embedding at position 0

    @classmethod
    def for_target(cls, target: TargetModel, kind: str = "shared-kv", **kw) -> MTPConfig:
        """A head shaped to fit `target` (its hidden size, vocabulary, attention geometry)."""
        args = target.args
        attn = target.model.layers[-1].self_attn
        head_dim = getattr(attn, "head_dim", None) or args.hidden_size // args.num_attention_heads
        defaults = dict(
            kind=kind,
            target_hidden_size=args.hidden_size,
            vocab_size=target.vocab_size,
            hidden_size=args.hidden_size,
            head_dim=head_dim,
            num_heads=args.num_attention_heads,
            num_kv_heads=args.num_key_value_heads,
            intermediate_size=args.intermediate_size,
            rms_norm_eps=args.rms_norm_eps,
            rope_theta=float(getattr(args, "rope_theta", 10000.0) or 10000.0),
            embed_scale=args.hidden_size**0.5 if "gemma" in args.model_type else 1.0,
        )
        defaults.update(kw)
        return cls(**defaults)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class SharedKVLayer(nn.Module):
    """Pre-norm block whose attention has queries only; K/V come from the target."""

    def __init__(self, cfg: MTPConfig):
        super().__init__()
        d, h, hd = cfg.hidden_size, cfg.num_heads, cfg.head_dim
        self.num_heads, self.head_dim = h, hd
        self.input_layernorm = nn.RMSNorm(d, eps=cfg.rms_norm_eps)
        self.q_proj = nn.Linear(d, h * hd, bias=False)
        self.q_norm = nn.RMSNorm(hd, eps=cfg.rms_norm_eps)
        self.o_proj = nn.Linear(h * hd, d, bias=False)
        self.post_attention_layernorm = nn.RMSNorm(d, eps=cfg.rms_norm_eps)
        self.mlp = SwiGLU(d, cfg.intermediate_size)

    def __call__(self, x, keys, values, rope, offset, mask, view=None):
        B, L, _ = x.shape
        q = self.q_proj(self.input_layernorm(x)).reshape(B, L, self.num_heads, self.head_dim)
        q = rope(self.q_norm(q).transpose(0, 2, 1, 3), offset=offset)
        # the target's keys carry RoPE at their absolute positions, so q·k sees relative offsets
        o = scaled_dot_product_attention(q, keys, values, cache=view,
                                         scale=self.head_dim**-0.5, mask=mask)
        x = x + self.o_proj(o.transpose(0, 2, 1, 3).reshape(B, L, -1))
        return x + self.mlp(self.post_attention_layernorm(x))


class SharedKVHead(nn.Module):
    def __init__(self, cfg: MTPConfig):
        super().__init__()
        self.pre_projection = nn.Linear(2 * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.layers = [SharedKVLayer(cfg) for _ in range(cfg.num_layers)]
        self.post_projection = nn.Linear(cfg.hidden_size, cfg.target_hidden_size, bias=False)
        self.norm = nn.RMSNorm(cfg.target_hidden_size, eps=cfg.rms_norm_eps)

    def __call__(self, emb, h, keys, values, rope, offset, mask=None, view=None):
        x = self.pre_projection(mx.concatenate([emb, h], axis=-1))
        for layer in self.layers:
            x = layer(x, keys, values, rope, offset, mask, view)
        return self.norm(self.post_projection(x))  # target-space h': head input and next h


def deepseek_head(cfg: MTPConfig) -> NextNHead:
    """Our own DeepSeek-style head: the published module with a small llama block."""
    args = llama.ModelArgs(
        model_type="llama", hidden_size=cfg.target_hidden_size, num_hidden_layers=1,
        intermediate_size=cfg.intermediate_size, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        rms_norm_eps=cfg.rms_norm_eps, vocab_size=cfg.vocab_size, rope_theta=cfg.rope_theta,
    )
    return NextNHead(cfg.target_hidden_size, cfg.rms_norm_eps, llama.TransformerBlock(args))


def make_head(cfg: MTPConfig) -> nn.Module:
    return SharedKVHead(cfg) if cfg.kind == "shared-kv" else deepseek_head(cfg)


@dataclass(frozen=True)
class QuantizedView:
    """A quantized target cache as a KV-sharing head sees it: passed as the attention's cache,
    it makes mlx-lm's attention run on the quantized K/V themselves (quantized SDPA), so no
    round dequantizes a whole layer; nothing is ever written through it."""

    group_size: int
    bits: int

    def update_and_fetch(self, keys, values):
        return keys, values


def target_kv(cache: Any) -> tuple[Any, Any, QuantizedView | None]:
    """A layer's stored K/V, read in place: plain arrays, or for a quantized cache its
    (packed, scales, biases) triples and the view that attends over them."""
    k, v = cache.keys_and_values() if hasattr(cache, "keys_and_values") else cache.state[:2]
    if isinstance(k, tuple | list):
        return tuple(k), tuple(v), QuantizedView(cache.group_size, cache.bits)
    return k, v, None


def last_keys(kv: Any, n: int) -> Any:
    """The newest n entries of stored K or V (plain, or a quantized triple)."""
    if isinstance(kv, tuple):
        return tuple(a[..., -n:, :] for a in kv)
    return kv[..., -n:, :]


class MTPState:
    """What a head keeps about one conversation: the target's hidden rows it may still read,
    and an own-cache head's one-layer cache (`cached` entries, the first `trusted` tokens'
    built from the target's own hidden states)."""

    def __init__(self, dim: int, own_cache: bool, layers: int = 1):
        self.hist = HiddenHistory(dim)
        self.cache = [kv.KVCache() for _ in range(layers)] if own_cache else []
        self.cached = 0
        self.trusted = 0

    def has_hidden(self, position: int) -> bool:
        return self.hist.holds(position)

    def nbytes(self) -> int:
        return self.hist.nbytes + kv.nbytes(self.cache)

    def arrays(self) -> list:
        return [c.state for c in self.cache] + ([self.hist.buf] if self.hist.buf is not None
                                                else [])


class MTPDrafter(Drafter):
    name = "mtp"
    needs_hidden = True

    def __init__(self, head: nn.Module, cfg: MTPConfig, target: TargetModel):
        if cfg.vocab_size != target.vocab_size:
            raise TokenizerMismatchError(
                f"MTP head vocabulary ({cfg.vocab_size}) differs from the target's "
                f"({target.vocab_size})"
            )
        if cfg.target_hidden_size != target.hidden_size:
            raise ModelLoadError(
                f"MTP head expects hidden size {cfg.target_hidden_size}, the target has "
                f"{target.hidden_size}"
            )
        if cfg.kind != "eagle3" and not target.exposes_hidden():  # eagle3 checks its taps
            raise ModelLoadError(f"{target.model.model_type}: final hidden state not reachable")
        self.head, self.cfg, self.target = head, cfg, target
        self._compiled = None  # the shared-KV head's compiled step (see compiled)
        if cfg.kind == "eagle3":  # it reads the inputs of a few target layers, not the output
            self.needs_hidden = tuple(head.cfg.layer_ids)
            self.name = "draft-eagle3"
        if cfg.kind == "shared-kv":
            layer = target.model.layers[cfg.kv_layer].self_attn
            self.rope = layer.rope  # the target's own RoPE, so positions match its keys exactly
            self.reads_target_kv = True
            self.name = "mtp"
        elif cfg.kind != "eagle3":
            self.name = "mtp-deepseek" if cfg.kind == "deepseek" else "mtp"
        # own-cache heads: entry e pairs token e + first with h_{e + first - 1}. Ours start at
        # token 0 (paired with zeros); published heads at token 1 (entry i = (x_{i+1}, h_i)).
        self.first = 1 if cfg.kind in ("nextn", "eagle3") else 0

    def new_state(self) -> MTPState:
        return MTPState(getattr(self.head, "input_dim", self.cfg.target_hidden_size),
                        own_cache=self.cfg.kind != "shared-kv",
                        layers=self.head.cfg.num_layers if self.cfg.kind == "eagle3" else 1)

    def commit(self, state: MTPState, ctx: DraftContext, valid: int) -> None:
        state.hist.set(ctx.hidden_start, ctx.hidden, len(ctx.tokens) - 1)
        if state.cache:
            # entries from draft steps 2.. were built on the head's own h', never the target's:
            # they go even when their tokens were accepted (recompute would use the target's h)
            keep = max(0, min(self.first + state.cached, state.trusted, valid) - self.first)
            kv.trim_to(state.cache, keep, have=state.cached)
            state.cached = keep
            state.trusted = keep + self.first
        # the next row this head reads: the newest (shared-kv), or its next entry's
        state.hist.forget_before(state.cached + self.first - 1 if state.cache
                                 else len(ctx.tokens) - 2)

    def _embed(self, tokens: list[int] | mx.array, position: int = -1) -> mx.array:
        """Embeddings [1, n, ·] of a row of n tokens; [B, n, ·] of tokens given as [B, n]."""
        x = tokens if isinstance(tokens, mx.array) else mx.array(tokens)
        embed = self.head.embed_tokens if "embed_tokens" in self.head else self.target.embed
        e = embed(x if x.ndim == 2 else x.reshape(1, -1)) * self.cfg.embed_scale
        if position == 0 and self.cfg.zero_first_embedding:
            e = mx.concatenate([mx.zeros_like(e[:, :1]), e[:, 1:]], axis=1)
        return e

    def draft(self, state: MTPState, ctx: DraftContext, k: int, sampler: Sampler) -> Draft:
        n = len(ctx.tokens)
        first_row = n - 2 if not state.cache else state.cached + self.first - 1
        if n < 2 or state.hist.n != n - 1 or not state.hist.has(first_row):
            return Draft()
        if self.cfg.kind == "shared-kv":
            layer = ctx.target_cache[self.cfg.kv_layer]
            if type(layer) is kv.KVCache:  # its whole buffer, the entries past its offset masked
                mask = (mx.arange(layer.keys.shape[2]) < layer.offset)[None, None, None]

                def step(tokens, h, pos):
                    return self.compiled()(self._embed(tokens), h, layer.keys, layer.values,
                                           mask, mx.array(pos))
            else:
                keys, values, view = target_kv(layer)

                def step(tokens, h, pos):
                    return self.head(self._embed(tokens), h, keys, values, self.rope, pos,
                                     view=view)

            first = (ctx.tokens[-1:], state.hist.rows(n - 2, n - 1)[None], n - 1)
            fed = 1
        else:
            start = state.cached + self.first  # catch up on every committed token not yet seen

            def step(tokens, h, pos):
                n_in = tokens.size if isinstance(tokens, mx.array) else len(tokens)
                emb = self._embed(tokens, state.cached)
                state.cached += n_in
                if self.cfg.kind == "eagle3":  # its layers build their masks (a window)
                    return self.head(emb, h, state.cache, true_entries=state.trusted - self.first)
                # an explicit mask: some blocks (DeepSeek's MLA) take no "causal" shorthand
                mask = create_causal_mask(n_in, state.cached - n_in) if n_in > 1 else None
                return self.head(emb, h, state.cache[0], mask)

            first = (ctx.tokens[start:], state.hist.rows(start - 1, n - 1)[None], start)
            fed = n - start
            state.trusted = n
        h, pos = None, n - 1

        def next_logits(x):
            # the first call reads the committed context; later ones feed back h' and a draft
            nonlocal h, pos
            if h is None:
                out = step(*first)
            else:
                pos += 1
                out = step(x, h, pos)
            h = out[:, -1:]
            return self._logits(h)[0, -1]

        return draft_chain(next_logits, None, ctx, k, sampler, fed=fed)

    def draft_rows(self, states: list[MTPState], ctxs: list[DraftContext], ks: list[int],
                   samplers: list[Sampler]) -> list[Draft] | None:
        """Several conversations' drafts, each head step run once over all their rows (the
        server's batch). A shared-kv head keeps nothing of its own, so a row is its last token,
        its newest hidden row and its target layer's K/V: the rows' K/V side by side,
        right-padded to the longest with zero keys the mask hides, and RoPE at each row's own
        position; the same step as `draft` for each row, up to the batched kernels' rounding.
        None (each drafts alone) for heads with caches of their own, a windowed or quantized
        K/V layer, or a row whose hidden row is not held."""
        if self.cfg.kind != "shared-kv":
            return None
        layers = [ctx.target_cache[self.cfg.kv_layer] for ctx in ctxs]
        if any(type(c) is not kv.KVCache for c in layers):
            return None
        for state, ctx in zip(states, ctxs, strict=True):
            n = len(ctx.tokens)
            if n < 2 or state.hist.n != n - 1 or not state.hist.has(n - 2):
                return None
        stored = [target_kv(c)[:2] for c in layers]  # each [1, kv heads, length, head dim]
        lengths = [k.shape[2] for k, _ in stored]
        # to a whole 256-entry step: the compiled step traces again per step, not per round
        width = -(-max(lengths) // kv.KVCache.step) * kv.KVCache.step

        def pad(x: mx.array) -> mx.array:
            return mx.pad(x, [(0, 0), (0, 0), (0, width - x.shape[2]), (0, 0)])

        keys = mx.concatenate([pad(k) for k, _ in stored])
        values = mx.concatenate([pad(v) for _, v in stored])
        mask = (mx.arange(width)[None] < mx.array(lengths)[:, None])[:, None, None, :]
        h = mx.concatenate([s.hist.rows(len(c.tokens) - 2, len(c.tokens) - 1)[None]
                            for s, c in zip(states, ctxs, strict=True)])
        pos = mx.array([len(c.tokens) - 1 for c in ctxs])
        first = mx.array([c.tokens[-1] for c in ctxs])

        def step(x: mx.array | None, live: list[bool]) -> mx.array:
            nonlocal h, pos  # (no cache of its own: done rows ride along, unread)
            if x is None:
                x = first
            else:
                pos = pos + 1
            emb = self._embed(x.reshape(-1, 1))
            h = self.compiled()(emb, h, keys, values, mask, pos)[:, -1:]
            return self._logits(h)[:, -1]

        return draft_rows_chain(step, ctxs, ks, samplers)

    def compiled(self):
        """The shared-KV head's step as one compiled graph (mx.compile): ~45 small ops fused
        and traced once (on a CPU it halved a step). Its weights are inputs, read at every
        call (a head still training is never stale); keys and values come whole, a cache's
        256-entry buffer with the entries past its offset masked, so it traces again once per
        256 entries, not every round."""
        if self._compiled is None:
            head, rope = self.head, self.rope

            def step(emb, h, keys, values, mask, pos):
                return head(emb, h, keys, values, rope, pos, mask=mask)

            self._compiled = mx.compile(step, inputs=head.state)
        return self._compiled

    def _logits(self, h: mx.array) -> mx.array:
        """The shared target head, or a head's own (EAGLE-3: its draft vocabulary)."""
        if self.cfg.kind == "eagle3":
            return self.head.logits(h, self.target.vocab_size)
        return self.target.head(h)

    def nbytes(self) -> int:
        return sum(v.nbytes for _, v in tree_flatten(self.head.parameters()))


def nextn_drafter(head: NextNHead, target: TargetModel, *,
                  zero_first_embedding: bool = False) -> MTPDrafter:
    """A drafter around a published-layout head (nextn.py) on `target`."""
    cfg = MTPConfig(kind="nextn", target_hidden_size=target.hidden_size,
                    vocab_size=target.vocab_size, hidden_size=target.hidden_size,
                    rms_norm_eps=target.args.rms_norm_eps,
                    zero_first_embedding=zero_first_embedding)
    return MTPDrafter(head, cfg, target)


def eagle3_drafter(head: nn.Module, target: TargetModel) -> MTPDrafter:
    """A drafter around an EAGLE-3 head (eagle3.py): an own-cache head on the target's taps."""
    cfg = MTPConfig(kind="eagle3", target_hidden_size=target.hidden_size,
                    vocab_size=target.vocab_size, hidden_size=head.cfg.hidden_size,
                    rms_norm_eps=head.cfg.rms_norm_eps)
    drafter = MTPDrafter(head, cfg, target)
    drafter.draft_length = head.cfg.speculative_tokens  # the length it was trained to draft
    return drafter
