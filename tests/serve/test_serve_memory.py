"""What `mlx-spec serve` holds in memory: each request's caches are reserved against a budget
before it starts (one that can never fit is a 400 at once, one that must wait for room waits in
the queue: never an out-of-memory kill mid-answer), the estimate behind it covers the caches a
turn really grows, finished and cancelled requests give their caches back, and an idle
kept-alive connection is closed rather than holding a thread for as long as its client
lives."""

from __future__ import annotations

import gc
import http.client
import json
import threading

import mlx.core as mx
import openai
import pytest

from mlx_spec import cache as kv
from mlx_spec.cache import Growth
from mlx_spec.drafters import DraftModelDrafter
from mlx_spec.engine import Engine
from mlx_spec.loading import load_target
from mlx_spec.sampling import SamplingConfig
from mlx_spec.serve import Server
from mlx_spec.serve import http as serve_http
from mlx_spec.serve.scheduler import Budget, Scheduler, TooLarge

CHAT = [{"role": "user", "content": "def add(a, b):"}]


@pytest.fixture(scope="module")
def pair(model_dirs):
    target, tok = load_target(model_dirs("llama"))
    draft, _ = load_target(model_dirs("llama"))
    return target, tok, draft


def engine_of(pair, **kw) -> Engine:
    target, tok, draft = pair
    return Engine(target, tok, DraftModelDrafter(draft, target), **kw)


def test_the_growth_estimate_covers_what_a_turn_grows(pair):
    """Measured on a two-token turn, the per-token estimate bounds the target's KV and the
    draft model's after a real 300-token turn, within one allocation step."""
    engine = engine_of(pair, draft_length=3)
    growth = engine.memory_growth()
    assert growth.per_token > 0 and growth.step > 1
    chat = engine.conversation()
    list(chat.generate(list(range(3, 260)), max_tokens=40))
    real = kv.nbytes(chat.cache) + chat.drafter_state.nbytes()
    estimate = growth.bytes_for(len(chat.tokens))
    assert real <= estimate <= real + growth.per_token * growth.step


def test_a_request_starts_when_its_caches_fit_first_in_line_first(pair):
    """Budget 100 'bytes' at one per token: a request needing more than all of it is refused
    outright; one needing more than is left waits in the queue while another runs, and the
    small one behind it waits too (first in line first: a large request is never overtaken
    for ever); when the first ends both start, and every reservation returns."""
    budget = Budget(100, Growth(per_token=1.0, fixed=0), reach=0, context=10**6)
    sched = Scheduler(engine_of(pair, draft_length=3), max_concurrency=4, budget=budget)
    gate, step = threading.Event(), sched.batch.step
    sched.batch.step = lambda rows: (gate.wait(30), step(rows))[1]
    started = []
    start = sched._start
    sched._start = lambda job: (started.append(job.need), start(job))[1]
    try:
        with pytest.raises(TooLarge, match="budget"):
            sched.submit([5] * 10, max_tokens=91, sampling=SamplingConfig())
        first = sched.submit([5] * 10, max_tokens=50, sampling=SamplingConfig())
        for _ in range(200):
            if started:
                break
            threading.Event().wait(0.01)
        large = sched.submit([5] * 10, max_tokens=41, sampling=SamplingConfig())
        small = sched.submit([5] * 10, max_tokens=5, sampling=SamplingConfig())
        threading.Event().wait(0.2)
        assert started == [60] and sched.reserved == 60 and sched.waiting == 2
        gate.set()
        for job in (first, large, small):
            list(job.stream())
        assert started == [60, 51, 15]
        assert sched.reserved == 0
        # a turn stops at the context: max_tokens beyond it reserves no more than the context
        assert Budget(100, budget.growth, reach=2, context=50).need(10, 10**9) == 52
    finally:
        gate.set()
        sched.close()


def test_a_request_too_large_for_the_budget_is_a_400_naming_it(pair):
    engine = engine_of(pair, draft_length=3)
    per_token = engine.memory_growth().per_token
    budget = int(per_token * engine.target.context_length // 2)  # half a full context's caches
    server = Server(engine, port=0, kv_memory=budget)
    server.start()
    try:
        c = openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0)
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="x", messages=CHAT, max_tokens=4096)
        assert "too large" in str(e.value) and "--kv-memory" in str(e.value)
        assert c.chat.completions.create(model="x", messages=CHAT, max_tokens=8).choices
        metrics = http.client.HTTPConnection(*server.httpd.server_address[:2])
        metrics.request("GET", "/metrics")
        text = metrics.getresponse().read().decode()
        assert f"mlx_spec:cache_budget_bytes {budget}" in text
        assert "mlx_spec:cache_reserved_bytes 0" in text
    finally:
        server.close()


def test_finished_and_cancelled_requests_free_their_caches(pair):
    """MLX's active memory back where it was once the requests, whole and dropped mid-stream,
    have ended (each one's caches would be ~its reservation)."""
    engine = engine_of(pair, draft_length=3)
    server = Server(engine, port=0, max_concurrency=4)
    server.start()
    try:
        c = openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0)
        c.chat.completions.create(model="x", messages=CHAT, max_tokens=64)  # warm
        gc.collect()
        before = mx.get_active_memory()
        threads = [threading.Thread(target=c.chat.completions.create,
                                    kwargs=dict(model="x", messages=CHAT, max_tokens=96))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for _ in range(4):
            stream = c.chat.completions.create(model="x", messages=CHAT, max_tokens=300,
                                               stream=True)
            next(iter(stream))
            stream.close()
        for t in threads:
            t.join(120)
        for _ in range(200):  # bounded: a dropped stream ends at its next round
            if server.scheduler.running == 0 and server.scheduler.waiting == 0:
                break
            threading.Event().wait(0.05)
        gc.collect()
        one = server.scheduler.budget.need(16, 96)
        assert server.scheduler.reserved == 0
        assert mx.get_active_memory() - before < one / 2
    finally:
        server.close()


def test_an_idle_kept_alive_connection_is_closed(pair, monkeypatch):
    monkeypatch.setattr(serve_http, "KEEP_ALIVE_S", 0.3)
    server = Server(engine_of(pair, draft_length=3), port=0)
    server.start()
    try:
        conn = http.client.HTTPConnection(*server.httpd.server_address[:2], timeout=10)
        conn.request("GET", "/health")
        assert json.loads(conn.getresponse().read()) == {"status": "ok"}
        conn.sock.settimeout(10)
        assert conn.sock.recv(1) == b""  # the server closed it after 0.3 s idle
    except TimeoutError:
        pytest.fail("the idle connection was kept open")
    finally:
        server.close()
