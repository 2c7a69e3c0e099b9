"""OpenAI-style request bodies to typed requests, validated field by field: a bad field is one
`BadRequest` naming it (the server answers 400 with OpenAI's error object), never a traceback."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..sampling import SamplingConfig

MAX_STOPS = 4


class BadRequest(ValueError):
    """A request the server refuses: `param` names the field (OpenAI's error object)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class GenerateRequest:
    """What one request asks the engine for. messages (chat) or prompt (text or token ids)."""

    kind: str  # "chat" or "completion"
    model: str
    messages: tuple[dict[str, Any], ...] = ()
    prompt: str | tuple[int, ...] = ""
    max_tokens: int = 256
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    kinds: bool = False  # extension: report what happened to every token
    trace: bool = False  # extension: the turn's trace (trace.py) with the answer
    tools: tuple[dict[str, Any], ...] = ()  # function definitions, OpenAI's shape


def parse_chat(body: Any, *, default_model: str) -> GenerateRequest:
    body = _object(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", "messages")
    tools = parse_tools(body.get("tools"), body.get("tool_choice"))
    return GenerateRequest(kind="chat", model=model_name(body, default_model),
                           messages=tuple(_message(m, i) for i, m in enumerate(messages)),
                           tools=tools, **common_fields(body))


def parse_completion(body: Any, *, default_model: str) -> GenerateRequest:
    body = _object(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(_is_int(t) and t >= 0 for t in prompt):
        prompt = tuple(prompt)
    elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not (isinstance(prompt, str) and prompt) and not isinstance(prompt, tuple):
        raise BadRequest("prompt must be a non-empty string or a list of token ids", "prompt")
    return GenerateRequest(kind="completion", model=model_name(body, default_model), prompt=prompt,
                           **common_fields(body))


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def model_name(body: dict[str, Any], default: str) -> str:
    model = body.get("model", default)
    if not isinstance(model, str):
        raise BadRequest("model must be a string", "model")
    return model or default


def parse_tools(tools: Any, choice: Any) -> tuple[dict[str, Any], ...]:
    """OpenAI's `tools` (functions) for the chat template; tool_choice "none" drops them."""
    if tools is None or choice == "none":
        return ()
    if not isinstance(tools, list) or not all(
            isinstance(t, dict) and t.get("type") == "function" and isinstance(
                t.get("function"), dict) and isinstance(t["function"].get("name"), str)
            for t in tools):
        raise BadRequest("tools must be a list of {type: function, function: {name, ...}}",
                         "tools")
    return tuple(tools)


def _message(m: Any, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user",
                                                        "assistant", "tool"):
        raise BadRequest(f"{where}.role must be system, user, assistant or tool", where)
    content = m.get("content")
    if isinstance(content, list):  # text parts; anything else cannot be read by a text model
        if not all(isinstance(p, dict) and p.get("type") == "text"
                   and isinstance(p.get("text"), str) for p in content):
            raise BadRequest(f"{where}.content: only text parts are supported", where)
        content = "".join(p["text"] for p in content)
    if content is None and m["role"] == "assistant":
        content = ""
    if not isinstance(content, str):
        raise BadRequest(f"{where}.content must be a string or a list of text parts", where)
    role = "system" if m["role"] == "developer" else m["role"]
    out: dict[str, Any] = {"role": role, "content": content}
    for passed in ("tool_calls", "tool_call_id", "name"):  # the template renders them
        if passed in m:
            out[passed] = m[passed]
    return out


def common_fields(body: dict[str, Any]) -> dict[str, Any]:
    """What every dialect shares: n, the token budget, streaming, sampling, stop sequences and
    the token-kinds and trace extensions."""
    n = body.get("n", 1)
    if n != 1:
        raise BadRequest("only n = 1 is supported", "n")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens", 256))
    if not _is_int(max_tokens) or max_tokens < 1:
        raise BadRequest("max_tokens must be an integer >= 1", "max_tokens")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream must be a boolean", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("stream_options must be an object", "stream_options")
    kinds = body.get("mlx_spec_token_kinds", False)
    if not isinstance(kinds, bool):
        raise BadRequest("mlx_spec_token_kinds must be a boolean", "mlx_spec_token_kinds")
    trace = body.get("mlx_spec_trace", False)
    if not isinstance(trace, bool):
        raise BadRequest("mlx_spec_trace must be a boolean", "mlx_spec_trace")
    return dict(max_tokens=max_tokens, sampling=_sampling(body), stop=_stops(body.get("stop")),
                stream=stream, include_usage=bool(options.get("include_usage")), kinds=kinds,
                trace=trace)


def _sampling(body: dict[str, Any]) -> SamplingConfig:
    names = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
             "min_p": "min_p", "repetition_penalty": "repetition_penalty", "seed": "seed"}
    values = {}
    for key, name in names.items():
        v = body.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise BadRequest(f"{key} must be a finite number", key)
        if key in ("top_k", "seed") and not _is_int(v):
            raise BadRequest(f"{key} must be an integer", key)
        values[name] = v
    if values.get("top_k") == -1:  # "no top-k" in several clients
        values["top_k"] = 0
    try:
        return SamplingConfig(**values)
    except ValueError as e:  # SamplingConfig names the field first ("top-p must be in ...")
        first, _, rest = str(e).partition(" ")
        key = first.replace("-", "_")
        raise BadRequest(f"{key} {rest}", key if key in names else None) from None


def _stops(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise BadRequest("stop must be a non-empty string or a list of them", "stop")
    if len(stops) > MAX_STOPS:
        raise BadRequest(f"at most {MAX_STOPS} stop sequences", "stop")
    return tuple(stops)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
