"""Modal screens: help, settings, saved conversations, and the load error."""

from __future__ import annotations

import time
from dataclasses import replace

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, Select, Static
from textual.widgets.option_list import Option

from mlx_spec import MlxSpecError, parse_draft_length

from .history import History
from .keys import help_rows
from .settings import EngineChoice, Settings
from .widgets import KIND_LABEL, KIND_STYLE

COLOURS = [
    ("accepted", "a drafted token the target agreed with"),
    ("corrected", "the target's own token where it rejected a draft (bold, underlined)"),
    ("bonus", "the target's extra token after it accepted every draft (italic)"),
    ("target", "decoded by the target alone (speculation off, or not worth it)"),
    ("rejected", "drafts the target threw away (f3 shows / hides them); not the answer"),
]


def help_content() -> Content:
    rows = [Content.styled("Keys", "bold")]
    rows += [Content.assemble((f"  {key:<9}", "bold $text-accent"), text)
             for key, text in help_rows()]
    rows += [Content(""), Content.styled("Token colours", "bold")]
    rows += [Content.assemble("  ", (f"{KIND_LABEL[k]:<20}", KIND_STYLE[k] or "$text-muted"),
                              f" {text}") for k, text in COLOURS]
    rows += [Content(""), Content(
        "Under each answer: tokens, tok/s, time to first token, acceptance, tokens per target "
        "pass, speedup against a target-only baseline (timed while the engine is idle and "
        "saved; \"estimating…\" until then), draft / verify time.")]
    return Content("\n").join(rows)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 96; height: auto; max-height: 90%;
                                  border: thick $primary; padding: 1 2; background: $surface; }
    HelpScreen Button { margin-top: 1; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(help_content())
            yield Button("Close (esc)", id="close")

    def on_button_pressed(self) -> None:
        self.dismiss()


class SettingsScreen(ModalScreen[tuple[Settings, EngineChoice] | None]):
    """Edit the settings; dismisses with (Settings, EngineChoice), or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "cancel"), Binding("ctrl+s", "save", "save")]
    DEFAULT_CSS = """
    SettingsScreen { align: center middle; }
    SettingsScreen > Vertical { width: 84; height: auto; border: thick $primary;
                                padding: 1 2; background: $surface; }
    SettingsScreen Grid { grid-size: 2; grid-columns: 24 1fr; height: auto; grid-gutter: 0 1; }
    SettingsScreen Label { padding: 1 0; }
    SettingsScreen #error { color: $error; height: auto; }
    SettingsScreen Horizontal { height: auto; }
    SettingsScreen Button { margin-right: 2; }
    """

    def __init__(self, current: Settings, engine: EngineChoice, drafters: list[str]) -> None:
        super().__init__()
        self.current, self.engine, self.drafters = current, engine, drafters

    def compose(self) -> ComposeResult:
        s, c, e = self.current.sampling, self.current, self.engine
        fields = [
            ("temperature (0 = greedy)", Input(str(s.temperature), id="temperature")),
            ("top-p", Input(str(s.top_p), id="top_p")),
            ("top-k (0 = off)", Input(str(s.top_k), id="top_k")),
            ("draft length", Input(str(e.draft_length), id="draft_length",
                                   placeholder="1..16 or auto")),
            ("drafter", Select([(d, d) for d in self.drafters], value=e.drafter, id="drafter",
                               allow_blank=False)),
            ("max tokens per answer", Input(str(c.max_tokens), id="max_tokens")),
            ("system prompt", Input(c.system_prompt, id="system_prompt",
                                    placeholder="(none)")),
        ]
        with Vertical():
            yield Static(Content.styled("Settings", "bold"))
            with Grid():
                for label, widget in fields:
                    yield Label(label)
                    yield widget
            yield Static("", id="error")
            with Horizontal():
                yield Button("Save (ctrl+s)", id="save", variant="primary")
                yield Button("Cancel (esc)", id="cancel")

    def _value(self, name: str) -> str:
        return self.query_one(f"#{name}", Input).value.strip()

    def parse(self) -> tuple[Settings, EngineChoice]:
        """The form's values; raises ValueError with a readable message."""
        try:
            sampling = replace(self.current.sampling,  # SamplingConfig validates its values
                               temperature=float(self._value("temperature")),
                               top_p=float(self._value("top_p")), top_k=int(self._value("top_k")))
        except ValueError as e:
            raise ValueError(str(e).replace("could not convert string to float", "not a number")
                             ) from None
        try:  # the engine's one rule for a draft length
            draft_length = parse_draft_length(self._value("draft_length"))
        except MlxSpecError as e:
            raise ValueError(str(e)) from None
        assert draft_length is not None  # only None parses to None
        max_tokens = self._value("max_tokens")
        if not (max_tokens.isdigit() and int(max_tokens) >= 1):
            raise ValueError("max tokens must be a whole number >= 1")
        drafter = str(self.query_one("#drafter", Select).value)
        return (Settings(sampling, self._value("system_prompt"), int(max_tokens)),
                EngineChoice(drafter, draft_length))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.action_save() if event.button.id == "save" else self.action_cancel()

    def on_input_submitted(self) -> None:
        self.action_save()

    def action_save(self) -> None:
        try:
            self.dismiss(self.parse())
        except ValueError as e:
            self.query_one("#error", Static).update(Content(f"invalid: {e}"))

    def action_cancel(self) -> None:
        self.dismiss(None)


class HistoryScreen(ModalScreen[int | None]):
    """Saved conversations, newest first: enter opens one, d or delete removes it."""

    BINDINGS = [Binding("escape", "dismiss(None)", "close"),
                Binding("d,delete", "delete", "delete")]
    DEFAULT_CSS = """
    HistoryScreen { align: center middle; }
    HistoryScreen > Vertical { width: 90; height: 26; border: thick $primary;
                               background: $surface; padding: 0 1; }
    HistoryScreen OptionList { height: 1fr; }
    """

    def __init__(self, history: History) -> None:
        super().__init__()
        self.history = history

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Content.assemble(("Saved conversations", "bold"),
                                          "   enter: open · d: delete · esc: close"))
            yield OptionList(*self._options())

    def _options(self) -> list[Option]:
        return [Option(Content(f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(t))}  {title}"),
                       id=str(cid)) for cid, title, t in self.history.conversations()]

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(int(event.option.id or 0))

    def action_delete(self) -> None:
        ol = self.query_one(OptionList)
        if ol.highlighted is None:
            return
        index = ol.highlighted
        self.history.delete(int(ol.get_option_at_index(index).id or 0))
        ol.clear_options()
        ol.add_options(self._options())
        if ol.option_count:
            ol.highlighted = min(index, ol.option_count - 1)


class LoadErrorScreen(ModalScreen[str]):
    """The model did not load: its one-line reason, then quit (exit code 2) or try the demo."""

    BINDINGS = [Binding("escape,q", "dismiss('quit')", "quit")]
    DEFAULT_CSS = """
    LoadErrorScreen { align: center middle; }
    LoadErrorScreen > Vertical { width: 90; height: auto; border: thick $error; padding: 1 2;
                                 background: $surface; }
    LoadErrorScreen Horizontal { height: auto; margin-top: 1; }
    LoadErrorScreen Button { margin-right: 2; }
    """

    def __init__(self, message: str, can_use_demo: bool) -> None:
        super().__init__()
        self.message, self.can_use_demo = message, can_use_demo

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Content.styled("The model could not be loaded", "bold $text-error"))
            yield Static(Content(self.message), id="message")
            with Horizontal():
                yield Button("Quit (esc)", id="quit", variant="error")
                if self.can_use_demo:
                    yield Button("Use the demo model", id="demo", variant="primary")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id or "quit")
