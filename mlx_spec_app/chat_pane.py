"""The chat pane, and the one owner of its turns.

`ChatPane` holds the conversation (and its id in the history), the answer in progress with its
stop handle, and the last finished turn (what a race re-runs). What it needs from outside comes
down: the engine and its baseline (`attach`, again when the baseline arrives: answers shown
before it get their speedup then), each turn's settings (`send`, `regenerate`, `race`),
highlighting (`set_highlight`), and `take_engine`, which a turn's thread calls before its first
engine call (the app's idle work stops and returns first). What the app needs to hear goes up
as messages: `ChatPane.Finished` and `ChatPane.Failed`. The app decides when a turn may start
(the engine is idle); the verbs say whether one started.

A turn and a race are the same worker; tokens reach the answer through a TokenBuffer drained on a
paced timer (stream.py), never a call_from_thread per token; the end or the failure comes back to
the pane as a TurnFinished message.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from textual import work
from textual.containers import VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.timer import Timer
from textual.widgets import Static

from mlx_spec import (
    Baseline,
    EngineService,
    Recorder,
    RoundTrace,
    TokenEvent,
    Trace,
    TurnEnd,
    TurnStats,
    engine_fields,
    user_message,
)

from .history import COMPLETE, STOPPED, STREAMING, History
from .race import RaceScreen, label
from .settings import Settings
from .stream import FramePacer, TokenBuffer
from .widgets import INTERRUPTED, Answer, UserMessage, stats_line

SAVE_EVERY_S = 1.0  # the streaming answer is written at most this often (kill -9 loses less)
Messages = list[dict[str, str]]


@dataclass(frozen=True)
class LastTurn:
    """What the race re-runs (the conversation before the answer), and what it compares with."""

    messages: Messages
    end: TurnEnd
    answer: Answer


class TurnFinished(Message):
    """A turn or race ended (end) or failed (error): posted by the worker to the pane."""

    bubble = False

    def __init__(self, end: TurnEnd | None, error: str = "", race: bool = False,
                 trace: Trace | None = None) -> None:
        super().__init__()
        self.end, self.error, self.race, self.trace = end, error, race, trace


class ChatPane(VerticalScroll):
    """The conversation on screen and in the history, and the turns that extend it."""

    class Finished(Message):
        """A turn or a race ended; stats: the turn's (None for a race)."""

        def __init__(self, stats: TurnStats | None) -> None:
            super().__init__()
            self.stats = stats

    class Failed(Message):
        """A turn or a race failed (the pane showed why); unsent: the user's message that was
        taken back, for the input box."""

        def __init__(self, unsent: str | None) -> None:
            super().__init__()
            self.unsent = unsent

    def __init__(self, history: History, *, take_engine: Callable[[], object] = lambda: None,
                 **kwargs) -> None:
        """take_engine: called in a turn's thread before it uses the engine; it returns once
        nothing else is using it."""
        super().__init__(**kwargs)
        self.history = history
        self._take_engine = take_engine
        self.engine: EngineService | None = None
        self.baseline: Baseline | None = None  # None: not measured yet ("estimating…")
        self._estimating: list[Answer] = []  # finished before the baseline came
        self.highlight = True
        self.ghosts = False  # rejected drafts shown, struck out (the app remembers the choice)
        self.messages: Messages = []
        self.conversation: int | None = None
        self.answer: Answer | None = None  # the answer being streamed
        self.stop_event = threading.Event()
        self.last_turn: LastTurn | None = None
        self._settings = Settings()  # the running (or last) turn's
        self._sent: tuple[str, int] | None = None  # (text, message id) of an unanswered send
        self._saving: int | None = None  # the row of the answer streaming now
        self._saved_at = 0.0
        self.buffer = TokenBuffer()
        self.pacer = FramePacer()
        self._flush_timer: Timer | None = None

    # -- what comes down -----------------------------------------------------------------------

    def attach(self, engine: EngineService, baseline: Baseline | None) -> None:
        """The engine the next turns run on, and the baseline their speedups are quoted on
        (None: not measured yet). A baseline for the same engine also completes the stats lines
        of the answers that ended before it came."""
        if engine is not self.engine:
            self._estimating.clear()
        self.engine, self.baseline = engine, baseline
        if baseline is not None:
            self._requote(baseline)

    def _requote(self, baseline: Baseline) -> None:
        """The answers shown with "speedup: estimating…": their stats lines with the speedup."""
        for answer in self._estimating:
            if answer.is_attached and answer.stats is not None:
                answer.show_line(stats_line(answer.stats, baseline))
        self._estimating.clear()

    def set_ghosts(self, on: bool) -> None:
        """Rejected drafts shown or hidden, in every answer shown and those to come."""
        self.ghosts = on
        for answer in self.query(Answer):
            answer.set_ghosts(on)

    def set_highlight(self, on: bool) -> None:
        """Token colours on or off, for every answer shown and those to come."""
        self.highlight = on
        for answer in self.query(Answer):
            answer.set_highlight(on)

    # -- verbs ---------------------------------------------------------------------------------

    def send(self, text: str, settings: Settings) -> None:
        """Start a turn answering `text` (the engine is idle). The conversation is saved with
        the model it is held with."""
        if self.conversation is None:
            model = self.engine.info.target if self.engine is not None else ""
            self.conversation = self.history.new_conversation(text, model=model)
        self._sent = (text, self.history.add_message(self.conversation, "user", text))
        self.messages.append({"role": "user", "content": text})
        self.mount(UserMessage(text))
        self._start_turn(settings)

    def regenerate(self, settings: Settings) -> bool:
        """The last answer again (greedy: the same answer); False when there is none yet."""
        if not self.messages:
            self.notify("Nothing to regenerate yet.", severity="warning")
            return False
        if self.messages[-1]["role"] == "assistant":
            self.messages.pop()
            if self.conversation is not None:
                self.history.delete_last_answer(self.conversation)
            self.query(Answer).last().remove()
        self._sent = None
        self._start_turn(settings)
        return True

    def race(self, settings: Settings, against: str = "none") -> bool:
        """The last prompt again on the same weights, target-only ("none") or with another
        drafter (its kind), on a conversation of its own (the chat's drafter and caches are
        never touched), and both speeds side by side — for a drafter, both answers in their
        colours (RaceScreen). False: nothing to race."""
        if self.last_turn is None:
            self.notify("Race needs a finished answer first.", severity="warning")
            return False
        self._settings = settings
        self.stop_event = threading.Event()
        tokens = max(self.last_turn.end.stats.generated_tokens, 1)
        self._run(self._engine(), self.last_turn.messages, settings, self.stop_event,
                  race=True, max_tokens=tokens, against=against)
        return True

    def stop(self) -> None:
        """Stop the turn or race in progress (each has its own event: a late esc cannot stop
        the next one)."""
        self.stop_event.set()

    def clear(self) -> None:
        self.messages, self.conversation, self.last_turn = [], None, None
        self._estimating.clear()
        self.remove_children()

    def note(self, text: str) -> None:
        """A line from the app (what the demo is), not part of the conversation."""
        self.mount(Static(Content(text), classes="note"))

    def open(self, conversation: int) -> None:
        """Show a saved conversation (the engine re-prefills it on the next turn by itself)."""
        self.clear()
        self.conversation = conversation
        for m in self.history.messages(conversation):
            self.messages.append({"role": m["role"], "content": m["content"]})
            self.mount(UserMessage(m["content"]) if m["role"] != "assistant"
                       else self._saved_answer(m))
        self.anchor()

    def last_answer(self) -> Answer | None:
        """The last finished answer (not the one streaming)."""
        answers = [a for a in self.query(Answer) if a is not self.answer]
        return answers[-1] if answers else None

    def _saved_answer(self, m: dict) -> Answer:
        answer = Answer(self.highlight, self.ghosts)
        answer.extend([(text, kind) for text, kind in m["kinds"] or [[m["content"], "target"]]])
        stats = TurnStats.from_dict(m["stats"]) if m["stats"] else None
        # no speedup: the baseline measured now is not the one the answer was timed against
        if m["partial"] == STREAMING:  # the app ended while this answer streamed
            answer.finish(None, f"{INTERRUPTED} · saved as far as it got")
        else:
            answer.finish(stats, (stats_line(stats, None, speedup=False) + " · saved")
                          if stats else "saved")
        answer.partial = m["partial"] != COMPLETE
        return answer

    # -- a turn --------------------------------------------------------------------------------

    def _engine(self) -> EngineService:
        assert self.engine is not None, "the app starts turns only on an attached engine"
        return self.engine

    def engine_messages(self) -> Messages:
        """The conversation as the engine gets it: the system prompt, then the messages."""
        system = self._settings.system_prompt
        return ([{"role": "system", "content": system}] if system else []) + list(self.messages)

    def _start_turn(self, settings: Settings) -> None:
        self._settings = settings
        self.answer = Answer(self.highlight, self.ghosts)
        self.mount(self.answer)
        self.anchor()
        self.buffer.reset()
        if self.conversation is not None:  # saved as it streams: a killed app keeps it
            self._saving = self.history.add_message(self.conversation, "assistant", "",
                                                    partial=STREAMING)
            self._saved_at = time.monotonic()
        self.stop_event = threading.Event()  # one per turn: a late esc cannot stop the next
        self._run(self._engine(), self.engine_messages(), settings, self.stop_event,
                  race=False, max_tokens=settings.max_tokens)
        if self._flush_timer is not None:
            self._flush_timer.stop()
        self._flush_timer = self.set_timer(self.pacer.start(), self._tick)

    @work(thread=True, exclusive=True, group="gen")
    def _run(self, engine: EngineService, messages: Messages, settings: Settings,
             stop: threading.Event, *, race: bool, max_tokens: int,
             against: str = "none") -> None:
        """The worker for turns and races: tokens into the buffer (a race shows none), the end
        or the failure as a TurnFinished. A turn is traced, and a race with a drafter (not one
        target-only): a turn's rounds bring the rejected drafts to the buffer, and the whole
        record comes with its end."""
        self._take_engine()
        recorder = Recorder()
        plain = race and against == "none"
        try:
            for ev in engine.chat(messages, max_tokens=max_tokens, sampling=settings.sampling,
                                  stop=stop, target_only=plain, trace=not plain,
                                  drafter=against if race and not plain else None):
                recorder.add(ev)
                if isinstance(ev, TokenEvent):
                    if not race:
                        self.buffer.push(ev)
                elif isinstance(ev, RoundTrace):
                    if not race:
                        self.buffer.push_round(ev)
                else:
                    info = engine.info
                    about = engine_fields(info.target, info.drafter, info.draft_length,
                                          info.split)
                    trace = None if plain else recorder.trace(
                        engine=about, sampling=settings.sampling, messages=messages)
                    self.post_message(TurnFinished(ev, race=race, trace=trace))
        except Exception as e:  # noqa: BLE001 - one line for the user, never a traceback
            what = "race failed" if race else "generation failed"
            self.post_message(TurnFinished(None, user_message(e, what), race))

    def _tick(self) -> None:
        """Flush, then come back after as long as the pacer says, while an answer streams."""
        self.flush()
        if self.answer is not None:
            self._flush_timer = self.set_timer(self.pacer.next_delay(), self._tick)
        else:
            self._flush_timer = None

    def flush(self) -> None:
        """Move buffered tokens into the streaming answer (on the UI thread)."""
        if self.answer is None or not len(self.buffer):
            return
        self.answer.extend(self.buffer.drain())  # only the answer's live tail is redrawn
        if self._saving is not None and time.monotonic() - self._saved_at >= SAVE_EVERY_S:
            self.history.update_message(self._saving, self.answer.text, kinds=self.answer.runs,
                                        partial=STREAMING)
            self._saved_at = time.monotonic()

    def on_turn_finished(self, msg: TurnFinished) -> None:
        if msg.end is None:
            self._failed(msg.error, "Race failed" if msg.race else "Not sent")
        elif msg.race:
            self._race_done(msg.end, msg.trace)
        else:
            self._turn_done(msg.end, msg.trace)

    def _turn_done(self, end: TurnEnd, trace: Trace | None = None) -> None:
        self.flush()
        answer, self.answer = self.answer, None
        s = end.stats
        if answer is not None:
            answer.trace = trace
            answer.finish(s, stats_line(s, self.baseline))
            if self.baseline is None:
                self._estimating.append(answer)
            self.messages.append({"role": "assistant", "content": answer.text})
            if self._saving is not None:
                self.history.update_message(self._saving, answer.text, kinds=answer.runs,
                                            stats=s.to_dict(),
                                            partial=STOPPED if answer.partial else COMPLETE)
            self.last_turn = LastTurn(self.engine_messages()[:-1], end, answer)
        self._saving = None
        self._sent = None
        self.post_message(self.Finished(s))

    def _race_done(self, other: TurnEnd, trace: Trace | None = None) -> None:
        last = self.last_turn
        if last is not None:
            sampling = self._settings.sampling
            line = race_line(last.end, other, sampling.temperature == 0,
                             seeded=sampling.invariant)
            if last.answer.is_attached:
                last.answer.show_race(line)
            if trace is not None and last.answer.trace is not None and \
                    other.finish_reason != "cancelled":
                self.app.push_screen(RaceScreen([(last.end, last.answer.trace), (other, trace)],
                                                line, self.baseline, ghosts=self.ghosts))
            else:
                self.notify(line, title="Race", timeout=8)
        self.post_message(self.Finished(None))

    def _failed(self, text: str, title: str) -> None:
        """E.g. a prompt longer than the context: forget the message, give its text back."""
        self.buffer.reset()
        if self.answer is not None:
            self.answer.remove()
            self.answer = None
        if self._saving is not None:
            self.history.delete_message(self._saving)
            self._saving = None
        unsent = self._take_back()
        self.notify(text, title=title, severity="error", timeout=10)
        self.post_message(self.Failed(unsent))

    def _take_back(self) -> str | None:
        """Remove the unanswered user message (screen, history, conversation); its text."""
        if self._sent is None:
            return None
        sent, mid = self._sent
        self._sent = None
        self.history.delete_message(mid)
        self.messages.pop()
        self.query(UserMessage).last().remove()
        if not self.messages and self.conversation is not None:
            self.history.delete(self.conversation)
            self.conversation = None
        return sent


def race_line(spec: TurnEnd, plain: TurnEnd, greedy: bool, *, seeded: bool = False) -> str:
    """Both runs' speed side by side (the race's: target-only, or another drafter); for greedy
    runs, whether the tokens were the same; for seeded ones (drafter-invariant sampling) that
    they were, as they must be."""
    if plain.finish_reason == "cancelled":
        return "race stopped"
    a, b = spec.stats, plain.stats
    line = (f"race · speculative ({a.drafter}) {a.tok_s:.1f} tok/s │ {label(b.drafter)} "
            f"{b.tok_s:.1f} tok/s │ ×{a.tok_s / b.tok_s if b.tok_s else 0:.2f}")
    if greedy:
        n = min(len(spec.tokens), len(plain.tokens))
        same = spec.tokens[:n] == plain.tokens[:n]
        line += " │ same tokens" if same else " │ outputs differ (a near-tie)"
    elif seeded:
        n = min(len(spec.tokens), len(plain.tokens))
        same = spec.tokens[:n] == plain.tokens[:n]
        line += (" │ same tokens (seeded)" if same else
                 " │ outputs differ (seeded: they must not, please report it)")
    return line
