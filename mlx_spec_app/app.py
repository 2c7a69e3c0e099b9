"""The chat app: layout, loading, settings, saved conversations and view toggles.

The engine runs in a child process (mlx_spec.EngineProcess: its own GIL, so the UI's Python never
stalls it), driven from worker threads one call at a time (every action that would start another
waits until the app is idle). Turns belong to the chat pane (chat.py: `Chat`, their one owner);
the keys come from one table (keys.py).
"""

from __future__ import annotations

import gc
import os
import re
import sys
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from mlx_spec import (
    Baseline,
    EngineInThread,
    EngineProcess,
    EngineService,
    MlxSpecError,
    Totals,
    TurnStats,
    hub,
    user_message,
    valid_text,
)

from .chat import Busy, Chat, LastTurn
from .history import History
from .keys import ACTIONS, bindings
from .models import DEMO, DEMO_LINE, DEMO_PROMPTS, Choice, DownloadScreen, WelcomeScreen
from .screens import HelpScreen, HistoryScreen, LoadErrorScreen, SettingsScreen
from .settings import EngineChoice, Settings
from .stream import EngineReady, EngineSwitched, LoadFailed
from .widgets import LEGEND, Answer, PromptInput, StatsPanel

# With the engine in this process (EngineInThread: tests, MLX_SPEC_ENGINE=thread), its thread
# needs the GIL back the moment an MLX evaluation returns; Python's default 5 ms switch interval
# lets a UI frame in progress keep it that long. Set while the app runs, restored when it ends.
GIL_SWITCH_S = 0.001
NARROW = 100  # columns: below this the side panel folds away
CODE_BLOCK = re.compile(r"```[^\n]*\n(.*?)```", re.S)


