"""The bench's side of a two-rank session (distributed_ranks.py) and of its relay (relay.py):
their processes, their per-rank ring hostfiles, and one JSON line each way per request.

Direct: both ranks' files list the real ports (rank r listens on ports[r]). Relayed: rank r's
file gives its own real port and, for the other rank, the relay's port that forwards to the
other's real one — so every byte between them crosses the relay, delayed."""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from .relay import HOST


class SessionError(RuntimeError):
    """A rank said an error, exited, or did not answer in time."""


def ring_files(tmp: Path, ports: list[int], relay: list[int] | None) -> list[Path]:
    """Each rank's MLX_HOSTFILE: [["127.0.0.1:port"], ...], the other's entry through `relay`
    (relay[r]: the relay port forwarding to ports[r]) where given."""
    files = []
    for rank in range(len(ports)):
        entries = [[f"{HOST}:{ports[r] if relay is None or r == rank else relay[r]}"]
                   for r in range(len(ports))]
        path = tmp / f"ring-{'relayed' if relay else 'direct'}-{rank}.json"
        path.write_text(json.dumps(entries))
        files.append(path)
    return files


class Lines:
    """A child's stdout, one JSON line at a time, read by a thread (so a wait can time out)."""

    def __init__(self, proc: subprocess.Popen, name: str):
        self.proc, self.name, self.q = proc, name, queue.SimpleQueue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.q.put(json.loads(line))
        self.q.put(None)

    def get(self, timeout: float) -> dict[str, Any]:
        try:
            item = self.q.get(timeout=timeout)
        except queue.Empty:
            raise SessionError(f"{self.name} gave no answer within {timeout:.0f} s") from None
        if item is None:
            raise SessionError(f"{self.name} exited (code {self.proc.wait()})")
        if "error" in item:
            raise SessionError(f"{self.name}: {item['error']}")
        return item

    def send(self, obj: dict[str, Any]) -> None:
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()


def spawn(stack: ExitStack, cmd: list[str], env: dict[str, str], log: Path, name: str) -> Lines:
    """A child with piped stdin / stdout (stderr to `log`), killed when `stack` unwinds."""
    err = stack.enter_context(open(log, "w"))  # noqa: SIM115 - the child writes it
    proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1)

    def end() -> None:
        try:
            proc.stdin.close()
            proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()

    stack.callback(end)
    return Lines(proc, name)


class Session:
    """Rank 0 (leader) and rank 1 (follower) of one split target, or (files None) the leader
    alone with the whole target (`single`); `ask` one request."""

    def __init__(self, stack: ExitStack, job: dict[str, Any], files: list[Path] | None,
                 tmp: Path, env: dict[str, str], timeout: float, pin: bool = True):
        """pin: rank r on CPU r alone (taskset), as if each had a machine of its own."""
        self.timeout = timeout
        module = [sys.executable, "-c", "import sys; from benchmarks.distributed_ranks "
                  "import main; sys.exit(main())"]
        self.pinned = pin and shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2
        roles = ((0, "single"),) if files is None else ((1, "follower"), (0, "leader"))
        self.ranks = []
        for rank, role in roles:
            renv = dict(env) if files is None else {**env, "MLX_RANK": str(rank),
                                                    "MLX_HOSTFILE": str(files[rank])}
            cmd = [*module, role, json.dumps(job)]
            if self.pinned:
                cmd = ["taskset", "-c", str(rank), *cmd]
            self.ranks.append(spawn(stack, cmd, renv, tmp / f"{role}.log", f"rank {rank}"))
        self.leader = self.ranks[-1]
        self.follower = self.ranks[0] if files is not None else None
        self.info = self.leader.get(timeout)
        if self.follower is not None:
            self.follower.get(timeout)

    def ask(self, req: dict[str, Any], phase: dict[str, Any] | None = None) -> dict[str, Any]:
        """Rank 0's answer to `req`; rank 1 runs `phase` beside it (None or no rank 1: no
        phase)."""
        phase = phase if self.follower is not None else None
        if phase is not None:
            self.follower.send(phase)
        self.leader.send(req)
        out = self.leader.get(self.timeout)
        if phase is not None:
            self.follower.get(self.timeout)
        return out

    def close(self) -> None:
        if self.follower is not None:
            self.follower.send({"phase": "end"})
        self.leader.send({"op": "quit"})


class RelayProcess:
    """relay.py in a process of its own: routes listen -> target, one delay for all."""

    def __init__(self, stack: ExitStack, routes: list[tuple[int, int]], tmp: Path):
        cmd = [sys.executable, "-c", "import sys; from benchmarks.relay import main; "
               "sys.exit(main())", json.dumps({"routes": routes})]
        self.lines = spawn(stack, cmd, {}, tmp / "relay.log", "the relay")
        self.scheduling = self.lines.get(60).get("scheduling", "default")

    def set_delay(self, seconds: float) -> None:
        self.lines.send({"delay": seconds})
        self.lines.get(30)

    def stats(self) -> dict[str, Any]:
        self.lines.send({"stats": True})
        return self.lines.get(30)

