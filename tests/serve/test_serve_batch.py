"""The server's batch, through the official `openai` client on 127.0.0.1: four concurrent
streams (greedy and seeded sampled) each equal to their request alone with every drafter kind
(a draft model that is often but not always right, our MTP head, a published nextn head on the
hybrid Qwen3.5 fixture, n-gram), with ONE target pass verifying several requests' rounds; and
a bounded load loop that loses nothing and leaves the server alive."""

from __future__ import annotations

import http.client
import threading
import time

import openai
import pytest
from helpers import assert_same_or_near_tie
from published import build_pair, write_checkpoint
from test_batch import near_copy
from test_mtp import make_drafter as make_head_drafter

import mlx_spec.engine.cycle as cycle_module
from mlx_spec.drafters import DraftModelDrafter, NgramDrafter
from mlx_spec.drafters.lookup import LookupFirst
from mlx_spec.engine import Engine
from mlx_spec.engine.adaptive import AdaptiveDraftLength
from mlx_spec.engine.batch import verify_together
from mlx_spec.engine.batch_length import OPENING_DRAFTED
from mlx_spec.events import TokenEvent, TurnEnd
from mlx_spec.loading import load_target, make_drafter
from mlx_spec.sampling import SamplingConfig
from mlx_spec.serve import Server
from mlx_spec.serve.scheduler import Scheduler
from mlx_spec.templates import encode_chat

KINDS = ["draft", "mtp", "nextn-hybrid", "ngram", "mtp+lookup"]


@pytest.fixture(scope="module")
def engines(model_dirs, tmp_path_factory, tokenizer_dir):
    made = {}

    def get(kind: str) -> Engine:
        if kind not in made:
            if kind == "nextn-hybrid":
                model, head = build_pair("qwen3_5", agree=True, noise=0.15)
                root = write_checkpoint(tmp_path_factory.mktemp("hybrid") / "q", "qwen3_5",
                                        model, head, tokenizer_dir)
                target, tok = load_target(root)
                drafter = make_drafter("mtp", target, model_path=root)
            else:
                target, tok = load_target(model_dirs("llama"))
                drafter = {"draft": lambda: DraftModelDrafter(near_copy(model_dirs, "llama", 0.3),
                                                              target),
                           "mtp": lambda: make_head_drafter(target, "shared-kv"),
                           "ngram": NgramDrafter,
                           "mtp+lookup": lambda: LookupFirst(make_head_drafter(target,
                                                                               "shared-kv")),
                           }[kind]()
            made[kind] = Engine(target, tok, drafter, draft_length=3)
        return made[kind]

    return get


def scrape(server) -> dict[str, float]:
    host, port = server.httpd.server_address[:2]
    c = http.client.HTTPConnection(host, port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def together(ask, n: int, timeout: float = 120) -> None:
    """ask(0..n-1) on n threads released at once (a barrier), all joined."""
    start = threading.Barrier(n)

    def run(i: int) -> None:
        start.wait()
        ask(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)


def alone(engine: Engine, messages, max_tokens, **sampling) -> str:
    conv = engine.conversation()
    events = list(conv.generate(encode_chat(engine.tokenizer, messages), max_tokens=max_tokens,
                                sampling=SamplingConfig(**sampling)))
    return "".join(e.text for e in events[:-1])


@pytest.mark.parametrize("kind", KINDS)
def test_four_streams_with_each_drafter_equal_their_request_alone(engines, kind):
    engine = engines(kind)
    server = Server(engine, port=0, max_concurrency=4, max_queue=4)
    server.start()
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120)
    asks = [dict(messages=[{"role": "user", "content": "def f(x):" + " x" * i}], max_tokens=16,
                 temperature=0.0 if i % 2 else 1.0, seed=i) for i in range(4)]
    got: dict[int, str] = {}

    def ask(i: int) -> None:
        stream = client.chat.completions.create(model="x", stream=True, **asks[i])
        got[i] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    try:
        before = scrape(server)
        together(ask, 4)
        after = scrape(server)
    finally:
        server.close()
    for i, a in enumerate(asks):
        want = alone(engine, a["messages"], 16, temperature=a["temperature"], seed=i)
        assert got.get(i) == want, (kind, i)
    passes = after["mlx_spec:verify_passes_total"] - before.get("mlx_spec:verify_passes_total", 0)
    rounds = after["mlx_spec:verify_rounds_total"] - before.get("mlx_spec:verify_rounds_total", 0)
    assert rounds > passes > 0, (rounds, passes)  # several requests' rounds per target pass


