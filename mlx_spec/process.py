"""The engine in a child process: EngineProcess (the parent's end) and the messages both ends
exchange over two pipes. The child's end is `_child.py` (`python -m mlx_spec._child`).

Why a process: see service.py. Requests are frozen dataclasses, one per service call; the child
answers a call with one `Ok` or `Failed`, and a `Generate` with `Token`s then `Done` (or `Failed`).
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import IO, Any

from .errors import MlxSpecError
from .events import Event
from .sampling import SamplingConfig
from .service import EngineInfo, Messages
from .spec import DraftLength, LoadSpec
from .stats import Baseline

# -- requests (parent -> child) -----------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    spec: LoadSpec


@dataclass(frozen=True)
class Generate:
    messages: Messages
    max_tokens: int
    sampling: SamplingConfig | None
    target_only: bool
    trace: bool
    drafter: str | None
    turn: int  # what a stop names: a stop for turn n never touches turn n + 1


@dataclass(frozen=True)
class MeasureBaseline:
    tokens: int
    repeats: int
    turn: int  # idle work is stopped like a turn


@dataclass(frozen=True)
class Calibrate:
    turn: int


@dataclass(frozen=True)
class Configure:
    draft_length: DraftLength | None
    drafter: str | None


@dataclass(frozen=True)
class Close:
    pass


Request = Load | Generate | MeasureBaseline | Calibrate | Configure | Close

# -- replies (child -> parent) ------------------------------------------------------------------


@dataclass(frozen=True)
class Ok:
    value: Any  # EngineInfo or Baseline


@dataclass(frozen=True)
class Token:
    event: Event  # a TokenEvent, a RoundTrace, or the TurnEnd before Done


@dataclass(frozen=True)
class Done:
    pass


@dataclass(frozen=True)
class Failed:
    error: MlxSpecError  # its type survives the pipe: a PromptTooLongError stays one


Reply = Ok | Token | Done | Failed

_POLL_S = 0.05  # how often a waiting parent looks at its stop flag and at the child


class TurnStops:
    """The child's end of the stop pipe: the parent writes the number of each turn it stops (8
    bytes, little-endian); `stopped(turn)` reads what has arrived, without blocking, and says
    whether that turn was stopped. Turn numbers only grow, so the highest one read is all there
    is to keep: a stop written before its turn began still stops it (it is never cleared), and
    one for an earlier turn never stops a later one."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self.fd, self.highest, self._pending = fd, 0, b""

    def stopped(self, turn: int) -> bool:
        try:
            while chunk := os.read(self.fd, 4096):
                self._pending += chunk
        except BlockingIOError:
            pass
        while len(self._pending) >= 8:
            (n,) = struct.unpack("<q", self._pending[:8])
            self._pending = self._pending[8:]
            self.highest = max(self.highest, n)
        return self.highest >= turn

    def event(self, turn: int) -> _TurnStop:
        return _TurnStop(self, turn)


@dataclass(frozen=True)
class _TurnStop:
    """The stop flag the engine polls between rounds, for one turn."""

    stops: TurnStops
    turn: int

    def is_set(self) -> bool:
        return self.stops.stopped(self.turn)


