"""The HTTP side: OpenAI's endpoints on the standard library's threading server, one thread per
connection, every generation on the scheduler's engine thread. Errors are OpenAI's error object
with the right status; a client that goes away cancels its request within a round."""

from __future__ import annotations

import json
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..engine import Engine
from ..errors import first_line
from ..kinds import kind_of
from ..templates import encode_chat
from ..trace import engine_fields
from . import anthropic
from . import responses as out
from .requests import BadRequest, GenerateRequest, parse_chat, parse_completion
from .scheduler import Budget, QueueFull, Scheduler, TooLarge
from .tools import ToolStream, ToolText

MAX_BODY = 16 * 2**20  # bytes
RETRY_AFTER_S = 1
# a kept-alive connection idle this long is closed (longer than httpx's 5 s pool expiry, so a
# client never sends into a socket being closed): else each client that never closes its pool
# holds a thread, its stack and its buffers for as long as it lives (the soak: 34 -> 168 threads
# in two minutes, the RSS growing with them)
KEEP_ALIVE_S = 10.0
IO_TIMEOUT_S = 120.0  # once a request has begun: its body's read, each write of its answer
GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)
ROUTES = {"/v1/chat/completions": "chat", "/chat/completions": "chat",
          "/v1/completions": "completion", "/completions": "completion",
          "/v1/messages": "messages"}
PARSE = {"chat": parse_chat, "completion": parse_completion,
         "messages": anthropic.parse_messages}


class _HTTPServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        """A client that went away (reset, a closed pipe) is the client's business: nothing
        printed. Anything else: one line, never a traceback (MLX_SPEC_DEBUG=1 shows it)."""
        import os
        import sys

        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError):
            return
        if os.environ.get("MLX_SPEC_DEBUG"):
            super().handle_error(request, client_address)
            return
        print(f"mlx-spec: serve: a request from {client_address[0]} failed: "
              f"{type(error).__name__}: {error}", file=sys.stderr)


