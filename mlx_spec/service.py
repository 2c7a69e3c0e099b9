"""The engine behind a small chat API, in this process (here) or in a child process (process.py).

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

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .events import Event
from .kinds import kind_of
from .sampling import SamplingConfig
from .stats import Baseline

if TYPE_CHECKING:  # EngineInThread imports the engine (and mlx-lm) when it is first used
    from .engine import Engine

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class EngineInfo:
    """What a UI shows about an engine and offers to change."""

    target: str  # the target model's name
    drafter: str  # a kind of kinds.DRAFTERS
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
    """The kind (kinds.DRAFTERS) of the engine's current drafter."""
    return kind_of(engine.drafter.name) if engine.drafter is not None else "none"


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
        if mtp or find_mtp_head(model, engine.target):
            kinds.append("mtp")
        if draft_model:
            kinds.append("draft")
        self._kinds = tuple(dict.fromkeys(kinds))

    @classmethod
    def load(cls, *, model: str | None = None, drafter: str = "auto",
             draft_model: str | None = None, mtp: str | None = None,
             num_draft: int | str | None = None) -> EngineInThread:
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

