"""mlx-spec: lossless speculative decoding on MLX.

Public API (the app and other tools use only this):

    from mlx_spec import load_engine, SamplingConfig, TokenEvent, TurnEnd
    engine = load_engine()                      # bundled demo pair, MTP drafter
    ids = encode_chat(engine.tokenizer, [{"role": "user", "content": "def add("}])
    for event in engine.generate(ids, max_tokens=128, sampling=SamplingConfig(temperature=0)):
        ...  # TokenEvent(token, text, kind, draft_position) ..., then TurnEnd(stats, ...)

    service = EngineProcess.start()             # the same engine in a child process, for UIs
    for event in service.chat([{"role": "user", "content": "def add("}], max_tokens=128):
        ...
"""

from .chat import encode_chat, encode_raw
from .engine import Engine
from .errors import (
    MlxSpecError,
    ModelLoadError,
    PromptTooLongError,
    TokenizerMismatchError,
    UnsupportedModelError,
)
from .events import Event, Kind, TokenEvent, TurnEnd, TurnStats
from .loading import find_mtp_head, load_engine, load_target, make_drafter
from .sampling import SamplingConfig
from .service import EngineInfo, EngineInThread, EngineProcess, EngineService
from .stats import Baseline, measure_baseline

__all__ = [
    "Baseline", "Engine", "EngineInThread", "EngineInfo", "EngineProcess", "EngineService",
    "Event", "Kind", "MlxSpecError", "ModelLoadError",
    "PromptTooLongError", "SamplingConfig", "TokenEvent", "TokenizerMismatchError", "TurnEnd",
    "TurnStats", "UnsupportedModelError", "encode_chat", "encode_raw", "find_mtp_head",
    "load_engine", "load_target", "make_drafter", "measure_baseline",
]
