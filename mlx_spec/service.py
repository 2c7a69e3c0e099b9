"""The engine behind a small chat API, in this process (here) or in a child process (process.py).

    service = EngineProcess.start(LoadSpec())          # the bundled demo pair, in a child process
    for event in service.chat([{"role": "user", "content": "def add("}], max_tokens=64):
        ...                                            # TokenEvent ..., then TurnEnd
    service.configure(drafter="none", draft_length=4)     # -> EngineInfo
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

import statistics
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .events import Event, TurnEnd
from .kinds import copies_first, kind_of
from .sampling import SamplingConfig
from .spec import DraftLength, LoadSpec
from .stats import Baseline

if TYPE_CHECKING:  # EngineInThread imports the engine (and mlx-lm) when it is first used
    from .engine import Chat, Engine

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class EngineInfo:
    """What a UI shows about an engine and offers to change."""

    target: str  # the target model's name
    drafter: str  # a kind of kinds.DRAFTERS
    draft_length: DraftLength  # tokens drafted per round, or "auto"
    drafters: tuple[str, ...]  # the drafter kinds `configure` can switch to
    baseline: Baseline | None = None  # the saved target-only speed (None: not measured yet)
    calibrated: bool = False  # are the target's costs measured (else `auto` reads a prior)?
    split: str = ""  # how the target is split over machines ("": it is not)
    lookup: bool = False  # copies of the conversation's own text are drafted first (--lookup)


class EngineService(Protocol):
    """What EngineInThread and EngineProcess share. Calls are made one at a time."""

    @property
    def info(self) -> EngineInfo: ...

    def measure_baseline(self, *, tokens: int = 64, repeats: int = 3,
                         stop: threading.Event | None = None) -> Baseline | None:
        """Time the target alone once more; the baseline speedups quote from now on (the
        median of the last few sessions' measurements), or None when `stop` ended it."""
        ...

    def calibrate(self, *, stop: threading.Event | None = None) -> bool: ...

    def chat(self, messages: Messages, *, max_tokens: int = 256,
             sampling: SamplingConfig | None = None, stop: threading.Event | None = None,
             target_only: bool = False, trace: bool = False,
             drafter: str | None = None) -> Iterator[Event]: ...

    def configure(self, *, draft_length: DraftLength | None = None,
                  drafter: str | None = None) -> EngineInfo: ...

    def close(self) -> None: ...


def drafter_kind(conv: Chat) -> str:
    """The kind (kinds.DRAFTERS) of the conversation's current drafter."""
    return kind_of(conv.drafter.name) if conv.drafter is not None else "none"


class EngineInThread:
    """An Engine and its one conversation in this process. MLX streams are per thread, so every
    call runs on a stream of its own and frees it when done: callers may use any thread (one
    call at a time)."""

    def __init__(self, engine: Engine, spec: LoadSpec | None = None) -> None:
        from .loading import find_mtp_head

        spec = spec or LoadSpec()
        self.engine, self.spec = engine, spec
        self.conversation = engine.conversation()  # the chat's tokens, caches, drafter state
        self._sides: dict[str, Chat] = {}  # races: a conversation per drafter kind
        self._drafters: dict[str, Any] = {"none": None,
                                          drafter_kind(self.conversation): engine.drafter}
        # what configure() can switch to: off, what was loaded, n-gram (needs no files), and
        # the kinds whose files are known (looked up once: `info` is read on the UI thread)
        kinds = ["none", drafter_kind(self.conversation), "ngram"]
        if spec.mtp or find_mtp_head(spec.model, engine.target):
            kinds.append("mtp")
        if spec.draft_model:
            kinds.append("draft")
        self._kinds = tuple(dict.fromkeys(kinds))

    @classmethod
    def load(cls, spec: LoadSpec | None = None) -> EngineInThread:
        from .loading import load_engine

        with _own_stream():
            engine = load_engine(spec)
        return cls(engine, spec)

    @property
    def info(self) -> EngineInfo:
        c, e = self.conversation, self.engine
        return EngineInfo(c.target.name, drafter_kind(c), c.draft_length, self._kinds,
                          e.baseline, e.calibrated, c.target.split_label,
                          lookup=c.drafter is not None and copies_first(c.drafter.name))

    def measure_baseline(self, *, tokens: int = 64, repeats: int = 3,
                         stop: threading.Event | None = None) -> Baseline | None:
        """Measure the target-only speed, join it to the saved ones and save; returns what
        speedups quote from now on (None: `stop` was set first). Work for when the engine is
        idle: a stop ends it between rounds."""
        with _own_stream():
            baseline = measure_baseline(self.engine, tokens=tokens, repeats=repeats, stop=stop)
        return None if baseline is None else self.engine.keep_baseline(baseline)

    def calibrate(self, *, stop: threading.Event | None = None) -> bool:
        """Measure the target's costs unless they are (saved); False if `stop` ended it."""
        if self.engine.calibrated:
            return True
        with _own_stream():
            return self.engine.calibrate(stop=stop)

    def chat(self, messages: Messages, *, max_tokens: int = 256,
             sampling: SamplingConfig | None = None, stop: threading.Event | None = None,
             target_only: bool = False, trace: bool = False,
             drafter: str | None = None) -> Iterator[Event]:
        """A turn of the chat; target_only / drafter: a race's turn instead, on a conversation
        of its own with no drafter / a drafter of that kind (the chat's caches and drafter
        state are never touched). Raises MlxSpecError."""
        from .templates import encode_chat

        conv = self.conversation
        with _own_stream():
            if target_only or drafter is not None:
                conv = self._side("none" if target_only else drafter)
            ids = encode_chat(conv.tokenizer, messages)
            yield from conv.generate(ids, max_tokens=max_tokens, sampling=sampling, stop=stop,
                                     trace=trace)

    def configure(self, *, draft_length: DraftLength | None = None,
                  drafter: str | None = None) -> EngineInfo:
        """Switch drafter (built the first time, then kept: switching back costs nothing) and
        draft length. Raises MlxSpecError."""
        conv = self.conversation
        with _own_stream():
            if drafter is not None and drafter != drafter_kind(conv):
                conv.set_drafter(self._drafter(drafter))
            if draft_length is not None:
                conv.set_draft_length(draft_length)
        return self.info

    def _drafter(self, kind: str) -> Any:
        """The drafter of that kind on this target: built the first time, then kept."""
        from .loading import make_drafter

        if kind not in self._drafters:
            self._drafters[kind] = make_drafter(
                kind, self.engine.target, model_path=self.spec.model,
                draft_model=self.spec.draft_model, mtp=self.spec.mtp, lookup=self.spec.lookup)
        return self._drafters[kind]

    def _side(self, kind: str) -> Chat:
        """The race conversation with a drafter of that kind ("none": target-only)."""
        length = self.conversation.draft_length
        if kind not in self._sides:
            self._sides[kind] = self.engine.conversation(drafter=self._drafter(kind),
                                                         draft_length=length)
        elif self._sides[kind].draft_length != length:  # the user changed it since
            self._sides[kind].set_draft_length(length)
        return self._sides[kind]

    def close(self) -> None:
        pass


def measure_baseline(engine: Engine, *, tokens: int = 64, prompt: list[int] | None = None,
                     repeats: int = 3, stop: threading.Event | None = None) -> Baseline | None:
    """Time target-only greedy decoding through the same loop, on a scratch conversation on the
    engine's weights (no other conversation is touched): the median of `repeats` runs after a
    short warm-up. The median, not the best: the best of a few noisy runs overstates the speed
    a turn will see. 64 tokens: per-token cost grows with the context. None: `stop` was set
    (checked between rounds)."""
    scratch = engine.conversation(drafter=None)
    ids = prompt or list(range(3, 35))

    def timed(n: int) -> float | None:
        scratch.reset()
        end = [e for e in scratch.generate(ids, max_tokens=n, ignore_eos=True, stop=stop)
               if isinstance(e, TurnEnd)][0]
        return None if end.finish_reason == "cancelled" else end.stats.tok_s

    runs = []
    for n in [8] + [tokens] * repeats:  # a warm-up first: kernels and allocations
        speed = timed(n)
        if speed is None:
            return None
        runs.append(speed)
    return Baseline(statistics.median(runs[1:]), tokens,
                    f"median of {repeats} timed target-only runs of {tokens} tokens (greedy, "
                    "same loop, no drafter)")


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

