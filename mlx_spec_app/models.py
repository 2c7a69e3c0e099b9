"""Choosing a model: the first-run welcome (what this is, the presets that fit this Mac, the
offline demo) and the download screen (progress, speed, ETA, cancel).

Nothing here touches the network until the user picks a preset that is not downloaded; the
download then runs in a child process (mlx_spec.hub.PullProcess), so cancelling is ending it and
what arrived resumes next time.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, OptionList, ProgressBar, Static
from textual.widgets.option_list import Option

from mlx_spec import hub, user_message

DEMO = "demo"
GGUF = "gguf:"  # an option naming a local GGUF model (the rest of its id is its model name)
DEMO_LINE = ("the bundled offline demo: a 2.4M-parameter code model that completes Python "
             "(it does not chat)")
PACKAGED_LINE = ("a real chat model installed with mlx-spec — small, so it chats briefly — "
                 "drafted by a head trained for it")
PACKAGED_PROMPTS = ("What is the capital of France?", "Give me three tips for sleeping better.",
                    "Write a Python function that reverses a string.")
DEMO_PROMPTS = ("def fibonacci(n):", "class Stack:", "for line in open(path):")
INTRO = ("mlx-spec decodes with a drafter that proposes tokens and the model that checks them "
         "in one pass; every token is coloured by what happened to it. Output is the model's own.")


@dataclass(frozen=True)
class Choice:
    """What the welcome screen returns: the demo, a local GGUF (GGUF + its model name), or a
    preset (downloaded or not)."""

    name: str
    downloaded: bool


def preset_line(p: hub.Preset, memory: int | None) -> Content:
    ready = hub.missing(p.name) is None
    fits = hub.fits(p, memory)
    parts = [(f"{p.name:<16}", "bold"),
             ("   ready " if ready else f"{p.download_gb:>6.1f} GB ",
              "$success" if ready else "$text-muted"), p.title]
    if not p.loadable:
        parts.append(("  target-only for now", "$warning"))
    if fits is False:
        parts.append((f"  needs ~{p.ram_gb:.0f} GB", "$error"))
    return Content.assemble(*parts)


class WelcomeScreen(ModalScreen[Choice | None]):
    """The GGUF models already here first, the demo, then the presets that fit this machine,
    then the rest (marked)."""

    BINDINGS = [Binding("escape", "dismiss(None)", "close")]
    DEFAULT_CSS = """
    WelcomeScreen { align: center middle; }
    WelcomeScreen > Vertical { width: 100; max-width: 100%; height: auto; max-height: 100%;
                               border: thick $primary; background: $surface; padding: 0 1; }
    WelcomeScreen Static { height: auto; margin-bottom: 1; }
    WelcomeScreen OptionList { height: auto; max-height: 14; }
    WelcomeScreen #hint { color: $text-muted; margin: 0; }
    """

    def __init__(self, *, first_run: bool = True) -> None:
        super().__init__()
        self.first_run = first_run

    def compose(self) -> ComposeResult:
        memory = hub.memory_bytes()
        presets = sorted(hub.presets(), key=lambda p: hub.fits(p, memory) is False)
        with Vertical():
            title = "Welcome to mlx-spec" if self.first_run else "Models"
            yield Static(Content.assemble((title, "bold"), "\n", INTRO))
            demo = Content.assemble((f"{DEMO:<16}", "bold"), ("   ready ", "$success"), DEMO_LINE)
            options = [Option(line, id=GGUF + name) for name, line in local_lines()]
            options += [Option(demo, id=DEMO)]
            options += [Option(preset_line(p, memory), id=p.name) for p in presets]
            yield OptionList(*options)
            yield Static(Content("enter: open (downloads what is missing) · esc: close · "
                                 "`mlx-spec models` in a terminal lists more"), id="hint")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        name = event.option.id or DEMO
        local = name.startswith(GGUF)
        self.dismiss(Choice(name, local or name == DEMO or hub.missing(name) is None))


def local_lines() -> list[tuple[str, Content]]:
    """The GGUF files already on this machine (Ollama, LM Studio, llama.cpp, the Hugging Face
    cache): real models that open offline, listed first."""
    from mlx_spec.errors import MlxSpecError
    from mlx_spec.gguf import find_local
    from mlx_spec.gguf.local import PACKAGED_SOURCE

    lines = []
    for g in find_local():
        try:
            d = g.describe()
        except MlxSpecError:
            continue
        label = f"{d['architecture']} {d['label']}".strip()
        if g.source.startswith(PACKAGED_SOURCE):  # installed with the app: named by its file
            shown, what = g.path.stem, f"{label}: {PACKAGED_LINE}"
        else:
            shown = g.name if len(g.name) <= 48 else "…" + g.name[-47:]
            what = f"{label}, GGUF from {g.source}"
        lines.append((g.name, Content.assemble((f"{shown:<16}", "bold"), ("   ready ", "$success"),
                                               what)))
    return lines


def is_packaged(model: str | None) -> bool:
    """Whether `model` is the chat model installed with the app (a packaged GGUF)."""
    from mlx_spec.gguf import find_packaged

    return model is not None and any(g.name == model for g in find_packaged())


class PullProgress(Message):
    def __init__(self, progress: hub.Progress) -> None:
        super().__init__()
        self.progress = progress


class PullEnded(Message):
    def __init__(self, launch: hub.Launch | None, error: str = "") -> None:
        super().__init__()
        self.launch, self.error = launch, error


class DownloadScreen(ModalScreen[hub.Launch | None]):
    """A pull with its progress; esc cancels (what arrived is kept and resumes next time)."""

    BINDINGS = [Binding("escape", "cancel", "cancel")]
    DEFAULT_CSS = """
    DownloadScreen { align: center middle; }
    DownloadScreen > Vertical { width: 90; max-width: 100%; height: auto; border: thick $primary;
                                background: $surface; padding: 1 2; }
    DownloadScreen Static { height: auto; }
    DownloadScreen ProgressBar { margin: 1 0; }
    DownloadScreen Horizontal { height: auto; }
    DownloadScreen Button { margin-right: 2; }
    """

    def __init__(self, name: str, *, drafter: str | None = None) -> None:
        super().__init__()
        self.pull_name, self.drafter = name, drafter
        self.process: hub.PullProcess | None = None
        self.failed = False

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Content.styled(f"Downloading {self.pull_name}", "bold"), id="title")
            yield ProgressBar(total=None, show_eta=False, id="bar")
            yield Static("asking the hub what to fetch…", id="detail")
            with Horizontal():
                yield Button("Cancel (esc)", id="cancel", variant="error")

    def on_mount(self) -> None:
        self._run()

    @work(thread=True, exclusive=True, group="pull")
    def _run(self) -> None:
        try:
            self.process = hub.PullProcess(self.pull_name, drafter=self.drafter)
            for event in self.process.events():
                if isinstance(event, hub.Progress):
                    self.post_message(PullProgress(event))  # at most 10 a second
                else:
                    self.post_message(PullEnded(event))
                    return
        except Exception as e:  # noqa: BLE001 - one line for the user
            self.post_message(PullEnded(None, user_message(e, "download failed")))

    def on_pull_progress(self, msg: PullProgress) -> None:
        p = msg.progress
        bar = self.query_one(ProgressBar)
        if p.total:
            bar.update(total=p.total, progress=p.done)
        self.query_one("#detail", Static).update(Content(progress_text(p)))

    def on_pull_ended(self, msg: PullEnded) -> None:
        if msg.launch is not None:
            self.dismiss(msg.launch)
            return
        if isinstance(self.process, hub.PullProcess) and self.process.cancelled:
            self.dismiss(None)
            return
        self.failed = True
        self.query_one("#title", Static).update(
            Content.styled(f"Could not download {self.pull_name}", "bold $text-error"))
        self.query_one("#detail", Static).update(Content(msg.error))
        self.query_one("#cancel", Button).label = "Back (esc)"

    def on_button_pressed(self) -> None:
        self.action_cancel()

    def action_cancel(self) -> None:
        if self.failed or self.process is None:
            if self.process is not None:
                self.process.close()
            self.dismiss(None)
            return
        self.process.cancel()  # the worker sees it end and dismisses


def progress_text(p: hub.Progress) -> str:
    if p.verifying:
        return f"{p.repo}: checking {p.file}"
    eta = "" if p.eta_s is None else f" · about {_duration(p.eta_s)} left"
    return (f"{p.repo} · {p.file}\n{hub.gb(p.done)} of {hub.gb(p.total)} · "
            f"{p.rate / 1e6:.1f} MB/s{eta}")


def _duration(s: float) -> str:
    s = int(s)
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"
