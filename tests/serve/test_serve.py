"""`mlx-spec serve` through the official `openai` client, on a tiny model served on 127.0.0.1:
answers equal the engine's own, concurrent streams equal each one alone, bad requests are
OpenAI's errors, a client that goes away frees its slot, and the server outlives all of it."""

from __future__ import annotations

import http.client
import json
import threading

import openai
import pytest

from mlx_spec.drafters import DraftModelDrafter
from mlx_spec.engine import Engine
from mlx_spec.loading import load_target
from mlx_spec.serve import Server
from mlx_spec.templates import encode_chat

KEY = "test-key"
CHAT = [{"role": "user", "content": "def add(a, b):"}]


@pytest.fixture(scope="module")
def pair(model_dirs):
    target, tok = load_target(model_dirs("llama"))
    draft, _ = load_target(model_dirs("llama"))  # drafting for itself: mostly accepted
    return target, tok, draft


@pytest.fixture(scope="module")
def server(pair):
    target, tok, draft = pair
    engine = Engine(target, tok, DraftModelDrafter(draft, target), draft_length=3)
    server = Server(engine, port=0, api_key=KEY, max_concurrency=4, max_queue=8)
    server.start()
    yield server
    server.close()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=120)


def alone(pair, messages, max_tokens, **sampling):
    """The same request on a conversation of its own, outside the server."""
    from mlx_spec.sampling import SamplingConfig

    target, tok, draft = pair
    conv = Engine(target, tok, DraftModelDrafter(draft, target), draft_length=3).conversation()
    events = list(conv.generate(encode_chat(tok, messages), max_tokens=max_tokens,
                                sampling=SamplingConfig(**sampling)))
    return "".join(e.text for e in events[:-1]), events[-1]


def test_chat_answers_as_the_engine_does_with_its_speculation_stats(client, pair):
    r = client.chat.completions.create(model="x", messages=CHAT, max_tokens=24, temperature=0)
    text, end = alone(pair, CHAT, 24)
    assert r.choices[0].message.content == text
    assert r.usage.completion_tokens == end.stats.generated_tokens
    extra = r.model_extra
    assert extra["timings"]["predicted_n"] == end.stats.generated_tokens
    assert extra["timings"]["draft_n"] == end.stats.drafted > 0
    spec = extra["speculative_decoding"]
    assert spec["num_accepted_draft_tokens"] == end.stats.accepted
    assert spec["mean_acceptance_length"] > 1


def test_streamed_chat_and_completions_and_models(client, pair):
    parts, last = [], None
    stream = client.chat.completions.create(model="x", messages=CHAT, max_tokens=24,
                                            stream=True, stream_options={"include_usage": True})
    for c in stream:
        if c.choices and c.choices[0].delta.content:
            parts.append(c.choices[0].delta.content)
        last = c
    assert "".join(parts) == alone(pair, CHAT, 24)[0]
    assert last.usage.completion_tokens > 0 and "speculative_decoding" in last.model_extra
    done = client.completions.create(model="x", prompt="def f(", max_tokens=8)
    assert done.choices[0].text and done.usage.completion_tokens == 8
    ids = client.completions.create(model="x", prompt=[5, 6, 7, 8], max_tokens=4)
    assert ids.usage.prompt_tokens == 4
    assert [m.id for m in client.models.list().data] == [pair[0].name]


def test_four_concurrent_streams_each_equal_their_request_alone(client, pair):
    """Greedy and seeded sampled requests interleaved on one engine: token for token what each
    gives alone (each has its own conversation and its own random stream)."""
    asks = [dict(messages=[{"role": "user", "content": f"def f{i}(x):"}], max_tokens=20,
                 temperature=0.0 if i % 2 else 1.0, seed=i) for i in range(4)]
    got: dict[int, str] = {}

    def ask(i: int) -> None:
        stream = client.chat.completions.create(model="x", stream=True, **asks[i])
        got[i] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i, a in enumerate(asks):
        want, _ = alone(pair, a["messages"], 20, temperature=a["temperature"], seed=i)
        assert got[i] == want, i


