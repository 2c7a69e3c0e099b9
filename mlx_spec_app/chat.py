"""The chat pane, and the one owner of its turns.

`Chat` holds the conversation (and its id in the history), the answer in progress with its stop
handle, the last finished turn (what a race re-runs), and what the engine is doing (`Busy`).
The app's keys and screens call its verbs: `send`, `regenerate`, `race`, `stop`, `clear`,
`open`. A turn and a race are the same worker; tokens reach the answer through a TokenBuffer
drained on a paced timer (stream.py), turn ends and failures come back as messages.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from textual import work
from textual.containers import VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.timer import Timer
from textual.widgets import Static

from mlx_spec import TokenEvent, TurnEnd, TurnStats, user_message

from .history import COMPLETE, STOPPED, STREAMING, History
from .settings import Settings
from .stream import FramePacer, TokenBuffer
from .widgets import INTERRUPTED, Answer, UserMessage, stats_line

SAVE_EVERY_S = 1.0  # the streaming answer is written at most this often (kill -9 loses less)

if TYPE_CHECKING:
    from .app import SpecChatApp


class Busy(Enum):
    """What the engine is doing; falsy when idle. `Chat.status` adds the detail."""

    IDLE = ""
    LOADING = "loading"
    MEASURING = "measuring the baseline…"
    SWITCHING = "switching"
    GENERATING = "generating"
    RACING = "racing target-only…"
    NOT_LOADED = "model not loaded"

    def __bool__(self) -> bool:
        return self is not Busy.IDLE

    @property
    def streaming(self) -> bool:
        """The engine runs a turn (esc stops it)."""
        return self in (Busy.GENERATING, Busy.RACING)


@dataclass(frozen=True)
class LastTurn:
    """What the race re-runs (the conversation before the answer), and what it compares with."""

    messages: list[dict[str, str]]
    end: TurnEnd
    answer: Answer


class TurnFinished(Message):
    """A turn or race ended (end) or failed (error): posted by the worker."""

    def __init__(self, end: TurnEnd | None, error: str = "", race: bool = False) -> None:
        super().__init__()
        self.end, self.error, self.race = end, error, race


class Chat(VerticalScroll):
    def __init__(self, history: History, **kwargs) -> None:
        super().__init__(**kwargs)
        self.history = history
        self.messages: list[dict[str, str]] = []
        self.conversation: int | None = None
        self.answer: Answer | None = None  # the answer being streamed
        self.stop_event = threading.Event()
        self.last_turn: LastTurn | None = None
        self.busy = Busy.LOADING
        self.detail = ""  # e.g. the model being loaded
        self._sent: tuple[str, int] | None = None  # (text, message id) of an unanswered send
        self._saving: int | None = None  # the row of the answer streaming now
        self._saved_at = 0.0
        self.buffer = TokenBuffer()
        self.pacer = FramePacer()
        self._flush_timer: Timer | None = None

    @property
    def spec_app(self) -> SpecChatApp:
        return self.app  # type: ignore[return-value]

    @property
    def status(self) -> str:
        return f"{self.busy.value} {self.detail}…" if self.detail else self.busy.value

    def why_busy(self) -> str | None:
        """None when a turn can start now; else why not."""
        if self.spec_app.engine is None:
            return "The model is not loaded yet."
        if self.busy:
            return f"Busy ({self.status.rstrip('…')}): press esc to stop."
        return None

    # -- verbs ---------------------------------------------------------------------------------

    def send(self, text: str, title: str) -> bool:
        """Start a turn answering `text`; False (and a notice) when it cannot start."""
        if (why := self.why_busy()) is not None:
            self.notify(why, severity="warning")
            return False
        if self.conversation is None:
            self.conversation = self.history.new_conversation(text, title)
        self._sent = (text, self.history.add_message(self.conversation, "user", text))
        self.messages.append({"role": "user", "content": text})
        self.mount(UserMessage(text))
        self._start_turn()
        return True

    def regenerate(self) -> None:
        if (why := self.why_busy()) is not None:
            self.notify(why, severity="warning")
            return
        if not self.messages:
            self.notify("Nothing to regenerate yet.", severity="warning")
            return
        if self.messages[-1]["role"] == "assistant":
            self.messages.pop()
            if self.conversation is not None:
                self.history.delete_last_answer(self.conversation)
            self.query(Answer).last().remove()
        self._sent = None
        self._start_turn()

    def race(self) -> None:
        """The last prompt again, target-only on the same weights (the main engine's drafter
        and caches are never touched), and both speeds side by side."""
        if (why := self.why_busy()) is not None:
            self.notify(why, severity="warning")
            return
        if self.last_turn is None:
            self.notify("Race needs a finished answer first.", severity="warning")
            return
        self.stop_event = threading.Event()
        self.spec_app.set_busy(Busy.RACING)
        tokens = max(self.last_turn.end.stats.generated_tokens, 1)
        self._run(self.last_turn.messages, self.spec_app.settings, self.stop_event,
                  race=True, max_tokens=tokens)

    def stop(self) -> None:
        if self.busy.streaming:
            self.stop_event.set()

    def clear(self) -> None:
        self.messages, self.conversation, self.last_turn = [], None, None
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

    def _saved_answer(self, m: dict) -> Answer:
        answer = Answer(self.spec_app.highlight)
        answer.extend([(text, kind) for text, kind in m["kinds"] or [[m["content"], "target"]]])
        stats = TurnStats.from_dict(m["stats"]) if m["stats"] else None
        # no speedup: the baseline measured now is not the one the answer was timed against
        if m["partial"] == STREAMING:  # the app ended while this answer streamed
            answer.finish(None, f"{INTERRUPTED} · saved as far as it got")
        else:
            answer.finish(stats, (stats_line(stats, None) + " · saved") if stats else "saved")
        answer.partial = m["partial"] != COMPLETE
        return answer

    # -- a turn --------------------------------------------------------------------------------

    def engine_messages(self) -> list[dict[str, str]]:
        system = self.spec_app.settings.system_prompt
        return ([{"role": "system", "content": system}] if system else []) + list(self.messages)

    def _start_turn(self) -> None:
        self.answer = Answer(self.spec_app.highlight)
        self.mount(self.answer)
        self.anchor()
        self.buffer.drain()
        if self.conversation is not None:  # saved as it streams: a killed app keeps it
            self._saving = self.history.add_message(self.conversation, "assistant", "",
                                                    partial=STREAMING)
            self._saved_at = time.monotonic()
        self.stop_event = threading.Event()  # one per turn: a late esc cannot stop the next
        self.spec_app.set_busy(Busy.GENERATING)
        settings = self.spec_app.settings
        self._run(self.engine_messages(), settings, self.stop_event, race=False,
                  max_tokens=settings.max_tokens)
        if self._flush_timer is not None:
            self._flush_timer.stop()
        self._flush_timer = self.set_timer(self.pacer.start(), self._tick)

    @work(thread=True, exclusive=True, group="gen")
    def _run(self, messages: list[dict[str, str]], settings: Settings, stop: threading.Event,
             *, race: bool, max_tokens: int) -> None:
        """The worker for turns and races: tokens into the buffer (a race shows none), the end
        or the failure as a TurnFinished."""
        engine = self.spec_app.engine
        assert engine is not None
        try:
            for ev in engine.chat(messages, max_tokens=max_tokens, sampling=settings.sampling,
                                  stop=stop, target_only=race):
                if isinstance(ev, TokenEvent):
                    if not race:
                        self.buffer.push(ev)
                else:
                    self.post_message(TurnFinished(ev, race=race))
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
        msg.stop()  # handled here; the app hears of it through turn_ended / set_busy
        if msg.end is None:
            self._failed(msg.error, "Race failed" if msg.race else "Not sent")
        elif msg.race:
            self._race_done(msg.end)
        else:
            self._turn_done(msg.end)

    def _turn_done(self, end: TurnEnd) -> None:
        self.flush()
        answer, self.answer = self.answer, None
        s = end.stats
        if answer is not None:
            answer.finish(s, stats_line(s, self.spec_app.baseline))
            self.messages.append({"role": "assistant", "content": answer.text})
            if self._saving is not None:
                self.history.update_message(self._saving, answer.text, kinds=answer.runs,
                                            stats=s.to_dict(),
                                            partial=STOPPED if answer.partial else COMPLETE)
            self.last_turn = LastTurn(self.engine_messages()[:-1], end, answer)
        self._saving = None
        self._sent = None
        self.spec_app.turn_ended(s)

    def _race_done(self, plain: TurnEnd) -> None:
        self.spec_app.set_busy(Busy.IDLE)
        last = self.last_turn
        if last is None:
            return
        line = race_line(last.end, plain, self.spec_app.settings.sampling.temperature == 0)
        if last.answer.is_attached:
            last.answer.show_race(line)
        self.notify(line, title="Race", timeout=8)

    def _failed(self, text: str, title: str) -> None:
        """E.g. a prompt longer than the context: forget the message, give its text back."""
        self.buffer.drain()
        if self.answer is not None:
            self.answer.remove()
            self.answer = None
        if self._saving is not None:
            self.history.delete_message(self._saving)
            self._saving = None
        if self._sent is not None:
            sent, mid = self._sent
            self._sent = None
            self.history.delete_message(mid)
            self.messages.pop()
            self.query(UserMessage).last().remove()
            self.spec_app.give_back(sent)
            if not self.messages and self.conversation is not None:
                self.history.delete(self.conversation)
                self.conversation = None
        self.spec_app.set_busy(Busy.IDLE)
        self.notify(text, title=title, severity="error", timeout=10)
        self.spec_app.restart_if_dead()


def race_line(spec: TurnEnd, plain: TurnEnd, greedy: bool) -> str:
    """Both runs' speed side by side; for greedy runs, whether the tokens were the same."""
    if plain.finish_reason == "cancelled":
        return "race stopped"
    a, b = spec.stats, plain.stats
    line = (f"race · speculative ({a.drafter}) {a.tok_s:.1f} tok/s │ target-only "
            f"{b.tok_s:.1f} tok/s │ ×{a.tok_s / b.tok_s if b.tok_s else 0:.2f}")
    if greedy:
        n = min(len(spec.tokens), len(plain.tokens))
        same = spec.tokens[:n] == plain.tokens[:n]
        line += " │ same tokens" if same else " │ outputs differ (a near-tie)"
    return line
