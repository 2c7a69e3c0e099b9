"""Race two drafters on the last prompt: pick the other one, then both answers side by side in
their colours, with their speeds. Seeded (drafter-invariant) sampling or greedy decoding gives
the same text in both panes: only the colours, what each drafter got right, differ."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from mlx_spec import Baseline, Trace, TurnEnd

from .inspect import answer_content
from .widgets import speedup_text


def label(kind: str) -> str:
    """A drafter kind as a race names it ("none": target-only)."""
    return "target-only" if kind == "none" else kind


class RacePicker(ModalScreen[str | None]):
    """Which drafter to race the last answer's against (its kind, or None: cancelled)."""

    BINDINGS = [Binding("escape", "dismiss(None)", "cancel")]
    DEFAULT_CSS = """
    RacePicker { align: center middle; }
    RacePicker > Vertical { width: 60; height: auto; border: thick $primary; padding: 1 2;
                            background: $surface; }
    RacePicker OptionList { height: auto; max-height: 12; }
    """

    def __init__(self, current: str, kinds: tuple[str, ...]) -> None:
        super().__init__()
        self.current, self.kinds = current, [k for k in kinds if k != current]

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Content(f"Race the last prompt: {label(self.current)} against…"))
            yield OptionList(*(Option(label(k), id=k) for k in self.kinds))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)


def side_title(end: TurnEnd, baseline: Baseline | None) -> Content:
    s = end.stats
    return Content.assemble((label(s.drafter), "bold"), f" · {s.tok_s:.1f} tok/s · "
                            f"{s.tokens_per_pass:.2f} tok/pass · acceptance "
                            f"{100 * s.acceptance_rate:.0f}% · {speedup_text(s.tok_s, baseline)}")


class RaceScreen(ModalScreen[None]):
    """The two answers side by side, coloured, each with its speed; the verdict below."""

    BINDINGS = [Binding("escape,q", "dismiss", "close")]
    DEFAULT_CSS = """
    RaceScreen { align: center middle; }
    RaceScreen > Vertical { width: 100%; height: 100%; border: thick $primary;
                            background: $surface; padding: 0 1; }
    RaceScreen Horizontal { height: 1fr; }
    RaceScreen VerticalScroll { width: 1fr; padding: 0 1 0 0; }
    RaceScreen .title { height: auto; color: $text-accent; }
    RaceScreen #verdict { height: auto; border-top: solid $primary; }
    """

    def __init__(self, sides: list[tuple[TurnEnd, Trace]], verdict: str,
                 baseline: Baseline | None, *, ghosts: bool = False) -> None:
        super().__init__()
        self.sides, self.verdict, self.baseline, self.ghosts = sides, verdict, baseline, ghosts

    def compose(self) -> ComposeResult:
        with Vertical():
            with Horizontal():
                for end, trace in self.sides:
                    with VerticalScroll():
                        yield Static(side_title(end, self.baseline), classes="title")
                        yield Static(answer_content(trace, -1, self.ghosts))
            yield Static(Content(self.verdict + " · esc close"), id="verdict")
