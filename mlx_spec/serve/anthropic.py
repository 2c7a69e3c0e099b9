"""Anthropic's Messages API (`POST /v1/messages`): its request body to a GenerateRequest, and its
answer — whole, or as the documented stream of events (message_start, content_block_start,
content_block_delta…, content_block_stop, message_delta, message_stop)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from .requests import BadRequest, GenerateRequest, common_fields, model_name
from .responses import Generation, extras, new_id
from .tools import ToolCall, ToolStream

STOP_REASON = {"stop": "end_turn", "length": "max_tokens", "context": "max_tokens",
               "cancelled": "end_turn"}


def parse_messages(body: Any, *, default_model: str) -> GenerateRequest:
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if "max_tokens" not in body:
        raise BadRequest("max_tokens is required", "max_tokens")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", "messages")
    turns = [{"role": "system", "content": _text(body["system"], "system")}] if body.get(
        "system") else []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise BadRequest(f"messages[{i}].role must be user or assistant", f"messages[{i}]")
        turns += _turns(m["role"], m.get("content"), f"messages[{i}]")
    fields = {k: v for k, v in body.items() if k not in ("stop_sequences", "stop")}
    if "stop_sequences" in body:
        fields["stop"] = body["stop_sequences"]
    return GenerateRequest(kind="messages", model=model_name(body, default_model),
                           messages=tuple(turns), tools=_tools(body), **common_fields(fields))


def _tools(body: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """Anthropic's tools ({name, description, input_schema}) as the functions a chat template
    lays out; tool_choice {"type": "none"} drops them."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None or (isinstance(choice, dict) and choice.get("type") == "none"):
        return ()
    if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance(
            t.get("name"), str) for t in tools):
        raise BadRequest("tools must be a list of {name, description, input_schema}", "tools")
    return tuple({"type": "function", "function": {
        "name": t["name"], "description": t.get("description", ""),
        "parameters": t.get("input_schema", {"type": "object"})}} for t in tools)


def _turns(role: str, content: Any, where: str) -> list[dict[str, Any]]:
    """One Anthropic message as chat-template turns: text, an assistant's tool_use blocks as
    its tool_calls, a user's tool_result blocks as tool turns."""
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise BadRequest(f"{where}: content must be a string or a list of blocks", where)
    text = "".join(b.get("text", "") for b in content if b.get("type") == "text")
    calls = [{"id": b.get("id", ""), "type": "function", "function": {
        "name": b.get("name", ""), "arguments": json.dumps(b.get("input", {}))}}
        for b in content if b.get("type") == "tool_use"]
    results = [{"role": "tool", "tool_call_id": b.get("tool_use_id", ""),
                "content": _text(b.get("content", ""), where)}
               for b in content if b.get("type") == "tool_result"]
    if any(b.get("type") not in ("text", "tool_use", "tool_result") for b in content):
        raise BadRequest(f"{where}: only text, tool_use and tool_result blocks are supported",
                         where)
    turn: dict[str, Any] = {"role": role, "content": text}
    if calls:
        turn["tool_calls"] = calls
    return results + ([turn] if text or calls or not results else [])


def _text(content: Any, where: str) -> str:
    """A string, or a list of text blocks (anything else a text model cannot read)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text"
                                         and isinstance(b.get("text"), str) for b in content):
        return "".join(b["text"] for b in content)
    raise BadRequest(f"{where}: content must be a string or a list of text blocks", where)


def _stop(gen: Generation, calls: list[ToolCall]) -> dict[str, Any]:
    reason = "tool_use" if calls else "stop_sequence" if gen.stopped_by else STOP_REASON.get(
        gen.end.finish_reason, "end_turn")
    return {"stop_reason": reason, "stop_sequence": gen.stopped_by}


def _usage(gen: Generation) -> dict[str, int]:
    s = gen.end.stats
    return {"input_tokens": s.prompt_tokens, "output_tokens": s.generated_tokens,
            "cache_read_input_tokens": s.reused_tokens}


def message(gen: Generation, text: str, calls: list[ToolCall], model: str, drafter: str,
            kinds: list[str] | None) -> dict[str, Any]:
    """The whole answer, once the generation has ended: its text and tool_use blocks."""
    blocks: list[dict[str, Any]] = []
    if text or not calls:
        blocks.append({"type": "text", "text": text})
        if kinds is not None:
            blocks[0]["mlx_spec_token_kinds"] = kinds
    blocks += [c.anthropic() for c in calls]
    return {"id": new_id("msg"), "type": "message", "role": "assistant", "model": model,
            "content": blocks, **_stop(gen, calls), "usage": _usage(gen),
            **extras(gen.end.stats, drafter)}


def events(gen: Generation, tools: ToolStream, model: str, drafter: str, kinds: bool
           ) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event name, data) in the documented order."""
    yield "message_start", {"type": "message_start", "message": {
        "id": new_id("msg"), "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0}}}
    yield "content_block_start", {"type": "content_block_start", "index": 0,
                                  "content_block": {"type": "text", "text": ""}}
    for piece, piece_kinds in gen:
        yield from _text_delta(tools.add(piece), piece_kinds if kinds else None)
    tail, calls = tools.finish()
    yield from _text_delta(tail, None)
    yield "content_block_stop", {"type": "content_block_stop", "index": 0}
    for i, call in enumerate(calls, start=1):
        yield "content_block_start", {"type": "content_block_start", "index": i,
                                      "content_block": {**call.anthropic(), "input": {}}}
        yield "content_block_delta", {"type": "content_block_delta", "index": i, "delta": {
            "type": "input_json_delta", "partial_json": json.dumps(call.arguments)}}
        yield "content_block_stop", {"type": "content_block_stop", "index": i}
    yield "message_delta", {"type": "message_delta", "delta": _stop(gen, calls),
                            "usage": _usage(gen), **extras(gen.end.stats, drafter),
                            **gen.traced()}
    yield "message_stop", {"type": "message_stop"}


def _text_delta(text: str, kinds: list[str] | None) -> Iterator[tuple[str, dict[str, Any]]]:
    if not text and kinds is None:
        return
    delta: dict[str, Any] = {"type": "text_delta", "text": text}
    if kinds is not None:
        delta["mlx_spec_token_kinds"] = kinds
    yield "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}


def error(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}