def test_stop_sequences_and_token_kinds(client):
    r = client.chat.completions.create(model="x", messages=CHAT, max_tokens=40,
                                       extra_body={"mlx_spec_token_kinds": True})
    full = r.choices[0].message.content
    kinds = r.choices[0].model_extra["mlx_spec_token_kinds"]
    assert len(kinds) == r.usage.completion_tokens
    assert set(kinds) <= {"accepted", "corrected", "bonus", "target"} and "accepted" in kinds
    cut = full[3:6]
    stopped = client.chat.completions.create(model="x", messages=CHAT, max_tokens=40, stop=cut)
    assert stopped.choices[0].message.content == full[: full.index(cut)]
    assert stopped.choices[0].finish_reason == "stop"


def test_the_trace_extension_carries_the_turns_record(client, server):
    """mlx_spec_trace: the answer comes with the same record `generate --trace` writes —
    whole, streamed (in the finish chunk) and through the Anthropic dialect; off, nothing."""
    from mlx_spec.trace import from_dict

    r = client.chat.completions.create(model="x", messages=CHAT, max_tokens=24,
                                       extra_body={"mlx_spec_trace": True})
    trace = from_dict(r.model_extra["mlx_spec_trace"])
    assert trace.text == r.choices[0].message.content
    assert sum(x.emitted for x in trace.rounds) == len(trace.tokens) == 24
    assert trace.rounds and all(t.round >= 0 for t in trace.tokens)
    assert trace.messages == tuple(CHAT) and trace.engine["draft length"] == "3"
    plain = client.chat.completions.create(model="x", messages=CHAT, max_tokens=4)
    assert "mlx_spec_trace" not in plain.model_extra
    last = None
    for c in client.chat.completions.create(model="x", messages=CHAT, max_tokens=24,
                                            stream=True, extra_body={"mlx_spec_trace": True}):
        if c.choices and c.choices[0].finish_reason:
            last = c
    assert from_dict(last.model_extra["mlx_spec_trace"]).text == trace.text
    body = json.dumps({"model": "x", "max_tokens": 8, "messages": CHAT, "mlx_spec_trace": True})
    conn = http.client.HTTPConnection(*server.httpd.server_address[:2], timeout=120)
    conn.request("POST", "/v1/messages", body, {"x-api-key": KEY})
    m = json.loads(conn.getresponse().read())
    assert from_dict(m["mlx_spec_trace"]).text == m["content"][0]["text"]
    bad = client.with_options(max_retries=0).chat.completions
    with pytest.raises(openai.BadRequestError, match="mlx_spec_trace must be a boolean"):
        bad.create(model="x", messages=CHAT, max_tokens=4, extra_body={"mlx_spec_trace": 1})


@pytest.mark.parametrize(("body", "param"), [
    (dict(messages=CHAT, n=2), "n"),
    (dict(messages=CHAT, temperature=-1), "temperature"),
    (dict(messages=CHAT, top_p=1.5), "top_p"),
    (dict(messages=CHAT, max_tokens=0), "max_tokens"),
    (dict(messages=[]), "messages"),
    (dict(messages=[{"role": "robot", "content": "x"}]), "messages[0]"),
    (dict(messages=CHAT, stop=["a", "b", "c", "d", "e"]), "stop"),
    (dict(messages=[{"role": "user", "content": "x " * 5000}]), "messages"),
])
def test_bad_requests_are_400_with_the_field_named(client, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="x", **body)
    assert e.value.body["param"] == param and "\n" not in e.value.body["message"]


def test_auth_bad_json_and_unknown_routes(server):
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    host, port = server.httpd.server_address[:2]
    for method, path, body, headers, status in [
        ("GET", "/health", None, {}, 200),  # no key needed
        ("POST", "/v1/chat/completions", b"{nope", {"Authorization": f"Bearer {KEY}"}, 400),
        ("POST", "/v1/chat/completions", b"[]", {"x-api-key": KEY}, 400),
        ("GET", "/v1/nothing", None, {"Authorization": f"Bearer {KEY}"}, 404),
    ]:
        c = http.client.HTTPConnection(host, port, timeout=30)
        c.request(method, path, body=body, headers=headers)
        r = c.getresponse()
        data = json.loads(r.read())
        assert r.status == status, (path, data)
        assert status == 200 or "message" in data["error"]
        c.close()


