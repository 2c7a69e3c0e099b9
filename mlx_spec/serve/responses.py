"""OpenAI-shaped answers: completions, streamed chunks, usage, and what speculation did for the
request under the names clients already read (llama.cpp's `timings`, vLLM's per-request
`speculative_decoding`)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from ..events import RoundTrace, TurnEnd, TurnStats
from ..trace import Recorder, to_dict

FINISH = {"stop": "stop", "length": "length", "context": "length", "cancelled": "stop"}


class StopText:
    """Stop sequences over streamed text: `add` returns what may be shown now, holding back any
    tail that could still become a stop sequence; `hit` once one appeared (the text is cut
    before it)."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops, self.held, self.hit = stops, "", False
        self.which: str | None = None
        self.after = ""

    def add(self, text: str) -> str:
        if not self.stops:
            return text
        self.held += text
        hits = [(i, s) for s in self.stops if (i := self.held.find(s)) >= 0]
        if hits:  # the earliest wins
            i, self.which = min(hits)
            self.after = self.held[i + len(self.which):]  # what came with it (tool calls)
            out, self.held, self.hit = self.held[:i], "", True
            return out
        keep = max((n for s in self.stops for n in range(1, len(s))
                    if self.held.endswith(s[:n])), default=0)
        out, self.held = self.held[: len(self.held) - keep], self.held[len(self.held) - keep :]
        return out

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out


class Generation:
    """A job's events as text the client may see: iterate for (text, kinds of the tokens behind
    it) pieces; after it, `end` is the TurnEnd and `stopped_by` the stop sequence that cut the
    text (the job is cancelled when one appears, so it ends within a round). about: what ran
    a traced job (Recorder.trace's keywords), whose events are kept for `traced()`."""

    def __init__(self, job: Any, stops: tuple[str, ...], about: dict[str, Any] | None = None):
        self.job, self.text = job, StopText(stops)
        self.about = about
        self.recorder = Recorder() if about is not None else None
        self.end: Any = None
        self.stopped_by: str | None = None

    def __iter__(self):
        kinds: list[str] = []
        for ev in self.job.stream():
            if self.recorder is not None:
                self.recorder.add(ev)
            if isinstance(ev, TurnEnd):
                self.end = ev
                continue
            if isinstance(ev, RoundTrace):
                continue
            if self.text.hit:
                continue
            kinds.append(ev.kind.value)
            if piece := self.text.add(ev.text):
                yield piece, kinds
                kinds = []
            if self.text.hit:
                self.stopped_by = self.text.which
                self.job.cancel()
        tail = "" if self.text.hit else self.text.flush()
        if tail or kinds:
            yield tail, kinds

    def traced(self) -> dict[str, Any]:
        """The trace extension's field for the answer's last body ({} if not traced): the
        whole turn's record (trace.py)."""
        if self.recorder is None or self.about is None:
            return {}
        return {"mlx_spec_trace": to_dict(self.recorder.trace(**self.about))}

    @property
    def finish(self) -> str:
        """OpenAI's finish_reason."""
        return "stop" if self.stopped_by else FINISH.get(self.end.finish_reason, "stop")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(s: TurnStats) -> dict[str, int]:
    return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.generated_tokens,
            "total_tokens": s.prompt_tokens + s.generated_tokens,
            "prompt_tokens_details": {"cached_tokens": s.reused_tokens}}


def timings(s: TurnStats, drafter: str) -> dict[str, Any]:
    """llama.cpp's per-request timings, and the draft counters when the request drafted."""
    gen_s = s.generation_s if s.generated_tokens else 0.0
    prompt_n = s.prompt_tokens - s.reused_tokens
    out: dict[str, Any] = {
        "cache_n": s.reused_tokens, "prompt_n": prompt_n, "prompt_ms": 1e3 * s.prefill_s,
        "prompt_per_second": prompt_n / s.prefill_s if s.prefill_s > 0 else 0.0,
        "predicted_n": s.generated_tokens, "predicted_ms": 1e3 * gen_s,
        "predicted_per_second": s.tok_s,
        "predicted_per_token_ms": 1e3 * gen_s / s.generated_tokens if s.generated_tokens else 0.0,
        "ttft_ms": 1e3 * s.ttft_s, "target_passes": s.target_passes,
    }
    if s.drafted:
        out.update(draft_kind=drafter, draft_n=s.drafted, draft_n_accepted=s.accepted)
    return out


def speculative_decoding(s: TurnStats) -> dict[str, Any] | None:
    """vLLM's per-request object: rounds that drafted, drafted and accepted tokens, mean
    acceptance length (1 + accepted per drafting round), acceptance per position."""
    if not s.drafted:
        return None
    rounds = s.per_position_drafted[0] if s.per_position_drafted else 0  # each drafts one
    return {
        "num_spec_steps": rounds,
        "num_draft_tokens": s.drafted,
        "num_accepted_draft_tokens": s.accepted,
        "mean_acceptance_length": 1 + s.accepted / rounds if rounds else 1.0,
        "draft_acceptance_rate": s.acceptance_rate,
        "acceptance_per_position": [round(a, 4) for a in s.per_position_acceptance],
        "tokens_per_target_pass": s.tokens_per_pass,
    }


def extras(s: TurnStats, drafter: str) -> dict[str, Any]:
    """The fields beside `usage` on a final answer or the last streamed chunk."""
    out: dict[str, Any] = {"timings": timings(s, drafter)}
    if (spec := speculative_decoding(s)) is not None:
        out["speculative_decoding"] = spec
    return out


def completion(kind: str, rid: str, model: str, text: str, finish: str, s: TurnStats,
               drafter: str, token_kinds: list[str] | None,
               tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The whole answer of a request that did not stream."""
    if kind == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": text or (
            None if tool_calls else "")}
        if tool_calls:
            message["tool_calls"] = tool_calls
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "message": message}
    else:
        choice = {"index": 0, "finish_reason": finish, "text": text, "logprobs": None}
    if token_kinds is not None:
        choice["mlx_spec_token_kinds"] = token_kinds
    return {"id": rid, "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice],
            "usage": usage(s), **extras(s, drafter)}


def chunk(kind: str, rid: str, model: str, text: str | None, *, finish: str | None = None,
          role: bool = False, token_kinds: list[str] | None = None,
          tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One streamed chunk (text None: a chunk with no content, e.g. the finish)."""
    if kind == "chat":
        delta: dict[str, Any] = {"role": "assistant"} if role else {}
        if text is not None:
            delta["content"] = text
        if tool_calls:
            delta["tool_calls"] = tool_calls
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
    if token_kinds:
        choice["mlx_spec_token_kinds"] = token_kinds
    return {"id": rid, "object": "chat.completion.chunk" if kind == "chat" else
            "text_completion", "created": int(time.time()), "model": model, "choices": [choice]}


def usage_chunk(kind: str, rid: str, model: str, s: TurnStats, drafter: str) -> dict[str, Any]:
    """The last chunk when the client asked for usage: no choices, usage and stats."""
    return {"id": rid, "object": "chat.completion.chunk" if kind == "chat" else
            "text_completion", "created": int(time.time()), "model": model, "choices": [],
            "usage": usage(s), **extras(s, drafter)}


def error(message: str, *, kind: str = "invalid_request_error", param: str | None = None,
          code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
