"""The target split over several ranks: each holds only its part (mlx-lm's own sharding), and
rank 0 sees it as one `TargetModel` whose every forward and cache operation happens on every
rank in step (link.py says how).

Pipeline (mlx-lm's `PipelineMixin`, qwen3_5 / qwen3_next / deepseek_v3 / qwen2 ...): rank r runs
a contiguous block of layers, rank 0 the *last* ones; a forward receives the hidden state from
the rank before, sends it on, and all-gathers the output, so every rank (rank 0 included) has
the final hidden state — the head, and any drafter reading h, live on rank 0. Tensor parallel
(`model.shard`, llama / qwen3 ...): every rank runs every layer on its slice of the heads and
of the MLP, with an all_sum after attention and after the MLP."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from ..cache import difference
from ..errors import UnsupportedModelError
from ..model import TargetModel
from .link import NO_CACHE, ROWS, Forward, Link, Op, gather_text

MODES = ("pipeline", "tensor")


@dataclass(frozen=True)
class Split:
    """How the target is split: over `ranks` ranks, by `mode`; `backend` the transport;
    `hosts` the machines (the hostfile's, in rank order: two clusters of the same shape have
    other links, so other measured costs)."""

    ranks: int
    mode: str
    backend: str = "ring"
    hosts: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.mode} over {self.ranks} ranks ({self.backend})"


def split_modes(target: TargetModel) -> tuple[str, ...]:
    """The ways mlx-lm can split this model, pipeline first where the family has it."""
    modes = []
    if hasattr(target.backbone, "pipeline"):
        modes.append("pipeline")
    if hasattr(target.model, "shard"):
        modes.append("tensor")
    return tuple(modes)


def choose_mode(target: TargetModel, forced: str | None) -> str:
    modes = split_modes(target)
    if forced is not None and forced not in modes:
        raise UnsupportedModelError(
            f"{target.name} ({target.args.model_type}) cannot be split by {forced} in mlx-lm"
            + (f"; it can by {' or '.join(modes)}" if modes else ""))
    if not modes:
        raise UnsupportedModelError(
            f"{target.name} ({target.args.model_type}): mlx-lm has no pipeline or tensor "
            "parallel split for this family, so it cannot run over several machines")
    return forced or modes[0]


def check_heads_divide(target: TargetModel, ranks: int) -> None:
    """A tensor split gives each rank a share of every layer's heads: mlx-lm's shard does not
    check that they divide (the first forward fails deep inside a norm), so say it here."""
    heads = getattr(target.args, "num_attention_heads", None)
    kv = getattr(target.args, "num_key_value_heads", None) or heads
    if heads and (heads % ranks or kv % ranks):
        other = "--pipeline or " if "pipeline" in split_modes(target) else ""
        raise UnsupportedModelError(
            f"{target.name}: {heads} attention heads / {kv} KV heads do not divide over "
            f"{ranks} ranks, which a tensor split needs; use {other}a rank count that "
            "divides both")


def split_target(target: TargetModel, group: mx.distributed.Group, mode: str) -> None:
    """Keep only this rank's part of a lazily loaded target, then read its weights."""
    if mode == "pipeline":
        target.backbone.pipeline(group)
    else:
        check_heads_divide(target, group.size())
        target.model.shard(group)
    mx.eval(target.model.parameters())


class SplitCache(list):
    """Rank 0's part of one conversation's caches, with the id every rank knows them by."""

    cid: int = NO_CACHE


class ShardedTarget(TargetModel):
    """Rank 0's view of a split target: its own part, and a `Link` that has every other rank
    do each forward and cache operation with it. Cache lists are `SplitCache`s."""

    link: Link
    split: Split

    @classmethod
    def over(cls, target: TargetModel, link: Link, split: Split) -> ShardedTarget:
        self = cls(**{f: getattr(target, f) for f in target.__dataclass_fields__})
        self.link, self.split, self._next, self._rows = link, split, 0, {}
        self.rollback_everywhere = getattr(target, "rollback_everywhere", True)
        return self

    def check_rollback(self, cache: list[Any]) -> None:
        super().check_rollback(cache)
        if not self.rollback_everywhere:
            raise UnsupportedModelError("another rank holds recurrent layers whose updates "
                                        "cannot be rolled back; use --drafter none")

    @property
    def ranks(self) -> int:
        return self.split.ranks

    @property
    def split_label(self) -> str:
        return self.split.label

    @property
    def split_hosts(self) -> tuple[str, ...]:
        return self.split.hosts

    def make_cache(self, *, slack: int = 16, kv_bits: int | None = None) -> list[Any]:
        cache = SplitCache(super().make_cache(slack=slack, kv_bits=kv_bits))
        cache.cid, self._next = self._next, self._next + 1
        self.link.queue(Op.NEW, cache.cid, slack, kv_bits or 0)
        for c in cache:  # a batched forward names its rows by their layer caches
            self._rows[id(c)] = cache.cid
        weakref.finalize(cache, self._forget, cache.cid, [id(c) for c in cache])
        return cache

    def _forget(self, cid: int, ids: list[int]) -> None:
        for i in ids:
            self._rows.pop(i, None)
        self.link.queue(Op.DROP, cid)

    def trim(self, cache: list[Any], n: int, *, have: int) -> list[Any]:
        self.link.queue(Op.TRIM, self._cid(cache), n, have)
        return super().trim(cache, n, have=have)

    def forward_rows(self, x: mx.array, cache: list[Any] | None, *,
                     hidden: bool | tuple[int, ...] = False):
        taps = hidden if isinstance(hidden, tuple) else ()
        if taps and self.split.mode == "pipeline":
            raise UnsupportedModelError("a drafter reading several target layers (EAGLE-3, "
                                        "DFlash) cannot run on a pipeline split: its layers "
                                        "are on other machines; use --tensor or another drafter")
        code = 2 if taps else 1 if hidden else 0
        with self.link.step("a target forward"):
            self.link.send(Forward(x, self._cid(cache), code, taps))
            out = super().forward_rows(x, cache, hidden=hidden)
            mx.eval([a for a in out if a is not None])  # its messages go now, in order
        return out

    def differences(self, cache: list[Any], other: list[Any]) -> list[float]:
        """Each rank's largest difference between its parts of two cache lists (cache.difference),
        in rank order: how a test sees that every rank's caches equal a recompute."""
        with self.link.step("comparing caches"):
            self.link.queue(Op.COMPARE, self._cid(cache), self._cid(other))
            self.link.send()
            return [float(d) for d in gather_text(self.link.group,
                                                  repr(difference(cache, other)))]

    def _cid(self, cache: list[Any] | None) -> int:
        if cache is None:
            return NO_CACHE
        if isinstance(cache, SplitCache):
            return cache.cid
        # a batched forward (engine/batch.py): layer i of every row; name the rows in order
        for row, length in zip(cache[0].caches, cache[0].lengths, strict=True):
            self.link.queue(Op.ROW, self._rows[id(row)], length)
        return ROWS
