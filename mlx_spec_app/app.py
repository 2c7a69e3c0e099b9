"""The chat app: the layout and the view, composed from the parts that do the work.

* `EngineHost` (engine_host.py): load, restart after a crash, drafter switches, close, and the
  idle work (idle.py) that measures the costs not saved yet and times the baseline.
* `ModelPicker` (downloads.py): the model list and downloads.
* `Activity` (busy.py): what the engine is doing; every action that would start another engine
  call waits until it is idle. Idle work runs only while it is idle and stops when it is not.
* `ChatPane` (chat_pane.py): the conversation and its turns; the app hands it the engine, the
  settings and the baseline, and hears back through its messages.

The keys come from one table (keys.py).
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

from textual.app import App, ComposeResult, SystemCommand
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from mlx_spec import (
    Baseline,
    EngineService,
    LoadSpec,
    MlxSpecError,
    Totals,
    Trace,
    save_trace,
    valid_text,
)
from mlx_spec.paths import data_dir

from .busy import Activity, Busy
from .chat_pane import ChatPane
from .downloads import ModelPicker
from .engine_host import EngineHost, EngineReady, EngineSwitched, LoadFailed
from .history import History
from .idle import IdleDone
from .inspect import InspectScreen
from .keys import ACTIONS, bindings
from .models import DEMO_LINE, DEMO_PROMPTS, PACKAGED_LINE, PACKAGED_PROMPTS, is_packaged
from .race import RacePicker
from .screens import HelpScreen, HistoryScreen, LoadErrorScreen, SettingsScreen
from .settings import EngineChoice, Settings
from .widgets import PromptInput, StatsPanel, legend

# what the first note says about watching speculation (docs/APP.md "Why a draft was rejected")
WATCH = " · After an answer: f2 shows why each token, f3 the drafts the model rejected."
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

    def __init__(self, spec: LoadSpec | None = None, *, engine: EngineService | None = None,
                 baseline: Baseline | None = None, history: History | None = None,
                 pull: str | None = None) -> None:
        """spec: what the user asked to load (no model: the last one used, or on first run
        what the welcome screen picks); the app starts it in an engine process of its own and
        closes it on exit. engine / baseline: already loaded ones instead (tests, tools; the
        caller closes that engine). pull: a preset or hub repo to download first."""
        super().__init__()
        self.history = history or History()
        self.activity = Activity(self._activity_changed, self.set_timer)
        self.host = EngineHost(self, self.history, self.activity, spec or LoadSpec(),
                               engine=engine, baseline=baseline)
        self.models = ModelPicker(self, self.host, self.activity, self.history)
        self.chat = ChatPane(self.history, take_engine=self.host.idle.yield_engine, id="chat")
        self.settings = Settings.restore(self.history.get("settings"))  # the next turn's
        self.chat.ghosts = self.history.get("ghosts") is True  # off until f3 (it clutters)
        self.highlight = True
        self.totals = Totals()
        self.pull = pull
        self.panel_shown: bool | None = None  # None: by width (folded below NARROW columns)

    @property
    def busy(self) -> Busy:
        """What the engine is doing (falsy: idle)."""
        return self.activity.state

    @property
    def engine(self) -> EngineService | None:
        """The running engine (None while none is loaded)."""
        return self.host.engine

    # -- layout --------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="body"):
            with Vertical(id="main"):
                yield self.chat
                with Horizontal(id="bar"):
                    yield Static(legend(self.chat.ghosts), id="legend")
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
        given = self.host.given
        if given is not None:
            self.on_engine_ready(EngineReady(given, self.host.baseline or given.info.baseline))
        elif self.pull is not None:
            self.models.download(self.pull)
        elif self.host.first_run():
            self.models.welcome(first_run=True)
        else:
            self.host.load(self.host.requested, remembered_ok=True)

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
        self.host.close()

    def get_system_commands(self, screen: Screen):
        yield from super().get_system_commands(screen)
        for a in ACTIONS:
            yield SystemCommand(a.title, f"{a.help} ({a.key})", getattr(self, f"action_{a.action}"))

    def _activity_changed(self) -> None:
        """Activity moved: the status line; idle work stops as the engine gets busy, and starts
        once it is idle (after the handler that made it idle, which may start a change)."""
        self._show_status()
        if self.activity.state:
            self.host.idle.stop()
        else:
            self.call_later(self.host.work_while_idle)

    def _show_status(self) -> None:
        """The status line from the engine's activity (Activity calls it on every change)."""
        busy = self.activity.state
        if busy:
            text = self.activity.status + (" · esc stops" if busy.streaming else "")
        elif self.host.engine is not None:
            text = f"ready · {self.host.label()}"
        else:
            text = ""
        # fixed width (app.tcss): no layout pass, which matters at up to 30 updates a second
        self.query_one("#status", Static).update(Content(text), layout=False)
        # No cursor blink while the engine runs: every repaint of a region far from the streamed
        # answer widens the area the compositor redraws each frame, and UI time is engine time.
        self.query_one(PromptInput).cursor_blink = not busy

    def _show_engine(self) -> None:
        assert self.host.engine is not None
        self.query_one(StatsPanel).show_engine(
            "\n".join(filter(None, (self.host.engine.info.target, self.host.label(),
                                    self.host.engine.info.split))), self.host.baseline)

    def show_history_notice(self) -> None:
        """The history file's one-line problem (damaged and replaced, or not being saved)."""
        if notice := self.history.take_notice():
            self.notify(notice, title="History", severity="warning", timeout=15)

    def _refuse_if_busy(self, *, needs_engine: bool = True) -> bool:
        """True (and a notice) when the action must wait: an engine is loaded and busy, or
        (needs_engine) none is loaded yet."""
        if needs_engine and self.host.engine is None:
            why = "The model is not loaded yet."
        elif self.activity.state and self.host.engine is not None:
            why = f"Busy ({self.activity.status.rstrip('…')}): press esc to stop first."
        else:
            return False
        self.notify(why, severity="warning")
        return True

    # -- the engine (engine_host.py does the work) ----------------------------------------------

    def on_engine_ready(self, msg: EngineReady) -> None:
        if self.host.adopt(msg):  # another model was chosen: a new chat on it
            self.totals = Totals()
            self.chat.clear()
        self.chat.attach(msg.engine, msg.baseline)
        self.sub_title = msg.engine.info.target
        self._show_engine()
        self._settle()
        if msg.spec is not None and msg.spec.model is None and not self.chat.messages:
            self.chat.note(f"This is {DEMO_LINE}. Try: {' · '.join(DEMO_PROMPTS)}  "
                           f"(ctrl+l: other models){WATCH}")
        elif msg.spec is not None and is_packaged(msg.spec.model) and not self.chat.messages:
            self.chat.note(f"This is {Path(msg.spec.model).stem}, {PACKAGED_LINE}. Try: "
                           f"{' · '.join(PACKAGED_PROMPTS)}  (ctrl+l: other models){WATCH}")

    def on_load_failed(self, msg: LoadFailed) -> None:
        self.activity.set(Busy.NOT_LOADED)

        def chosen(choice: str | None) -> None:
            if choice == "demo":
                self.host.load_demo()
            else:
                self.exit(return_code=2)

        self.push_screen(LoadErrorScreen(msg.text, can_use_demo=msg.spec.model is not None),
                         chosen)

    def on_engine_switched(self, msg: EngineSwitched) -> None:
        self._show_engine()
        self._settle()
        if msg.error:
            self.notify(msg.error, title="Drafter not changed", severity="error", timeout=10)
        else:
            self.notify(f"Now: {self.host.label()}.")

    def on_idle_done(self, msg: IdleDone) -> None:
        """Idle work returned: a baseline that arrived goes wherever speedups are shown; work
        that a call stopped goes on once the engine is idle again."""
        if msg.engine is not self.host.engine:
            return  # closed since
        if self.host.took(msg):
            self.chat.attach(msg.engine, self.host.baseline)
            self._show_engine()
            if self.totals.turns:
                self.query_one(StatsPanel).show_totals(self.totals, self.host.baseline)
        if msg.error:
            self.notify(msg.error, title="Measuring while idle", severity="warning", timeout=10)
            if self.host.restart_if_dead():
                self.notify("Starting the engine again…", timeout=6)
        elif msg.stopped:
            self.host.work_while_idle()

    def _settle(self) -> None:
        """The engine is idle: say so, then apply a drafter change that waited for it."""
        self.activity.set(Busy.IDLE)
        self.host.switch_pending()

    def action_models(self) -> None:
        if not self._refuse_if_busy(needs_engine=False):
            self.models.welcome(first_run=False)

    # -- turns (the chat pane runs them) ---------------------------------------------------------

    def on_prompt_input_submitted(self, msg: PromptInput.Submitted) -> None:
        text, replaced = valid_text(msg.text.rstrip())
        if replaced:
            self.notify("The message had characters that are not valid Unicode (bytes that "
                        "are not UTF-8); each was replaced with U+FFFD.", severity="warning")
        if not text.strip():
            self.notify("Empty message: nothing to send.", severity="warning")
            return
        if not self._refuse_if_busy():
            self.chat.send(text, self.settings)
            self.activity.set(Busy.GENERATING)
            self.query_one(PromptInput).clear()

    def action_regenerate(self) -> None:
        if not self._refuse_if_busy() and self.chat.regenerate(self.settings):
            self.activity.set(Busy.GENERATING)

    def action_race(self) -> None:
        if not self._refuse_if_busy() and self.chat.race(self.settings):
            self.activity.set(Busy.RACING)

    def action_race_drafters(self) -> None:
        """Pick a drafter, then race it against the last answer's (RaceScreen)."""
        engine = self.host.engine
        if self._refuse_if_busy() or engine is None:
            return
        if self.chat.last_turn is None:
            self.notify("Race needs a finished answer first.", severity="warning")
            return

        def picked(kind: str | None) -> None:
            if kind is not None and not self._refuse_if_busy() and \
                    self.chat.race(self.settings, kind):
                self.activity.set(Busy.RACING)

        self.push_screen(RacePicker(engine.info.drafter, engine.info.drafters), picked)

    def action_stop(self) -> None:
        if self.activity.state.streaming:
            self.chat.stop()

    def on_chat_pane_finished(self, msg: ChatPane.Finished) -> None:
        """A turn ended: the session totals, then an engine change that waited for it."""
        self.show_history_notice()
        if msg.stats is not None:
            self.totals.add(msg.stats)
            self.query_one(StatsPanel).show_totals(self.totals, self.host.baseline)
        self._settle()

    def on_chat_pane_failed(self, msg: ChatPane.Failed) -> None:
        """A turn failed: its message back into the empty input box; a dead engine restarts."""
        self.show_history_notice()
        prompt = self.query_one(PromptInput)
        if msg.unsent is not None and not prompt.text:
            prompt.text = msg.unsent
        if self.host.restart_if_dead():
            self.notify("Starting the engine again…", timeout=6)
        else:
            self._settle()

    def action_new_chat(self) -> None:
        if not self._refuse_if_busy(needs_engine=False):
            self.chat.clear()

    # -- saved conversations -------------------------------------------------------------------

    def action_conversations(self) -> None:
        if not self._refuse_if_busy(needs_engine=False):
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
        if self.host.engine is None:
            self.notify("The model is not loaded yet.", severity="warning")
            return
        info = self.host.engine.info
        self.push_screen(SettingsScreen(self.settings, EngineChoice.of(info),
                                        list(info.drafters)), self.apply_settings)

    def apply_settings(self, chosen: tuple[Settings, EngineChoice] | None) -> None:
        if chosen is None:
            return
        self.settings, engine = chosen
        self.history.set("settings", self.settings.saved())
        assert self.host.engine is not None
        if engine == EngineChoice.of(self.host.engine.info):
            self.notify("Settings saved.")
        elif self.activity.state:
            self.host.pending = engine
            self.notify("Drafter / draft length change: after this answer.")
        else:
            self.host.switch(engine)

    # -- view ----------------------------------------------------------------------------------

    def action_toggle_highlight(self) -> None:
        self.highlight = not self.highlight
        self.chat.set_highlight(self.highlight)
        self.query_one("#legend").set_class(not self.highlight, "off")

    def action_toggle_markdown(self) -> None:
        answer = self.chat.last_answer()
        if answer is None:
            self.notify("No finished answer yet.", severity="warning")
            return
        answer.toggle_markdown()

    def action_copy_answer(self) -> None:
        answer = self.chat.last_answer()
        if answer is None or not answer.text:
            self.notify("No answer to copy.", severity="warning")
            return
        self.copy_to_clipboard(answer.text)
        self.notify(f"Copied the answer ({len(answer.text)} characters).")

    def action_copy_code(self) -> None:
        answer = self.chat.last_answer()
        blocks = CODE_BLOCK.findall(answer.text) if answer is not None else []
        if not blocks:
            self.notify("No code block in the last answer.", severity="warning")
            return
        self.copy_to_clipboard(blocks[-1])
        self.notify(f"Copied the code block ({len(blocks[-1].splitlines())} lines).")

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    # -- what speculation did ------------------------------------------------------------------

    def _last_trace(self) -> Trace | None:
        answer = self.chat.last_answer()
        if answer is None or answer.trace is None or not answer.trace.tokens:
            self.notify("No traced answer yet (answers of this session are traced).",
                        severity="warning")
            return None
        return answer.trace

    def action_inspect(self) -> None:
        trace = self._last_trace()
        if trace is not None:
            self.push_screen(InspectScreen(trace, ghosts=self.chat.ghosts))

    def action_toggle_ghosts(self) -> None:
        self.chat.set_ghosts(not self.chat.ghosts)
        self.history.set("ghosts", self.chat.ghosts)
        self.query_one("#legend", Static).update(legend(self.chat.ghosts))
        self.notify("Rejected drafts shown." if self.chat.ghosts else "Rejected drafts hidden.",
                    timeout=2)

    def action_save_trace(self) -> None:
        trace = self._last_trace()
        if trace is None:
            return
        stem = data_dir() / "traces" / time.strftime("trace-%Y%m%d-%H%M%S")
        try:
            page = save_trace(trace, stem.with_suffix(".html"))
            save_trace(trace, stem.with_suffix(".json"))
        except MlxSpecError as e:
            self.notify(str(e), title="Trace not saved", severity="error")
            return
        self.notify(f"{page} (and .json): open it in a browser.", title="Trace saved",
                    timeout=10)


def run_app(spec: LoadSpec, *, pull: str | None = None) -> int:
    """`mlx-spec` / `mlx-spec chat [MODEL]`: the app on `spec` (pull: a preset or hub repo to
    download first, the user named it). Exit code 2 when the model did not load."""
    app = SpecChatApp(spec, pull=pull)
    try:
        app.run()
    finally:
        app.history.close()
    return app.return_code or 0