def test_a_client_that_goes_away_frees_its_slot(server, client):
    """Many streams dropped after their first chunk: each request is cancelled within a round,
    nothing keeps running, and the server still answers."""
    for _ in range(6):
        stream = client.chat.completions.create(model="x", messages=CHAT, max_tokens=200,
                                                stream=True)
        next(iter(stream))
        stream.close()
    for _ in range(200):  # bounded: the engine thread notices each at its next write
        if server.scheduler.running == 0 and server.scheduler.waiting == 0:
            break
        threading.Event().wait(0.05)
    assert server.scheduler.running == 0
    assert client.chat.completions.create(model="x", messages=CHAT, max_tokens=4).choices


def test_a_prompt_too_long_to_fit_is_refused_before_tokenizing(server, client):
    """More characters than 2 × (longest token) × (context) cannot fit: 400, chat and
    completions alike, by the length check that runs before the tokenizer ("at least": the
    check after tokenizing gives the exact count)."""
    n = 2 * server.longest_token * server.engine.target.context_length
    assert server.longest_token > 0
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="x", max_tokens=4,
                                       messages=[{"role": "user", "content": "a" * (n + 1)}])
    assert "has at least" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="x", max_tokens=4, prompt="a" * (n + 1))
    assert "has at least" in str(e.value)


def test_a_refused_request_says_its_connection_closes(server):
    """A 400 whose body may be unread closes the connection after it, and says so
    (`Connection: close`): a kept-alive client would otherwise send its next request into a
    socket the server has closed ("Server disconnected without sending a response")."""
    conn = http.client.HTTPConnection(*server.httpd.server_address[:2], timeout=60)
    conn.request("POST", "/v1/completions", body=b"not json",
                 headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    reply = conn.getresponse()
    reply.read()
    assert reply.status == 400 and reply.getheader("Connection") == "close"
    conn.close()


def test_a_connection_reset_prints_no_traceback(server, capfd):
    """A client that resets its connection (a keep-alive socket dropped, a killed process) is
    the client's business: the server prints nothing for it, and goes on answering."""
    import socket
    import struct

    host, port = server.httpd.server_address[:2]
    for _ in range(3):
        s = socket.create_connection((host, port))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # a request never finished
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # RST, not FIN
    threading.Event().wait(0.5)
    c = http.client.HTTPConnection(host, port, timeout=30)
    c.request("GET", "/health")
    assert c.getresponse().status == 200
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ConnectionResetError" not in err


def test_the_cli_serves_the_demo_pair_and_stops(tmp_path):
    """`mlx-spec serve` as a process: prints its URL, answers, and ctrl+c ends it with 0."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "mlx_spec.cli", "serve", "--port", str(port)],
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONFAULTHANDLER": "1"},
                            # ctrl+c as a terminal delivers it, even where this test runs as a
                            # shell's background job (which ignores SIGINT, and so its children)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    rest: list[str] = []  # read as it comes: a full pipe must not be what stops it exiting
    reader = None
    try:
        line = proc.stderr.readline()
        reader = threading.Thread(target=lambda: rest.extend(proc.stderr), daemon=True)
        reader.start()
        assert f"127.0.0.1:{port}/v1" in line and "drafter mtp" in line, line
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0)
        assert c.chat.completions.create(model="demo", messages=CHAT, max_tokens=8).choices
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:  # every thread's stack, for the message
            proc.send_signal(signal.SIGABRT)  # (PYTHONFAULTHANDLER prints them)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
            code = None
        if reader is not None:
            reader.join(5)
        assert code == 0, "".join(rest)[-4000:]


def test_an_auto_server_calibrates_while_idle(pair, tmp_path):
    """No request waits for a calibration: the server measures the costs between requests."""
    from mlx_spec.engine.calibration import CalibrationStore

    target, tok, draft = pair
    engine = Engine(target, tok, DraftModelDrafter(draft, target), draft_length="auto",
                    store=CalibrationStore(tmp_path))
    server = Server(engine, port=0)
    server.start()
    try:
        for _ in range(600):  # bounded: a few seconds on the tiny model
            if engine.calibrated:
                break
            threading.Event().wait(0.05)
        assert engine.calibrated
        c = openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0)
        assert c.chat.completions.create(model="x", messages=CHAT, max_tokens=8).choices
    finally:
        server.close()


@pytest.fixture
def claude(server):
    import anthropic

    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=120)


def test_anthropic_messages_whole_and_streamed(claude, pair):
    """The official `anthropic` client: a message, and its documented stream of events, both
    the engine's own answer; a system prompt and stop_sequences."""
    want, end = alone(pair, CHAT, 24)
    m = claude.messages.create(model="x", max_tokens=24, messages=CHAT)
    assert m.content[0].text == want and m.stop_reason == "max_tokens"
    assert m.usage.output_tokens == end.stats.generated_tokens
    assert m.model_extra["speculative_decoding"]["num_draft_tokens"] == end.stats.drafted
    names, text = [], []
    with claude.messages.stream(model="x", max_tokens=24, messages=CHAT) as stream:
        for ev in stream:
            names.append(ev.type)
            if ev.type == "content_block_delta":
                text.append(ev.delta.text)
        final = stream.get_final_message()
    assert "".join(text) == want == final.content[0].text
    assert names[0] == "message_start" and names[-1] == "message_stop"
    assert {"content_block_start", "content_block_stop", "message_delta"} <= set(names)
    cut = want[3:6]
    stopped = claude.messages.create(model="x", max_tokens=24, messages=CHAT,
                                     stop_sequences=[cut])
    assert stopped.content[0].text == want[: want.index(cut)]
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == cut
    system = [{"role": "system", "content": "Be brief."}, *CHAT]
    told = claude.messages.create(model="x", max_tokens=12, messages=CHAT, system="Be brief.")
    assert told.content[0].text == alone(pair, system, 12)[0]


def test_anthropic_errors_are_anthropic_shaped(claude):
    import anthropic

    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="x", max_tokens=8, messages=[{"role": "robot",
                                                                    "content": "x"}])
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"
    bad = anthropic.Anthropic(base_url=claude.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model="x", max_tokens=8, messages=CHAT)


