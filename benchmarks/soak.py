"""`python -m benchmarks --group soak`: `mlx-spec serve` held under a long mixed load.

The server runs as its own process on 127.0.0.1 (the demo pair, its defaults: MTP + lookup,
k = auto), so its memory is its own (VmRSS sampled every second). `clients` threads of the
official openai and anthropic SDKs send, until the time or the count runs out: chat and
completions, streamed and whole; Anthropic messages, streamed and whole; tool calls; seeded
T = 1 and greedy requests; clients that hang up after three events; prompts longer than the
context; and more at once than the queue holds. Every request must end answered or refused
with its status (lost: an SDK connection error or timeout), greedy answers must equal the same
request sent alone afterwards, the memory after warm-up must stay flat, and /metrics must count
what the clients saw. Bounded in time and count, loopback only; it stops by itself. Results:
docs/BENCH-soak.md, docs/bench-soak.json. Timings are measured here, never asserted by tests.
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .runners import BenchConfig, machine
from .serve_clients import HOST, Stream, free_ports, launched, stream_completion, wait_ready
from .tables import reproduce_line, write_json


@dataclass(frozen=True)
class SoakConfig:
    clients: int = 16
    seconds: float = 300.0
    max_requests: int = 8000  # a bound, not the stop: 5 minutes sent ~3000 before
    max_tokens: int = 24
    max_concurrency: int = 4
    max_queue: int = 8  # 16 clients against 4 + 8 places: the queue fills, 429s are expected
    # the cache budget, 8 MiB: the demo's caches take 2.75 KiB a token (with its head's), in
    # 256-token steps, and a turn stops at its 4096-token context (11.7 MiB); a plain request
    # reserves 0.7 MiB, a "big" one 6.2 MiB (it waits in the queue until the running ones leave
    # it room), and one asking for the whole context can never fit (400)
    kv_memory_gib: float = 8 / 1024
    big_tokens: int = 2000  # a "big" request's max_tokens (it hangs up after 3 events)
    huge_tokens: int = 2_000_000  # the whole context: more than the budget holds
    levels: tuple[int, ...] = (1, 2, 4, 8, 16)  # the latency table's concurrent streams
    level_seconds: float = 20.0


GREEDY = ["def parse(self, elements):", "class Stack:", "import os\n\ndef walk(path):",
          "for i in range(10):"]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
KINDS = ("chat", "chat-stream", "completion", "completion-stream", "messages",
         "messages-stream", "tools", "seeded", "hang-up", "over-long", "big", "too-large")


def bench_soak(cfg: BenchConfig, out: Path, log=print, soak: SoakConfig = SoakConfig()
               ) -> dict[str, Any]:
    started = time.perf_counter()
    port = free_ports(1)[0]
    url = f"http://{HOST}:{port}"
    logfile = Path(tempfile.mkdtemp(prefix="mlx-spec-soak-")) / "serve.log"
    cmd = [sys.executable, "-m", "mlx_spec.cli", "serve", "--host", HOST, "--port", str(port),
           "--max-concurrency", str(soak.max_concurrency), "--max-queue", str(soak.max_queue),
           "--kv-memory", str(soak.kv_memory_gib)]
    with launched(cmd, logfile) as proc:
        wait_ready(proc, url, 180, logfile)
        latency = [level(url, n, soak) for n in soak.levels]
        idle_before = scrape(url)
        rss: list[tuple[float, int]] = []
        mlx: list[tuple[float, ...]] = []
        failed: list[str] = []
        stop = threading.Event()
        sampler = threading.Thread(target=sample_rss,
                                   args=(proc.pid, rss, stop, url, mlx, failed), daemon=True)
        sampler.start()
        began = time.monotonic()
        outcomes = load(url, soak, log)
        load_seconds = time.monotonic() - began
        stop.set()
        sampler.join(5)
        settle(url)
        idle_after = scrape(url)
        alone = {p: ask(url, "chat", p, soak)[1] for p in GREEDY}  # each sent alone, after
        metrics = scrape(url)
        traceback = "Traceback" in logfile.read_text(errors="replace")
    result = summarise(outcomes, alone, rss, metrics, soak, traceback,
                       idle_before.get("vllm:request_success_total", 0.0))
    result["latency"] = latency
    result["load_seconds"] = load_seconds
    result["idle"] = {k: [idle_before.get(m, 0.0), idle_after.get(m, 0.0)] for k, m in (
        ("mlx_active", "mlx_spec:mlx_active_memory_bytes"),
        ("reserved", "mlx_spec:cache_reserved_bytes"))}
    t0 = rss[0][0] if rss else 0.0
    result["memory_mb"] = [  # every 10 s: (seconds, RSS) and every 5 s: MLX active, cached
        [round(t - t0), round(b / 2**20)] for t, b in rss[::10]]
    result["mlx_mb"] = [[round(t - t0), round(a / 2**20), round(c / 2**20)]
                        for t, a, c, _ in mlx]
    result["scrapes_failed"] = failed[:10] + ([f"... {len(failed)} in all"]
                                              if len(failed) > 10 else [])
    result["reserved_max_mib"] = max((r for *_, r in mlx), default=0.0) / 2**20
    result.update({"machine": machine(), "config": asdict(cfg), "soak": asdict(soak),
                   "minutes": (time.perf_counter() - started) / 60})
    write_json(result, out / "bench-soak.json")
    (out / "BENCH-soak.md").write_text("\n".join(report(result)) + "\n")
    log("\n".join(report(result)))
    return result


def sample_rss(pid: int, out: list[tuple[float, int]], stop: threading.Event,
               url: str | None = None, mlx: list[tuple[float, ...]] | None = None,
               failed: list[str] | None = None) -> None:
    """VmRSS every second; every 5 s also MLX's active and cached memory and the cache budget
    the running requests hold (/metrics; a scrape that fails is noted in `failed`)."""
    tick = 0
    while not stop.wait(1.0):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return
        kb = next(int(line.split()[1]) for line in status.splitlines()
                  if line.startswith("VmRSS:"))
        out.append((time.monotonic(), kb * 1024))
        tick += 1
        if url is not None and mlx is not None and failed is not None and tick % 5 == 0:
            try:
                m = scrape(url)
            except Exception as e:  # noqa: BLE001 - a failed scrape must not end the sampling
                failed.append(f"{type(e).__name__}: {e}"[:200])
                continue
            mlx.append((time.monotonic(), m.get("mlx_spec:mlx_active_memory_bytes", 0.0),
                        m.get("mlx_spec:mlx_cache_memory_bytes", 0.0),
                        m.get("mlx_spec:cache_reserved_bytes", 0.0)))


def load(url: str, soak: SoakConfig, log) -> list[dict[str, Any]]:
    """The clients, until the time or the count runs out: each request's outcome."""
    outcomes: list[dict[str, Any]] = []
    lock = threading.Lock()
    deadline = time.monotonic() + soak.seconds

    def client(c: int) -> None:
        rng = random.Random(c)
        while time.monotonic() < deadline:
            with lock:
                if len(outcomes) >= soak.max_requests:
                    return
            kind = rng.choice(KINDS)
            prompt = rng.choice(GREEDY)
            t = time.monotonic()
            status, text, first = ask(url, kind, prompt, soak, seed=rng.randrange(1000))
            if status == "429":  # a full queue: back off as a client should, then try again
                time.sleep(0.5 + rng.random())
            with lock:
                outcomes.append({"kind": kind, "prompt": prompt, "status": status, "text": text,
                                 "ttft_s": None if first is None else first - t,
                                 "seconds": time.monotonic() - t})

    threads = [threading.Thread(target=client, args=(c,)) for c in range(soak.clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(soak.seconds + 300)
    log(f"soak: {len(outcomes)} requests")
    return outcomes


def ask(url: str, kind: str, prompt: str, soak: SoakConfig, seed: int = 0
        ) -> tuple[str, str, float | None]:
    """One request of `kind`: (status — "200", "400", "429", …, or "lost: <error>", or
    "hung up" —, its text, when its first event came)."""
    import anthropic
    import openai

    oa = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=300)
    an = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=300)
    messages = [{"role": "user", "content": prompt}]
    n = soak.max_tokens
    try:
        if kind in ("chat", "tools", "seeded", "over-long"):
            extra: dict[str, Any] = {"temperature": 0.0}
            if kind == "tools":
                extra["tools"] = TOOLS
            if kind == "seeded":
                extra = {"temperature": 1.0, "seed": seed}
            if kind == "over-long":
                messages = [{"role": "user", "content": "word " * 60000}]
            r = oa.chat.completions.create(model="x", max_tokens=n, messages=messages, **extra)
            return "200", r.choices[0].message.content or "", None
        if kind == "completion":
            r = oa.completions.create(model="x", max_tokens=n, prompt=prompt, temperature=0.0)
            return "200", r.choices[0].text, None
        if kind in ("chat-stream", "hang-up", "big", "too-large"):
            n = {"big": soak.big_tokens, "too-large": soak.huge_tokens}.get(kind, n)
            stream = oa.chat.completions.create(model="x", max_tokens=n, messages=messages,
                                                temperature=0.0, stream=True)
            return _read(stream, lambda c: c.choices[0].delta.content if c.choices else "",
                         hang_up=kind in ("hang-up", "big"))
        if kind == "completion-stream":
            stream = oa.completions.create(model="x", max_tokens=n, prompt=prompt,
                                           temperature=0.0, stream=True)
            return _read(stream, lambda c: c.choices[0].text if c.choices else "")
        if kind == "messages":
            r = an.messages.create(model="x", max_tokens=n, messages=messages)
            return "200", "".join(b.text for b in r.content if b.type == "text"), None
        with an.messages.stream(model="x", max_tokens=n, messages=messages) as stream:
            first, parts = None, []
            for text in stream.text_stream:
                first = first or time.monotonic()
                parts.append(text)
            return "200", "".join(parts), first
    except (openai.APIStatusError, anthropic.APIStatusError) as e:
        return str(e.status_code), str(e), None  # the message: which limit refused it
    except Exception as e:  # noqa: BLE001 - what a client would see as a lost request
        return f"lost: {type(e).__name__}: {e}"[:200], "", None


