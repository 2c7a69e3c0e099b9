"""Rank 0: start a worker on every other host of the hostfile (ssh, or a local process for
127.0.0.1), join the group, load this rank's part, and watch the others.

One command on the first Mac (`mlx-spec chat|generate|serve … --hostfile hosts.json`): this
process is rank 0 and keeps the terminal; the workers' output goes to
MLX_SPEC_HOME/logs/rank-N.log (local) or is kept by ssh's pipe, and only rank 0 speaks. A rank
that exits, or a forward that gets no answer within MLX_SPEC_RANK_TIMEOUT seconds (default
120), ends rank 0 with one line and a non-zero exit code: every process is gone, nothing
hangs. At exit rank 0 tells the workers to quit."""

from __future__ import annotations

import atexit
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

import mlx.core as mx

from ..errors import MlxSpecError
from ..model import TargetModel
from ..paths import data_dir
from .bell import Bell
from .hosts import DEFAULT_PORT, Hostfile, read_hostfile
from .link import Link, Op
from .ranks import agree, load_part
from .target import ShardedTarget, Split, choose_mode

LOAD_TIMEOUT = 3600.0  # a rank loading its part of a 400B model from a slow disk
JOIN_TIMEOUT = 120.0  # every rank started and in the group (MLX_SPEC_RANK_TIMEOUT is per step)


class Watch:
    """A thread that ends rank 0 when a worker exits or a step overruns its deadline."""

    def __init__(self, hostfile: Hostfile, procs: list[subprocess.Popen], logs: list[deque]):
        self.hostfile, self.procs, self.logs = hostfile, procs, logs
        self.deadline: float | None = None
        self.what = ""
        self.closing = False
        self.timeout = float(os.environ.get("MLX_SPEC_RANK_TIMEOUT", "120"))
        threading.Thread(target=self._run, daemon=True, name="mlx-spec-ranks").start()

    def arm(self, what: str, seconds: float | None = None) -> None:
        self.what, self.deadline = what, time.monotonic() + (seconds or self.timeout)

    def disarm(self) -> None:
        self.deadline = None

    def _run(self) -> None:
        while not self.closing:
            self.check()
            time.sleep(0.2)

    def check(self) -> None:
        """End rank 0 (fail) if a worker has exited or the armed step overran."""
        for rank, p in enumerate(self.procs, 1):
            code = p.poll()
            if code is not None and not self.closing:
                time.sleep(0.2)  # its last words, through the log tail
                last = self.logs[rank - 1][-1] if self.logs[rank - 1] else ""
                self.fail(f"rank {rank} ({self.hostfile.hosts[rank].ssh}) exited "
                          f"(code {code})" + (f": {last}" if last else ""))
        deadline = self.deadline
        if deadline is not None and time.monotonic() > deadline and not self.closing:
            self.fail(f"no answer from the other ranks within {self.timeout:.0f} s "
                      f"({self.what}); set MLX_SPEC_RANK_TIMEOUT to wait longer")

    def fail(self, line: str) -> None:
        """One line, every process gone, exit code 1 (the main thread may be blocked in a
        collective that will never complete, so this cannot be an exception there)."""
        self.closing = True
        stop(self.procs, wait=1.0)
        time.sleep(0.3)  # MLX's own backend prints its lost sockets: our line comes after
        sys.stderr.write(f"mlx-spec: {line}\n")
        sys.stderr.flush()
        os._exit(1)


def stop(procs: list[subprocess.Popen], wait: float = 5.0) -> None:
    for p in procs:
        if p.poll() is None and p.stdin is not None:
            try:
                p.stdin.close()  # the worker's watcher: rank 0 is gone
            except OSError:
                pass
    end = time.monotonic() + wait
    for p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()  # (a stopped process too)
            p.wait()


def start_workers(hostfile: Hostfile, args: dict, port: int, *,
                  module: str = "mlx_spec.distributed.worker") -> tuple[list, list]:
    """A `module` process on every host but the first, with its rank's backend environment
    (args: its one JSON argument); their last output lines are kept, for the one line."""
    procs, logs = [], []
    for rank, host in enumerate(hostfile.hosts[1:], 1):
        env, files = hostfile.rank_env(rank, port=port)
        cmd = [sys.executable, "-m", module, json.dumps(args)]
        log: deque = deque(maxlen=20)
        if host.local:
            for var, content in files.items():
                env[var] = _temp_file(content)
            out = _log_file(rank)
            p = subprocess.Popen(cmd, env={**os.environ, **env}, stdin=subprocess.PIPE,
                                 stdout=out, stderr=subprocess.STDOUT, cwd=os.getcwd(),
                                 start_new_session=True)  # a ctrl+c reaches rank 0 only
            threading.Thread(target=_tail, args=(out.name, log, p), daemon=True).start()
        else:
            p = subprocess.Popen(["ssh", "-o", "BatchMode=yes", host.ssh,
                                  _remote_script(cmd, env, files)],
                                 stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE)
            threading.Thread(target=_keep, args=(p.stderr, log), daemon=True).start()
        procs.append(p)
        logs.append(log)
    return procs, logs


