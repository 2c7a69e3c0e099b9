"""The engine behind a small chat API, in this process or in a child process.

    service = EngineProcess.start(model=None)          # the bundled demo pair, in a child process
    for event in service.chat([{"role": "user", "content": "def add("}], max_tokens=64):
        ...                                            # TokenEvent ..., then TurnEnd
    service.configure(drafter="none", num_draft=4)     # -> EngineInfo
    service.close()

Both services take conversations (the chat template is applied engine-side), switch drafters by
kind, measure the target-only baseline, and run target-only "race" turns on the same weights.

Why a process: a UI thread and the engine's thread share one GIL. The engine gives it up in every
MLX evaluation and must win it back when the evaluation returns; whenever a UI thread is running
Python at that moment, the engine waits, and Python hands the GIL over only at its switch interval
(the convoy effect). On a 2-core x86 box a thread busy in Python 8% of the time slowed the demo
engine by ~6%; the same load in another process cost nothing measurable. A child process has its
own GIL, and a crash in it (out of memory, a bad kernel) leaves the UI standing with a message.
`EngineInThread` keeps everything in one process (tests, scripts, debugging).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import IO, TYPE_CHECKING, Any, Protocol

from .errors import MlxSpecError
from .events import Event
from .sampling import SamplingConfig
from .stats import Baseline

if TYPE_CHECKING:  # EngineInThread imports the engine (and mlx-lm) when it is first used
    from .engine import Engine

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class EngineInfo:
    """What a UI shows about an engine and offers to change."""

    target: str  # the target model's name
    drafter: str  # "none", "mtp", "draft" or "ngram"
    num_draft: int | str  # draft length k, or "auto"
    drafters: tuple[str, ...]  # the drafter kinds `configure` can switch to


class EngineService(Protocol):
    """What EngineInThread and EngineProcess share. Calls are made one at a time."""

    @property
    def info(self) -> EngineInfo: ...

    def measure_baseline(self, *, tokens: int = 64, repeats: int = 3) -> Baseline: ...

    def chat(self, messages: Messages, *, max_tokens: int = 256,
             sampling: SamplingConfig | None = None, stop: threading.Event | None = None,
             target_only: bool = False) -> Iterator[Event]: ...

    def configure(self, *, num_draft: int | str | None = None,
                  drafter: str | None = None) -> EngineInfo: ...

    def close(self) -> None: ...


def drafter_kind(engine: Engine) -> str:
    """The kind of the engine's current drafter ("mtp-deepseek" is an "mtp")."""
    return engine.drafter.name.split("-")[0] if engine.drafter is not None else "none"


class EngineInThread:
    """An Engine in this process. MLX streams are per thread, so every call runs on a stream of
    its own and frees it when done: callers may use any thread (one call at a time)."""

    def __init__(self, engine: Engine, *, model: str | None = None,
                 draft_model: str | None = None, mtp: str | None = None) -> None:
        from .loading import find_mtp_head

        self.engine = engine
        self._paths = dict(model_path=model, draft_model=draft_model, mtp=mtp)
        self._drafters: dict[str, Any] = {"none": None, drafter_kind(engine): engine.drafter}
        self._plain: Engine | None = None  # target-only, sharing the weights (races)
        # what configure() can switch to: off, what was loaded, n-gram (needs no files), and
        # the kinds whose files are known (looked up once: `info` is read on the UI thread)
        kinds = ["none", drafter_kind(engine), "ngram"]
        if mtp or find_mtp_head(model):
            kinds.append("mtp")
        if draft_model:
            kinds.append("draft")
        self._kinds = tuple(dict.fromkeys(kinds))

    @classmethod
    def load(cls, *, model: str | None = None, drafter: str = "auto",
             draft_model: str | None = None, mtp: str | None = None,
             num_draft: int | str = "auto") -> EngineInThread:
        from .loading import load_engine

        with _own_stream():
            engine = load_engine(model, drafter=drafter, draft_model=draft_model, mtp=mtp,
                                 num_draft=num_draft)
        return cls(engine, model=model, draft_model=draft_model, mtp=mtp)

    @property
    def info(self) -> EngineInfo:
        e = self.engine
        return EngineInfo(e.target.name, drafter_kind(e), "auto" if e.adaptive else e.num_draft,
                          self._kinds)

    def measure_baseline(self, *, tokens: int = 64, repeats: int = 3) -> Baseline:
        from .stats import measure_baseline

        with _own_stream():
            return measure_baseline(self.engine, tokens=tokens, repeats=repeats)

    def chat(self, messages: Messages, *, max_tokens: int = 256,
             sampling: SamplingConfig | None = None, stop: threading.Event | None = None,
             target_only: bool = False) -> Iterator[Event]:
        from .chat import encode_chat
        from .engine import Engine

        engine = self.engine
        if target_only:
            if self._plain is None:
                self._plain = Engine(engine.target, engine.tokenizer, None)
            engine = self._plain
        with _own_stream():
            ids = encode_chat(engine.tokenizer, messages)
            yield from engine.generate(ids, max_tokens=max_tokens, sampling=sampling, stop=stop)

    def configure(self, *, num_draft: int | str | None = None,
                  drafter: str | None = None) -> EngineInfo:
        """Switch drafter (built the first time, then kept: switching back costs nothing) and
        draft length. Raises MlxSpecError."""
        from .loading import make_drafter

        with _own_stream():
            if drafter is not None and drafter != drafter_kind(self.engine):
                if drafter not in self._drafters:
                    self._drafters[drafter] = make_drafter(drafter, self.engine.target,
                                                           **self._paths)
                self.engine.set_drafter(self._drafters[drafter])
            if num_draft is not None:
                self.engine.set_num_draft(num_draft)
        return self.info

    def close(self) -> None:
        pass


