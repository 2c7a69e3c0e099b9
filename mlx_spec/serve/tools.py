"""Tool calls in generated text, found and parsed by the tokenizer's own markers and parser
(mlx-lm's TokenizerWrapper: `tool_call_start`, `tool_call_end`, `tool_parser`); this server
writes no parser of its own."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from .requests import BadRequest
from .responses import StopText


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments)}}

    def anthropic(self) -> dict[str, Any]:
        return {"type": "tool_use", "id": self.id, "name": self.name, "input": self.arguments}


class ToolText:
    """Splits an answer into its text and its tool calls (when the request offered tools)."""

    def __init__(self, tokenizer: Any, tools: tuple[dict[str, Any], ...]):
        self.tools = list(tools)
        self.start = getattr(tokenizer, "tool_call_start", None) if tools else None
        self.end = getattr(tokenizer, "tool_call_end", None)
        self.parser = getattr(tokenizer, "tool_parser", None)
        if tools and not (self.start and self.parser):
            raise BadRequest("this model's chat template has no tool calling", "tools")

    @property
    def active(self) -> bool:
        return self.start is not None

    def split(self, text: str) -> tuple[str, list[ToolCall]]:
        """(the text outside tool calls, the calls). A call cut off by max_tokens, or one the
        parser refuses, stays in the text: nothing the model wrote is dropped."""
        if not self.active or self.start not in text:
            return text, []
        kept, calls, rest = [], [], text
        while (i := rest.find(self.start)) >= 0:
            kept.append(rest[:i])
            body = rest[i + len(self.start):]
            j = body.find(self.end) if self.end else len(body)
            if j < 0:
                kept.append(rest[i:])
                rest = ""
                break
            call = self._parse(body[:j])
            if call is None:
                kept.append(rest[i : i + len(self.start) + j + len(self.end or "")])
            else:
                calls.append(call)
            rest = body[j + len(self.end or ""):]
        kept.append(rest)
        return "".join(kept).strip() if calls else "".join(kept), calls

    def _parse(self, body: str) -> ToolCall | None:
        try:
            parsed = self.parser(body, self.tools)
        except Exception:  # noqa: BLE001 - a malformed call stays text
            return None
        first = parsed[0] if isinstance(parsed, list) and parsed else parsed
        if not isinstance(first, dict) or not isinstance(first.get("name"), str):
            return None
        arguments = first.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return None
        return ToolCall(first["name"], arguments if isinstance(arguments, dict) else {},
                        f"call_{uuid.uuid4().hex[:24]}")


class ToolStream:
    """Streamed text with tool calls held back: `add` passes text through until the first
    tool-call marker (holding back what could still become one), then keeps the rest;
    `finish` gives the text still to show and the parsed calls."""

    def __init__(self, tool_text: ToolText):
        self.tool_text = tool_text
        self.guard = StopText((tool_text.start,)) if tool_text.active else None
        self.rest: list[str] = []

    def add(self, piece: str) -> str:
        if self.guard is None:
            return piece
        if self.guard.hit:
            self.rest.append(piece)
            return ""
        shown = self.guard.add(piece)
        if self.guard.hit:
            self.rest = [self.tool_text.start, self.guard.after]
        return shown

    def finish(self) -> tuple[str, list[ToolCall]]:
        if self.guard is None:
            return "", []
        if not self.guard.hit:
            return self.guard.flush(), []
        return self.tool_text.split("".join(self.rest))
