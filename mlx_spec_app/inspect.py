"""Inspect the last answer: a cursor over its tokens, what decided the one under it (p, q, the
test, the top-5 of each, its round, the drafts it replaced), and the turn's round timeline.

Everything shown comes from the turn's trace (mlx_spec.Trace), recorded while it ran: opening
this screen does no engine work."""

from __future__ import annotations

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.content import Content, Span
from textual.screen import ModalScreen
from textual.style import Style
from textual.widgets import DataTable, Static

from mlx_spec import RoundTrace, Trace, rejected_text
from mlx_spec.events import Row

from .widgets import KIND_LABEL, KIND_STYLE

BAR = 16  # cells of the timeline's time bar


def pct(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{100 * x:.1f}%" if x >= 0.001 or x == 0 else f"{100 * x:.3f}%"


def shown(text: str) -> str:
    """A token's text on one line, quoted: its spaces and line breaks visible."""
    return repr(text)


def details(trace: Trace, i: int) -> Content:
    """What decided token i: its round, and its row of that round's verify pass."""
    t = trace.tokens[i]
    head = Content.assemble((shown(t.text), "bold"), "  ",
                            (KIND_LABEL.get(t.kind, t.kind), KIND_STYLE.get(t.kind) or
                             "$text-muted"), f"  token {i + 1} of {len(trace.tokens)}")
    if not 0 <= t.round < len(trace.rounds):
        return Content("\n").join([head, Content("not traced round by round")])
    r = trace.rounds[t.round]
    first = next(j for j, x in enumerate(trace.tokens) if x.round == t.round)
    lines = [head, Content(_round_line(r))]
    row = r.rows[i - first] if i - first < len(r.rows) else None
    if row is None:
        lines.append(Content("a plain step: the target's own token (its logits were not read)"))
        return Content("\n").join(lines)
    lines += _row_lines(r, row)
    if t.kind == "corrected" and r.rejected:
        lost: list[Content | tuple[str, str] | str] = [("replaced: ", "bold")]
        for n, x in enumerate(r.rejected):
            lost += [", " if n else "", (shown(x.draft_text), KIND_STYLE["rejected"]),
                     f" p {pct(x.p)} q {pct(x.q)} {x.verdict}"]
        lines.append(Content.assemble(*lost))
    return Content("\n").join(lines)


def _round_line(r: RoundTrace) -> str:
    copy = " (a copy)" if r.copied else ""
    return (f"round {r.index + 1}: drafted {r.k}{copy}, accepted {r.accepted} · draft / verify "
            f"/ commit {1e3 * r.draft_s:.1f} / {1e3 * r.verify_s:.1f} / "
            f"{1e3 * r.commit_s:.1f} ms")


def _row_lines(r: RoundTrace, row: Row) -> list[Content]:
    out = []
    if row.draft is not None:  # q: none where the drafter drafts greedily (T = 0)
        test = {"argmax": "kept if the target's argmax",
                "p/q": f"min(1, p/q) {pct(row.chance)}",
                "gumbel": "kept if the target's own draw"}[r.rule]
        out.append(Content(f"draft {shown(row.draft_text)}: p {pct(row.p)} · q {pct(row.q)} · "
                           f"{test} → {row.verdict}"))
    if row.token is not None:
        out.append(Content(f"p({shown(row.token_text)}) {pct(row.p_token)}"
                           + (" · greedy: p is the softmax at T = 1" if r.rule == "argmax"
                              else "")))
    out.append(Content("top-5 p: " + "  ".join(f"{shown(c.text)} {pct(c.prob)}"
                                               for c in row.top_p)))
    if row.top_q:
        out.append(Content("top-5 q: " + "  ".join(f"{shown(c.text)} {pct(c.prob)}"
                                                   for c in row.top_q)))
    return out


def answer_content(trace: Trace, cursor: int, ghosts: bool) -> Content:
    """The answer's tokens in their colours, the cursor's reversed, each token clickable
    (its index in the style's meta), ghosts before the corrections when they are shown."""
    parts: list[str] = []
    spans: list[Span] = []
    at = 0
    for i, t in enumerate(trace.tokens):
        if ghosts and t.kind == "corrected" and 0 <= t.round < len(trace.rounds):
            lost = rejected_text(trace.rounds[t.round])
            if lost:
                parts.append(lost)
                spans.append(Span(at, at + len(lost), KIND_STYLE["rejected"]))
                at += len(lost)
        text = t.text if t.text else ("·" if i == cursor else "")
        if i == cursor and text.strip() == "":
            text = text.replace("\n", "⏎\n") or "·"
        parts.append(text)
        style = KIND_STYLE.get(t.kind, "")
        if style:
            spans.append(Span(at, at + len(text), style))
        spans.append(Span(at, at + len(text), Style.from_meta({"token": i})))
        if i == cursor:
            spans.append(Span(at, at + len(text), "reverse"))
        at += len(text)
    return Content("".join(parts), spans)


class InspectScreen(ModalScreen[None]):
    """The last answer, token by token, and its rounds."""

    BINDINGS = [
        Binding("escape,f2,q", "dismiss", "close"),
        Binding("left,h", "move(-1)", "previous", show=False),
        Binding("right,l", "move(1)", "next", show=False),
        Binding("n", "jump(1)", "next correction"),
        Binding("p", "jump(-1)", "previous correction"),
        Binding("home", "move(-100000)", "first", show=False),
        Binding("end", "move(100000)", "last", show=False),
        Binding("t", "timeline", "rounds / tokens"),
    ]
    DEFAULT_CSS = """
    InspectScreen { align: center middle; }
    InspectScreen > Vertical { width: 100%; height: 100%; border: thick $primary;
                               background: $surface; padding: 0 1; }
    InspectScreen #help { color: $text-muted; height: 1; }
    InspectScreen #answer { height: 1fr; min-height: 3; }
    InspectScreen #details { height: auto; max-height: 9; border-top: solid $primary;
                             overflow-y: auto; }
    InspectScreen DataTable { height: 1fr; display: none; }
    InspectScreen.timeline DataTable { display: block; }
    InspectScreen.timeline #answer, InspectScreen.timeline #details { display: none; }
    """

    def __init__(self, trace: Trace, *, ghosts: bool = True) -> None:
        super().__init__()
        self.trace, self.ghosts = trace, ghosts
        self.cursor = next((i for i, t in enumerate(trace.tokens) if t.kind == "corrected"), 0)

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Content("← → token · n / p correction · t rounds · click a token · "
                                 "esc close"), id="help")
            with VerticalScroll(id="answer"):
                yield Static(id="tokens")
            yield Static(id="details")
            yield DataTable(id="rounds", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        self._fill_timeline()
        self._draw()

    def _draw(self) -> None:
        if not self.trace.tokens:
            self.query_one("#details", Static).update("No tokens in this answer.")
            return
        content = answer_content(self.trace, self.cursor, self.ghosts)
        self.query_one("#tokens", Static).update(content)
        self.query_one("#details", Static).update(details(self.trace, self.cursor))
        self.call_after_refresh(self._follow, content)

    def _follow(self, content: Content) -> None:
        """Scroll the answer so the cursor's row is in view (a long answer)."""
        pane, tokens = self.query_one("#answer", VerticalScroll), self.query_one("#tokens")
        start = next((s.start for s in content.spans if str(s.style) == "reverse"), 0)
        if tokens.size.width:
            row = content[:start + 1].get_height(tokens.styles, tokens.size.width) - 1
            if not pane.scroll_offset.y <= row < pane.scroll_offset.y + pane.size.height:
                pane.scroll_to(y=max(0, row - pane.size.height // 2), animate=False)

    def action_move(self, step: int) -> None:
        self.cursor = max(0, min(len(self.trace.tokens) - 1, self.cursor + step))
        self._draw()

    def action_jump(self, direction: int) -> None:
        """To the next (1) / previous (-1) corrected token."""
        order = range(self.cursor + 1, len(self.trace.tokens)) if direction > 0 else \
            range(self.cursor - 1, -1, -1)
        found = next((i for i in order if self.trace.tokens[i].kind == "corrected"), None)
        if found is None:
            self.notify("No more corrections that way.", timeout=2)
            return
        self.cursor = found
        self._draw()

    def action_timeline(self) -> None:
        self.toggle_class("timeline")
        if self.has_class("timeline"):
            self.query_one(DataTable).focus()

    def on_click(self, event: events.Click) -> None:
        token = event.style.meta.get("token") if event.style else None
        if isinstance(token, int):
            self.cursor = token
            self._draw()

    def _fill_timeline(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("#", "at ms", "k", "ok", "out", "ms", "draft · verify · commit")
        rounds = self.trace.rounds
        if not rounds:
            return
        longest = max(r.draft_s + r.verify_s + r.commit_s for r in rounds) or 1.0
        for r in rounds:
            total = r.draft_s + r.verify_s + r.commit_s
            table.add_row(str(r.index + 1), f"{1e3 * r.at_s:.0f}", str(r.k) +
                          ("c" if r.copied else ""), str(r.accepted), str(r.emitted),
                          f"{1e3 * total:.1f}", bar(r, longest))


def bar(r: RoundTrace, longest: float) -> Content:
    """The round's time as a bar of BAR cells at most: draft, verify, commit."""
    parts, spans, at = [], [], 0
    for seconds, style in ((r.draft_s, "$primary"), (r.verify_s, "$success"),
                           (r.commit_s, "$warning")):
        n = round(BAR * seconds / longest)
        if n:
            parts.append("█" * n)
            spans.append(Span(at, at + n, style))
            at += n
    return Content("".join(parts), spans)
