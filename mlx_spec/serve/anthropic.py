"""Anthropic's Messages API (`POST /v1/messages`): its request body to a GenerateRequest, and its
answer — whole, or as the documented stream of events (message_start, content_block_start,
content_block_delta…, content_block_stop, message_delta, message_stop)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .requests import BadRequest, GenerateRequest, common_fields
from .responses import Generation, extras, new_id

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
        turns.append({"role": m["role"], "content": _text(m.get("content"), f"messages[{i}]")})
    fields = {k: v for k, v in body.items() if k not in ("stop_sequences", "stop")}
    if "stop_sequences" in body:
        fields["stop"] = body["stop_sequences"]
    model = body.get("model", default_model)
    if not isinstance(model, str):
        raise BadRequest("model must be a string", "model")
    return GenerateRequest(kind="messages", model=model or default_model,
                           messages=tuple(turns), **common_fields(fields))


def _text(content: Any, where: str) -> str:
    """A string, or a list of text blocks (anything else a text model cannot read)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text"
                                         and isinstance(b.get("text"), str) for b in content):
        return "".join(b["text"] for b in content)
    raise BadRequest(f"{where}: content must be a string or a list of text blocks", where)


def _stop(gen: Generation) -> dict[str, Any]:
    reason = "stop_sequence" if gen.stopped_by else STOP_REASON.get(gen.end.finish_reason,
                                                                    "end_turn")
    return {"stop_reason": reason, "stop_sequence": gen.stopped_by}


def _usage(gen: Generation) -> dict[str, int]:
    s = gen.end.stats
    return {"input_tokens": s.prompt_tokens, "output_tokens": s.generated_tokens,
            "cache_read_input_tokens": s.reused_tokens}


def message(gen: Generation, model: str, drafter: str, kinds: bool) -> dict[str, Any]:
    """The whole answer: iterates the generation to its end."""
    text, seen = [], []
    for piece, piece_kinds in gen:
        text.append(piece)
        seen += piece_kinds
    block: dict[str, Any] = {"type": "text", "text": "".join(text)}
    if kinds:
        block["mlx_spec_token_kinds"] = seen
    return {"id": new_id("msg"), "type": "message", "role": "assistant", "model": model,
            "content": [block], **_stop(gen), "usage": _usage(gen),
            **extras(gen.end.stats, drafter)}


def events(gen: Generation, model: str, drafter: str, kinds: bool
           ) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event name, data) in the documented order."""
    yield "message_start", {"type": "message_start", "message": {
        "id": new_id("msg"), "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0}}}
    yield "content_block_start", {"type": "content_block_start", "index": 0,
                                  "content_block": {"type": "text", "text": ""}}
    for piece, piece_kinds in gen:
        delta: dict[str, Any] = {"type": "text_delta", "text": piece}
        if kinds:
            delta["mlx_spec_token_kinds"] = piece_kinds
        yield "content_block_delta", {"type": "content_block_delta", "index": 0,
                                      "delta": delta}
    yield "content_block_stop", {"type": "content_block_stop", "index": 0}
    yield "message_delta", {"type": "message_delta", "delta": _stop(gen),
                            "usage": _usage(gen), **extras(gen.end.stats, drafter)}
    yield "message_stop", {"type": "message_stop"}


def error(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}
