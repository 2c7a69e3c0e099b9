"""A worker rank (every host but the first): load its part of the target, then do what rank 0
says — each forward on the same tokens, each cache cut to the same length — until it says
quit. It prints nothing, decides nothing, and holds no drafter.

    python -m mlx_spec.distributed.worker '{"model": DIR, "mode": "pipeline", "hosts": [...]}'

(started by launch.py with the backend's environment: MLX_RANK, MLX_HOSTFILE or JACCL's)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import mlx.core as mx

from ..cache import difference
from ..model import TargetModel
from .link import NO_CACHE, ROWS, Command, Op, gather_text, receive


def follow(target: TargetModel, group: mx.distributed.Group, bell=None) -> None:
    """Rank 0's commands, one by one, until QUIT (bell: wait for each asleep, bell.py)."""
    caches: dict[int, list[Any]] = {}
    while True:
        cmd = receive(group, bell)
        rows: list[tuple[int, int]] = []
        for op, a, b, c in cmd.ops:
            if op == Op.NEW:
                caches[a] = target.make_cache(slack=b, kv_bits=c or None)
            elif op == Op.TRIM:
                mx.eval(target.trim(caches[a], b, have=c))
            elif op == Op.DROP:
                caches.pop(a, None)
            elif op == Op.ROW:
                rows.append((a, b))
            elif op == Op.QUIT:
                return
            elif op == Op.COMPARE:
                gather_text(group, repr(difference(caches[a], caches[b])))
        if cmd.forward is not None:
            run_forward(target, cmd, caches, rows)


def run_forward(target: TargetModel, cmd: Command, caches: dict[int, list[Any]],
                rows: list[tuple[int, int]]) -> None:
    """The forward rank 0 runs, on this rank's part: the same code path (hidden or taps), so
    the same messages in the same order."""
    f = cmd.forward
    assert f is not None
    if f.cid == NO_CACHE:
        cache = None
    elif f.cid == ROWS:  # a batched verify: the rows' caches, layer by layer
        from ..rows import rows_of

        lengths = [n for _, n in rows]
        cache = [rows_of([caches[cid][i] for cid, _ in rows], lengths)
                 for i in range(len(caches[rows[0][0]]))]
        # a pipeline rank that sends ties its send into its last cache (mlx-lm's
        # `cache[-1].keys = mx.depends(...)`); a batch view keeps no keys of its own, so it
        # gets a placeholder to tie to (the send is in the outputs evaluated below anyway)
        cache[-1].keys = mx.array(0)
    else:
        cache = caches[f.cid]
    hidden = f.taps if f.hidden == 2 else bool(f.hidden)
    out = target.forward_rows(f.tokens, cache, hidden=hidden)
    mx.eval([a for a in out if a is not None])


def _exit_with_parent() -> None:
    """End this rank when rank 0 goes: the launcher holds our stdin, so EOF means it is gone
    (killed, crashed, or its ssh session closed)."""
    def watch() -> None:
        try:
            while sys.stdin.buffer.read(1 << 16):
                pass
        except (OSError, ValueError):
            pass
        time.sleep(2)  # a QUIT on its way ends the main thread first, cleanly
        os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    from ..errors import MlxSpecError
    from ..loading import load_target
    from .ranks import agree, load_part

    args = json.loads((argv or sys.argv[1:])[0])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a ctrl+c is rank 0's to handle: it says quit
    _exit_with_parent()
    bell = None
    if args.get("bell"):  # before joining: rank 0 accepts it once every rank has its part
        from .bell import answer

        try:
            bell = answer(args["bell"], int(os.environ.get("MLX_RANK", "0")))
        except OSError as e:
            print(f"rank {os.environ.get('MLX_RANK')}: cannot reach rank 0 at {args['bell']}"
                  f" ({e})", file=sys.stderr, flush=True)
            return 1
    group = mx.distributed.init(backend=args.get("backend", "ring"), strict=True)
    try:
        model = Path(args["model"])
        agree(group, args["hosts"], model)
        target = load_part(group, args["hosts"], lambda: load_target(model, lazy=True)[0],
                           args["mode"])
    except MlxSpecError:  # every rank reached the same verdict; rank 0 says it
        return 1
    try:
        follow(target, group, bell)
    except EOFError:  # rank 0 closed the doorbell: it is gone
        os._exit(3)
    except Exception as e:  # noqa: BLE001 - one line for rank 0's watch, then gone
        from ..errors import user_message

        print(f"rank {group.rank()}: {user_message(e, 'failed')}", file=sys.stderr, flush=True)
        os._exit(1)  # (not sys.exit: the stdin watcher would block interpreter shutdown)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