def _read(stream, piece, *, hang_up: bool = False) -> tuple[str, str, float | None]:
    first, parts = None, []
    for i, chunk in enumerate(stream):
        first = first or time.monotonic()
        parts.append(piece(chunk) or "")
        if hang_up and i == 2:
            stream.close()  # the client goes away mid-answer
            return "hung up", "".join(parts), first
    return "200", "".join(parts), first


def level(url: str, n: int, soak: SoakConfig) -> dict[str, Any]:
    """`n` clients streaming greedy completions back to back for `level_seconds`: TTFT (queue
    included), the gaps between text chunks (ITL: a round's tokens come as one burst, so many
    gaps are ~0), each stream's time per output token after its first, the tokens per second
    all streams together made, and how many were answered 429 (they back off 0.5 s)."""
    streams: list[Stream] = []
    busy = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + soak.level_seconds

    def client(c: int) -> None:
        while time.monotonic() < deadline:
            try:
                s = stream_completion(url, GREEDY[c % len(GREEDY)], soak.max_tokens, 300)
            except RuntimeError as e:
                if "HTTP 429" not in str(e):
                    raise
                with lock:
                    busy[0] += 1
                time.sleep(0.5)
                continue
            with lock:
                streams.append(s)

    started = time.monotonic()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(soak.level_seconds + 300)
    wall = time.monotonic() - started
    ttft = sorted(s.ttft_s for s in streams)
    gaps = sorted(g for s in streams for g in s.gaps)
    tpot = sorted((s.arrivals[-1] - s.arrivals[0]) / (s.tokens - 1) for s in streams
                  if s.tokens > 1 and len(s.arrivals) > 1)
    return {"clients": n, "streams": len(streams), "busy_429": busy[0],
            "ttft_p50_s": pct(ttft, 0.5), "ttft_p99_s": pct(ttft, 0.99),
            "itl_p50_s": pct(gaps, 0.5), "itl_p99_s": pct(gaps, 0.99),
            "tpot_p50_s": pct(tpot, 0.5), "tpot_p99_s": pct(tpot, 0.99),
            "tok_s": sum(s.tokens for s in streams) / wall}


