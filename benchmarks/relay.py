"""A delaying TCP relay: the link latency of `python -m benchmarks --group distributed` (this kernel
has no netem qdisc, so `tc` cannot add delay).

Each route listens on a port and forwards every connection it accepts to a target port; each
direction of a connection has a reader thread, which stamps every chunk it receives with its
due time (arrival + the delay in force), and a writer thread, which sends the chunks in order,
each when due. So every byte reaches the other end `delay` seconds later than it would have,
plus the relay's own hop (measured: `ping_pong`, and each chunk's lateness past its due time,
`Relay.stats`). MLX's ring backend reads a hostfile per rank (MLX_HOSTFILE: one "ip:port" list
per rank) and each rank binds its own entry and connects to the others', so a rank whose file
names a relay port for every other rank reaches them only through the relay.

Run as a process of its own (the ranks' threads spin while they wait, and a relay sharing their
GIL would be late): `main()` with argv '{"routes": [[listen, target], ...]}',
then one JSON line per command on stdin — {"delay": seconds} or {"stats": true} — each
answered with one JSON line; end of input ends it. No MLX here.
"""

from __future__ import annotations

import ctypes
import json
import os
import queue
import socket
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

HOST = "127.0.0.1"
CHUNK = 1 << 16
CONNECT_WAIT_S = 120.0  # a rank that binds its port late (still loading)


def fine_timers() -> None:
    """Ask Linux for 1 ns timer slack (default 50 µs: every sleep would overshoot that much);
    threads made after this inherit it. Elsewhere: nothing."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK
    except (OSError, AttributeError):
        pass


def prompt_scheduling() -> str:
    """Let the relay preempt the ranks' spinning threads at once: real-time FIFO where allowed
    (it sleeps or blocks between chunks, so it takes little), else a higher nice; which one
    was granted."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        return "SCHED_FIFO"
    except (AttributeError, OSError):
        pass
    try:
        os.nice(-10)
        return "nice -10"
    except OSError:
        return "default"


def _nodelay(s: socket.socket) -> socket.socket:
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


class Relay:
    """Routes (listen port -> target port) on 127.0.0.1, each byte held `delay` seconds."""

    def __init__(self, routes: list[tuple[int, int]], delay: float = 0.0):
        self.routes, self.delay = list(routes), float(delay)
        self._late: list[float] = []  # seconds past due, per chunk sent
        self._lock = threading.Lock()
        self._listeners: list[socket.socket] = []
        self._open: list[socket.socket] = []
        self.chunks = self.bytes = 0
        self.lead = 0.0  # how much sooner than due a writer wakes (its wake-up's own lateness)
        for listen, target in self.routes:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((HOST, listen))
            s.listen(8)
            self._listeners.append(s)
            threading.Thread(target=self._accept, args=(s, target), daemon=True).start()

    def set_delay(self, seconds: float) -> None:
        self.delay = float(seconds)

    def stats(self, reset: bool = True) -> dict:
        """Chunks forwarded and how late each was sent past its due time (µs quantiles)."""
        with self._lock:
            late, self._late = self._late, ([] if reset else self._late)
            chunks, nbytes = self.chunks, self.bytes
            if reset:
                self.chunks = self.bytes = 0
        late.sort()
        q = lambda p: 1e6 * late[min(len(late) - 1, int(p * len(late)))] if late else None  # noqa: E731
        return {"chunks": chunks, "bytes": nbytes, "late_p50_us": q(0.5), "late_p90_us": q(0.9),
                "late_p99_us": q(0.99), "late_max_us": q(1.0)}

    def close(self) -> None:
        for s in self._listeners + self._open:
            try:
                s.close()
            except OSError:
                pass

    def _accept(self, listener: socket.socket, target: int) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client, target), daemon=True).start()

    def _connect(self, client: socket.socket, target: int) -> None:
        deadline = time.monotonic() + CONNECT_WAIT_S
        while True:
            try:
                upstream = socket.create_connection((HOST, target))
                break
            except OSError:
                if time.monotonic() > deadline:
                    client.close()
                    return
                time.sleep(0.02)
        self._open += [_nodelay(client), _nodelay(upstream)]
        for src, dst in ((client, upstream), (upstream, client)):
            q: queue.SimpleQueue = queue.SimpleQueue()
            threading.Thread(target=self._read, args=(src, q), daemon=True).start()
            threading.Thread(target=self._write, args=(dst, q), daemon=True).start()

    def _read(self, src: socket.socket, q: queue.SimpleQueue) -> None:
        while True:
            try:
                data = src.recv(CHUNK)
            except OSError:
                data = b""
            q.put((time.perf_counter() + self.delay, data))
            if not data:
                return

    def _write(self, dst: socket.socket, q: queue.SimpleQueue) -> None:
        while True:
            due, data = q.get()
            if not data:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            wait = due - time.perf_counter() - self.lead
            if wait > 0:
                time.sleep(wait)
            late = time.perf_counter() - due
            try:
                dst.sendall(data)
            except OSError:
                return
            if wait > 0:  # learn the wake-up's lateness: wake that much sooner next time
                self.lead = max(0.0, min(self.delay / 2, self.lead + 0.1 * late))
            with self._lock:
                self._late.append(late)
                self.chunks += 1
                self.bytes += len(data)


def free_ports(n: int) -> list[int]:
    """n ports free on 127.0.0.1 now (bound together, so distinct)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind((HOST, 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@contextmanager
def echo_server() -> Iterator[int]:
    """A port on 127.0.0.1 that echoes every byte back (one connection at a time)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((HOST, 0))
    s.listen(4)

    def serve() -> None:
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            _nodelay(c)
            with c:
                while data := c.recv(CHUNK):
                    c.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


def ping_pong(port: int, n: int = 200, size: int = 64) -> list[float]:
    """Round-trip times (s) of `n` messages of `size` bytes to an echo behind `port`."""
    out = []
    msg = b"x" * size
    with _nodelay(socket.create_connection((HOST, port))) as c:
        for _ in range(n + 5):
            t0 = time.perf_counter()
            c.sendall(msg)
            got = 0
            while got < size:
                got += len(c.recv(CHUNK))
            out.append(time.perf_counter() - t0)
    return out[5:]  # the first few set the connection up


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def main() -> int:
    fine_timers()
    scheduling = prompt_scheduling()  # before the threads: they inherit it
    job = json.loads(sys.argv[-1])
    relay = Relay([tuple(r) for r in job["routes"]], job.get("delay", 0.0))
    print(json.dumps({"ready": True, "scheduling": scheduling}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if "delay" in cmd:
            relay.set_delay(cmd["delay"])
            reply: dict = {"delay": relay.delay}
        else:
            reply = relay.stats(reset=cmd.get("reset", True))
        print(json.dumps(reply), flush=True)
    relay.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
