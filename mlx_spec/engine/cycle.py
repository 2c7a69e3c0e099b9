"""Several turns advanced together, one cycle per call: the one exchange between a server and
the engine (as vLLM's scheduler hands its runner the running requests and gets back what each
produced).

`Batch.step(rows)` takes the running turns (each a conversation and its turn, played in rounds:
turn.steps) and advances every one to its next round: it resumes each with what the last cycle
ran for it and the cycle's cap on its draft length, collecting the events it emits until it asks
for its next round (or prompt chunk); then runs every round asked for — the drafts together
where the drafter can, ONE target pass over all of them where they batch (batch.py) — and the
prompt chunks of turns in their prefill in one pass. What comes back per row: its events, its
end, or its error (one failing request never ends the others). A new turn's prefill takes one
chunk per cycle, so the running ones keep flowing meanwhile.

The cap: before a cycle of two or more `auto` rows that verify in one pass, every row's draft
length is capped at the common k that maximises the batch's expected tokens per second, the
cycle priced at the measured cost of its pass's B·(k+1) tokens (BatchDraftLength); each cycle it
times feeds that cost back. One row alone is uncapped: its own policy chooses, as in generate.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx

from ..drafters import Draft
from ..events import Event, TurnEnd
from ..sampling import SamplingConfig
from .batch import batch_key, draft_together, prefill_together, same_key, verify_together
from .batch_length import BatchDraftLength
from .conversation import Conversation
from .costbook import CostBook
from .rounds import Due, PrefillDue, Prefilled, Resume, RoundDue, RoundRan
from .turn import Turn, steps


@dataclass(eq=False)
class Row:
    """A running turn: its conversation, the turn, what it asked for last (None: not started),
    and what this cycle ran for it."""

    conv: Conversation
    turn: Turn
    due: Due | None = None
    ran: RoundRan | Prefilled | None = None
    started: bool = False


@dataclass(frozen=True)
class Produced:
    """What a row produced in a cycle: its events (TokenEvents, then a TurnEnd where it
    ended), or the error that ended it."""

    events: list[Event] = field(default_factory=list)
    error: BaseException | None = None
    ended: bool = False  # the turn is over (its TurnEnd is the last event, if it got that far)

    @property
    def over(self) -> bool:
        return self.ended or self.error is not None


@dataclass(frozen=True)
class Cycle:
    """A cycle's result: per row (in the order given) what it produced; the target passes its
    rounds ran as (1: all in one pass) over how many rounds; and the rows whose prompt chunks
    ran in one prefill pass (0: none did; a lone chunk runs inside its turn)."""

    produced: list[Produced]
    passes: int = 0
    rounds: int = 0
    prefilled: int = 0


class Batch:
    """The driver of several turns on one engine's weights (the server's engine thread)."""

    def __init__(self, costbook: CostBook):
        self.costbook = costbook
        self.length = BatchDraftLength()  # the cap on a cycle's drafts, and its cycles' costs
        self.cap: int | None = None  # the cap the rounds now asked for were chosen under
        self._resumed = 0.0  # when the last step began resuming its rows (see step)

    def start(self, conv: Conversation, prompt: list[int], *, max_tokens: int,
              sampling: SamplingConfig | None = None, stop: threading.Event | None = None,
              ignore_eos: bool = False, trace: bool = False) -> Row:
        """A new turn on `conv` (turn.steps' options); the next step() starts it."""
        return Row(conv, steps(conv, prompt, max_tokens=max_tokens, sampling=sampling,
                               stop=stop, ignore_eos=ignore_eos, trace=trace))

    def step(self, rows: list[Row]) -> Cycle:
        """One cycle: new rows started (up to their first round or chunk); every round asked
        for run (the drafts together, one pass where they batch) and the paused rows' prompt
        chunks; then every row resumed with what ran for it and the next cap, its events
        collected until it asks again. Rows that end (Produced.over) are done: drop them."""
        produced = {row: self._advance(row, None) if not row.started else Produced()
                    for row in rows}
        waiting = [row for row in rows if not produced[row].over]
        # asked once a cycle, row by row: rows with one batch key verify (and prefill) together
        key = {row: batch_key(row.conv) for row in waiting}

        def together(some: list[Row]) -> bool:
            return len(some) > 1 and same_key([key[row] for row in some])

        rounds = [row for row in waiting if isinstance(row.due, RoundDue)]
        passes = widest = 0
        if rounds:
            one = together(rounds)
            ran = run_rounds([(row.conv, row.due) for row in rounds], sync=self.cap is not None,
                             together=one)
            for row, result in zip(rounds, ran, strict=True):
                row.ran = result
            ran_one = one and ran[0] is not None and ran[0].logits is not None
            passes = 1 if ran_one else len(rounds)
            widest = max((r.draft.k for r in ran if r is not None), default=0)
        paused = [r for r in waiting if isinstance(r.due, PrefillDue)]
        failed = self._prefill(paused, together(paused))
        for row, error in failed.items():
            produced[row] = Produced(produced[row].events, error, ended=True)
        prefilled = len(paused) if len(paused) > 1 and not failed and paused[0].ran else 0
        if self.cap is not None and passes == 1 and 1 < len(rounds) == len(waiting):
            # a capped cycle priced whole: from its rounds' choice (the last resume: the rows'
            # commits and decisions) through their drafts and ONE synced pass; not a cycle
            # that ran a prefill chunk (a row without a round paused). Seen before the next
            # cap is chosen.
            self.length.observe(len(rounds), widest, time.perf_counter() - self._resumed)
        self.cap = self._cap([row for row in waiting if row.conv.policy is not None], together)
        self._resumed = time.perf_counter()
        for row in waiting:  # each resumed with what ran for it (or it runs it alone)
            if not produced[row].over:
                out = self._advance(row, self.cap)
                produced[row] = Produced(produced[row].events + out.events, out.error, out.ended)
        return Cycle([produced[row] for row in rows], passes, len(rounds), prefilled)

    def _cap(self, rows: list[Row], together: Callable[[list[Row]], bool]) -> int | None:
        """The cap on every `auto` row's next draft length (BatchDraftLength): over the rows
        whose turn has begun (`rows`), if they verify in one pass (`together`); else None,
        each policy choosing alone."""
        if not together(rows):
            return None
        begun = [row.conv for row in rows]
        # each row priced by the policy that will choose its round (a ready copy's, or its
        # model's); the cap binds both
        policies = [conv.round_policy() for conv in begun]
        return self.length.cap(policies, self.costbook.costs(policies[0].max_draft).verify)

    def _advance(self, row: Row, cap: int | None) -> Produced:
        """Resume the row's turn with what ran for it and the cap (a new one: start it),
        collecting its events until it asks for its next round or chunk, or ends."""
        events: list[Event] = []
        resume = Resume(row.ran, cap) if row.started else None
        row.started, row.ran, row.due = True, None, None
        while True:
            try:
                item = row.turn.send(resume)
            except StopIteration:
                return Produced(events, ended=True)
            except Exception as e:  # noqa: BLE001 - one failing request never ends the others
                return Produced(events, e)
            resume = None
            if isinstance(item, RoundDue | PrefillDue):
                row.due = item
                return Produced(events)
            events.append(item)
            if isinstance(item, TurnEnd):
                row.turn.close()
                return Produced(events, ended=True)

    def _prefill(self, paused: list[Row], together: bool) -> dict[Row, BaseException]:
        """The paused rows' next prompt chunks, in one pass where they batch (`together`; else
        each runs alone when its turn resumes). A failed pass ends those rows with its error
        (their caches may hold part of it), never the others."""
        if not together:
            return {}
        try:
            done = prefill_together([(row.conv, row.due) for row in paused], together=True)
        except Exception as e:  # noqa: BLE001
            return {row: e for row in paused}
        for row, reply in zip(paused, done, strict=True):
            row.ran = reply
        return {}


def run_rounds(rounds: list[tuple[Conversation, RoundDue]], *, sync: bool = False,
               together: bool | None = None) -> list[RoundRan | None]:
    """The rounds' drafts (together where the drafter can) and their verify pass (one for all
    where they batch), timed as a whole; sync: wait for the pass, so a cycle is timed whole.
    A failed batched draft leaves each to draft alone from its committed sequence (the pass
    still shared); a failed pass, each to verify alone (logits None); where even that fails,
    every round runs alone (None), so an error reaches its own request. together: whether
    they verify in one pass, where the caller knows (verify_together)."""
    t = time.perf_counter()
    try:
        drafts = draft_together(rounds)
    except Exception:  # noqa: BLE001 - each drafts alone, the pass still shared
        try:
            drafts = draft_alone(rounds)
        except Exception:  # noqa: BLE001 - each runs alone: an error reaches its own request
            return [None] * len(rounds)
    draft_s = time.perf_counter() - t
    t = time.perf_counter()
    try:
        rows = verify_together([(conv, d) for (conv, _), d in zip(rounds, drafts, strict=True)],
                               together=together)
        if sync:
            mx.eval([a for pair in rows for a in pair if a is not None])
    except Exception:  # noqa: BLE001 - each verifies alone
        return [RoundRan(d, draft_s, None, None, 0.0) for d in drafts]
    verify_s = time.perf_counter() - t
    return [RoundRan(d, draft_s, logits, hidden, verify_s)
            for d, (logits, hidden) in zip(drafts, rows, strict=True)]


def draft_alone(rounds: list[tuple[Conversation, RoundDue]]) -> list[Draft]:
    """Each round's drafts on its own, each drafter first cut back to its committed sequence
    (a batched draft that failed may have taken some of its steps)."""
    for conv, _ in rounds:
        conv.drop_drafts()
    return [conv.draft(due.k, due.sampler, split=due.split, copy=due.copy)
            for conv, due in rounds]
