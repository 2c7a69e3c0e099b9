"""The target model, as the engine sees it: one forward that also returns the final hidden state."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from . import cache as kv


@dataclass
class TargetModel:
    """An mlx-lm model plus what the engine needs to know about it."""

    model: nn.Module
    context_length: int
    name: str = "target"
    path: Path | None = None  # the local checkpoint directory, when loaded from one
    config: dict = field(default_factory=dict)  # its config.json
    tokenizer: Any = None  # the mlx-lm tokenizer loaded with it (drafters compare vocabularies)
    cast: str | None = None  # computed in this dtype, not as saved (load_target(dtype=...))

    @property
    def ranks(self) -> int:
        """Machines the target is split over (distributed/target.py: more than 1)."""
        return 1

    @property
    def split_label(self) -> str:
        return ""

    @property
    def split_hosts(self) -> tuple[str, ...]:
        """The machines a split target runs on, in rank order (none for one machine)."""
        return ()

    @property
    def text(self) -> nn.Module:
        """The language model: the model itself, or its `language_model` (Qwen3.5, Gemma 3/4
        checkpoints carry a text model inside a multimodal wrapper)."""
        return getattr(self.model, "language_model", self.model)

    @property
    def args(self) -> Any:
        return self.text.args

    @property
    def backbone(self) -> nn.Module:
        return self.text.model

    @property
    def vocab_size(self) -> int:
        try:
            return self.backbone.embed_tokens.weight.shape[0]  # padded rows included
        except AttributeError:  # e.g. mamba: no `model.embed_tokens`
            return int(self.args.vocab_size)

    @property
    def hidden_size(self) -> int:
        return self.args.hidden_size

    def embed(self, tokens: mx.array) -> mx.array:
        return self.backbone.embed_tokens(tokens)

    def head(self, hidden: mx.array) -> mx.array:
        """The target's LM head over final hidden states (shared by MTP drafters), with the
        model's own final soft-cap (Gemma 2 / 4: logits = cap · tanh(logits / cap))."""
        if "lm_head" in self.text:
            logits = self.text.lm_head(hidden)
            group = getattr(self.text, "sharding_group", None)
            if group is not None:  # a tensor-parallel head holds a slice of the vocabulary
                from mlx_lm.models.base import gather_last_axis

                logits = gather_last_axis(logits, group)
        else:
            logits = self.backbone.embed_tokens.as_linear(hidden)
        cap = getattr(self.text, "final_logit_softcapping", None)
        return mx.tanh(logits / cap) * cap if cap else logits

    def forward(self, tokens: list[int] | mx.array, cache: list[Any], *,
                hidden: bool | tuple[int, ...] = False):
        """Logits [n, V] for n new tokens, appended to cache; with hidden=True also the final
        hidden states [n, D]; with hidden=(i, j, ...) instead the inputs of layers i, j, ...
        side by side, [n, D·len] (EAGLE-3's taps), from the same single pass.
        tokens may be a (lazy) mx.array, so drafters can chain steps without a host sync."""
        x = (tokens if isinstance(tokens, mx.array) else mx.array(tokens)).reshape(1, -1)
        logits, h = self.forward_rows(x, cache, hidden=hidden)
        return logits[0], (h[0] if h is not None else None)

    def forward_rows(self, x: mx.array, cache: list[Any], *,
                     hidden: bool | tuple[int, ...] = False):
        """`forward` over a batch of rows x [B, n]: logits [B, n, V] (and hidden [B, n, ·])."""
        if not hidden:
            return self.model(x, cache=cache), None
        if isinstance(hidden, tuple):
            h, taps = self._run_tapped(x, cache, hidden)
            return self.head(h), mx.concatenate(taps, axis=-1)
        h = self.backbone(x, cache=cache)
        return self.head(h), h

    def _run_tapped(self, x: mx.array, cache: list[Any] | None, taps: tuple[int, ...]):
        """The backbone's own loop (embed, layers, norm: llama-style, or a hybrid's with its
        attention and recurrent masks), keeping the input of each tapped layer (index
        len(layers): the last layer's output, before the norm)."""
        bb = self.backbone
        h = bb.embed_tokens(x)
        cache = cache or [None] * len(bb.layers)
        masks = self._masks(h, cache)
        seen: dict[int, mx.array] = {}
        for i, (layer, c, mask) in enumerate(zip(bb.layers, cache, masks, strict=True)):
            seen[i] = h
            h = layer(h, mask, cache=c)
        seen[len(bb.layers)] = h
        return bb.norm(h), [seen[i] for i in taps]

    def _masks(self, h: mx.array, cache: list[Any]) -> list[Any]:
        """Each layer's mask, as the backbone's own forward builds them: one causal mask, or
        (Qwen3.5 / Qwen3-Next hybrids) the full-attention one and the recurrent layers'."""
        from mlx_lm.models.base import create_attention_mask, create_ssm_mask

        bb = self.backbone
        if not all(hasattr(layer, "is_linear") for layer in bb.layers):
            return [create_attention_mask(h, cache[0])] * len(bb.layers)
        fa, ssm = getattr(bb, "fa_idx", None), getattr(bb, "ssm_idx", None)
        fa_mask = create_attention_mask(h, cache[fa]) if fa is not None else None
        ssm_mask = create_ssm_mask(h, cache[ssm]) if ssm is not None else None
        return [ssm_mask if layer.is_linear else fa_mask for layer in bb.layers]

    def exposes_taps(self, taps: tuple[int, ...]) -> bool:
        """True if the tapped loop reproduces the model's own logits (its layers are plain)."""
        return self._same_logits(taps)

    def exposes_hidden(self) -> bool:
        """True if backbone + head reproduces the model's own logits (so MTP heads can use h)."""
        return self._same_logits(True)

    def _same_logits(self, hidden: bool | tuple[int, ...]) -> bool:
        """Do the model's own logits equal those of the path that also returns `hidden`? (Both
        through forward_rows, so a split target checks on every rank alike.)"""
        try:
            x = mx.array([[1, 2]])
            a, _ = self.forward_rows(x, None)
            b, _ = self.forward_rows(x, None, hidden=hidden)
            return bool(mx.allclose(a, b, atol=1e-4, rtol=1e-4).item())
        except Exception:
            return False

    # -- its caches: every cache operation on the target goes through these four, so a target
    # split over machines (distributed/target.py) can do the same on every rank --------------

    def make_cache(self, *, slack: int = 16, kv_bits: int | None = None) -> list[Any]:
        """A fresh rollback-able cache list for this target (cache.make_cache)."""
        caches = kv.make_cache(self.model, slack=slack, kv_bits=kv_bits)
        rank = getattr(getattr(self.text, "model", None), "pipeline_rank", 0)
        if rank and caches and not hasattr(caches[-1], "keys"):
            # a pipeline rank that sends ties the send into its last cache: mlx-lm does
            # `cache[-1].keys = mx.depends(...)`, else `cache[-1][0] = ...`, an unrecorded
            # write that would end a recurrent cache's rollback. A placeholder to tie it to
            # instead (the send is in the outputs every forward evaluates anyway).
            caches[-1].keys = mx.array(0)
        return caches

    def trim(self, cache: list[Any], n: int, *, have: int) -> list[Any]:
        """The one commit path (cache.trim_to): cut `cache` from `have` tokens back to n."""
        return kv.trim_to(cache, n, have=have)

    def can_trim(self, cache: list[Any], n: int, *, have: int) -> bool:
        return kv.can_trim_to(cache, n, have=have)

    def check_rollback(self, cache: list[Any]) -> None:
        """Raise if speculation on this target would be unsafe (a cache that cannot roll back)."""
        kv.check_rollback(cache)

    def nbytes(self) -> int:
        from mlx.utils import tree_flatten

        return sum(v.nbytes for _, v in tree_flatten(self.model.parameters()))
