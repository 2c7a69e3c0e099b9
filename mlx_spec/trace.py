"""A traced turn as one record to keep or share: `generate --trace`, the app's "save trace" and
the server's `mlx_spec_trace` extension all write this same record (JSON; trace_html.py draws
it as one self-contained HTML page).

    recorder = Recorder()
    for event in chat.generate(ids, trace=True):
        recorder.add(event)
    save_trace(recorder.trace(engine=..., sampling=cfg, messages=...), "turn.json")
    # (trace_html.save_trace: JSON, or for a .html path the page)

Every figure in it was measured in the turn: p and q are the probabilities the round's
acceptance test read (events.Row says which distribution), times are the engine's own clocks.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import MlxSpecError
from .events import Choice, Event, RoundTrace, Row, TokenEvent, TurnEnd, TurnStats

if TYPE_CHECKING:  # no MLX here: the app's process reads and writes traces
    from .sampling import SamplingConfig

FORMAT = "mlx-spec-trace"
VERSION = 1


@dataclass(frozen=True)
class Token:
    """An emitted token: its id, text (as streamed), kind and the round it came from."""

    token: int
    text: str
    kind: str
    round: int  # index into Trace.rounds (-1: the turn was not traced round by round)


@dataclass(frozen=True)
class Trace:
    tokens: tuple[Token, ...]
    rounds: tuple[RoundTrace, ...]
    stats: TurnStats | None
    engine: dict[str, Any] = field(default_factory=dict)  # target, drafter, draft length, ...
    sampling: dict[str, Any] = field(default_factory=dict)
    messages: tuple[dict[str, str], ...] = ()
    created: str = ""

    @property
    def text(self) -> str:
        return "".join(t.text for t in self.tokens)


class Recorder:
    """Collects a traced turn's events (in the order they came) into a Trace."""

    def __init__(self) -> None:
        self.tokens: list[Token] = []
        self.rounds: list[RoundTrace] = []
        self.end: TurnEnd | None = None
        self._owed = 0  # tokens the last RoundTrace announced and not yet come

    def add(self, event: Event) -> None:
        if isinstance(event, TokenEvent):
            mine = self._owed > 0
            self._owed -= mine
            self.tokens.append(Token(event.token, event.text, event.kind.value,
                                     len(self.rounds) - 1 if mine else -1))
        elif isinstance(event, RoundTrace):  # it comes before its tokens
            self.rounds.append(event)
            self._owed = event.emitted
        elif isinstance(event, TurnEnd):
            self.end = event

    def trace(self, *, engine: dict[str, Any] | None = None,
              sampling: SamplingConfig | None = None,
              messages: list[dict[str, str]] | None = None) -> Trace:
        return Trace(tuple(self.tokens), tuple(self.rounds),
                     self.end.stats if self.end is not None else None,
                     dict(engine or {}), asdict(sampling) if sampling is not None else {},
                     tuple(messages or ()), time.strftime("%Y-%m-%dT%H:%M:%S%z"))


def ghost(text: str) -> str:
    """Rejected drafts as one line of ghost text: line breaks (and the indent after them) and
    tabs as visible marks."""
    return re.sub(r"\n[ \t]*", "⏎", text).replace("\t", "→")


def rejected_text(round_: RoundTrace) -> str:
    """The drafts a round's target threw away, as ghost text ("" if none)."""
    return ghost("".join(r.draft_text for r in round_.rejected))


def engine_fields(target: str, drafter: str, draft_length: object, split: str = ""
                  ) -> dict[str, Any]:
    """What a trace says about the engine that ran it."""
    return {"target": target, "drafter": drafter, "draft length": str(draft_length),
            "split": split}


def to_dict(trace: Trace) -> dict[str, Any]:
    """The trace as JSON-ready data (the file format, version VERSION)."""
    return {
        "format": FORMAT, "version": VERSION, "created": trace.created,
        "engine": trace.engine, "sampling": trace.sampling, "messages": list(trace.messages),
        "text": trace.text,
        "tokens": [asdict(t) for t in trace.tokens],
        "rounds": [asdict(r) for r in trace.rounds],
        "stats": trace.stats.to_dict() if trace.stats is not None else None,
    }


def from_dict(d: dict[str, Any]) -> Trace:
    """Back from to_dict(); MlxSpecError if it is not a trace this version reads."""
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise MlxSpecError("not an mlx-spec trace")
    if d.get("version") != VERSION:
        raise MlxSpecError(f"trace version {d.get('version')} (this mlx-spec reads {VERSION})")
    return Trace(
        tokens=tuple(Token(**t) for t in d["tokens"]),
        rounds=tuple(_round(r) for r in d["rounds"]),
        stats=TurnStats.from_dict(d["stats"]) if d.get("stats") else None,
        engine=d.get("engine", {}), sampling=d.get("sampling", {}),
        messages=tuple(d.get("messages", ())), created=d.get("created", ""))


def _round(d: dict[str, Any]) -> RoundTrace:
    rows = tuple(Row(**{**r, "top_p": tuple(Choice(**c) for c in r["top_p"]),
                        "top_q": tuple(Choice(**c) for c in r["top_q"])}) for r in d["rows"])
    return RoundTrace(**{**d, "drafted": tuple(d["drafted"]), "rows": rows})


def load_trace(path: str | Path) -> Trace:
    try:
        return from_dict(json.loads(Path(path).expanduser().read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise MlxSpecError(f"cannot read the trace {path}: {e}") from e
