"""The doorbell: an idle worker sleeps in the kernel, not in the backend.

A worker waiting for rank 0's next command would wait inside the backend's all_sum, and the
ring backend polls its sockets there: one full core per idle rank for as long as the server
waits for a request or the user reads an answer. So a worker first blocks on a plain TCP
socket to rank 0 (a blocking recv: no CPU), and rank 0 writes one byte to every worker just
before each command's all_sum. The worker's wake-up overlaps rank 0's own send, so a command
costs one more small write per worker, not a round trip.

The socket is rank 0's listener on its first address in the hostfile (the one the ring and
JACCL's coordinator use), on a port the kernel picks; each worker connects before joining the
group and says its rank. Closing it (rank 0 gone) wakes the worker with end-of-file."""

from __future__ import annotations

import socket
import struct
import time

from ..errors import MlxSpecError

RING = b"\x01"


class Bell:
    """Rank 0's side: listen, accept every worker, ring them all."""

    def __init__(self, host: str):
        self._listener = socket.create_server((host, 0))
        self.address = f"{host}:{self._listener.getsockname()[1]}"
        self._workers: list[socket.socket] = []

    def accept(self, workers: int, timeout: float = 60.0) -> None:
        """Every worker's connection, in rank order (they connect as they start, long before
        rank 0 gets here: the kernel holds them)."""
        by_rank: dict[int, socket.socket] = {}
        self._listener.settimeout(timeout)
        try:
            while len(by_rank) < workers:
                conn, _ = self._listener.accept()
                conn.settimeout(timeout)
                rank = struct.unpack("!I", _read(conn, 4))[0]
                conn.settimeout(None)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                by_rank[rank] = conn
        except (OSError, EOFError) as e:
            raise MlxSpecError(f"the workers did not reach rank 0's doorbell at "
                               f"{self.address} ({e}); is a firewall in the way?") from None
        finally:
            self._listener.close()
        self._workers = [by_rank[r] for r in sorted(by_rank)]

    def ring(self) -> None:
        for w in self._workers:
            w.sendall(RING)

    def close(self) -> None:
        for w in self._workers:
            try:
                w.close()
            except OSError:
                pass


def answer(address: str, rank: int, timeout: float = 60.0) -> socket.socket:
    """A worker's side: connect to rank 0's bell (retrying while rank 0 starts) and say its
    rank."""
    host, port = address.rsplit(":", 1)
    end = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection((host, int(port)), timeout=5.0)
            break
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(struct.pack("!I", rank))
    return sock


def wait(sock: socket.socket) -> None:
    """Sleep until rank 0 rings; EOFError when it has gone."""
    if not sock.recv(1):
        raise EOFError("rank 0 closed the doorbell")


def _read(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError("a worker hung up before saying its rank")
        data += chunk
    return data
