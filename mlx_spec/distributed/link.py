"""Rank 0's word to the other ranks: one small message before each target forward.

Every rank holds a part of the target and its own part of every conversation's cache, and a
forward is collective (a pipeline sends the hidden state from rank to rank; tensor parallelism
sums partial products), so all ranks must run the same forwards on the same tokens, in the same
order, and cut their caches back exactly as rank 0 does. Rank 0 decides everything else (the
draft, k, the sampled tokens, the verdict) and tells the others only what their caches must do:

    command = [cache ops queued since the last forward (new / trim / drop)] + [the forward]

The cache ops ride on the next forward's message (a trim changes nothing a rank needs before
it), so a speculation round of k drafts costs ONE command message plus the forward's own —
the same count for k = 0 as for k = 16: speculation divides the network cost by the tokens per
pass. The message is an int32 vector broadcast as an all_sum to which the other ranks add
zeros (mlx.distributed has no broadcast); tokens that do not fit it follow in a second one
(prefill chunks only)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import IntEnum

import mlx.core as mx

from ..errors import MlxSpecError, first_line

SIZE = 256  # int32 slots in a command
MAGIC = 0x5350EC
_FWD, _OPS, _INLINE = 2, 16, 80  # where the forward, the ops and the inline tokens start
MAX_OPS = (_INLINE - _OPS) // 4


class Op(IntEnum):
    NEW = 1  # (cid, slack, kv_bits): a fresh cache list
    TRIM = 2  # (cid, n, have): the commit path, cache.trim_to
    DROP = 3  # (cid): a conversation's caches are gone
    ROW = 4  # (cid, length): one row of a batched forward, in order
    QUIT = 5  # the session ends
    COMPARE = 6  # (cid, other): every rank says how far its two caches differ (a check)


NO_CACHE, ROWS = -1, -2  # a forward's cid: without a cache (a check), or over ROW ops


@dataclass(frozen=True)
class Forward:
    """One target forward, as every rank runs it: tokens [B, n] over conversation `cid`'s caches
    (or the ROW ops' rows), with hidden 0 (logits only), 1 (the final hidden) or 2 (the inputs of
    the layers in `taps`)."""

    tokens: mx.array
    cid: int
    hidden: int = 0
    taps: tuple[int, ...] = ()


@dataclass(frozen=True)
class Command:
    ops: tuple[tuple[int, ...], ...]
    forward: Forward | None


def encode(ops: list[tuple[int, ...]], fwd: Forward | None) -> tuple[mx.array, mx.array | None]:
    """(the command vector, the tokens that did not fit inline or None)."""
    head = [0] * SIZE
    head[0], head[1] = MAGIC, len(ops)
    for i, op in enumerate(ops):
        head[_OPS + 4 * i : _OPS + 4 * i + len(op)] = op
    extra = None
    if fwd is not None:
        B, n = fwd.tokens.shape
        head[_FWD : _FWD + 6] = [1, fwd.cid, B, n, fwd.hidden, len(fwd.taps)]
        head[_FWD + 6 : _FWD + 6 + len(fwd.taps)] = fwd.taps
        vec = mx.array(head, dtype=mx.int32)
        flat = fwd.tokens.reshape(-1).astype(mx.int32)
        if B * n <= SIZE - _INLINE:
            vec = mx.concatenate([vec[:_INLINE], flat, vec[_INLINE + B * n :]])
        else:
            extra = flat
        return vec, extra
    return mx.array(head, dtype=mx.int32), None


def decode(vec: list[int], receive_extra) -> Command:
    if vec[0] != MAGIC:
        raise RuntimeError("rank 0's command is garbled (a rank out of step)")
    ops = tuple(tuple(vec[_OPS + 4 * i : _OPS + 4 * i + 4]) for i in range(vec[1]))
    has, cid, B, n, hidden, ntaps = vec[_FWD : _FWD + 6]
    if not has:
        return Command(ops, None)
    taps = tuple(vec[_FWD + 6 : _FWD + 6 + ntaps])
    if B * n <= SIZE - _INLINE:
        tokens = mx.array(vec[_INLINE : _INLINE + B * n], dtype=mx.int32)
    else:
        tokens = receive_extra(B * n)
    return Command(ops, Forward(tokens.reshape(B, n), cid, hidden, taps))


TEXT = 512  # bytes of each rank's answer


def gather_text(group: mx.distributed.Group, text: str) -> list[str]:
    """Every rank's `text`, in rank order (one all_gather)."""
    raw = text.encode()[: TEXT - 1]
    vec = mx.array(list(raw) + [0] * (TEXT - len(raw)), dtype=mx.int32)
    rows = mx.distributed.all_gather(vec, group=group).reshape(group.size(), TEXT).tolist()
    return [bytes(b for b in row if b).decode(errors="replace") for row in rows]


