"""Gemma 4's assistant drafters (`gemma4_assistant`, google/gemma-4-*-it-assistant).

A few Gemma 4 text layers that own no K/V: every layer's queries attend over the target's cache
of the last target layer of its attention type (full or sliding), read in place. One draft step:

    x   = pre_projection(concat(Emb_target(token) · √d_target, h))     d_target → d_assistant
    y   = norm(layers(x))            queries at one fixed position p, keys = the target's cache
    h'  = post_projection(y)         back to the target's width: the next step's h
    logits = head(y)                 tied to the assistant's own embedding (no soft-cap)

Round by round (as transformers' candidate generator does): h starts as the target's final
(normed) hidden state at the position that predicted the pending token, p is the pending
token's position, and p stays fixed for every step of the round; the assistant keeps no cache,
so its only state is that one row of h.

The E2B / E4B assistants score only part of the vocabulary: `masked_embedding` picks the top
`centroid_intermediate_top_k` of `num_centroids` clusters of tokens (`token_ordering` lists the
tokens cluster by cluster), computes their logits exactly and sets every other token to
min(those logits) − 1. q is the softmax of exactly those logits, so rejection sampling stays
exact: tokens outside the clusters keep the small mass the reference gives them.

Sliding layers see the last `sliding_window + 1` committed keys, as the reference's
bidirectional window mask allows (|q − k| ≤ window, flipped to the past); full layers see all.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models import gemma4_text

from ..errors import ModelLoadError, TokenizerMismatchError
from ..layouts import gemma4_text as normalized_text
from ..model import TargetModel
from ..sampling import Sampler
from .base import Draft, DraftContext, Drafter, draft_chain
from .mtp import last_keys, target_kv
from .weights import load_exactly, one_line_errors, read_safetensors

MODEL_TYPE = "gemma4_assistant"


@dataclass(frozen=True)
class AssistantConfig:
    backbone_hidden_size: int
    text: dict  # the assistant's own gemma4_text config
    use_ordered_embeddings: bool = False
    num_centroids: int = 2048
    centroid_intermediate_top_k: int = 32
    num_assistant_tokens: int | None = None  # generation_config's draft length, when given
    quantization: dict | None = None

    @classmethod
    def from_dir(cls, path: Path) -> AssistantConfig:
        raw = json.loads((path / "config.json").read_text())
        text = dict(normalized_text(raw.get("text_config") or {}))
        # every layer reads the target's K/V (transformers sets this when the config omits it)
        text["num_kv_shared_layers"] = text.get("num_hidden_layers", 4)
        text.setdefault("hidden_size_per_layer_input", 0)
        text.setdefault("use_double_wide_mlp", False)
        gen = path / "generation_config.json"
        k = json.loads(gen.read_text()).get("num_assistant_tokens") if gen.exists() else None
        return cls(
            backbone_hidden_size=int(raw["backbone_hidden_size"]),
            text=text,
            use_ordered_embeddings=bool(raw.get("use_ordered_embeddings", False)),
            num_centroids=int(raw.get("num_centroids", 2048)),
            centroid_intermediate_top_k=int(raw.get("centroid_intermediate_top_k", 32)),
            num_assistant_tokens=int(k) if k else None,
            quantization=raw.get("quantization"),
        )

    @property
    def args(self) -> gemma4_text.ModelArgs:
        return gemma4_text.ModelArgs.from_dict(self.text)


def is_assistant(path: str | Path) -> bool:
    config = Path(path) / "config.json"
    try:
        return json.loads(config.read_text()).get("model_type") == MODEL_TYPE
    except (OSError, ValueError):
        return False


class MaskedEmbedder(nn.Module):
    """The clustered head: exact logits for the tokens of the best clusters, min − 1 elsewhere."""

    def __init__(self, hidden: int, vocab: int, num_centroids: int, top_k: int):
        super().__init__()
        self.top_k, self.vocab = top_k, vocab
        self.centroids = nn.Linear(hidden, num_centroids, bias=False)
        self.token_ordering = mx.arange(vocab, dtype=mx.int32)  # cluster c: row c of [C, V/C]

    def __call__(self, y: mx.array, embed: nn.Module) -> mx.array:
        """y [D] → logits [V]."""
        scores = self.centroids(y)
        clusters = mx.argpartition(-scores, kth=self.top_k - 1)[: self.top_k]
        per_cluster = self.token_ordering.reshape(scores.shape[-1], -1)
        ids = per_cluster[clusters].reshape(-1)  # the tokens of the chosen clusters
        chosen = embed(ids) @ y  # rows gathered (and dequantized) from the tied head
        out = mx.full((self.vocab,), chosen.min() - 1.0, chosen.dtype)
        return mx.put_along_axis(out, ids, chosen, axis=-1)


class AssistantBody(nn.Module):
    def __init__(self, args: gemma4_text.ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [gemma4_text.DecoderLayer(args, i) for i in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)


class Gemma4Assistant(nn.Module):
    """The published module tree (names as in the checkpoint)."""

    def __init__(self, cfg: AssistantConfig):
        super().__init__()
        args = cfg.args
        self.layer_types = list(args.layer_types)
        self.window = args.sliding_window
        self.model = AssistantBody(args)
        self.pre_projection = nn.Linear(2 * cfg.backbone_hidden_size, args.hidden_size, bias=False)
        self.post_projection = nn.Linear(args.hidden_size, cfg.backbone_hidden_size, bias=False)
        if cfg.use_ordered_embeddings:
            self.masked_embedding = MaskedEmbedder(args.hidden_size, args.vocab_size,
                                                   cfg.num_centroids,
                                                   cfg.centroid_intermediate_top_k)

    def __call__(self, emb: mx.array, h: mx.array, kv: dict[str, tuple], position: int):
        """emb, h [1, 1, d_target] → (logits [V], h' [1, 1, d_target]). kv: the target's
        (keys, values, quantized view or None) per attention type, already cut to what each
        type may see."""
        x = self.pre_projection(mx.concatenate([emb, h], axis=-1))
        for layer, kind in zip(self.model.layers, self.layer_types, strict=True):
            keys, values, view = kv[kind]
            x, _, _ = layer(x, None, view, shared_kv=(keys, values), offset=position)
        y = self.model.norm(x)
        if "masked_embedding" in self:
            logits = self.masked_embedding(y[0, 0], self.model.embed_tokens)
        else:
            logits = self.model.embed_tokens.as_linear(y)[0, 0]
        return logits, self.post_projection(y)


def kv_sources(target: TargetModel, n_caches: int) -> dict[str, int]:
    """For each attention type, the cache of the last target layer of that type that owns one."""
    types = list(getattr(target.args, "layer_types", None) or [])
    if not types:
        raise ModelLoadError(f"{target.name} is not a Gemma 4 model (no layer_types): "
                             "a Gemma 4 assistant drafts only for its Gemma 4 target")
    return {kind: i for i, kind in enumerate(types[:n_caches])}


class AssistantState:
    """One row of the target's hidden state: the one at `at`, which predicted the pending
    token."""

    def __init__(self) -> None:
        self.h: mx.array | None = None
        self.at = -1

    def has_hidden(self, position: int) -> bool:
        return self.h is not None and self.at == position

    def nbytes(self) -> int:
        return self.h.nbytes if self.h is not None else 0

    def arrays(self) -> list:
        return [self.h] if self.h is not None else []


class AssistantDrafter(Drafter):
    name = "draft-assistant"  # of kind "draft": what --draft-model DIR loads
    needs_hidden = True
    reads_target_kv = True  # its attention reads the target's last layers' KV

    def __init__(self, module: Gemma4Assistant, cfg: AssistantConfig, target: TargetModel):
        check_fits(cfg, target)
        self.module, self.cfg, self.target = module, cfg, target
        self.embed_scale = float(getattr(target.backbone, "embed_scale",
                                         target.hidden_size**0.5))
        self.draft_length = cfg.num_assistant_tokens

    def new_state(self) -> AssistantState:
        return AssistantState()

    def commit(self, state: AssistantState, ctx: DraftContext, valid: int) -> None:
        """Keep only the target's hidden row that predicted the pending token."""
        want = len(ctx.tokens) - 2
        if ctx.hidden is not None and ctx.hidden_start <= want < ctx.hidden_start + len(
                ctx.hidden):
            state.h, state.at = ctx.hidden[want - ctx.hidden_start][None, None], want
        elif state.at != want:
            state.h, state.at = None, -1

    def _kv(self, cache: list[Any]) -> dict[str, tuple]:
        out = {}
        for kind, i in kv_sources(self.target, len(cache)).items():
            k, v, view = target_kv(cache[i])
            if kind == "sliding_attention":
                keep = self.module.window + 1
                k, v = last_keys(k, keep), last_keys(v, keep)
            out[kind] = (k, v, view)
        return out

    def draft(self, state: AssistantState, ctx: DraftContext, k: int, sampler: Sampler
              ) -> Draft:
        n = len(ctx.tokens)
        if not state.has_hidden(n - 2):
            return Draft()
        kv, position = self._kv(ctx.target_cache), n - 1
        h = state.h

        def step(token):
            nonlocal h
            emb = self.target.embed(mx.array(token).reshape(1, 1)) * self.embed_scale
            logits, h = self.module(emb, h, kv, position)
            return logits

        return draft_chain(step, ctx.tokens[-1:], ctx, k, sampler)

    def nbytes(self) -> int:
        return sum(v.nbytes for _, v in tree_flatten(self.module.parameters()))


def check_fits(cfg: AssistantConfig, target: TargetModel) -> None:
    """One clear line when this assistant cannot draft for this target."""
    args = target.args
    if "gemma4" not in str(getattr(args, "model_type", "")):
        raise ModelLoadError(f"a Gemma 4 assistant drafts only for Gemma 4 targets; "
                             f"{target.name} is {getattr(args, 'model_type', '?')}")
    if cfg.backbone_hidden_size != target.hidden_size:
        raise ModelLoadError(
            f"this assistant was trained for a {cfg.backbone_hidden_size}-wide Gemma 4; "
            f"{target.name} is {target.hidden_size} wide (pick the assistant of the same size)")
    mine = cfg.args
    if mine.vocab_size != target.vocab_size:
        raise TokenizerMismatchError(f"assistant vocabulary ({mine.vocab_size}) differs from "
                                     f"the target's ({target.vocab_size})")
    for kind, dim in (("sliding_attention", mine.head_dim),
                      ("full_attention", mine.global_head_dim or mine.head_dim)):
        theirs = [layer.self_attn.head_dim for layer in target.text.layers
                  if layer.layer_type == kind]
        if kind in mine.layer_types and theirs and theirs[-1] != dim:
            raise ModelLoadError(f"assistant {kind} heads are {dim} wide, the target's "
                                 f"{theirs[-1]}: not this target's assistant")


def load_assistant(path: str | Path, target: TargetModel) -> AssistantDrafter:
    """An assistant drafter from a local directory (HF names; MLX conversions keep them)."""
    path = Path(path).expanduser()
    with one_line_errors("Gemma 4 assistant", path):
        cfg = AssistantConfig.from_dir(path)
        module = Gemma4Assistant(cfg)
        weights = read_safetensors(path)
        weights.pop("lm_head.weight", None)  # tied to model.embed_tokens
        if "masked_embedding.token_ordering" in weights:
            weights["masked_embedding.token_ordering"] = (
                weights["masked_embedding.token_ordering"].astype(mx.int32))
        if cfg.quantization:
            q = cfg.quantization
            nn.quantize(module, group_size=q["group_size"], bits=q["bits"],
                        class_predicate=lambda p, m: f"{p}.scales" in weights)
        load_exactly(module, weights, f"Gemma 4 assistant {path}")
    return AssistantDrafter(module, cfg, target)
