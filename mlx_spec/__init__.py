"""mlx-spec: lossless speculative decoding on MLX.

Public API (the app and other tools use only this):

    from mlx_spec import LoadSpec, load_engine, SamplingConfig, TokenEvent, TurnEnd
    engine = load_engine(LoadSpec())            # weights: the bundled demo pair, MTP drafter
    chat = engine.conversation()                # a Chat: tokens, caches, drafter state
    ids = encode_chat(engine.tokenizer, [{"role": "user", "content": "def add("}])
    for event in chat.generate(ids, max_tokens=128, sampling=SamplingConfig(temperature=0)):
        ...  # TokenEvent(token, text, kind) ..., then TurnEnd(stats, ...)

    service = EngineProcess.start(LoadSpec())   # the same engine in a child process, for UIs
    for event in service.chat([{"role": "user", "content": "def add("}], max_tokens=128):
        ...
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

# Where each public name lives. Imported on first use (PEP 562): a UI process that only drives an
# EngineProcess never imports mlx-lm (2+ seconds and ~100 MB here), only the child does.
_HOME = {
    "encode_chat": "templates", "encode_raw": "templates", "valid_text": "templates",
    "DRAFTERS": "kinds", "Chat": "engine", "Conversation": "engine", "Engine": "engine",
    "MlxSpecError": "errors", "ModelLoadError": "errors", "PromptTooLongError": "errors",
    "TokenizerMismatchError": "errors", "UnsupportedModelError": "errors",
    "user_message": "errors",
    "Event": "events", "Kind": "events", "RoundTrace": "events", "TokenEvent": "events",
    "TurnEnd": "events", "TurnStats": "events",
    "Recorder": "trace", "Trace": "trace", "engine_fields": "trace", "load_trace": "trace",
    "rejected_text": "trace", "save_trace": "trace_html",
    "find_mtp_head": "loading", "load_engine": "loading", "load_target": "loading",
    "make_drafter": "loading",
    "SamplingConfig": "sampling",
    "EngineInfo": "service", "EngineInThread": "service", "EngineProcess": "process",
    "EngineService": "service",
    "measure_baseline": "service",
    "Baseline": "stats", "Totals": "stats",
    "DraftLength": "spec", "LoadSpec": "spec", "parse_draft_length": "spec",
}
__all__ = [  # == sorted(_HOME) (a test checks): written out for tools that read it statically
    "Baseline", "Chat", "Conversation", "DRAFTERS", "DraftLength", "Engine", "EngineInThread",
    "EngineInfo", "EngineProcess", "EngineService",
    "Event", "Kind", "LoadSpec", "MlxSpecError", "ModelLoadError", "PromptTooLongError",
    "Recorder", "RoundTrace", "SamplingConfig", "TokenEvent", "TokenizerMismatchError",
    "Totals", "Trace", "TurnEnd", "TurnStats", "UnsupportedModelError",
    "encode_chat", "encode_raw", "engine_fields", "find_mtp_head", "load_engine", "load_target",
    "load_trace", "make_drafter", "measure_baseline", "parse_draft_length", "rejected_text",
    "save_trace", "user_message", "valid_text",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'mlx_spec' has no attribute {name!r}")
    value = getattr(import_module(f".{_HOME[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))


if TYPE_CHECKING:
    from .engine import Chat, Conversation, Engine
    from .errors import (
        MlxSpecError,
        ModelLoadError,
        PromptTooLongError,
        TokenizerMismatchError,
        UnsupportedModelError,
        user_message,
    )
    from .events import Event, Kind, RoundTrace, TokenEvent, TurnEnd, TurnStats
    from .kinds import DRAFTERS
    from .loading import find_mtp_head, load_engine, load_target, make_drafter
    from .process import EngineProcess
    from .sampling import SamplingConfig
    from .service import EngineInfo, EngineInThread, EngineService, measure_baseline
    from .spec import DraftLength, LoadSpec, parse_draft_length
    from .stats import Baseline, Totals
    from .templates import encode_chat, encode_raw, valid_text
    from .trace import Recorder, Trace, engine_fields, load_trace, rejected_text
    from .trace_html import save_trace