class Link:
    """Rank 0's side. `queue` cache ops; `send` them with a forward (or alone). One lock: a
    forward and its command go as one, so threads (a calibration while idle) cannot interleave
    their messages."""

    def __init__(self, group: mx.distributed.Group, watch=None, bell=None):
        self.group, self.watch = group, watch  # watch: launch.Watch, which ends a hung step
        self.bell = bell  # bell.Bell: wakes the workers before each command (None: they spin)
        self.lock = threading.RLock()
        self._ops: list[tuple[int, ...]] = []
        self.broken = False  # a collective failed: the group cannot be trusted again
        self.messages = 0  # command messages sent (the bench counts them per pass)

    def queue(self, op: Op, *args: int) -> None:
        with self.lock:
            self._ops.append((int(op), *map(int, args)))

    @contextmanager
    def step(self, what: str) -> Iterator[None]:
        """One command and the forward after it, alone and watched."""
        with self.lock:
            if self.broken:
                raise MlxSpecError("the other ranks are gone; restart to split the target again")
            if self.watch is not None:
                self.watch.arm(what)
            try:
                yield
            except (RuntimeError, OSError) as e:  # the backend lost a peer ("[ring] connection
                # ... lost"), or the doorbell did
                self.broken = True
                if self.watch is not None:
                    self.watch.check()  # a rank that exited: its own line, and the end
                    if self.watch.closing:  # the watch is ending this process with its line
                        threading.Event().wait(10)
                raise MlxSpecError(f"lost the other ranks during {what}: {first_line(e)}"
                                   ) from None
            except BaseException:  # e.g. a second ctrl+c between a command and its forward:
                self.broken = True  # the ranks may be out of step, so nothing more is sent
                raise
            finally:
                if self.watch is not None:
                    self.watch.disarm()

    def send(self, fwd: Forward | None = None) -> None:
        """Broadcast the queued ops and `fwd`. The caller runs the forward itself right after,
        under the same lock, and evaluates it before the next send: a rank reads messages in
        the order they were evaluated here."""
        with self.lock:
            while len(self._ops) > MAX_OPS:  # a backlog: flush it ahead, ops only
                self._broadcast(*encode(self._ops[:MAX_OPS], None))
                del self._ops[:MAX_OPS]
            ops, self._ops = self._ops, []
            self._broadcast(*encode(ops, fwd))

    def _broadcast(self, vec: mx.array, extra: mx.array | None) -> None:
        if self.bell is not None:
            self.bell.ring()  # one byte each: the workers leave their kernel wait for it
        mx.eval(mx.distributed.all_sum(vec, group=self.group))
        self.messages += 1
        if extra is not None:
            mx.eval(mx.distributed.all_sum(extra, group=self.group))
            self.messages += 1


def receive(group: mx.distributed.Group, bell=None) -> Command:
    """A worker's side: wait for rank 0's next command (adding zeros to its all_sum); with
    `bell` (a socket from bell.answer) asleep until rank 0 rings, not in the backend."""
    if bell is not None:
        from .bell import wait

        wait(bell)
    vec = mx.distributed.all_sum(mx.zeros((SIZE,), mx.int32), group=group)

    def extra(n: int) -> mx.array:
        out = mx.distributed.all_sum(mx.zeros((n,), mx.int32), group=group)
        mx.eval(out)
        return out

    return decode(vec.tolist(), extra)
