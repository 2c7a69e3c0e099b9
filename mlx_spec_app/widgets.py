"""Widgets: an answer coloured token by token, its stats line, the side panel, the input box."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.containers import Vertical, VerticalScroll
from textual.content import Content, Span
from textual.geometry import Region, Size
from textual.message import Message
from textual.strip import Strip
from textual.visual import Visual
from textual.widget import Widget
from textual.widgets import Markdown, Static, TextArea

from mlx_spec import Baseline, Totals, Trace, TurnStats

MB = 2**20


# Theme variables, so every theme keeps the meaning. Not colour-only: a correction is also bold
# and underlined, a bonus token italic; accepted and target-only text differ by colour alone, and
# the acceptance numbers say how much of each there is.
KIND_STYLE = {
    "accepted": "$success",
    "corrected": "bold underline $error",
    "bonus": "italic $primary",
    "target": "",
    "rejected": "strike dim",  # drafts the target threw away: not the answer's text
}
KIND_LABEL = {
    "accepted": "accepted draft",
    "corrected": "corrected by target",
    "bonus": "bonus",
    "target": "target only",
    "rejected": "rejected drafts",
}
def legend(ghosts: bool) -> Content:
    """Each kind's name in its own style ("rejected" while rejected drafts are shown). Short:
    it shares one row with the status, and fits the 40 columns 80 leave beside the side panel
    (f1 explains more)."""
    return Content(" ").join(Content.styled(kind, KIND_STYLE[kind] or "$text-muted")
                             for kind in KIND_STYLE if ghosts or kind != "rejected")
STOPPED = "[stopped]"
INTERRUPTED = "[interrupted]"  # the app ended (killed, crashed) while the answer streamed


ESTIMATING = "speedup: estimating…"  # the baseline is not measured yet: no number shown
NOT_MEASURED = "speedup: not measured"  # measuring it failed (the Baseline's method says why)


def stats_line(s: TurnStats, baseline: Baseline | None, *, speedup: bool = True) -> str:
    """One line under an answer. Speedup is against the target-only baseline (None: not
    measured yet, "estimating…"); speedup=False leaves it out (a saved answer: the baseline it
    was timed against is gone)."""
    if not s.generated_tokens:  # nothing was timed: no rates to show (never a 0 as if measured)
        return " · ".join([STOPPED] * (s.finish_reason == "cancelled") + ["no tokens"])
    parts = [f"{s.generated_tokens} tokens", f"{s.tok_s:.1f} tok/s",
             f"TTFT {s.ttft_s * 1e3:.0f} ms"]
    if s.drafted:
        parts.append(f"acceptance {s.acceptance_rate:.0%}")
    parts.append(f"{s.tokens_per_pass:.2f} tok/pass")
    if speedup:
        parts.append(speedup_text(s.tok_s, baseline))
    if s.generated_tokens > 1:
        parts.append(f"ITL p50/p90 {s.itl_p50_s * 1e3:.0f}/{s.itl_p90_s * 1e3:.0f} ms")
    parts.append(f"draft {s.draft_s * 1e3:.0f} ms / verify {s.verify_s * 1e3:.0f} ms")
    k = f"auto≤{s.max_draft}" if s.adaptive else str(s.max_draft)
    parts.append(f"{s.drafter} k={k}" if s.drafter != "none" else "no drafter")
    if s.finish_reason == "cancelled":
        parts.insert(0, STOPPED)
    return " · ".join(parts)


def speedup_text(tok_s: float, baseline: Baseline | None) -> str:
    """`speedup ×1.23`; "estimating…" while no baseline is measured; "not measured" when
    measuring it failed (a baseline of 0 tok/s: its method says why)."""
    if baseline is None:
        return ESTIMATING
    if baseline.tok_s <= 0:
        return NOT_MEASURED
    return f"speedup ×{baseline.speedup(tok_s):.2f}"


def sparkline(percents: list[float], width: int) -> Content:
    """The last `width` values as one line of block characters on a fixed 0..100 scale (Textual's
    Sparkline rescales to the data, which makes a steady 5% look like 100%)."""
    if not percents:
        return Content("–")
    ticks = "▁▂▃▄▅▆▇█"
    bars = "".join(ticks[min(7, int(p / 100 * 8))] for p in percents[-width:])
    return Content.assemble((bars, "$success"), f" {percents[-1]:.0f}%")


class TokenView(Widget):
    """An answer's coloured tokens, drawn with Textual's line API and wrapped incrementally.

    Text only ever grows at its end, so rows of finished paragraphs (up to the last newline) are
    wrapped once and kept as strips; a flush re-wraps only the paragraph in progress and repaints
    only the rows from its first one on. A plain Static would re-wrap the whole answer and repaint
    every row on each update. While streaming, rows are reserved STEP at a time, so the height
    changes, and a (costly) layout pass runs, once per STEP lines instead of once per line.
    Every millisecond the UI thread spends here is taken from the engine on a small machine."""

    DEFAULT_CSS = "TokenView { height: auto; }"
    STEP = 16

    def __init__(self, piece: Callable[[int, int], Content], **kwargs: Any) -> None:
        """piece(start, end): the answer's text[start:end] with its styles."""
        super().__init__(**kwargs)
        self._piece = piece
        self._text = ""
        self._width = 0
        self._rows: list[Strip] = []  # finished paragraphs, text[:_done]
        self._tail: list[Strip] = []  # the paragraph in progress, text[_done:]
        self._done = 0
        self._paragraphs = 0  # newlines in text[:_done]
        self.streaming = True

    @property
    def rows(self) -> int:
        return len(self._rows) + len(self._tail)

    def _reserved(self, rows: int) -> int:
        """The height for `rows` rows of text: while streaming, whole steps, and at least one."""
        return max(1, -(-rows // self.STEP)) * self.STEP if self.streaming else rows

    def _wrap(self, start: int, end: int) -> list[Strip]:
        """Rows of text[start:end] (which starts a paragraph). Each segment carries an "offset"
        (column, paragraph) that text selection maps back to the text; rendered on its own the
        piece counts paragraphs from 0, so they are shifted by those above it."""
        strips = Visual.to_strips(self, self._piece(start, end), self._width, None,
                                  self.visual_style)
        return _shift_paragraphs(strips, self._paragraphs) if self._paragraphs else strips

    def sync(self, text: str, *, redraw: bool = False) -> None:
        """Catch up with `text`, which grew at its end since the last call. redraw: start over
        (the width or the styles changed)."""
        width = self.size.width
        old_height = self._reserved(self.rows)
        if redraw or width != self._width:
            self._width, self._rows, self._tail, self._done, self._paragraphs = width, [], [], 0, 0
        self._text = text
        if not width:  # not laid out yet: on_resize draws it
            return
        first = len(self._rows)
        cut = text.rfind("\n", self._done)
        if cut >= 0:  # paragraphs finished since the last call move into the kept rows
            self._rows += self._wrap(self._done, cut)
            self._paragraphs += text.count("\n", self._done, cut + 1)
            self._done = cut + 1
        self._tail = self._wrap(self._done, len(text))
        if self._reserved(self.rows) != old_height:
            self.refresh(layout=True)
        else:
            self.refresh(Region(0, first, width, max(1, self.rows - first)))

    def finish(self) -> None:
        """Streaming is over: no more reserved rows."""
        self.streaming = False
        self.refresh(layout=True)

    def on_resize(self) -> None:
        if self.size.width != self._width:
            self.sync(self._text, redraw=True)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        if width != self._width:  # asked about another width: wrap for it
            return self._reserved(self._piece(0, len(self._text)).get_height(self.styles, width))
        return self._reserved(self.rows)

    def render_line(self, y: int) -> Strip:
        rows = self._rows
        if y < len(rows):
            return rows[y]
        if y - len(rows) < len(self._tail):
            return self._tail[y - len(rows)]
        return Strip.blank(self.size.width, self.visual_style.rich_style)

    def render(self) -> Content:
        """The whole text (what text selection reads; drawing goes through render_line)."""
        return self._piece(0, len(self._text))


def _shift_paragraphs(strips: list[Strip], paragraphs: int) -> list[Strip]:
    """The strips with each segment's selection offset (column, paragraph) moved down."""
    out = []
    for strip in strips:
        segments = []
        for text, style, control in strip:
            if style is not None and (offset := style.meta.get("offset")) is not None:
                style = style + Style.from_meta({"offset": (offset[0], offset[1] + paragraphs)})
            segments.append(Segment(text, style, control))
        out.append(Strip(segments, strip.cell_length))
    return out


class Answer(Vertical):
    """One assistant answer: coloured tokens while streaming, Markdown on demand afterwards."""

    DEFAULT_CSS = """
    Answer { height: auto; margin: 0 0 1 0; }
    Answer > .tokens { height: auto; }
    Answer > Markdown { height: auto; margin: 0; padding: 0; }
    Answer > .stats { color: $text-muted; height: auto; }
    Answer > .race { color: $text-accent; height: auto; display: none; }
    Answer.raced > .race { display: block; }
    Answer.markdown > .tokens { display: none; }
    Answer > Markdown { display: none; }
    Answer.markdown > Markdown { display: block; }
    """

    def __init__(self, highlight: bool = True, ghosts: bool = False) -> None:
        """ghosts: show the drafts the target rejected (pieces of kind "rejected"), struck
        out; they are never part of the answer's text."""
        super().__init__(classes="answer")
        self.highlight, self.ghosts = highlight, ghosts
        self.kinds: list[str] = []  # the answer's tokens' (ghosts not counted)
        self.stats: TurnStats | None = None
        self.trace: Trace | None = None  # the finished turn's record (inspect, save trace)
        self.partial = False
        self._pieces: list[tuple[str, str]] = []  # everything extend() was given
        self._plain = ""  # the answer's own text
        self._text = ""  # what is shown: with the ghosts when they are on
        self._runs: list[Span] = []  # adjacent pieces of one kind merged; style = kind name
        # built here, not in compose, so they can be updated before the answer is mounted
        self._tokens = TokenView(self._content, classes="tokens")
        self._stats = Static(classes="stats")
        self._race = Static(classes="race")

    def compose(self):
        yield self._tokens
        yield self._stats
        yield self._race

    @property
    def text(self) -> str:
        """The answer's own text (rejected drafts are not in it)."""
        return self._plain

    @property
    def runs(self) -> list[list[str]]:
        """[[text, kind], ...] with adjacent same-kind pieces merged, rejected drafts included
        (what history stores)."""
        runs: list[list[str]] = []
        for text, kind in self._pieces:
            if runs and runs[-1][1] == kind:
                runs[-1][0] += text
            elif text:
                runs.append([text, kind])
        return runs

    @property
    def content(self) -> Content:
        """The whole answer as the token view shows it: styled by kind when highlighting."""
        return self._content(0, len(self._text))

    def extend(self, pieces: list[tuple[str, str]]) -> None:
        """Append (text, kind) tokens (and rejected drafts) and redraw what changed."""
        self._pieces += pieces
        self._show(pieces)
        self._tokens.sync(self._text)

    def _show(self, pieces: list[tuple[str, str]]) -> None:
        for text, kind in pieces:
            if kind != "rejected":
                self.kinds.append(kind)
                self._plain += text
            elif not self.ghosts:
                continue
            if not text:
                continue
            start = len(self._text)
            self._text += text
            runs = self._runs
            if runs and runs[-1].style == kind and runs[-1].end == start:
                runs[-1] = Span(runs[-1].start, len(self._text), kind)
            else:
                runs.append(Span(start, len(self._text), kind))

    def set_ghosts(self, on: bool) -> None:
        """Show or hide the rejected drafts (the answer is drawn again)."""
        if on == self.ghosts:
            return
        self.ghosts = on
        self.kinds, self._plain, self._text, self._runs = [], "", "", []
        self._show(self._pieces)
        self._tokens.sync(self._text, redraw=True)

    def _content(self, start: int, end: int) -> Content:
        """text[start:end] with the kinds' styles (spans clipped and shifted)."""
        spans = []
        for r in reversed(self._runs):  # callers mostly want the end: stop early
            if r.end <= start:
                break
            if self.highlight or r.style == "rejected":  # a ghost is always told apart
                style = KIND_STYLE[str(r.style)]
                if style and r.start < end:
                    spans.append(Span(max(r.start, start) - start, min(r.end, end) - start,
                                      style))
        spans.reverse()
        return Content(self._text[start:end], spans)

    def set_highlight(self, on: bool) -> None:
        self.highlight = on
        self._tokens.sync(self._text, redraw=True)

    def finish(self, stats: TurnStats | None, line: str) -> None:
        self.stats = stats
        self._tokens.finish()
        self.partial = stats is not None and stats.finish_reason == "cancelled"
        self.show_line(line)

    def show_line(self, line: str) -> None:
        self._stats.update(Content(line))  # plain text, never markup

    def show_race(self, line: str) -> None:
        self._race.update(Content(line))
        self.add_class("raced")

    def toggle_markdown(self) -> bool:
        """Switch between coloured tokens and Markdown; True when Markdown is now shown."""
        if not self.query(Markdown):
            self.mount(Markdown(self.text), before=self._stats)
        self.toggle_class("markdown")
        return self.has_class("markdown")


class UserMessage(Static):
    DEFAULT_CSS = """
    UserMessage { background: $boost; padding: 0 1; margin: 0 0 1 0;
                  border-left: outer $primary; }
    """

    def __init__(self, text: str) -> None:
        super().__init__(Content(text))  # user text is never parsed as markup
        self.text = text


class StatsPanel(VerticalScroll):
    """Session totals, per-position acceptance bars, acceptance over turns, memory."""

    DEFAULT_CSS = """
    StatsPanel { width: 40; border-left: solid $primary; padding: 0 1; }
    StatsPanel > Static { height: auto; margin-bottom: 1; }
    StatsPanel > .title { margin-bottom: 0; text-style: bold; color: $text-primary; }
    StatsPanel > #method { color: $text-muted; }
    """
    BAR = 20

    def compose(self):
        yield Static("Engine", classes="title")
        yield Static("loading…", id="engine")
        yield Static("", id="method")
        yield Static("Session", classes="title")
        yield Static("no turns yet", id="totals")
        yield Static("Acceptance by draft position", classes="title")
        yield Static("–", id="positions")
        yield Static("Acceptance, last turns (0–100%)", classes="title")
        yield Static("–", id="trend")
        yield Static("Memory", classes="title")
        yield Static("–", id="memory")

    def show_engine(self, text: str, baseline: Baseline | None) -> None:
        """The engine's line, and the baseline speedups are quoted on (or that it is being
        estimated: measured while the engine is idle)."""
        self.query_one("#engine", Static).update(Content(text))
        if baseline is None:
            method = f"{ESTIMATING} (the target alone is timed while the engine is idle)"
        elif baseline.tok_s <= 0:
            method = f"{NOT_MEASURED}: {baseline.method}"
        else:
            method = (f"speedup = tok/s ÷ baseline {baseline.tok_s:.1f} tok/s: "
                      f"{baseline.describe()}")
        self.query_one("#method", Static).update(Content(method))

    def show_totals(self, t: Totals, baseline: Baseline | None) -> None:
        lines = [f"{t.turns} turn{'s' * (t.turns != 1)} · {t.tokens} tokens",
                 f"{t.tok_s:.1f} tok/s average"]
        speedup = speedup_text(t.tok_s, baseline)
        lines.append(speedup if speedup in (ESTIMATING, NOT_MEASURED)
                     else f"{speedup} vs baseline")
        lines.append(f"{t.tokens_per_pass:.2f} tokens / target pass")
        lines.append(f"acceptance {t.acceptance_rate:.0%} of {t.drafted} drafted"
                     if t.drafted else "nothing drafted yet")
        self.query_one("#totals", Static).update(Content("\n".join(lines)))
        self.query_one("#positions", Static).update(self._bars(t))
        self.query_one("#trend", Static).update(sparkline(t.acceptance, self.BAR + 6))
        self._memory(t.last)

    def _bars(self, t: Totals) -> Content:
        rows = []
        for pos, rate, _ in t.per_position():
            full = round(rate * self.BAR)
            rows.append(Content.assemble(
                f"{pos:>2} ", ("█" * full, "$success"), ("░" * (self.BAR - full), "$text-muted"),
                f" {rate:4.0%}"))
        return Content("\n").join(rows) if rows else Content("–")

    def _memory(self, s: TurnStats | None) -> None:
        if s is None:
            return
        self.query_one("#memory", Static).update(Content(
            f"target   {s.target_bytes / MB:7.1f} MB" + (" (here)" if s.ranks > 1 else "") + "\n"
            f"drafter  {s.drafter_bytes / MB:7.1f} MB\n"
            f"KV cache {s.kv_cache_bytes / MB:7.1f} MB\n"
            f"peak     {s.peak_memory / MB:7.1f} MB (last turn)"))


class PromptInput(TextArea):
    """The message box. Enter sends; ctrl+j (or shift/alt+enter where the terminal reports them)
    inserts a newline: a plain TextArea would insert one on enter."""

    NEWLINE_KEYS = frozenset({"ctrl+j", "shift+enter", "alt+enter"})

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self.text))
            return
        if event.key in self.NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        await super()._on_key(event)