def test_a_bounded_load_loop_loses_nothing(engines):
    """24 short requests from 6 client threads (loopback, bounded in count and in time): every
    one answered in full, the counters moved by exactly 24, the server alive after."""
    engine = engines("draft")
    server = Server(engine, port=0, max_concurrency=4, max_queue=32)
    server.start()
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120)
    answers: list[int] = []
    lock = threading.Lock()
    deadline = time.monotonic() + 240

    def worker(w: int) -> None:
        for j in range(4):
            if time.monotonic() > deadline:
                return
            r = client.chat.completions.create(
                model="x", max_tokens=6, messages=[{"role": "user", "content": f"{w} {j}"}])
            with lock:
                answers.append(r.usage.completion_tokens)

    try:
        before = scrape(server)
        threads = [threading.Thread(target=worker, args=(w,)) for w in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        after = scrape(server)
        assert client.models.list().data  # still serving
    finally:
        server.close()
    assert len(answers) == 24 and all(n >= 1 for n in answers)
    assert after["vllm:request_success_total"] - before.get("vllm:request_success_total", 0) == 24
    assert after["vllm:num_requests_running"] == after["vllm:num_requests_waiting"] == 0


def served_together(engine: Engine, prompts, max_tokens, monkeypatch, batch_costs):
    """`prompts` through a Scheduler at once (greedy), every row's own policy made to want
    drafts (a flat verify cost), the batch's cycle costs T_B(k) given by batch_costs(B, k):
    (each prompt's tokens, each verify pass as (rows, each row's k))."""
    passes = []

    def recorded(rounds, **options):
        passes.append((len(rounds), [draft.k for _, draft in rounds]))
        return verify_together(rounds, **options)

    monkeypatch.setattr(cycle_module, "verify_together", recorded)
    monkeypatch.setattr(AdaptiveDraftLength, "round_costs",
                        lambda self, top: [1.0] * (top + 1))  # alone: drafting always pays
    scheduler = Scheduler(engine, max_concurrency=len(prompts))
    monkeypatch.setattr(scheduler.batch.length, "cycle_costs", lambda rows, top, drafting, costs: [
        batch_costs(rows, k) for k in range(top + 1)])
    try:
        jobs = [scheduler.submit(p, max_tokens=max_tokens, sampling=SamplingConfig())
                for p in prompts]
        ends = [[e for e in job.stream() if isinstance(e, TurnEnd)][0] for job in jobs]
    finally:
        scheduler.close()
    return [list(end.tokens) for end in ends], passes


PROMPTS = [[(i * 29 + 7 * j) % 300 + 5 for i in range(12 + j)] for j in range(4)]


@pytest.mark.parametrize("bound", ["compute", "memory"])
def test_auto_drafts_as_the_batch_pays_and_stays_greedy_identical(engines, monkeypatch, bound):
    """Four `auto` requests at once, each row's own policy wanting drafts. Where B rows cost
    what B·(k+1) tokens cost and each token as much as it brings (compute-bound), the batch's
    cap turns speculation off: after the drafted cycles that open each batch size (its cost
    line's slope measured), no pass over two or more rows carries a draft. Where the pass
    costs the same at any k (memory-bound), the batch drafts. Either way each request's tokens
    are the target's own, as alone (up to a near-tie from batched arithmetic)."""
    base = engines("draft")
    engine = Engine(base.target, base.tokenizer, base.drafter, draft_length="auto")
    cost = (lambda b, k: float(b * (k + 1))) if bound == "compute" else (lambda b, k: 1.0)
    got, passes = served_together(engine, PROMPTS, 16, monkeypatch, cost)
    batched = [ks for rows, ks in passes if rows > 1]
    assert batched, passes
    if bound == "compute":
        opened: dict[int, int] = {}
        for ks in batched:
            opened[len(ks)] = opened.get(len(ks), 0) + (max(ks) > 0)
        assert all(n <= OPENING_DRAFTED for n in opened.values()), passes
        late = batched[OPENING_DRAFTED + 1 :]
        assert all(k == 0 for ks in late if len(ks) == 4 for k in ks), str(passes)
    else:
        assert any(k > 0 for ks in batched for k in ks), passes
    for prompt, tokens in zip(PROMPTS, got, strict=True):
        want = [e.token for e in Engine(base.target, base.tokenizer, None).conversation()
                .generate(prompt, max_tokens=16) if isinstance(e, TokenEvent)]
        assert_same_or_near_tie(engine.target, prompt, tokens, want)


def test_a_batched_draft_that_fails_leaves_each_request_to_draft_alone(engines, monkeypatch):
    """draft_together raising after a draft model took the batch's steps (its caches hold
    them): every request drafts alone from its committed state, and each answer is still the
    one it gets alone (the failed try drew from copies of the samplers, so seeded ones too)."""
    import copy
    from dataclasses import replace

    from mlx_spec.engine import cycle as sched

    failed = []

    def broken(rounds):
        real([(conv, replace(due, sampler=copy.deepcopy(due.sampler))) for conv, due in rounds])
        if len(rounds) > 1 and not failed:
            failed.append(len(rounds))
            raise RuntimeError("a batched draft failed")
        return real(rounds)

    real = sched.draft_together
    monkeypatch.setattr(sched, "draft_together", broken)
    test_four_streams_with_each_drafter_equal_their_request_alone(engines, "draft")
    assert failed


@pytest.mark.parametrize("kind", ["draft", "mtp+lookup"])
def test_a_seeded_request_is_the_same_alone_beside_others_and_without_speculation(engines,
                                                                                  kind):
    """The reproducibility promise through the official SDK: a request with a seed at T = 1
    gets one answer alone, the same beside four greedy streams (its rounds batched, its draft
    length capped by the batch), and the same from target-only decoding."""
    engine = engines(kind)
    server = Server(engine, port=0, max_concurrency=5, max_queue=4)
    server.start()
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120)
    seeded = dict(messages=[{"role": "user", "content": "def parse(self, elements):"}],
                  max_tokens=24, temperature=1.0, top_p=0.95, seed=7)

    def ask(request: dict) -> str:
        return client.chat.completions.create(model="x", **request).choices[0].message.content

    try:
        first = ask(seeded)
        got: dict[int, str] = {}
        greedy = [dict(messages=[{"role": "user", "content": "class A" + "a" * i}],
                       max_tokens=24, temperature=0.0) for i in range(4)]
        together(lambda i: got.__setitem__(i, ask(seeded if i == 4 else greedy[i])), 5)
        passes = scrape(server)
    finally:
        server.close()
    plain = Engine(engine.target, engine.tokenizer, None)
    assert first == got[4] == alone(plain, seeded["messages"], 24, temperature=1.0,
                                    top_p=0.95, seed=7)
    assert passes["mlx_spec:verify_rounds_total"] > passes["mlx_spec:verify_passes_total"]