class _own_stream:
    """On a worker thread: a fresh default MLX stream, freed on exit (MLX streams are per
    thread, and a thread that ends holding some can crash the process at exit). Thread pools
    reuse threads, and a thread whose streams were freed has no default stream left ("There is
    no Stream(cpu, N) in current thread"), so it is set anew on entry. The engine leaves no lazy
    array behind at the end of a call, so nothing needs these streams later. The main thread
    keeps its own streams: it lives as long as the process, and other code uses them."""

    def __enter__(self) -> None:
        import mlx.core as mx

        self._worker = threading.current_thread() is not threading.main_thread()
        if self._worker:
            mx.set_default_stream(mx.new_stream(mx.default_device()))

    def __exit__(self, *exc: object) -> None:
        import mlx.core as mx

        if self._worker:
            mx.clear_streams()


# -- the child process -------------------------------------------------------------------------

_POLL_S = 0.05  # how often a waiting parent looks at its stop flag and at the child


class EngineProcess:
    """The engine in a child process (`python -m mlx_spec._child`, a fresh interpreter: nothing
    of the parent's __main__ is re-imported), driven by pickled messages over two pipes. Same
    API as EngineInThread. Stopping a turn is a SIGUSR1, which the child turns into the
    engine's stop flag; a dead child becomes a one-line MlxSpecError."""

    def __init__(self, process: subprocess.Popen, send: Connection, recv: Connection,
                 log: IO[bytes]) -> None:
        self._process, self._send_conn, self._recv_conn, self._log = process, send, recv, log
        self._lock = threading.Lock()
        self._info = EngineInfo("", "none", 0, ())

    @classmethod
    def start(cls, *, model: str | None = None, drafter: str = "auto",
              draft_model: str | None = None, mtp: str | None = None,
              num_draft: int | str = "auto") -> EngineProcess:
        """Start the child and load there; returns when loaded. Raises MlxSpecError."""
        to_child, from_parent = os.pipe()[::-1]  # (write end, read end)
        from_child, to_parent = os.pipe()
        log = tempfile.TemporaryFile()  # the child's stderr: its last line explains a crash
        process = subprocess.Popen(
            [sys.executable, "-m", "mlx_spec._child", str(from_parent), str(to_parent)],
            pass_fds=(from_parent, to_parent), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=log)
        os.close(from_parent)
        os.close(to_parent)
        service = cls(process, Connection(to_child, readable=False),
                      Connection(from_child, writable=False), log)
        try:
            service._info = service._call("load", model=model, drafter=drafter,
                                          draft_model=draft_model, mtp=mtp, num_draft=num_draft)
        except MlxSpecError:
            service.close()
            raise
        return service

    @property
    def info(self) -> EngineInfo:
        return self._info

    def measure_baseline(self, *, tokens: int = 64, repeats: int = 3) -> Baseline:
        return self._call("baseline", tokens=tokens, repeats=repeats)

    def configure(self, *, num_draft: int | str | None = None,
                  drafter: str | None = None) -> EngineInfo:
        self._info = self._call("configure", num_draft=num_draft, drafter=drafter)
        return self._info

    def chat(self, messages: Messages, *, max_tokens: int = 256,
             sampling: SamplingConfig | None = None, stop: threading.Event | None = None,
             target_only: bool = False) -> Iterator[Event]:
        with self._lock:
            self._send("chat", messages=messages, max_tokens=max_tokens, sampling=sampling,
                       target_only=target_only)
            signalled, finished = False, False
            try:
                while True:
                    if stop is not None and stop.is_set() and not signalled:
                        self._process.send_signal(signal.SIGUSR1)  # checked between rounds
                        signalled = True
                    if not self._wait():
                        continue
                    kind, payload = self._recv()
                    if kind == "event":
                        yield payload
                    else:
                        finished = True
                        if kind == "done":
                            return
                        raise payload
            finally:
                if not finished and self._process.poll() is None:
                    self._abandon()

    def _abandon(self) -> None:
        """The caller stopped reading mid-turn: stop the turn and drop the rest of its events,
        so the next request reads its own answer."""
        self._process.send_signal(signal.SIGUSR1)
        try:
            while True:
                while not self._wait():
                    pass
                if self._recv()[0] != "event":
                    return
        except MlxSpecError:
            return

    def close(self) -> None:
        """Ask the child to exit; end it if it has not within a few seconds."""
        if self._process.poll() is None:
            try:
                self._process.send_signal(signal.SIGUSR1)  # a turn in progress ends first
                self._send_conn.send(("close", {}))
                self._process.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                self._process.kill()
                self._process.wait()
        for c in (self._send_conn, self._recv_conn):
            c.close()
        self._log.close()

    # the pipes

    def _call(self, op: str, **kwargs: Any) -> Any:
        with self._lock:
            self._send(op, **kwargs)
            while not self._wait():
                pass
            kind, payload = self._recv()
            if kind != "ok":
                raise payload
            return payload

    def _send(self, op: str, **kwargs: Any) -> None:
        try:
            self._send_conn.send((op, kwargs))
        except OSError:
            raise self._died() from None

    def _wait(self) -> bool:
        """True when a message is ready; raises if the child died without one."""
        if self._recv_conn.poll(_POLL_S):
            return True
        if self._process.poll() is not None and not self._recv_conn.poll():
            raise self._died()
        return False

    def _recv(self) -> tuple[str, Any]:
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


