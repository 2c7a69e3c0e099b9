"""Tool calls through `mlx-spec serve`: tools reach the chat template, and calls in the answer
are found by the tokenizer's own markers and parser (mlx-lm's json_tools here) and returned as
OpenAI `tool_calls` and Anthropic `tool_use` blocks, whole and streamed, read by the official
clients. A random tiny model writes no tool call, so the answer's text is scripted (the
scheduler replays it as the engine's events); everything from there on is the server's own."""

from __future__ import annotations

import json
import shutil

import anthropic
import openai
import pytest

from mlx_spec.engine import Engine
from mlx_spec.engine.cycle import Row
from mlx_spec.events import Kind, TokenEvent, TurnEnd, TurnStats
from mlx_spec.loading import load_target
from mlx_spec.serve import Server
from mlx_spec.serve.scheduler import Scheduler, _Running
from mlx_spec.serve.tools import ToolText

# a Qwen-style template: tools laid out, calls as <tool_call>{json}</tool_call>
TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n{%- for tool in tools %}\n{{ tool | tojson }}"
    "{%- endfor %}\nAnswer with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>"
    "<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message.tool_calls %}{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "<tool_call>{\"name\": \"{{ tool_call.name }}\"}</tool_call>{%- endfor %}{%- endif %}"
    "{{ message['content'] + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
ANSWER = 'Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n' \
         '</tool_call>'
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def tool_model(model_dirs, tmp_path_factory):
    out = shutil.copytree(model_dirs("llama"), tmp_path_factory.mktemp("tools") / "llama")
    config = json.loads((out / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps({**config,
                                                           "chat_template": TEMPLATE}))
    return out


@pytest.fixture(scope="module")
def server(tool_model):
    target, tok = load_target(tool_model)
    server = Server(Engine(target, tok, None), port=0)
    server.start()
    yield server
    server.close()


@pytest.fixture
def scripted(monkeypatch):
    """The engine's events for ANSWER, in pieces of a few characters, as a turn yields them."""
    prompts = []

    def events(job):
        prompts.append(job.prompt)
        pieces = [ANSWER[i : i + 5] for i in range(0, len(ANSWER), 5)]
        for p in pieces:
            yield TokenEvent(0, p, Kind.TARGET)
        stats = TurnStats(prompt_tokens=len(job.prompt), generated_tokens=len(pieces),
                          target_passes=len(pieces), total_s=0.1, finish_reason="stop")
        yield TurnEnd(stats, "stop", tuple([0] * len(pieces)))

    def start(self, job):  # a real (target-only) conversation, its turn replaced
        return _Running(job, Row(self.engine.conversation(), events(job)))

    monkeypatch.setattr(Scheduler, "_start", start)
    return prompts


def test_the_tokenizers_own_parser_splits_text_and_calls(tool_model):
    _, tok = load_target(tool_model)
    text, calls = ToolText(tok, (WEATHER,)).split(ANSWER)
    assert text == "Let me look." and [(c.name, c.arguments) for c in calls] == [
        ("get_weather", {"city": "Paris"})]
    cut = ToolText(tok, (WEATHER,)).split(ANSWER[:-5])  # cut off by max_tokens: kept as text
    assert cut == (ANSWER[:-5], [])


def test_openai_tool_calls_whole_and_streamed(server, scripted):
    c = openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0)
    r = c.chat.completions.create(model="x", messages=ASK, tools=[WEATHER])
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert r.choices[0].message.content == "Let me look."
    text, calls, finish = [], {}, None
    for chunk in c.chat.completions.create(model="x", messages=ASK, tools=[WEATHER],
                                           stream=True):
        d = chunk.choices[0].delta
        text.append(d.content or "")
        for tc in d.tool_calls or []:
            calls.setdefault(tc.index, []).append(tc.function.arguments or "")
        finish = chunk.choices[0].finish_reason or finish
    assert "".join(text) == "Let me look." and finish == "tool_calls"
    assert json.loads("".join(calls[0])) == {"city": "Paris"}
    no_tools = c.chat.completions.create(model="x", messages=ASK)
    assert no_tools.choices[0].message.content == ANSWER  # nothing offered: plain text
    assert len(scripted[0]) > len(scripted[-1])  # the template laid the tools out


def test_anthropic_tool_use_whole_and_streamed(server, scripted):
    c = anthropic.Anthropic(base_url=server.url, api_key="-", max_retries=0)
    tools = [{"name": "get_weather", "description": "The weather in a city",
              "input_schema": WEATHER["function"]["parameters"]}]
    m = c.messages.create(model="x", max_tokens=64, messages=ASK, tools=tools)
    assert m.stop_reason == "tool_use"
    assert [b.type for b in m.content] == ["text", "tool_use"]
    assert m.content[1].name == "get_weather" and m.content[1].input == {"city": "Paris"}
    with c.messages.stream(model="x", max_tokens=64, messages=ASK, tools=tools) as stream:
        final = stream.get_final_message()
    assert final.content[1].input == {"city": "Paris"} and final.stop_reason == "tool_use"
    # the call and its result go back into the template on the next turn
    again = c.messages.create(model="x", max_tokens=64, tools=tools, messages=[
        *ASK, {"role": "assistant", "content": [m.content[1].model_dump()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": m.content[1].id,
                                      "content": "sunny"}]}])
    assert again.stop_reason == "tool_use"


def test_tools_for_a_model_without_tool_calling_are_a_400(model_dirs):
    target, tok = load_target(model_dirs("llama"))  # chatml without tools
    server = Server(Engine(target, tok, None), port=0)
    server.start()
    try:
        c = openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0)
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="x", messages=ASK, tools=[WEATHER])
        assert e.value.body["param"] == "tools"
    finally:
        server.close()
