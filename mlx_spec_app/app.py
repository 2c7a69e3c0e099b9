"""The chat app.

The engine runs in a child process (mlx_spec.EngineProcess: its own GIL, so the UI's Python never
stalls it), driven from worker threads one call at a time (every action that would start another
waits until the app is idle). Tokens reach the UI through a TokenBuffer that a paced timer drains
(at most 30 times a second, less when frames are costly: see FramePacer); turn ends and failures
arrive as messages.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Header, Static

from mlx_spec import (
    Baseline,
    EngineInThread,
    EngineProcess,
    EngineService,
    MlxSpecError,
    TokenEvent,
)

from .actions import HistoryActions, SettingsActions, ViewActions
from .history import History
from .race import RACING, LastTurn, RaceMixin
from .screens import LoadErrorScreen
from .session import SessionTotals
from .settings import Settings
from .stream import (
    EngineReady,
    FramePacer,
    LoadFailed,
    TokenBuffer,
    TurnDone,
    TurnFailed,
    one_line,
)
from .widgets import LEGEND, Answer, PromptInput, StatsPanel, UserMessage, stats_line

# With the engine in this process (EngineInThread: tests, MLX_SPEC_ENGINE=thread), its thread
# needs the GIL back the moment an MLX evaluation returns; Python's default 5 ms switch interval
# lets a UI frame in progress keep it that long. Set while the app runs, restored when it ends.
GIL_SWITCH_S = 0.001
GENERATING = "generating"
STREAMING = (GENERATING, RACING)  # states in which the engine runs a turn


class SpecChatApp(ViewActions, SettingsActions, HistoryActions, RaceMixin, App[None]):
    """The chat. Turns and loading live here; the other actions in actions.py and race.py."""

    TITLE = "mlx-spec"
    CSS_PATH = "app.tcss"
    BINDINGS = [
        Binding("escape", "stop", "stop"),
        Binding("ctrl+r", "regenerate", "regenerate"),
        Binding("ctrl+n", "new_chat", "new chat"),
        Binding("ctrl+o", "conversations", "history"),
        Binding("ctrl+s", "settings", "settings"),
        Binding("ctrl+t", "toggle_highlight", "highlight"),
        Binding("ctrl+g", "toggle_markdown", "markdown"),
        Binding("f5", "race", "race"),
        Binding("f8", "copy_answer", "copy", show=False),
        Binding("f9", "copy_code", "copy code", show=False),
        Binding("f1", "help", "help"),
    ]

    def __init__(self, *, model: str | None = None, drafter: str = "auto",
                 draft_model: str | None = None, mtp: str | None = None,
                 num_draft: int | str = 4, engine: EngineService | None = None,
                 baseline: Baseline | None = None, history: History | None = None) -> None:
        """engine / baseline: already loaded ones (tests, the overhead script; the caller closes
        that engine); else the app starts `model` (or the last used one, or the demo pair) in an
        engine process of its own, and closes it on exit."""
        super().__init__()
        self.history = history or History()
        self.load_args: dict[str, Any] = dict(model=model, drafter=drafter,
                                              draft_model=draft_model, mtp=mtp,
                                              num_draft=num_draft)
        self.engine: EngineService | None = None
        self.baseline = baseline
        self._given_engine = engine
        self.settings = Settings.restore(self.history.get("settings"), num_draft=num_draft)
        self.messages: list[dict[str, str]] = []
        self.conversation: int | None = None
        self.buffer = TokenBuffer()
        self.stop_event = threading.Event()
        self.answer: Answer | None = None  # the answer being streamed
        self.busy = "loading"  # "" when idle; else what the engine is doing
        self.highlight = True
        self.totals = SessionTotals()
        self.last_turn: LastTurn | None = None
        self._sent: tuple[str, int] | None = None  # (text, message id) of an unanswered send
        self.pacer = FramePacer()
        self._flush_timer: Timer | None = None

    # -- layout --------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="body"):
            with Vertical(id="main"):
                yield VerticalScroll(id="chat")
                with Horizontal(id="bar"):
                    yield Static(LEGEND, id="legend")
                    yield Static("", id="status")
                yield PromptInput(id="prompt")
            yield StatsPanel(id="panel")
        yield Footer()

    def on_mount(self) -> None:
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(GIL_SWITCH_S)
        self.query_one("#chat", VerticalScroll).anchor()  # follow the stream until scrolled
        self.query_one(PromptInput).focus()
        if self._given_engine is None:
            self._start_load(self.load_args["model"], remembered_ok=True)
        elif self.baseline is None:
            self.set_busy("measuring the baseline…")
            self._measure(self._given_engine)
        else:
            self.on_engine_ready(EngineReady(self._given_engine, self.baseline))

    def on_unmount(self) -> None:
        sys.setswitchinterval(self._switch_interval)
        if self.engine is not None and self.engine is not self._given_engine:
            self.engine.close()

    def get_system_commands(self, screen: Screen):
        yield from super().get_system_commands(screen)
        for title, text, action in [
            ("New chat", "start a new conversation (ctrl+n)", self.action_new_chat),
            ("Regenerate", "answer the last message again (ctrl+r)", self.action_regenerate),
            ("Stop", "stop the answer being generated (esc)", self.action_stop),
            ("Race target-only", "re-run the last prompt without a drafter (f5)",
             self.action_race),
            ("Copy answer", "copy the last answer (f8)", self.action_copy_answer),
            ("Copy code block", "copy the last answer's last code block (f9)",
             self.action_copy_code),
            ("Toggle highlighting", "colour tokens by kind (ctrl+t)",
             self.action_toggle_highlight),
            ("Toggle Markdown", "the last answer as Markdown (ctrl+g)",
             self.action_toggle_markdown),
            ("Settings", "sampling, draft length, drafter, system prompt (ctrl+s)",
             self.action_settings),
            ("Conversations", "open or delete saved conversations (ctrl+o)",
             self.action_conversations),
            ("Keys", "every key and token colour (f1)", self.action_help),
        ]:
            yield SystemCommand(title, text, action)

    def set_busy(self, state: str) -> None:
        streaming = state in STREAMING
        if streaming != (self.busy in STREAMING):
            # While the engine runs, the garbage collector only looks at objects made since it
            # started: a full collection scans every widget and style the app holds (100+ ms
            # of UI thread here, in one go), and the UI thread's time is the engine's.
            # Unfrozen once idle, so what the turn left behind is collected as usual.
            if streaming:
                gc.freeze()
            else:
                gc.unfreeze()
                self.set_timer(1.0, self._collect_when_idle)
        self.busy = state
        self._show_status()
        # No cursor blink while the engine runs: every repaint of a region far from the streamed
        # answer widens the area the compositor redraws each frame, and UI time is engine time.
        self.query_one(PromptInput).cursor_blink = not state

    def _collect_when_idle(self) -> None:
        if self.busy not in STREAMING:
            gc.collect()

    def _show_status(self) -> None:
        if self.busy:
            text = self.busy + (" · esc stops" if self.busy in STREAMING else "")
        elif self.engine is not None:
            text = f"ready · {self._engine_label()}"
        else:
            text = ""
        # fixed width (app.tcss): no layout pass, which matters at up to 30 updates a second
        self.query_one("#status", Static).update(Content(text), layout=False)

    def _engine_label(self) -> str:
        assert self.engine is not None
        info = self.engine.info
        return "no drafter" if info.drafter == "none" else f"{info.drafter} k={info.num_draft}"

    # -- loading -------------------------------------------------------------------------------

    def _start_load(self, model: str | None, *, remembered_ok: bool) -> None:
        args = dict(self.load_args, model=model)
        remembered = False
        if model is None and remembered_ok and (last := self.history.get("last_model")):
            args.update(model=last["model"], draft_model=args["draft_model"] or
                        last.get("draft_model"), mtp=args["mtp"] or last.get("mtp"))
            remembered = True
        self.set_busy(f"loading {args['model'] or 'the demo pair'}…")
        self._load(args, remembered)

    @work(thread=True, exclusive=True, group="load")
    def _load(self, args: dict[str, Any], remembered: bool) -> None:
        start = (EngineInThread.load if os.environ.get("MLX_SPEC_ENGINE") == "thread"
                 else EngineProcess.start)
        try:
            try:
                engine = start(**args)
            except MlxSpecError:
                if not remembered:
                    raise
                # the model remembered from last time is gone: the demo pair
                args = dict(args, model=None, draft_model=None, mtp=None)
                engine = start(**args)
            try:
                baseline = engine.measure_baseline()
            except BaseException:
                engine.close()
                raise
            self.post_message(EngineReady(engine, baseline, args))
        except Exception as e:  # noqa: BLE001 - the user gets one line, never a traceback
            text = str(e) if isinstance(e, MlxSpecError) else f"cannot load: {one_line(e)}"
            self.post_message(LoadFailed(text, args["model"]))

    @work(thread=True, exclusive=True, group="load")
    def _measure(self, engine: EngineService) -> None:
        self.post_message(EngineReady(engine, engine.measure_baseline()))

    def on_engine_ready(self, msg: EngineReady) -> None:
        engine = self.engine = msg.engine
        self.baseline = msg.baseline
        if msg.load_args is not None:  # remember what loaded (None: the demo pair)
            self.load_args = msg.load_args
            self.history.set("last_model", _remembered(msg.load_args)
                             if msg.load_args["model"] else None)
        info = engine.info
        self.settings = replace(self.settings, drafter=info.drafter, num_draft=info.num_draft)
        self.sub_title = info.target
        self._show_engine()
        self.set_busy("")

    def _show_engine(self) -> None:
        assert self.engine is not None
        self.query_one(StatsPanel).show_engine(
            f"{self.engine.info.target}\n{self._engine_label()}", self.baseline)

    def on_load_failed(self, msg: LoadFailed) -> None:
        self.set_busy("model not loaded")

        def chosen(choice: str | None) -> None:
            if choice == "demo":
                self._start_load(None, remembered_ok=False)
            else:
                self.exit(return_code=2)

        self.push_screen(LoadErrorScreen(msg.text, can_use_demo=msg.model is not None), chosen)

    # -- a turn --------------------------------------------------------------------------------

    def on_prompt_input_submitted(self, msg: PromptInput.Submitted) -> None:
        text = msg.text.rstrip()
        if not text.strip():
            self.notify("Empty message: nothing to send.", severity="warning")
            return
        if not self._can_start():
            return
        self.query_one(PromptInput).clear()
        if self.conversation is None:
            self.conversation = self.history.new_conversation(text, self.sub_title)
        mid = self.history.add_message(self.conversation, "user", text)
        self._sent = (text, mid)
        self.messages.append({"role": "user", "content": text})
        self.query_one("#chat").mount(UserMessage(text))
        self._start_turn()

    def _can_start(self) -> bool:
        """True when the engine is idle; else says why not."""
        if self.engine is None:
            self.notify("The model is not loaded yet.", severity="warning")
        elif self.busy:
            self.notify(f"Busy ({self.busy.rstrip('…')}): press esc to stop.",
                        severity="warning")
        return self.engine is not None and not self.busy

    def _engine_messages(self) -> list[dict[str, str]]:
        system = self.settings.system_prompt
        return ([{"role": "system", "content": system}] if system else []) + list(self.messages)

    def _start_turn(self) -> None:
        self.answer = Answer(self.highlight)
        chat = self.query_one("#chat", VerticalScroll)
        chat.mount(self.answer)
        chat.anchor()
        self.buffer.drain()
        self.stop_event = threading.Event()  # one per turn: a late esc cannot stop the next
        self.set_busy(GENERATING)
        self._generate(self._engine_messages(), self.settings, self.stop_event)
        if self._flush_timer is not None:
            self._flush_timer.stop()
        self._flush_timer = self.set_timer(self.pacer.start(), self._tick)

    @work(thread=True, exclusive=True, group="gen")
    def _generate(self, messages: list[dict[str, str]], settings: Settings,
                  stop: threading.Event) -> None:
        engine = self.engine
        assert engine is not None
        try:
            for ev in engine.chat(messages, max_tokens=settings.max_tokens,
                                  sampling=settings.sampling, stop=stop):
                if isinstance(ev, TokenEvent):
                    self.buffer.push(ev)
                else:
                    self.post_message(TurnDone(ev))
        except Exception as e:  # noqa: BLE001 - one line for the user, never a traceback
            self.post_message(TurnFailed(str(e) if isinstance(e, MlxSpecError)
                                         else f"generation failed: {one_line(e)}"))

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

    def on_turn_done(self, msg: TurnDone) -> None:
        self.flush()
        answer, self.answer = self.answer, None
        s = msg.end.stats
        if answer is not None:
            answer.finish(s, stats_line(s, self.baseline))
            self.messages.append({"role": "assistant", "content": answer.text})
            if self.conversation is not None:
                self.history.add_message(self.conversation, "assistant", answer.text,
                                         kinds=answer.runs, stats=s.to_dict(),
                                         partial=answer.partial)
            self.last_turn = LastTurn(self._engine_messages()[:-1], msg.end, answer)
        self._sent = None
        self.totals.add(s)
        self.query_one(StatsPanel).show_totals(self.totals, self.baseline)
        self.set_busy("")
        self._apply_pending()

    def on_turn_failed(self, msg: TurnFailed) -> None:
        """E.g. a prompt longer than the context: forget the message, give its text back."""
        self.buffer.drain()
        if self.answer is not None:
            self.answer.remove()
            self.answer = None
        if self._sent is not None:
            text, mid = self._sent
            self._sent = None
            self.history.delete_message(mid)
            self.messages.pop()
            self.query(UserMessage).last().remove()
            prompt = self.query_one(PromptInput)
            if not prompt.text:
                prompt.text = text
            if not self.messages and self.conversation is not None:
                self.history.delete(self.conversation)
                self.conversation = None
        self.set_busy("")
        self.notify(msg.text, title=msg.title, severity="error", timeout=10)

    # -- actions -------------------------------------------------------------------------------

    def action_stop(self) -> None:
        if self.busy in STREAMING:
            self.stop_event.set()

    def action_regenerate(self) -> None:
        if not self._can_start():
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

    def action_new_chat(self) -> None:
        if self.busy and self.engine is not None:
            self.notify("Busy: press esc to stop first.", severity="warning")
            return
        self._clear_chat()

    def _clear_chat(self) -> None:
        self.messages, self.conversation, self.last_turn = [], None, None
        self.query_one("#chat").remove_children()


def _remembered(args: dict[str, Any]) -> dict[str, str | None]:
    """The model to reopen next time: local paths made absolute, hub ids kept as they are."""

    def norm(p: str | None) -> str | None:
        return str(Path(p).expanduser().resolve()) if p and Path(p).expanduser().exists() else p

    return {"model": norm(args["model"]), "draft_model": norm(args["draft_model"]),
            "mtp": norm(args["mtp"])}


def run_app(*, model: str | None = None, drafter: str = "auto", draft_model: str | None = None,
            mtp: str | None = None, num_draft: int | str = 4) -> int:
    """`mlx-spec` / `mlx-spec chat [MODEL]`. Exit code 2 when the model did not load."""
    app = SpecChatApp(model=model, drafter=drafter, draft_model=draft_model, mtp=mtp,
                      num_draft=num_draft)
    try:
        app.run()
    finally:
        app.history.close()
    return app.return_code or 0
