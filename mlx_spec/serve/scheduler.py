"""Several requests at once on one engine: each request is a Conversation of its own beside the
engine's weights, and one engine thread runs them all in cycles. A cycle advances every running
request to its next round (emitting the tokens its last round committed; a request in its
prefill takes one chunk), drafts every round's drafts (together where the drafter can:
engine/batch.py `draft_together`, each on its own drafter state), then runs ONE target pass
over every waiting round (each row commits its own accepted prefix). Requests join and
leave between cycles, so speculation stays on for each (its own drafter state, its own policy,
its own random stream) while the verify is shared.

A new request's prefill takes one chunk per cycle, so running streams keep flowing meanwhile;
the chunks of requests that arrived together run in one pass (`prefill_together`).

The draft length knows the batch: before a cycle of two or more `auto` rows, the scheduler caps
every row's k at the common k that maximises the batch's expected tokens per second, the cycle
priced at the measured cost of its pass's B·(k+1) tokens (engine/adaptive.py
`BatchDraftLength`); each cycle it times feeds that cost back. So where the batch makes the
pass compute-bound, speculation is off for the cycle, and back on when it pays. One request
alone is uncapped: its own policy chooses, as in `generate`.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from ..drafters import Draft
from ..engine import Engine
from ..engine.adaptive import AdaptiveDraftLength
from ..engine.batch import batchable, draft_together, prefill_together, verify_together
from ..engine.batch_length import BatchDraftLength
from ..engine.conversation import Conversation
from ..engine.turn import Drafting, Pause, Reply, Verify
from ..events import Event, TokenEvent, TurnEnd
from ..sampling import SamplingConfig
from .metrics import Metrics

_DONE = object()  # the end of a job's events


class QueueFull(Exception):
    """More requests are waiting than the server queues (answered 429)."""


@dataclass
class Job:
    """One request in the scheduler: its prompt, its events as they come, its stop flag."""

    prompt: list[int]
    max_tokens: int
    sampling: SamplingConfig
    stop: threading.Event = field(default_factory=threading.Event)
    events: queue.Queue = field(default_factory=queue.Queue)
    arrived: float = field(default_factory=time.perf_counter)
    last_token: float = 0.0  # when its latest token was handed over

    def stream(self) -> Iterator[Event]:
        """The job's events (TokenEvents, then its TurnEnd); an engine error is raised here."""
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

    def __init__(self, engine: Engine, *, max_concurrency: int = 4, max_queue: int = 64):
        self.engine = engine
        self.max_concurrency, self.max_queue = max_concurrency, max_queue
        self._waiting: deque[Job] = deque()
        self._lock = threading.Condition()
        self._closed = False
        self._arrived = threading.Event()  # a request came: idle work gives way
        self.metrics = Metrics()
        self.batch = BatchDraftLength()  # the cap on a cycle's drafts, and its cycles' costs
        self.running = 0
        self._thread = threading.Thread(target=self._run, name="mlx-spec-engine", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def submit(self, prompt: list[int], *, max_tokens: int, sampling: SamplingConfig) -> Job:
        job = Job(prompt, max_tokens, sampling)
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
                    running.append(self._start(self._waiting.popleft()))
                self.running = len(running)
            try:
                running = self._cycle(running)
            except Exception as e:  # noqa: BLE001 - a failing cycle ends its requests with
                for run in running:  # their error, never hangs them (nor the next ones)
                    run.job.events.put(e)
                    run.job.events.put(_DONE)
                running = []
            self.running = len(running)

    def _cycle(self, running: list[_Running]) -> list[_Running]:
        """Every request to its next round (or one plain step), the rounds' drafts (together
        where they can), then one pass for all."""
        start = time.perf_counter()
        capped = self._cap(running)
        running = [run for run in running if self._advance(run)]
        self._draft(running)
        running = [run for run in running
                   if not isinstance(run.item, Drafting) or self._advance(run)]
        rounds = [run for run in running if isinstance(run.item, Verify)]
        if rounds:
            together = [(run.item.conv, run.item.draft) for run in rounds]
            try:
                results = verify_together(together)
                if capped:  # the pass synced here, so the cycle is timed whole
                    mx.eval([a for pair in results for a in pair if a is not None])
            except Exception:  # noqa: BLE001 - each verifies alone: an error reaches its own job
                results = [None] * len(rounds)
            for run, result in zip(rounds, results, strict=True):
                run.reply, run.item = result, None
            one = batchable([conv for conv, _ in together]) and results[0] is not None
            self.metrics.verified(1 if one else len(rounds), len(rounds))
            if capped and one and len(rounds) > 1 and len(rounds) == len(running):
                # (not a cycle that ran a prefill chunk: a row without a round paused)
                self.batch.observe(len(rounds), max(draft.k for _, draft in together),
                                   time.perf_counter() - start)
        return self._prefill(running)

    def _prefill(self, running: list[_Running]) -> list[_Running]:
        """The paused requests' next prompt chunks, in one pass where they batch (else each
        runs alone when its turn resumes). A failed pass ends those requests with its error
        (their caches may hold part of it), never the others."""
        paused = [run for run in running if isinstance(run.item, Pause)]
        if len(paused) < 2:
            return running
        try:
            done = prefill_together([run.item for run in paused])
        except Exception as e:  # noqa: BLE001
            for run in paused:
                run.job.events.put(e)
                run.job.events.put(_DONE)
            gone = {id(run) for run in paused}
            return [run for run in running if id(run) not in gone]
        for run, reply in zip(paused, done, strict=True):
            run.reply, run.item = reply, None
        return running

    def _draft(self, running: list[_Running]) -> None:
        """The rounds about to draft get their drafts (draft_together) as their replies; an
        error leaves each to draft alone, where it reaches its own request."""
        rounds = [run for run in running if isinstance(run.item, Drafting)]
        if not rounds:
            return
        try:
            drafts: list[Draft | None] = list(draft_together([run.item for run in rounds]))
        except Exception:  # noqa: BLE001 - each drafts alone: an error reaches its own job
            drafts = [None] * len(rounds)
            for run in rounds:  # back to the committed sequence (a draft model may have
                conv = run.item.conv  # taken some of the batch's steps)
                conv.drafter.commit(conv.drafter_state, conv.draft_context(),
                                    len(conv.tokens) - 1)
        for run, draft in zip(rounds, drafts, strict=True):
            run.reply = draft

    def _cap(self, running: list[_Running]) -> bool:
        """Set this cycle's cap on every `auto` row's draft length (BatchDraftLength): the
        rows whose turn has begun, if there are two or more and they verify in one pass; else
        no cap, each policy choosing alone. True when capped."""
        rows = [run for run in running if run.conv.policy is not None]
        # each row priced by the policy that will choose its round (a ready copy's, or its
        # model's); the cap binds both
        policies: list[AdaptiveDraftLength] = [run.conv.round_policy() for run in rows]
        cap = None
        if len(rows) > 1 and batchable([run.conv for run in rows]):
            costs = self.engine.costs(policies[0].k_max).verify
            cap = self.batch.cap(policies, costs)
        for run in rows:
            for policy in (run.conv.policy, run.conv.copy_policy):
                if policy is not None:
                    policy.cap = cap
        return cap is not None

    def _advance(self, run: _Running) -> bool:
        """Run the request's turn up to its next verify pass, or through one plain step;
        False when the request is over (its end, or its error, handed to it)."""
        job = run.job
        while True:
            try:
                item: Any = run.turn.send(run.reply)
            except StopIteration:
                job.events.put(_DONE)
                return False
            except Exception as e:  # noqa: BLE001 - one failing request never ends the others
                job.events.put(e)
                job.events.put(_DONE)
                return False
            run.reply = None
            if isinstance(item, Drafting | Verify):
                run.item = item
                return True
            if isinstance(item, Pause):  # a prefill chunk is next: in the cycle's prefill
                run.item = item  # pass with the others' (_prefill), or alone when resumed
                return True
            if not self._hand(job, item):
                return False  # (plain tokens come as Verify rounds too: they wait for the batch)

    def _calibrate_while_idle(self) -> None:
        """Between requests: measure the target's costs if `auto` still reads a prior; a
        request arriving stops it between passes (it is tried again at the next idle)."""
        engine = self.engine
        if engine.draft_length != "auto" or engine.drafter is None or engine.calibrated:
            return
        self._arrived.clear()
        engine.calibrate(stop=self._arrived)

    def _start(self, job: Job) -> _Running:
        conv = self.engine.conversation()
        return _Running(job, conv, conv.steps(job.prompt, max_tokens=job.max_tokens,
                                              sampling=job.sampling, stop=job.stop))

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
            job.events.put(_DONE)
            return False
        return True


@dataclass
class _Running:
    """A running request: its turn, and what the turn waits for (its Drafting or Verify, then
    its reply)."""

    job: Job
    conv: Conversation  # its policy (set once the turn begins) takes each cycle's cap
    turn: Generator[Event | Drafting | Verify | Pause, Reply, None]
    item: Drafting | Verify | Pause | None = None
    reply: Reply = None