def test_metrics_count_what_each_request_reports(server, client):
    """/metrics (Prometheus text, vLLM's names) moves by exactly one request's own stats."""
    def scrape() -> dict[str, float]:
        host, port = server.httpd.server_address[:2]
        c = http.client.HTTPConnection(host, port, timeout=30)
        c.request("GET", "/metrics", headers={"Authorization": f"Bearer {KEY}"})
        text = c.getresponse().read().decode()
        c.close()
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines() if line and not line.startswith("#")}

    before = scrape()
    r = client.chat.completions.create(model="x", messages=CHAT, max_tokens=16)
    after = scrape()
    spec = r.model_extra["speculative_decoding"]

    def moved(name: str) -> float:
        return after[f"vllm:{name}"] - before.get(f"vllm:{name}", 0.0)

    assert moved("generation_tokens_total") == r.usage.completion_tokens
    assert moved("prompt_tokens_total") == r.usage.prompt_tokens
    assert moved("spec_decode_num_draft_tokens_total") == spec["num_draft_tokens"]
    assert moved("spec_decode_num_accepted_tokens_total") == spec["num_accepted_draft_tokens"]
    assert moved("spec_decode_num_drafts_total") == spec["num_spec_steps"]
    assert moved('spec_decode_num_accepted_tokens_per_pos_total{position="0"}') > 0
    assert moved("time_to_first_token_seconds_count") == 1
    assert moved("inter_token_latency_seconds_count") == r.usage.completion_tokens - 1
    assert after["vllm:num_requests_running"] == 0


def test_a_full_queue_is_429_with_retry_after(pair):
    target, tok, draft = pair
    server = Server(Engine(target, tok, DraftModelDrafter(draft, target), draft_length=3),
                    port=0, max_concurrency=1, max_queue=0)
    server.start()
    try:
        c = openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0)
        stream = c.chat.completions.create(model="x", messages=CHAT, max_tokens=400,
                                           stream=True)
        next(iter(stream))  # running: the one slot is taken
        with pytest.raises(openai.RateLimitError) as e:
            c.chat.completions.create(model="x", messages=CHAT, max_tokens=4)
        assert e.value.response.headers["Retry-After"] == "1"
        stream.close()
    finally:
        server.close()