def serve(recv: Connection, send: Connection) -> None:
    """The child's main loop: load, then answer requests until "close" or the pipe closes."""
    stop = threading.Event()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ctrl+c is the UI's: it stops turns
    signal.signal(signal.SIGUSR1, lambda *_: stop.set())
    service: EngineInThread | None = None
    while True:
        try:
            op, kwargs = recv.recv()
        except (EOFError, OSError):
            return
        if op == "close":
            return
        try:
            if op == "load":
                service = EngineInThread.load(**kwargs)
                send.send(("ok", service.info))
            elif service is None:
                raise MlxSpecError("no model loaded")
            elif op == "chat":
                stop.clear()
                for event in service.chat(**kwargs, stop=stop):
                    send.send(("event", event))
                send.send(("done", None))
            else:
                handler = {"baseline": service.measure_baseline,
                           "configure": service.configure}[op]
                send.send(("ok", handler(**kwargs)))
        except Exception as e:  # noqa: BLE001 - the parent shows one line
            what = "cannot load" if op == "load" else "engine error"
            try:
                send.send(("error", _user_error(e, what)))
            except OSError:
                return


def _user_error(error: BaseException, what: str) -> MlxSpecError:
    """What the parent re-raises: an MlxSpecError as it is (its type survives the pipe: a
    PromptTooLongError stays one), anything else as one line naming its type."""
    if isinstance(error, MlxSpecError):
        return error
    lines = str(error).strip().splitlines()
    return MlxSpecError(f"{what}: {type(error).__name__}" + (f": {lines[0]}" if lines else ""))
