"""Several requests at once on one engine: each request is a conversation of its own beside the
engine's weights, and one engine thread runs them all in cycles. Each cycle is one exchange with
the engine (engine/cycle.py `Batch.step`): the running requests go down, and what each produced
comes back — its tokens, its end or its error — with how many passes its rounds ran as. The
engine drafts and verifies every round together where it can (ONE target pass), caps the batch's
draft length, and runs new requests' prefills a chunk per cycle; this file keeps the queue, the
jobs' events and the metrics.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import mlx.core as mx

from ..cache import Growth
from ..engine import Engine
from ..engine.cycle import Batch, Row
from ..events import Event, TokenEvent, TurnEnd
from ..sampling import SamplingConfig
from .metrics import Metrics

_DONE = object()  # the end of a job's events


class QueueFull(Exception):
    """More requests are waiting than the server queues (answered 429: try again)."""


class TooLarge(Exception):
    """A request whose caches alone would outgrow the memory budget (answered 400)."""


@dataclass(frozen=True)
class Budget:
    """The bytes the caches of every running request may take together, and what one
    conversation's caches take (Engine.memory_growth). A request starts only once its caches at
    their longest — prompt + max_tokens (a turn stops at the context), and the longest draft a
    round verifies — fit beside the running ones' (it waits in the queue, first in line first:
    a large request is not overtaken for ever by small ones), and gives them back when it
    ends: what runs always fits. One that could never fit is refused at once."""

    bytes: int
    growth: Growth
    reach: int  # the tokens a verify pass may hold beyond the committed ones
    context: int  # the most tokens a conversation holds

    def need(self, prompt: int, max_tokens: int) -> int:
        return self.growth.bytes_for(min(prompt + max_tokens, self.context) + self.reach)


@dataclass
class Job:
    """One request in the scheduler: its prompt, its events as they come, its stop flag."""

    prompt: list[int]
    max_tokens: int
    sampling: SamplingConfig
    trace: bool = False  # a RoundTrace before each round's tokens (the trace extension)
    stop: threading.Event = field(default_factory=threading.Event)
    events: queue.Queue = field(default_factory=queue.Queue)
    arrived: float = field(default_factory=time.perf_counter)
    need: int = 0  # the bytes of the memory budget it holds while it runs
    reserved: int = 0  # what it holds now (its need from its start to its end)
    last_token: float = 0.0  # when its latest token was handed over

    def stream(self) -> Iterator[Event]:
        """The job's events (TokenEvents, a RoundTrace before each round's if traced, then its
        TurnEnd); an engine error is raised here."""
        while (item := self.events.get()) is not _DONE:
            if isinstance(item, BaseException):
                raise item
            yield item

    def cancel(self) -> None:
        """Stop after the round in progress (a client went away, a stop sequence was seen)."""
        self.stop.set()


class Scheduler:
    """The engine thread: takes jobs (up to `max_concurrency` run at once, `max_queue` more
    wait), and advances every running job by one event in turn."""

    def __init__(self, engine: Engine, *, max_concurrency: int = 4, max_queue: int = 64,
                 budget: Budget | None = None):
        self.engine = engine
        self.max_concurrency, self.max_queue = max_concurrency, max_queue
        self.budget, self.reserved = budget, 0  # None: no memory budget (a split target)
        # reserved: what the running requests hold of it
        self._waiting: deque[Job] = deque()
        self._lock = threading.Condition()
        self._closed = False
        self._arrived = threading.Event()  # a request came: idle work gives way
        self.metrics = Metrics()
        self.batch = Batch(engine.costbook)  # the engine's side of every cycle
        self.running = 0
        self._thread = threading.Thread(target=self._run, name="mlx-spec-engine", daemon=True)
        self._thread.start()

    @property
    def budget_bytes(self) -> float:
        return self.budget.bytes if self.budget else float("inf")

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def submit(self, prompt: list[int], *, max_tokens: int, sampling: SamplingConfig,
               trace: bool = False) -> Job:
        job = Job(prompt, max_tokens, sampling, trace)
        need = job.need = self.budget.need(len(prompt), max_tokens) if self.budget else 0
        if self.budget and need > self.budget.bytes:
            capped = (f", up to the {self.budget.context}-token context"
                      if len(prompt) + max_tokens > self.budget.context else "")
            raise TooLarge(f"its caches would take {_mb(need)} (a {len(prompt)}-token prompt "
                           f"and max_tokens {max_tokens}{capped}); the server's budget for all "
                           f"of them is {_mb(self.budget.bytes)} (serve --kv-memory)")
        with self._lock:
            if self._closed:
                raise QueueFull("the server is shutting down")
            if self.running + len(self._waiting) >= self.max_concurrency + self.max_queue:
                raise QueueFull(f"{self.running} requests are running and "
                                f"{len(self._waiting)} waiting")
            self._waiting.append(job)
            self._arrived.set()
            self._lock.notify()
        return job

    def close(self, timeout: float = 10.0) -> None:
        """Cancel what runs or waits (each ends after its round in progress) and stop."""
        with self._lock:
            self._closed = True
            for job in self._waiting:
                job.cancel()
            self._arrived.set()
            self._lock.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        """The engine thread, on an MLX stream of its own, freed when it ends (MLX streams are
        per thread; a thread that ends holding one can abort the process at exit)."""
        mx.set_default_stream(mx.new_stream(mx.default_device()))
        try:
            self._loop()
        finally:
            mx.clear_streams()

    def _loop(self) -> None:
        running: list[_Running] = []
        while True:
            if not running and not self._waiting and not self._closed:
                self._calibrate_while_idle()
            with self._lock:
                while not running and not self._waiting and not self._closed:
                    self._lock.wait()
                if self._closed and not running and not self._waiting:
                    return
                while self._waiting and len(running) < self.max_concurrency:
                    job = self._waiting[0]
                    if running and self.reserved + job.need > self.budget_bytes:
                        break  # the first in line waits for room: a running one must end
                    self._waiting.popleft()
                    job.reserved, self.reserved = job.need, self.reserved + job.need
                    try:
                        running.append(self._start(job))
                    except Exception as e:  # noqa: BLE001 - its own error, never the thread's
                        job.events.put(e)
                        self._end(job)
                self.running = len(running)
            try:
                running = self._cycle(running)
            except Exception as e:  # noqa: BLE001 - a failing cycle ends its requests with
                for run in running:  # their error, never hangs them (nor the next ones)
                    run.job.events.put(e)
                    self._end(run.job)
                running = []
            self.running = len(running)

    def _cycle(self, running: list[_Running]) -> list[_Running]:
        """One exchange with the engine: every request to its next round, its tokens handed
        over; the ones that ended leave."""
        cycle = self.batch.step([run.row for run in running])
        if cycle.rounds:
            self.metrics.verified(cycle.passes, cycle.rounds)
        still = []
        for run, out in zip(running, cycle.produced, strict=True):
            handed = all(self._hand(run.job, event) for event in out.events)
            if not out.over:
                still.append(run)
            elif out.error is not None:
                run.job.events.put(out.error)
                self._end(run.job)
            elif handed:  # over without its TurnEnd (never, but never hang a client)
                self._end(run.job)
        return still

    def _calibrate_while_idle(self) -> None:
        """Between requests: measure the target's costs if `auto` still reads a prior; a
        request arriving stops it between passes (it is tried again at the next idle)."""
        engine = self.engine
        if engine.draft_length != "auto" or engine.drafter is None or engine.calibrated:
            return
        self._arrived.clear()
        engine.calibrate(stop=self._arrived)

    def _start(self, job: Job) -> _Running:
        return _Running(job, self.batch.start(self.engine.conversation(), job.prompt,
                                              max_tokens=job.max_tokens,
                                              sampling=job.sampling, stop=job.stop,
                                              trace=job.trace))

    def _hand(self, job: Job, event: Event) -> bool:
        """Hand the job an event; False when it was the job's last."""
        job.events.put(event)
        if isinstance(event, TokenEvent):
            now = time.perf_counter()
            if job.last_token:
                self.metrics.next_token(now - job.last_token)
            else:
                self.metrics.first_token(now - job.arrived)
            job.last_token = now
        if isinstance(event, TurnEnd):
            self.metrics.finished(event.stats)
            self._end(job)
            return False
        return True

    def _end(self, job: Job) -> None:
        """The job's last event; its share of the memory budget is free again."""
        with self._lock:
            self.reserved -= job.reserved
            job.reserved = 0
        job.events.put(_DONE)


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


@dataclass
class _Running:
    """A running request: its job and its turn on the engine."""

    job: Job
    row: Row
