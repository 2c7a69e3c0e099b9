"""The frozen target's side of training, computed once per row and kept on disk.

An EAGLE-3 head reads the target's taps and learns its next-token distribution; neither changes
while the head trains, yet computing them is a full forward of the target over every row of every
step: on a small target about half of a step (DESIGN.md, "Measurements"). Rows are visited several
times over a run, so each row's taps (f16), its p over the draft vocabulary (f16) and the target's
argmax are computed once into memory-mapped arrays in the run's directory, filled batch by batch (a
killed run goes on where it stopped) and read by row index at every step. A key of the rows, the
taps and the draft vocabulary guards the files: other rows or another head's vocabulary start them
afresh.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..model import TargetModel

FILL_BATCH = 8


class TeacherCache:
    """taps [N, T, 3·d], p [N, T, V'] (V': the draft vocabulary) and want [N, T] (the target's
    argmax) for each of `rows`, as eagle3.teacher computes them."""

    def __init__(self, root: Path, target: TargetModel, rows: np.ndarray,
                 taps: tuple[int, ...], ids: np.ndarray | None):
        self.root, self.target, self.rows = root, target, rows
        self.taps = taps
        self.ids = None if ids is None else mx.array(np.asarray(ids, np.int32))
        n, t = rows.shape
        width = len(taps) * target.hidden_size
        vocab = target.vocab_size if ids is None else len(ids)
        key = hashlib.sha256(rows.tobytes() + repr(taps).encode() +
                             (b"" if ids is None else np.asarray(ids, np.int32).tobytes()))
        self.key = key.hexdigest()
        root.mkdir(parents=True, exist_ok=True)
        meta = root / "key.json"
        fresh = not meta.exists() or json.loads(meta.read_text()).get("key") != self.key
        if fresh:
            for f in root.glob("*.npy"):
                f.unlink()
            meta.write_text(json.dumps({"key": self.key, "done": 0}))
        mode = "w+" if fresh else "r+"
        self.a = np.lib.format.open_memmap(root / "taps.npy", mode, np.float16, (n, t, width))
        self.p = np.lib.format.open_memmap(root / "p.npy", mode, np.float16, (n, t, vocab))
        self.want = np.lib.format.open_memmap(root / "want.npy", mode, np.int32, (n, t))

    @property
    def done(self) -> int:
        return int(json.loads((self.root / "key.json").read_text())["done"])

    def fill(self, *, seconds: float | None = None, log=print) -> bool:
        """Compute the rows not yet done (at least a batch, then at most `seconds` of it);
        True when all are."""
        from .eagle3 import teacher

        t0, n = time.perf_counter(), len(self.rows)
        i = start = self.done
        while i < n:
            if i > start and seconds is not None and time.perf_counter() - t0 > seconds:
                log(f"the target's states: {i}/{n} rows, the rest next time")
                return False
            j = min(n, i + FILL_BATCH)
            a, p, want = teacher(self.target, mx.array(self.rows[i:j]), self.taps, self.ids)
            if want is None:
                want = mx.argmax(p, axis=-1)
            mx.eval(a, p, want)
            self.a[i:j] = np.array(a.astype(mx.float16))
            self.p[i:j] = np.array(p.astype(mx.float16))
            self.want[i:j] = np.array(want)
            for m in (self.a, self.p, self.want):
                m.flush()
            i = j
            (self.root / "key.json").write_text(json.dumps({"key": self.key, "done": i}))
        log(f"the target's states of {n} rows computed once, kept in {self.root}")
        return True

    def get(self, index: np.ndarray) -> tuple[mx.array, mx.array, mx.array]:
        """(taps, p, want) of rows `index`, in f32 (only rows already filled)."""
        return (mx.array(self.a[index]).astype(mx.float32),
                mx.array(self.p[index]).astype(mx.float32), mx.array(self.want[index]))