class Server:
    """`mlx-spec serve`: the engine behind OpenAI-compatible endpoints on host:port."""

    def __init__(self, engine: Engine, *, host: str = "127.0.0.1", port: int = 8080,
                 api_key: str | None = None, max_concurrency: int = 4, max_queue: int = 64,
                 kv_memory: int | None = None):
        """kv_memory: the bytes the running requests' caches may take together (None:
        half of what the machine's memory leaves beside the weights; see `cache_budget`)."""
        self.engine, self.api_key = engine, api_key
        self.model = engine.target.name
        self.drafter = kind_of(engine.drafter.name) if engine.drafter is not None else "none"
        self.scheduler = Scheduler(engine, max_concurrency=max_concurrency, max_queue=max_queue,
                                   budget=cache_budget(engine, kv_memory))
        handler = type("Handler", (_Handler,), {"server_state": self})
        self.httpd = _HTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        # the most characters one token can stand for (its vocabulary string: a byte-level
        # token's characters are its bytes, a SentencePiece piece is its text): a prompt of
        # more than twice that many characters per context position cannot fit, and is
        # refused before the tokenizer spends time and memory on it
        vocab = engine.tokenizer.get_vocab() if hasattr(engine.tokenizer, "get_vocab") else {}
        self.longest_token = max((len(t) for t in vocab), default=0)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def serve_forever(self) -> None:
        self.httpd.serve_forever(poll_interval=0.2)

    def start(self) -> threading.Thread:
        """Serve on a thread of its own (tests, embedding); `close` ends it."""
        thread = threading.Thread(target=self.serve_forever, name="mlx-spec-http", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        """Stop taking requests, cancel the ones in flight (after their round), and stop."""
        self.httpd.shutdown()
        self.scheduler.close()
        self.httpd.server_close()


def cache_budget(engine: Engine, kv_memory: int | None) -> Budget | None:
    """The memory budget requests start against: `kv_memory` bytes, or half of the
    machine's memory less the weights (the other half is the system's and the allocator's
    slack). None for a target split over ranks: its caches live on every rank (not measured
    here: a one-turn measurement would need every rank)."""
    if engine.target.ranks > 1:
        return None
    if kv_memory is None:
        from ..hub.presets import memory_bytes

        weights = engine.target.nbytes() + (engine.drafter.nbytes() if engine.drafter else 0)
        kv_memory = max(0, ((memory_bytes() or 16 * 2**30) - weights) // 2)
    k = engine.draft_length if isinstance(engine.draft_length, int) else 0
    return Budget(kv_memory, engine.memory_growth(), max(engine.auto_max_draft, k) + 1,
                  engine.target.context_length)


class _Handler(BaseHTTPRequestHandler):
    server_state: Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the CLI prints the URL
        pass

    def handle_one_request(self) -> None:
        self.connection.settimeout(KEEP_ALIVE_S)  # waiting for the next request's first line
        super().handle_one_request()

    def parse_request(self) -> bool:
        self.connection.settimeout(IO_TIMEOUT_S)  # a request has begun: a longer patience
        return super().parse_request()

    # -- routes ------------------------------------------------------------------------------

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/health":
            return self._json(HTTPStatus.OK, {"status": "ok"})
        if not self._authorized():
            return
        if path == "/metrics":
            sched = self.server_state.scheduler
            return self._text(sched.metrics.render(
                running=sched.running, waiting=sched.waiting, reserved=sched.reserved,
                budget=sched.budget.bytes if sched.budget else None))
        if path in ("/v1/models", "/models"):
            s = self.server_state
            return self._json(HTTPStatus.OK, {"object": "list", "data": [
                {"id": s.model, "object": "model", "owned_by": "mlx-spec", "drafter": s.drafter}]})
        self._error(HTTPStatus.NOT_FOUND, f"no route GET {path}", "not_found_error")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        route = ROUTES.get(path)
        self.dialect = "anthropic" if route == "messages" else "openai"
        if not self._authorized():
            return
        if route is None:
            return self._error(HTTPStatus.NOT_FOUND, f"no route POST {path}", "not_found_error")
        try:
            request = PARSE[route](self._body(), default_model=self.server_state.model)
            tools = ToolText(self.server_state.engine.tokenizer, request.tools)
            prompt = self._prompt(request)
            job = self.server_state.scheduler.submit(prompt, max_tokens=request.max_tokens,
                                                     sampling=request.sampling,
                                                     trace=request.trace)
        except BadRequest as e:
            self.close_connection = True  # the body may be unread: start clean
            return self._error(HTTPStatus.BAD_REQUEST, str(e), param=e.param)
        except TooLarge as e:
            return self._error(HTTPStatus.BAD_REQUEST, f"the request is too large: {e}",
                               param="max_tokens")
        except QueueFull as e:
            return self._error(HTTPStatus.TOO_MANY_REQUESTS, f"busy: {e}", "rate_limit_error",
                               {"Retry-After": str(RETRY_AFTER_S)})
        gen = out.Generation(job, request.stop, self._about(request) if request.trace else None)
        try:
            if request.stream:
                self._stream(request, gen, tools)
            else:
                self._answer(request, gen, tools)
        except GONE:  # the client went away: its request ends after the round in progress
            job.cancel()
            for _ in job.stream():
                pass
            self.close_connection = True

    # -- answers -----------------------------------------------------------------------------

    def _answer(self, request: GenerateRequest, gen: out.Generation, tools: ToolText) -> None:
        s = self.server_state
        try:
            text, kinds = [], []
            for piece, piece_kinds in gen:
                text.append(piece)
                kinds += piece_kinds
        except Exception as e:  # noqa: BLE001 - an engine error is this request's alone
            return self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"generation failed: {e}",
                               "server_error")
        content, calls = tools.split("".join(text))
        if request.kind == "messages":
            return self._json(HTTPStatus.OK, {**anthropic.message(
                gen, content, calls, s.model, s.drafter, kinds if request.kinds else None),
                **gen.traced()})
        rid = out.new_id("chatcmpl" if request.kind == "chat" else "cmpl")
        self._json(HTTPStatus.OK, {**out.completion(
            request.kind, rid, s.model, content, "tool_calls" if calls else gen.finish,
            gen.end.stats, s.drafter, kinds if request.kinds else None,
            [c.openai() for c in calls]), **gen.traced()})

    def _stream(self, request: GenerateRequest, gen: out.Generation, tools: ToolText) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        s = self.server_state
        try:
            if request.kind == "messages":
                for name, data in anthropic.events(gen, ToolStream(tools), s.model, s.drafter,
                                                   request.kinds):
                    self._event(data, name)
                return
            for data in self._openai_chunks(request, gen, ToolStream(tools)):
                self._event(data)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except GONE:
            raise
        except Exception as e:  # noqa: BLE001 - headers are sent: report in the stream
            gen.job.cancel()
            body = (anthropic.error(f"generation failed: {e}", "api_error")
                    if request.kind == "messages" else
                    out.error(f"generation failed: {e}", kind="server_error"))
            self._event(body, "error" if request.kind == "messages" else None)

    def _openai_chunks(self, request: GenerateRequest, gen: out.Generation, tools: ToolStream):
        s, kind = self.server_state, request.kind
        rid = out.new_id("chatcmpl" if kind == "chat" else "cmpl")
        if kind == "chat":
            yield out.chunk(kind, rid, s.model, "", role=True)
        for piece, kinds in gen:
            shown = tools.add(piece)
            if shown or request.kinds:
                yield out.chunk(kind, rid, s.model, shown,
                                token_kinds=kinds if request.kinds else None)
        tail, calls = tools.finish()
        if tail:
            yield out.chunk(kind, rid, s.model, tail)
        if calls:
            yield out.chunk(kind, rid, s.model, None, tool_calls=[
                {"index": i, **c.openai()} for i, c in enumerate(calls)])
        yield {**out.chunk(kind, rid, s.model, None,
                           finish="tool_calls" if calls else gen.finish), **gen.traced()}
        if request.include_usage:
            yield out.usage_chunk(kind, rid, s.model, gen.end.stats, s.drafter)

    # -- plumbing ----------------------------------------------------------------------------

    def _about(self, request: GenerateRequest) -> dict[str, Any]:
        """What a traced request's trace says ran it (trace.Recorder.trace's keywords)."""
        engine = self.server_state.engine
        drafter = engine.drafter.name if engine.drafter is not None else "none"
        prompt = request.prompt if isinstance(request.prompt, str) else ""
        return dict(engine=engine_fields(self.server_state.model, drafter, engine.draft_length,
                                         engine.target.split_label),
                    sampling=request.sampling,
                    messages=[dict(m) for m in request.messages]
                    or [{"role": "prompt", "content": prompt}])

    def _prompt(self, request: GenerateRequest) -> list[int]:
        engine = self.server_state.engine
        tokenizer = engine.tokenizer
        self._check_length(request)
        if request.messages:
            try:
                ids = encode_chat(tokenizer, [dict(m) for m in request.messages],
                                  tools=list(request.tools) or None)
            except Exception as e:  # noqa: BLE001 - a template that refuses these messages
                raise BadRequest(f"the chat template refused the messages: {first_line(e)}",
                                 "messages") from None
        elif isinstance(request.prompt, tuple):
            ids = list(request.prompt)
            if max(ids) >= engine.target.vocab_size:
                raise BadRequest(f"token id {max(ids)} is outside the vocabulary "
                                 f"({engine.target.vocab_size})", "prompt")
        else:
            ids = tokenizer.encode(request.prompt)
        context = engine.target.context_length
        if not ids:
            raise BadRequest("the prompt is empty", "prompt")
        if len(ids) >= context:
            raise BadRequest(f"the prompt has {len(ids)} tokens; the model's context is "
                             f"{context}", "messages" if request.messages else "prompt")
        return ids

    def _check_length(self, request: GenerateRequest) -> None:
        """A prompt with more characters than 2 × (the longest token) × (the context) has more
        tokens than the context holds: refused without tokenizing it (a 60k-word prompt's
        tokenizing was what grew the server's memory under load: BENCH-soak.md)."""
        longest = self.server_state.longest_token
        if not longest or isinstance(request.prompt, tuple):
            return
        chars = (sum(len(str(m.get("content") or "")) for m in request.messages)
                 if request.messages else len(request.prompt or ""))
        context = self.server_state.engine.target.context_length
        if chars > 2 * longest * context:
            raise BadRequest(f"the prompt has at least {chars // (2 * longest)} tokens; the "
                             f"model's context is {context}",
                             "messages" if request.messages else "prompt")

    def _authorized(self) -> bool:
        key = self.server_state.api_key
        if key is None:
            return True
        bearer = self.headers.get("Authorization", "")
        if bearer == f"Bearer {key}" or self.headers.get("x-api-key") == key:
            return True
        self._error(HTTPStatus.UNAUTHORIZED, "a valid API key is required",
                    "authentication_error", code="invalid_api_key")
        return False

    def _body(self) -> Any:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise BadRequest("Content-Length is not a number") from None
        if length > MAX_BODY:
            raise BadRequest(f"the body is over {MAX_BODY // 2**20} MiB")
        raw = self.rfile.read(length)
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BadRequest(f"the body is not JSON: {e}") from None

    def _json(self, status: HTTPStatus, body: dict[str, Any],
              headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            if self.close_connection:  # it closes after this answer: a client that reused
                self.send_header("Connection", "close")  # the socket would find it gone
            self.end_headers()
            self.wfile.write(data)
        except GONE:
            self.close_connection = True

    def _text(self, text: str) -> None:
        data = text.encode()
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: HTTPStatus, message: str, kind: str = "invalid_request_error",
               headers: dict[str, str] | None = None, *, param: str | None = None,
               code: str | None = None) -> None:
        """The dialect's error object: OpenAI's, or Anthropic's on /v1/messages."""
        body = (anthropic.error(message, kind) if getattr(self, "dialect", "") == "anthropic"
                else out.error(message, kind=kind, param=param, code=code))
        self._json(status, body, headers)

    def _event(self, body: dict[str, Any], name: str | None = None) -> None:
        head = f"event: {name}\n".encode() if name else b""
        self.wfile.write(head + b"data: " + json.dumps(body).encode() + b"\n\n")
        self.wfile.flush()
