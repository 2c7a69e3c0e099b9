"""The engine as a service: in this process and in a child process, behind one API.

EngineProcess must give exactly the engine's tokens (greedy, same weights), stop on request,
switch drafters, and turn every failure - a bad model, an over-long prompt, a child that dies -
into a one-line MlxSpecError, without leaving a process behind."""

from __future__ import annotations

import threading
import time

import pytest
from helpers import assert_same_or_near_tie, open_chat

from mlx_spec import (
    EngineInThread,
    EngineProcess,
    Kind,
    LoadSpec,
    MlxSpecError,
    ModelLoadError,
    PromptTooLongError,
    SamplingConfig,
    TokenEvent,
    TurnEnd,
    encode_chat,
)
from mlx_spec.events import RoundTrace

CHAT = [{"role": "user", "content": "def add(a, b):"}]


@pytest.fixture(scope="module")
def process():
    service = EngineProcess.start(LoadSpec(draft_length=3))
    yield service
    service.close()


def turn(service, **kw) -> tuple[list[TokenEvent], TurnEnd]:
    events = list(service.chat(CHAT, **kw))
    assert isinstance(events[-1], TurnEnd)
    return events[:-1], events[-1]


def test_process_gives_the_engines_tokens_and_kinds(process):
    engine = open_chat(draft_length=3)
    ref = [e for e in engine.generate(encode_chat(engine.tokenizer, CHAT), max_tokens=40)]
    tokens, end = turn(process, max_tokens=40)
    assert list(end.tokens) == list(ref[-1].tokens)  # same weights, same loop: exact
    assert {e.kind for e in tokens} - {Kind.TARGET}  # drafts were verified in the child
    # the demo variant that can pay here: on MLX's CPU backend the bf16 target in f32
    assert process.info.target == "demo-target (f32)" and process.info.drafter == "mtp"
    assert end.stats.generated_tokens == len(tokens) and end.stats.tok_s > 0


def test_a_traced_turn_crosses_the_pipe(process):
    events, end = turn(process, max_tokens=24, trace=True)
    rounds = [e for e in events if isinstance(e, RoundTrace)]
    assert rounds and sum(r.emitted for r in rounds) == end.stats.generated_tokens
    assert any(r.rows for r in rounds)


def test_in_thread_and_process_agree_and_switch_drafters(process):
    local = EngineInThread.load(LoadSpec(draft_length=3))
    _, a = turn(local, max_tokens=30)
    _, b = turn(process, max_tokens=30)
    assert a.tokens == b.tokens
    info = process.configure(drafter="none")
    assert info.drafter == "none" and "mtp" in info.drafters
    tokens, c = turn(process, max_tokens=30)
    assert {e.kind for e in tokens} == {Kind.TARGET}
    # speculative vs target-only greedy: equal, or parted at a measured near-tie (8-bit target)
    prompt = encode_chat(local.engine.tokenizer, CHAT)
    assert_same_or_near_tie(local.engine.target, prompt, list(c.tokens), list(a.tokens), 8)
    assert process.configure(drafter="mtp", draft_length="auto").draft_length == "auto"
    _, race = turn(process, max_tokens=30, target_only=True)
    assert race.stats.drafted == 0 and race.tokens == c.tokens  # both target-only: exact
    assert process.measure_baseline(tokens=8, repeats=1).tok_s > 0


def test_info_says_when_copies_are_drafted_first_and_the_app_labels_it():
    """EngineInfo.lookup follows the drafter (a switch to none and back keeps --lookup), and
    the app's panel and status line name it `mtp+lookup`, as the turn's line does."""
    from mlx_spec_app.engine_host import EngineHost

    service = EngineInThread.load(LoadSpec(draft_length="auto", lookup=True))
    host = EngineHost.__new__(EngineHost)  # label() reads only the running engine's info
    host.engine = service
    assert service.info.drafter == "mtp" and service.info.lookup
    assert host.label() == "mtp+lookup k=auto"
    assert not service.configure(drafter="none").lookup and host.label() == "no drafter"
    assert service.configure(drafter="mtp").lookup
    assert not EngineInThread.load(LoadSpec(draft_length=3)).info.lookup


def test_stop_mid_turn_and_errors_are_one_line(process):
    stop = threading.Event()
    events = []
    for event in process.chat(CHAT, max_tokens=400, stop=stop,
                              sampling=SamplingConfig(temperature=1.0)):
        events.append(event)
        if len(events) == 3:
            stop.set()
    end = events[-1]
    assert isinstance(end, TurnEnd) and end.finish_reason == "cancelled" and len(events) < 100
    with pytest.raises(PromptTooLongError) as e:  # the error's type survives the pipe
        list(process.chat([{"role": "user", "content": "x " * 20000}], max_tokens=4))
    assert "context" in str(e.value) and "\n" not in str(e.value)
    _, end = turn(process, max_tokens=8)  # the service is still usable after an error
    assert end.stats.generated_tokens > 0


def test_a_turn_abandoned_mid_stream_does_not_leak_into_the_next(process):
    events = process.chat(CHAT, max_tokens=300, sampling=SamplingConfig(temperature=1.0))
    for _ in range(3):
        next(events)
    events.close()  # the reader walks away mid-turn
    tokens, end = turn(process, max_tokens=12)
    assert [e.token for e in tokens] == list(end.tokens)
    assert end.stats.generated_tokens == len(tokens) <= 12


def test_a_stop_in_the_same_instant_as_the_message_is_not_lost_nor_leaks(process):
    """The stop is tied to its turn: set before the request is even read, it still stops that
    turn; written again after that turn ended, it does not touch the next one."""
    stop = threading.Event()
    stop.set()  # esc pressed as the message went out
    tokens, end = turn(process, max_tokens=200, stop=stop)
    assert end.finish_reason == "cancelled" and len(tokens) <= 9  # at most one round
    process._stop(process._turn)  # a late, duplicate stop for the turn that ended
    tokens, end = turn(process, max_tokens=40)
    assert end.finish_reason in ("length", "stop") and end.stats.generated_tokens > 0
    assert end.finish_reason != "cancelled"


def test_load_failure_and_a_dying_child_are_one_line_errors(tmp_path):
    with pytest.raises(ModelLoadError) as e:
        EngineProcess.start(LoadSpec(model=str(tmp_path / "missing")))
    assert "not found" in str(e.value) and "\n" not in str(e.value)
    service = EngineProcess.start(LoadSpec(draft_length=2))
    child = service._process
    child.kill()
    with pytest.raises(MlxSpecError, match="ended unexpectedly .killed by SIGKILL"):
        turn(service, max_tokens=8)
    assert not service.alive
    service.close()
    assert child.poll() is not None


def test_close_ends_the_child():
    service = EngineProcess.start(LoadSpec(draft_length=2))
    child = service._process
    t = time.perf_counter()
    service.close()
    assert child.poll() == 0 and time.perf_counter() - t < 5


def test_public_names_resolve_and_the_ui_process_never_imports_mlx_lm():
    import subprocess
    import sys

    import mlx_spec

    assert sorted(mlx_spec.__all__) == sorted(mlx_spec._HOME)
    assert all(getattr(mlx_spec, name) is not None for name in mlx_spec.__all__)
    # the app drives an EngineProcess: mlx-lm (seconds to import) belongs to the child only
    code = "import sys, mlx_spec_app.app; sys.exit('mlx_lm' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