class SpecChatApp(App[None]):
    TITLE = "mlx-spec"
    CSS_PATH = "app.tcss"
    BINDINGS = bindings()

    def __init__(self, *, model: str | None = None, drafter: str = "auto",
                 draft_model: str | None = None, mtp: str | None = None,
                 num_draft: int | str = 4, engine: EngineService | None = None,
                 baseline: Baseline | None = None, history: History | None = None,
                 pull: str | None = None) -> None:
        """engine / baseline: already loaded ones (tests, the overhead script; the caller closes
        that engine); else the app starts `model` (a local directory; or the last used one, or
        on first run what the welcome screen picks) in an engine process of its own, and closes
        it on exit. pull: a preset or hub repo to download first (the user named it)."""
        super().__init__()
        self.history = history or History()
        self.load_args: dict[str, Any] = dict(model=model, drafter=drafter,
                                              draft_model=draft_model, mtp=mtp,
                                              num_draft=num_draft)
        self.engine: EngineService | None = None
        self.baseline = baseline
        self._given_engine = engine
        self.settings = Settings.restore(self.history.get("settings"))
        self.highlight = True
        self.totals = Totals()
        self.chat = Chat(self.history, id="chat")
        self._pending_engine: EngineChoice | None = None  # applied once the engine is idle
        self.pull = pull
        self.panel_shown: bool | None = None  # None: by width (folded below NARROW columns)

    # what the chat pane owns, read by tests and tools
    @property
    def busy(self) -> Busy:
        return self.chat.busy

    @property
    def messages(self) -> list[dict[str, str]]:
        return self.chat.messages

    @property
    def conversation(self) -> int | None:
        return self.chat.conversation

    @property
    def last_turn(self) -> LastTurn | None:
        return self.chat.last_turn

    # -- layout --------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="body"):
            with Vertical(id="main"):
                yield self.chat
                with Horizontal(id="bar"):
                    yield Static(LEGEND, id="legend")
                    yield Static("", id="status")
                yield PromptInput(id="prompt")
            yield StatsPanel(id="panel")
        yield Footer()

    def on_mount(self) -> None:
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(GIL_SWITCH_S)
        self.chat.anchor()  # follow the stream until scrolled
        self.query_one(PromptInput).focus()
        self.show_history_notice()
        if self._given_engine is None and self.pull is not None:
            self._download(self.pull)
        elif self._given_engine is None and self._first_run():
            self.push_screen(WelcomeScreen(first_run=True), self._chosen)
        elif self._given_engine is None:
            self._start_load(self.load_args["model"], remembered_ok=True)
        elif self.baseline is None:
            self.set_busy(Busy.MEASURING)
            self._measure(self._given_engine)
        else:
            self.on_engine_ready(EngineReady(self._given_engine, self.baseline))

    def _first_run(self) -> bool:
        return (self.load_args["model"] is None and self.history.get("last_model") is None
                and not self.history.get("welcomed"))

    def on_resize(self) -> None:
        self._fold()

    def _fold(self) -> None:
        """Below NARROW columns the side panel folds away (ctrl+b brings it back) and the legend
        and status take a row each, so neither is ever cut."""
        narrow = self.size.width < NARROW
        self.set_class(narrow, "-narrow")
        shown = self.panel_shown if self.panel_shown is not None else not narrow
        self.query_one(StatsPanel).display = shown

    def action_toggle_panel(self) -> None:
        self.panel_shown = not self.query_one(StatsPanel).display
        self._fold()

    def on_unmount(self) -> None:
        sys.setswitchinterval(self._switch_interval)
        if self.engine is not None and self.engine is not self._given_engine:
            self.engine.close()

    def get_system_commands(self, screen: Screen):
        yield from super().get_system_commands(screen)
        for a in ACTIONS:
            yield SystemCommand(a.title, f"{a.help} ({a.key})", getattr(self, f"action_{a.action}"))

    def set_busy(self, state: Busy, detail: str = "") -> None:
        if state.streaming != self.chat.busy.streaming:
            # While the engine runs, the garbage collector only looks at objects made since it
            # started: a full collection scans every widget and style the app holds (100+ ms
            # of UI thread here, in one go), and the UI thread's time is the engine's.
            # Unfrozen once idle, so what the turn left behind is collected as usual.
            if state.streaming:
                gc.freeze()
            else:
                gc.unfreeze()
                self.set_timer(1.0, self._collect_when_idle)
        self.chat.busy, self.chat.detail = state, detail
        self._show_status()
        # No cursor blink while the engine runs: every repaint of a region far from the streamed
        # answer widens the area the compositor redraws each frame, and UI time is engine time.
        self.query_one(PromptInput).cursor_blink = not state

    def _collect_when_idle(self) -> None:
        if not self.chat.busy.streaming:
            gc.collect()

    def _show_status(self) -> None:
        busy = self.chat.busy
        if busy:
            text = self.chat.status + (" · esc stops" if busy.streaming else "")
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

    # -- choosing and downloading a model -------------------------------------------------------

    def action_models(self) -> None:
        if self.chat.busy and self.engine is not None:
            self.notify("Busy: press esc to stop first.", severity="warning")
            return
        self.push_screen(WelcomeScreen(first_run=False), self._chosen)

    def _chosen(self, choice: Choice | None) -> None:
        self.history.set("welcomed", True)
        if choice is None:
            if self.engine is None:  # closed the welcome: the demo rather than an empty chat
                self._start_load(None, remembered_ok=False)
            return
        if choice.name == DEMO:
            self._start_load(None, remembered_ok=False)
        elif choice.downloaded:
            try:
                self._launch(hub.launch_for(choice.name))
            except MlxSpecError as e:  # e.g. removed meanwhile, or a tokenizer mismatch
                self.notify(str(e), title="Cannot open", severity="error", timeout=10)
        else:
            self._download(choice.name)

    def _download(self, name: str) -> None:
        self.set_busy(Busy.LOADING, f"downloading {name}")
        self.push_screen(DownloadScreen(name), self._pulled)

    def _pulled(self, launch: hub.Launch | None) -> None:
        if launch is not None:
            self._launch(launch)
        elif self.engine is None:
            self.notify("Download stopped; what arrived resumes next time.", timeout=8)
            self.push_screen(WelcomeScreen(first_run=False), self._chosen)
        else:
            self.set_busy(Busy.IDLE)

    def _launch(self, launch: hub.Launch) -> None:
        for warning in launch.warnings:
            self.notify(warning, severity="warning", timeout=10)
        self.load_args.update(drafter=launch.drafter, num_draft=self.load_args["num_draft"],
                              draft_model=_path(launch.draft_model), mtp=_path(launch.mtp))
        self._start_load(str(launch.target), remembered_ok=False)

    # -- loading -------------------------------------------------------------------------------

    def _start_load(self, model: str | None, *, remembered_ok: bool) -> None:
        args = dict(self.load_args, model=model)
        remembered = False
        if model is None and remembered_ok and (last := self.history.get("last_model")):
            args.update(model=last["model"], draft_model=args["draft_model"] or
                        last.get("draft_model"), mtp=args["mtp"] or last.get("mtp"))
            remembered = True
        self.set_busy(Busy.LOADING, args["model"] or "the demo pair")
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
            self.post_message(LoadFailed(user_message(e, "cannot load"), args["model"]))

    @work(thread=True, exclusive=True, group="load")
    def _measure(self, engine: EngineService) -> None:
        self.post_message(EngineReady(engine, engine.measure_baseline()))

    def on_engine_ready(self, msg: EngineReady) -> None:
        if self.engine is not None and self.engine is not msg.engine:
            if self.engine is not self._given_engine:
                self.engine.close()  # another model was chosen: the old one goes
            self.totals = Totals()
            self.chat.clear()
        engine = self.engine = msg.engine
        self.baseline = msg.baseline
        if msg.load_args is not None:  # remember what loaded (None: the demo pair)
            self.load_args = msg.load_args
            self.history.set("last_model", _remembered(msg.load_args)
                             if msg.load_args["model"] else None)
        self.sub_title = engine.info.target
        self._show_engine()
        self.set_busy(Busy.IDLE)
        if msg.load_args is not None and msg.load_args["model"] is None and not self.messages:
            self.chat.note(f"This is {DEMO_LINE}. Try: {' · '.join(DEMO_PROMPTS)}  "
                           "(ctrl+l: other models)")

    def _show_engine(self) -> None:
        assert self.engine is not None
        self.query_one(StatsPanel).show_engine(
            f"{self.engine.info.target}\n{self._engine_label()}", self.baseline)

    def on_load_failed(self, msg: LoadFailed) -> None:
        self.set_busy(Busy.NOT_LOADED)

        def chosen(choice: str | None) -> None:
            if choice == "demo":
                self._start_load(None, remembered_ok=False)
            else:
                self.exit(return_code=2)

        self.push_screen(LoadErrorScreen(msg.text, can_use_demo=msg.model is not None), chosen)

    # -- turns (the chat pane owns them) -------------------------------------------------------

    def on_prompt_input_submitted(self, msg: PromptInput.Submitted) -> None:
        text, replaced = valid_text(msg.text.rstrip())
        if replaced:
            self.notify("The message had characters that are not valid Unicode (bytes that "
                        "are not UTF-8); each was replaced with U+FFFD.", severity="warning")
        if not text.strip():
            self.notify("Empty message: nothing to send.", severity="warning")
            return
        if self.chat.send(text, self.sub_title):
            self.query_one(PromptInput).clear()

    def show_history_notice(self) -> None:
        """The history file's one-line problem (damaged and replaced, or not being saved)."""
        if notice := self.history.take_notice():
            self.notify(notice, title="History", severity="warning", timeout=15)

    def turn_ended(self, stats: TurnStats) -> None:
        """Called by the chat when a turn finished: totals, then any engine change waiting."""
        self.show_history_notice()
        self.totals.add(stats)
        self.query_one(StatsPanel).show_totals(self.totals, self.baseline)
        self.set_busy(Busy.IDLE)
        if self._pending_engine is not None:
            pending, self._pending_engine = self._pending_engine, None
            self._switch(pending)

    def restart_if_dead(self) -> None:
        """A turn failed because the engine process died (out of memory, killed): start a new
        one on the same model, so the chat goes on without restarting the app."""
        if self.engine is None or getattr(self.engine, "alive", True):
            return
        dead, self.engine = self.engine, None
        if dead is not self._given_engine:
            dead.close()
        self.notify("Starting the engine again…", timeout=6)
        self._start_load(self.load_args["model"], remembered_ok=False)

    def give_back(self, text: str) -> None:
        """A message that was not sent goes back into the empty prompt."""
        prompt = self.query_one(PromptInput)
        if not prompt.text:
            prompt.text = text

    def action_stop(self) -> None:
        self.chat.stop()

    def action_regenerate(self) -> None:
        self.chat.regenerate()

    def action_race(self) -> None:
        self.chat.race()

    def action_new_chat(self) -> None:
        if self.chat.busy and self.engine is not None:
            self.notify("Busy: press esc to stop first.", severity="warning")
            return
        self.chat.clear()

    # -- saved conversations -------------------------------------------------------------------

    def action_conversations(self) -> None:
        if self.chat.busy and self.engine is not None:
            self.notify("Busy: press esc to stop first.", severity="warning")
            return
        self.push_screen(HistoryScreen(self.history), self.open_conversation)

    def open_conversation(self, conversation: int | None) -> None:
        if conversation is not None:
            self.chat.open(conversation)
        elif self.chat.conversation is not None and not self.history.exists(
                self.chat.conversation):
            self.chat.clear()  # the open conversation was just deleted

    # -- settings ------------------------------------------------------------------------------
    # Sampling, system prompt and answer length apply to the next turn. Drafter and draft length
    # change the engine, so a worker applies them while the engine is idle.

    def action_settings(self) -> None:
        if self.engine is None:
            self.notify("The model is not loaded yet.", severity="warning")
            return
        info = self.engine.info
        self.push_screen(SettingsScreen(self.settings, EngineChoice.of(info),
                                        list(info.drafters)), self.apply_settings)

    def apply_settings(self, chosen: tuple[Settings, EngineChoice] | None) -> None:
        if chosen is None:
            return
        self.settings, engine = chosen
        self.history.set("settings", self.settings.saved())
        assert self.engine is not None
        if engine == EngineChoice.of(self.engine.info):
            self.notify("Settings saved.")
        elif self.chat.busy:
            self._pending_engine = engine
            self.notify("Drafter / draft length change: after this answer.")
        else:
            self._switch(engine)

    def _switch(self, engine: EngineChoice) -> None:
        self.set_busy(Busy.SWITCHING, f"to {engine.drafter}")
        self._switch_worker(engine)

    @work(thread=True, exclusive=True, group="gen")
    def _switch_worker(self, choice: EngineChoice) -> None:
        assert self.engine is not None
        try:
            self.engine.configure(drafter=choice.drafter, num_draft=choice.num_draft)
            self.post_message(EngineSwitched())
        except Exception as e:  # noqa: BLE001 - one line for the user, never a traceback
            self.post_message(EngineSwitched(user_message(e, "cannot switch")))

    def on_engine_switched(self, msg: EngineSwitched) -> None:
        self._show_engine()
        self.set_busy(Busy.IDLE)
        if msg.error:
            self.notify(msg.error, title="Drafter not changed", severity="error", timeout=10)
        else:
            self.notify(f"Now: {self._engine_label()}.")

    # -- view ----------------------------------------------------------------------------------

    def action_toggle_highlight(self) -> None:
        self.highlight = not self.highlight
        for answer in self.query(Answer):
            answer.set_highlight(self.highlight)
        self.query_one("#legend").set_class(not self.highlight, "off")

    def _last_answer(self) -> Answer | None:
        answers = [a for a in self.query(Answer) if a is not self.chat.answer]  # finished ones
        return answers[-1] if answers else None

    def action_toggle_markdown(self) -> None:
        answer = self._last_answer()
        if answer is None:
            self.notify("No finished answer yet.", severity="warning")
            return
        answer.toggle_markdown()

    def action_copy_answer(self) -> None:
        answer = self._last_answer()
        if answer is None or not answer.text:
            self.notify("No answer to copy.", severity="warning")
            return
        self.copy_to_clipboard(answer.text)
        self.notify(f"Copied the answer ({len(answer.text)} characters).")

    def action_copy_code(self) -> None:
        answer = self._last_answer()
        blocks = CODE_BLOCK.findall(answer.text) if answer is not None else []
        if not blocks:
            self.notify("No code block in the last answer.", severity="warning")
            return
        self.copy_to_clipboard(blocks[-1])
        self.notify(f"Copied the code block ({len(blocks[-1].splitlines())} lines).")

    def action_help(self) -> None:
        self.push_screen(HelpScreen())


def _path(p: Path | None) -> str | None:
    return str(p) if p is not None else None


def _remembered(args: dict[str, Any]) -> dict[str, str | None]:
    """The model to reopen next time: local paths made absolute, hub ids kept as they are."""

    def norm(p: str | None) -> str | None:
        return str(Path(p).expanduser().resolve()) if p and Path(p).expanduser().exists() else p

    return {"model": norm(args["model"]), "draft_model": norm(args["draft_model"]),
            "mtp": norm(args["mtp"])}


def run_app(*, model: str | None = None, drafter: str = "auto", draft_model: str | None = None,
            mtp: str | None = None, num_draft: int | str = 4, pull: str | None = None) -> int:
    """`mlx-spec` / `mlx-spec chat [MODEL]`. Exit code 2 when the model did not load."""
    app = SpecChatApp(model=model, drafter=drafter, draft_model=draft_model, mtp=mtp,
                      num_draft=num_draft, pull=pull)
    try:
        app.run()
    finally:
        app.history.close()
    return app.return_code or 0
