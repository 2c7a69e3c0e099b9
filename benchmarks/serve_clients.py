"""The serve group's load side: a lean streaming client (http.client, one thread per stream, so
the clients cost the 2 cores little), a wave of concurrent streams, and `mlx_lm.server` run as
a subprocess on 127.0.0.1 (always killed on the way out). Timings are measured here and never
asserted by tests."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HOST = "127.0.0.1"


@dataclass
class Stream:
    """One streamed completion as its client saw it: when it was sent, when each piece of text
    arrived, and what the server's last (usage) chunk said."""

    start: float
    arrivals: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    end: float = 0.0
    usage: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)  # ours only (llama.cpp's names)

    @property
    def tokens(self) -> int:
        """Completion tokens as the server counted them (its usage chunk)."""
        return int(self.usage.get("completion_tokens", len(self.arrivals)))

    @property
    def ttft_s(self) -> float:
        return self.arrivals[0] - self.start if self.arrivals else 0.0

    @property
    def tok_s(self) -> float:
        """(tokens − 1) / (last piece − first piece): as the bench times `generate`."""
        a = self.arrivals
        return (self.tokens - 1) / (a[-1] - a[0]) if len(a) > 1 and a[-1] > a[0] else 0.0

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]


@dataclass
class Wave:
    """`len(streams)` streams sent at once; aggregate tok/s over the wave's wall time."""

    streams: list[Stream]

    @property
    def seconds(self) -> float:
        return max(s.end for s in self.streams) - min(s.start for s in self.streams)

    @property
    def tok_s(self) -> float:
        """All completion tokens ÷ (last stream's end − first stream's start)."""
        return sum(s.tokens for s in self.streams) / self.seconds if self.seconds > 0 else 0.0


def completion_body(prompt: str, max_tokens: int) -> bytes:
    """A greedy streamed /v1/completions body both servers read the same way (no model field:
    mlx-lm would load a model by that name)."""
    return json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()


def stream_completion(url: str, prompt: str, max_tokens: int, timeout: float) -> Stream:
    """POST one streamed completion to `url` and read its server-sent events to the end."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or HOST, parts.port, timeout=timeout)
    body = completion_body(prompt, max_tokens)
    stream = Stream(time.perf_counter())
    try:
        conn.request("POST", "/v1/completions", body=body,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {resp.read(300)!r}")
        read_events(resp, stream)
    finally:
        conn.close()
    stream.end = time.perf_counter()
    return stream


def read_events(resp: http.client.HTTPResponse, stream: Stream) -> None:
    """Fill `stream` from `data:` lines until [DONE] (or the connection closes)."""
    for line in resp:
        if not line.startswith(b"data: "):
            continue
        now, data = time.perf_counter(), line[6:].strip()
        if data == b"[DONE]":
            return
        event = json.loads(data)
        if "error" in event:
            raise RuntimeError(f"the server reported: {event['error']}")
        for choice in event.get("choices") or ():
            if choice.get("text"):
                stream.arrivals.append(now)
                stream.text.append(choice["text"])
        if event.get("usage"):
            stream.usage = event["usage"]
            stream.timings = event.get("timings") or {}


def run_wave(url: str, prompts: list[str], max_tokens: int, timeout: float) -> Wave:
    """One stream per prompt, all sent at once from threads (a barrier lines them up); every
    thread is joined within `timeout` seconds, else the wave fails."""
    results: list[Stream | BaseException | None] = [None] * len(prompts)
    barrier = threading.Barrier(len(prompts))

    def client(i: int) -> None:
        try:
            barrier.wait(timeout)
            results[i] = stream_completion(url, prompts[i], max_tokens, timeout)
        except BaseException as e:  # noqa: BLE001 - reported below, on the caller's thread
            results[i] = e

    threads = [threading.Thread(target=client, args=(i,), daemon=True)
               for i in range(len(prompts))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    streams = []
    for r in results:
        if not isinstance(r, Stream):
            raise RuntimeError(f"a stream to {url} failed: {r or 'timed out'}")
        streams.append(r)
    return Wave(streams)


def free_ports(n: int) -> list[int]:
    """n ports free on 127.0.0.1 now (the OS picks them; held together, so all differ)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((HOST, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def healthy(url: str) -> bool:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or HOST, parts.port, timeout=2)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def mlx_lm_command(model: Path, draft: Path | None, draft_length: int, port: int) -> list[str]:
    """`python -m mlx_lm.server` on 127.0.0.1:port (a draft model: `--draft-model`, k drafts
    a round), with no prompt cache: ours keeps none across requests either."""
    cmd = [sys.executable, "-m", "mlx_lm.server", "--model", str(model), "--host", HOST,
           "--port", str(port), "--prompt-cache-size", "0", "--log-level", "WARNING"]
    if draft is not None:
        cmd += ["--draft-model", str(draft), "--num-draft-tokens", str(draft_length)]
    return cmd


@contextmanager
def launched(cmd: list[str], log_file: Path) -> Iterator[subprocess.Popen]:
    """A server process (its output to `log_file`), stopped on the way out whatever happened."""
    with open(log_file, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
        try:
            yield proc
        finally:
            stop_process(proc)


def wait_ready(proc: subprocess.Popen, url: str, seconds: float, log_file: Path) -> None:
    """Until `url`/health answers 200; a process that exits, or the time running out, fails
    with the tail of its log."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if healthy(url):
            return
        time.sleep(0.25)
    tail = log_file.read_text(errors="replace")[-800:]
    raise RuntimeError(f"mlx_lm.server at {url} did not come up (exit {proc.poll()}): {tail}")


def stop_process(proc: subprocess.Popen) -> None:
    """Terminate, then kill if it is still there after 10 s; reaped either way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """While inside: SIGTERM (a plain `kill`) raises SystemExit, so what is being unwound (our
    servers, the mlx-lm subprocesses) is closed and killed on the way out. SIGINT does that
    already where it is not ignored (a background job of a shell ignores it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