def settle(url: str, seconds: float = 60.0) -> None:
    """Until nothing runs or waits (hung-up requests end at their next round), bounded."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        m = scrape(url)
        if not m.get("vllm:num_requests_running") and not m.get("vllm:num_requests_waiting"):
            return
        time.sleep(0.2)


def pct(xs: list[float], q: float) -> float | None:
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def scrape(url: str) -> dict[str, float]:
    import urllib.request

    text = urllib.request.urlopen(f"{url}/metrics", timeout=30).read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def summarise(outcomes, alone, rss, metrics, soak: SoakConfig, traceback: bool,
              succeeded_before: float = 0.0) -> dict:
    statuses = Counter(o["status"] if not o["status"].startswith("lost") else "lost"
                       for o in outcomes)
    greedy = [o for o in outcomes if o["status"] == "200" and o["kind"] == "chat"]
    equal = sum(o["text"] == alone[o["prompt"]] for o in greedy)
    warm = rss[len(rss) // 8 :]  # the first eighth is warm-up (kernels, caches, allocator)
    quarter = max(1, len(warm) // 4)
    first_q = statistics.mean(b for _, b in warm[:quarter]) if warm else 0.0
    last_q = statistics.mean(b for _, b in warm[-quarter:]) if warm else 0.0
    ttft = sorted(o["ttft_s"] for o in outcomes if o["ttft_s"] is not None)
    return {
        "sent": len(outcomes), "statuses": dict(statuses),
        "lost": [o["status"] for o in outcomes if o["status"].startswith("lost")][:20],
        "by_kind": {k: dict(Counter(o["status"][:4] for o in outcomes if o["kind"] == k))
                    for k in KINDS},
        "greedy_equal_alone": [equal, len(greedy)],
        "rss_first_quarter_mb": first_q / 2**20, "rss_last_quarter_mb": last_q / 2**20,
        "rss_growth": (last_q / first_q - 1) if first_q else None,
        "ttft_p50_s": pct(ttft, 0.5), "ttft_p99_s": pct(ttft, 0.99),
        "metrics_success": metrics.get("vllm:request_success_total", 0.0) - succeeded_before,

        "clients_answered": statuses.get("200", 0) + statuses.get("hung up", 0),
        "server_traceback": traceback,
    }


def report(r: dict[str, Any]) -> list[str]:
    growth = r["rss_growth"]
    return [
        "# Soak: `mlx-spec serve` under a mixed load", "", reproduce_line("soak", r), "",
        f"{r['soak']['clients']} clients (official openai and anthropic SDKs) for "
        f"{r.get('load_seconds', r['soak']['seconds']):.0f} s against the demo pair's server "
        "(--max-concurrency "
        f"{r['soak']['max_concurrency']}, --max-queue {r['soak']['max_queue']}): chat and "
        "completions streamed and whole, messages streamed and whole, tool calls, seeded T = 1, "
        "hang-ups after 3 events, over-long prompts, \"big\" streams (max_tokens "
        f"{r['soak']['big_tokens']}: one holds most of the --kv-memory "
        f"{r['soak']['kv_memory_gib'] * 1024:.0f} MiB cache budget, so it waits in the queue "
        "for room) that hang up after 3 events, and requests for the whole context, which the "
        f"budget can never hold (max_tokens {r['soak']['huge_tokens']}: 400).", "",
        f"- sent {r['sent']}; by status: " + ", ".join(f"{k}: {v}" for k, v in
                                                       sorted(r["statuses"].items())),
        f"- the cache budget the running requests held, sampled every 5 s: at most "
        f"{r.get('reserved_max_mib', 0):.1f} of {r['soak']['kv_memory_gib'] * 1024:.0f} MiB",
        f"- lost: {len(r['lost'])}" + (f" ({'; '.join(r['lost'][:3])})" if r["lost"] else ""),
        "- by kind: " + "; ".join(f"{k} {v}" for k, v in r["by_kind"].items()),
        f"- greedy chat answers equal to the same request alone: {r['greedy_equal_alone'][0]}"
        f"/{r['greedy_equal_alone'][1]}",
        f"- server RSS after warm-up (the run's first eighth), first quarter "
        f"{r['rss_first_quarter_mb']:.0f} MB, last quarter "
        f"{r['rss_last_quarter_mb']:.0f} MB"
        + (f" ({growth * 100:+.1f}%)" if growth is not None else ""),
        "- MLX's own memory (active, cached) over the run: " + (
            f"{r['mlx_mb'][0][1]} / {r['mlx_mb'][0][2]} MB at {r['mlx_mb'][0][0]} s, "
            f"{r['mlx_mb'][-1][1]} / {r['mlx_mb'][-1][2]} MB at {r['mlx_mb'][-1][0]} s"
            if r.get("mlx_mb") else "not sampled"),
        "- RSS every 10 s (s, MB): " + " ".join(f"{t}:{m}" for t, m in r.get("memory_mb", [])),
        f"- TTFT of streams p50 {r['ttft_p50_s'] or 0:.2f} s, p99 {r['ttft_p99_s'] or 0:.2f} s",
        f"- /metrics request_success_total over the mixed load {r['metrics_success']:.0f}; the "
        "clients counted "
        f"{r['clients_answered']} answered (hang-ups included: the server finished or "
        "cancelled them) plus the 'alone' checks",
        f"- a traceback in the server's log: {'yes' if r['server_traceback'] else 'no'}",
        f"- /metrics scrapes by the sampler that failed: {len(r.get('scrapes_failed', []))}"
        + (f" ({'; '.join(r['scrapes_failed'][:2])})" if r.get("scrapes_failed") else ""),
        *idle_lines(r),
        "- tool calls are refused 400 on the demo pair (its chat template has none); the "
        "server's tool calling is tested with a tool-aware template in test_serve_tools.py",
        "", "## Latency by concurrency (before the mixed load)", "",
        f"Each row: that many clients streaming greedy completions ({r['soak']['max_tokens']} "
        f"tokens) back to back for {r['soak']['level_seconds']:.0f} s; the server runs "
        f"{r['soak']['max_concurrency']} at once and queues {r['soak']['max_queue']}. TTFT "
        "includes the queue; ITL is the gap between text chunks (a round's accepted tokens "
        "arrive together, so its median is ~0); TPOT is a stream's (last - first chunk) / "
        "(tokens - 1).", "",
        "| clients | streams | 429s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | TPOT p50 | "
        "TPOT p99 | tok/s all |", "|---|---|---|---|---|---|---|---|---|---|",
        *(f"| {x['clients']} | {x['streams']} | {x['busy_429']} | {_ms(x['ttft_p50_s'])} | "
          f"{_ms(x['ttft_p99_s'])} | {_ms(x['itl_p50_s'])} | {_ms(x['itl_p99_s'])} | "
          f"{_ms(x['tpot_p50_s'])} | {_ms(x['tpot_p99_s'])} | {x['tok_s']:.0f} |"
          for x in r.get("latency", [])),
    ] + (["", r["note"]] if r.get("note") else [])


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.0f} ms"


def idle_lines(r: dict[str, Any]) -> list[str]:
    """Caches freed: the server idle before the mixed load and after it (every request ended:
    answered, refused, hung up or cancelled)."""
    idle = r.get("idle")
    if not idle:
        return []
    (a0, a1), (r0, r1) = idle["mlx_active"], idle["reserved"]
    return [f"- idle before and after the mixed load: MLX active memory {a0 / 2**20:.1f} -> "
            f"{a1 / 2**20:.1f} MB, cache budget reserved {r0:.0f} -> {r1:.0f} bytes"]