class EngineProcess:
    """The engine in a child process (a fresh interpreter: nothing of the parent's __main__ is
    re-imported). Same API as EngineInThread. Stopping a turn writes its number to a stop pipe
    the child's engine polls between rounds (TurnStops); a dead child becomes a one-line
    MlxSpecError."""

    def __init__(self, process: subprocess.Popen, send: Connection, recv: Connection,
                 log: IO[bytes], stop_fd: int) -> None:
        self._process, self._send_conn, self._recv_conn, self._log = process, send, recv, log
        self._stop_fd = stop_fd
        self._turn = 0
        self._lock = threading.Lock()
        self._info = EngineInfo("", "none", 0, ())

    @classmethod
    def start(cls, spec: LoadSpec | None = None) -> EngineProcess:
        """Start the child and load there; returns when loaded. Raises MlxSpecError."""
        to_child, from_parent = os.pipe()[::-1]  # (write end, read end)
        from_child, to_parent = os.pipe()
        stop_read, stop_write = os.pipe()
        log = tempfile.TemporaryFile()  # the child's stderr: its last line explains a crash
        process = subprocess.Popen(
            [sys.executable, "-m", "mlx_spec._child", str(from_parent), str(to_parent),
             str(stop_read)],
            pass_fds=(from_parent, to_parent, stop_read), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=log)
        for fd in (from_parent, to_parent, stop_read):
            os.close(fd)
        service = cls(process, Connection(to_child, readable=False),
                      Connection(from_child, writable=False), log, stop_write)
        try:
            service._info = service._call(Load(spec or LoadSpec()))
        except MlxSpecError:
            service.close()
            raise
        return service

    @property
    def info(self) -> EngineInfo:
        return self._info

    def measure_baseline(self, *, tokens: int = 64, repeats: int = 3,
                         stop: threading.Event | None = None) -> Baseline | None:
        baseline = self._call_stoppable(lambda turn: MeasureBaseline(tokens, repeats, turn),
                                        stop)
        if baseline is not None:  # the child saved it: `info` says so from now on
            self._info = replace(self._info, baseline=baseline)
        return baseline

    def calibrate(self, *, stop: threading.Event | None = None) -> bool:
        done = self._call_stoppable(Calibrate, stop)
        if done:
            self._info = replace(self._info, calibrated=True)
        return done

    def _call_stoppable(self, request: Any, stop: threading.Event | None) -> Any:
        """A call the child ends early when `stop` is set (idle work giving way to a turn):
        it takes a turn number, as a chat turn does, and the stop pipe names it."""
        with self._lock:
            self._turn += 1
            turn = self._turn
            self._send(request(turn))
            signalled = False
            while not self._wait():
                if stop is not None and stop.is_set() and not signalled:
                    self._stop(turn)
                    signalled = True
            return self._reply_value(self._recv())

    def configure(self, *, draft_length: DraftLength | None = None,
                  drafter: str | None = None) -> EngineInfo:
        self._info = self._call(Configure(draft_length, drafter))
        return self._info

    def chat(self, messages: Messages, *, max_tokens: int = 256,
             sampling: SamplingConfig | None = None, stop: threading.Event | None = None,
             target_only: bool = False, trace: bool = False,
             drafter: str | None = None) -> Iterator[Event]:
        with self._lock:
            self._turn += 1
            turn = self._turn
            self._send(Generate(messages, max_tokens, sampling, target_only, trace, drafter,
                                turn))
            signalled, finished = False, False
            try:
                while True:
                    if stop is not None and stop.is_set() and not signalled:
                        self._stop(turn)  # checked between rounds
                        signalled = True
                    if not self._wait():
                        continue
                    reply = self._recv()
                    if isinstance(reply, Token):
                        yield reply.event
                        continue
                    finished = True
                    if isinstance(reply, Failed):
                        raise reply.error
                    return
            finally:
                if not finished and self._process.poll() is None:
                    self._abandon()

    def _abandon(self) -> None:
        """The caller stopped reading mid-turn: stop the turn and drop the rest of its events,
        so the next request reads its own answer."""
        self._stop(self._turn)
        try:
            while True:
                while not self._wait():
                    pass
                if not isinstance(self._recv(), Token):
                    return
        except MlxSpecError:
            return

    def close(self) -> None:
        """Ask the child to exit; end it if it has not within a few seconds."""
        if self._process.poll() is None:
            try:
                self._stop(self._turn)  # a turn in progress ends first
                self._send_conn.send(Close())
                self._process.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                self._process.kill()
                self._process.wait()
        for c in (self._send_conn, self._recv_conn):
            c.close()
        os.close(self._stop_fd)
        self._log.close()

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    def _stop(self, turn: int) -> None:
        try:
            os.write(self._stop_fd, struct.pack("<q", turn))
        except OSError:  # the child is gone; its death is reported where it is read
            pass

    # the pipes

    def _call(self, request: Request) -> Any:
        with self._lock:
            self._send(request)
            while not self._wait():
                pass
            return self._reply_value(self._recv())

    @staticmethod
    def _reply_value(reply: Reply) -> Any:
        if isinstance(reply, Failed):
            raise reply.error
        assert isinstance(reply, Ok), reply
        return reply.value

    def _send(self, request: Request) -> None:
        try:
            self._send_conn.send(request)
        except OSError:
            raise self._died() from None

    def _wait(self) -> bool:
        """True when a message is ready; raises if the child died without one."""
        if self._recv_conn.poll(_POLL_S):
            return True
        if self._process.poll() is not None and not self._recv_conn.poll():
            raise self._died()
        return False

    def _recv(self) -> Reply:
        try:
            return self._recv_conn.recv()
        except (EOFError, OSError):
            raise self._died() from None

    def _died(self) -> MlxSpecError:
        try:
            code = self._process.wait(2)
        except subprocess.TimeoutExpired:
            code = None
        if code is not None and code < 0:  # a signal: the OOM killer, a crash in a kernel
            why = f"killed by {signal.Signals(-code).name}"
        else:  # a Python error's traceback ends with its one-line message
            self._log.seek(0)
            lines = [ln for ln in self._log.read().decode(errors="replace").splitlines() if ln]
            why = f"exit code {code}" + (f": {lines[-1].strip()}" if lines else "")
        return MlxSpecError(f"the engine process ended unexpectedly ({why})")