def _remote_script(cmd: list[str], env: dict[str, str], files: dict[str, str]) -> str:
    """What ssh runs on the host: its environment, the backend's files, then the worker (as
    mlx.launch does it). Same path to the project and the interpreter on every Mac."""
    parts = [f"cd {shlex.quote(os.getcwd())} 2>/dev/null"]
    parts += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    for var, content in files.items():
        parts += ["f=$(mktemp)", f"echo {shlex.quote(content)} > $f", f"export {var}=$f"]
    parts.append("exec " + shlex.join(cmd))
    return "; ".join(parts)


def _temp_file(content: str) -> str:
    """A backend file for a rank on this machine, removed when this process exits."""
    fd, path = tempfile.mkstemp(prefix="mlx-spec-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        f.write(content)
    atexit.register(_remove, path)
    return path


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _log_file(rank: int):
    d = data_dir() / "logs"
    d.mkdir(parents=True, exist_ok=True)
    return open(d / f"rank-{rank}.log", "w")  # noqa: SIM115 - the worker writes it


def _tail(path: str, log: deque, p: subprocess.Popen) -> None:
    """Keep a local worker's last lines (for the one line if it dies)."""
    with open(path, errors="replace") as f:
        while True:
            line = f.readline()
            if line.strip():
                log.append(line.strip())
            elif p.poll() is not None:
                return
            else:
                time.sleep(0.1)


def _keep(stream, log: deque) -> None:
    for line in iter(stream.readline, b""):
        if line.strip():
            log.append(line.decode(errors="replace").strip())


def load_split(whole: TargetModel, *, hostfile: str | Path, mode: str | None = None
               ) -> ShardedTarget:
    """Rank 0's split of `whole` (a lazily loaded target: loading.load_target(lazy=True)):
    workers started, versions and model files agreed, every rank holding its part. Raises
    ModelLoadError / HostfileError in one line."""
    hf = read_hostfile(hostfile)
    mode = choose_mode(whole, mode)
    path = Path(whole.path)
    hosts = [h.ssh for h in hf.hosts]
    port = int(os.environ.get("MLX_SPEC_PORT", DEFAULT_PORT))
    bell = Bell(hf.hosts[0].ips[0] if hf.hosts[0].ips else "127.0.0.1")
    args = {"model": str(path), "mode": mode, "hosts": hosts, "backend": hf.backend,
            "bell": bell.address}
    procs, logs = start_workers(hf, args, port)
    watch = Watch(hf, procs, logs)
    atexit.register(stop, procs)
    env, files = hf.rank_env(0, port=port)
    os.environ.update(env)
    for var, content in files.items():
        os.environ[var] = _temp_file(content)
    watch.arm("joining the group", JOIN_TIMEOUT)
    group = mx.distributed.init(backend=hf.backend, strict=True)
    try:
        agree(group, hosts, path)
        watch.arm("loading the target's parts", LOAD_TIMEOUT)
        part = load_part(group, hosts, lambda: whole, mode)
        bell.accept(hf.size - 1)
    except MlxSpecError:  # every rank reached this verdict and exits: not a crash
        watch.closing = True
        stop(procs)
        raise
    watch.disarm()
    link = Link(group, watch, bell)
    target = ShardedTarget.over(part, link, Split(group.size(), mode, hf.backend,
                                                     tuple(hosts)))
    atexit.register(_quit, link, watch)  # runs before stop(): registered later
    return target


def _quit(link: Link, watch: Watch) -> None:
    watch.closing = True
    if link.broken or any(p.poll() is not None for p in watch.procs):
        return  # nobody to tell, or out of step (stop() ends whoever is left)
    if not link.lock.acquire(timeout=10):  # a thread still mid-step (the server's)
        return
    try:
        link.queue(Op.QUIT)
        link.send()
    except Exception:  # noqa: BLE001 - a rank already gone: stop() ends it
        pass
    finally:
        link.lock.release()
