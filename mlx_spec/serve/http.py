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
from ..events import TokenEvent, TurnEnd
from ..kinds import kind_of
from ..templates import encode_chat
from . import responses as out
from .requests import BadRequest, GenerateRequest, parse_chat, parse_completion
from .scheduler import Job, QueueFull, Scheduler

MAX_BODY = 16 * 2**20  # bytes
RETRY_AFTER_S = 1
GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


class Server:
    """`mlx-spec serve`: the engine behind OpenAI-compatible endpoints on host:port."""

    def __init__(self, engine: Engine, *, host: str = "127.0.0.1", port: int = 8080,
                 api_key: str | None = None, max_concurrency: int = 4, max_queue: int = 64):
        self.engine, self.api_key = engine, api_key
        self.model = engine.target.name
        self.drafter = kind_of(engine.drafter.name) if engine.drafter is not None else "none"
        self.scheduler = Scheduler(engine, max_concurrency=max_concurrency, max_queue=max_queue)
        handler = type("Handler", (_Handler,), {"server_state": self})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True

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


class _Handler(BaseHTTPRequestHandler):
    server_state: Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the CLI prints the URL
        pass

    # -- routes ------------------------------------------------------------------------------

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/health":
            return self._json(HTTPStatus.OK, {"status": "ok"})
        if not self._authorized():
            return
        if path in ("/v1/models", "/models"):
            s = self.server_state
            return self._json(HTTPStatus.OK, {"object": "list", "data": [
                {"id": s.model, "object": "model", "owned_by": "mlx-spec", "drafter": s.drafter}]})
        self._json(HTTPStatus.NOT_FOUND, out.error(f"no route GET {path}", code="not_found"))

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        parse = {"/v1/chat/completions": parse_chat, "/chat/completions": parse_chat,
                 "/v1/completions": parse_completion, "/completions": parse_completion}.get(path)
        if not self._authorized():
            return
        if parse is None:
            return self._json(HTTPStatus.NOT_FOUND,
                              out.error(f"no route POST {path}", code="not_found"))
        try:
            request = parse(self._body(), default_model=self.server_state.model)
            prompt = self._prompt(request)
            job = self.server_state.scheduler.submit(prompt, max_tokens=request.max_tokens,
                                                     sampling=request.sampling)
        except BadRequest as e:
            self.close_connection = True  # the body may be unread: start clean
            return self._json(HTTPStatus.BAD_REQUEST, out.error(str(e), param=e.param))
        except QueueFull as e:
            return self._json(HTTPStatus.TOO_MANY_REQUESTS,
                              out.error(f"busy: {e}", kind="rate_limit_error"),
                              {"Retry-After": str(RETRY_AFTER_S)})
        (self._stream if request.stream else self._answer)(request, job)

    # -- answers -----------------------------------------------------------------------------

    def _answer(self, request: GenerateRequest, job: Job) -> None:
        stop, text, kinds, end = out.StopText(request.stop), [], [], None
        try:
            for ev in job.stream():
                if isinstance(ev, TokenEvent) and not stop.hit:
                    text.append(stop.add(ev.text))
                    kinds.append(ev.kind.value)
                    if stop.hit:
                        job.cancel()
                elif isinstance(ev, TurnEnd):
                    end = ev
        except Exception as e:  # noqa: BLE001 - an engine error is this request's alone
            return self._json(HTTPStatus.INTERNAL_SERVER_ERROR, out.error(
                f"generation failed: {e}", kind="server_error"))
        assert end is not None  # a turn always ends with its TurnEnd
        if not stop.hit:
            text.append(stop.flush())
        s = self.server_state
        finish = "stop" if stop.hit else out.FINISH.get(end.finish_reason, "stop")
        body = out.completion(request.kind, out.new_id("chatcmpl" if request.kind == "chat"
                                                       else "cmpl"), s.model, "".join(text),
                              finish, end.stats, s.drafter, kinds if request.kinds else None)
        self._json(HTTPStatus.OK, body)

    def _stream(self, request: GenerateRequest, job: Job) -> None:
        s, kind = self.server_state, request.kind
        rid = out.new_id("chatcmpl" if kind == "chat" else "cmpl")
        stop, pending_kinds = out.StopText(request.stop), []
        try:
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            if kind == "chat":
                self._event(out.chunk(kind, rid, s.model, "", role=True))
            end = None
            for ev in job.stream():
                if isinstance(ev, TurnEnd):
                    end = ev
                elif not stop.hit:
                    pending_kinds.append(ev.kind.value)
                    if text := stop.add(ev.text):
                        self._event(out.chunk(kind, rid, s.model, text, token_kinds=(
                            pending_kinds if request.kinds else None)))
                        pending_kinds = []
                    if stop.hit:
                        job.cancel()
            assert end is not None
            tail = "" if stop.hit else stop.flush()
            finish = "stop" if stop.hit else out.FINISH.get(end.finish_reason, "stop")
            self._event(out.chunk(kind, rid, s.model, tail or None, finish=finish,
                                  token_kinds=pending_kinds if request.kinds else None))
            if request.include_usage:
                self._event(out.usage_chunk(kind, rid, s.model, end.stats, s.drafter))
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except GONE:  # the client went away: its request ends after the round in progress
            job.cancel()
            for _ in job.stream():
                pass
        except Exception as e:  # noqa: BLE001 - headers are sent: report in the stream
            job.cancel()
            try:
                self._event(out.error(f"generation failed: {e}", kind="server_error"))
            except GONE:
                pass
        self.close_connection = True

    # -- plumbing ----------------------------------------------------------------------------

    def _prompt(self, request: GenerateRequest) -> list[int]:
        engine = self.server_state.engine
        tokenizer = engine.tokenizer
        if request.kind == "chat":
            ids = encode_chat(tokenizer, [dict(m) for m in request.messages])
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
                             f"{context}", "messages" if request.kind == "chat" else "prompt")
        return ids

    def _authorized(self) -> bool:
        key = self.server_state.api_key
        if key is None:
            return True
        bearer = self.headers.get("Authorization", "")
        if bearer == f"Bearer {key}" or self.headers.get("x-api-key") == key:
            return True
        self._json(HTTPStatus.UNAUTHORIZED, out.error("a valid API key is required",
                                                      kind="authentication_error",
                                                      code="invalid_api_key"))
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
            self.end_headers()
            self.wfile.write(data)
        except GONE:
            self.close_connection = True

    def _event(self, body: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps(body).encode() + b"\n\n")
        self.wfile.flush()
