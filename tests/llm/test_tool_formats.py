"""The tool-call formats with dedicated handlers in llama.cpp's common/chat.cpp (GPT-OSS's harmony,
Qwen3-Coder's XML), on the real templates (tests/data/chat_templates) and on the model outputs and
expected messages of llama.cpp's tests/test-chat.cpp: detection, rendering with tools, the reply
parsed whole and streamed in pieces of every size, and the grammars."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from helpers.data import DATA
from helpers.tool_stream import streamed
from pyggml.llm.chat import ChatTemplate
from pyggml.llm.grammar import LlamaGrammar
from pyggml.llm.tool_calls import (
    ToolFormat,
    apply_chat_template,
    build_response_format_grammar,
    detect_format,
    parse_reply,
)

TEMPLATES = DATA / "chat_templates"


def _template(name: str) -> ChatTemplate:
    return ChatTemplate((TEMPLATES / name).read_text(encoding="utf-8"))


GPT_OSS = "openai-gpt-oss-120b.jinja"
SPECIAL = {"type": "function", "function": {
    "name": "special_function", "description": "I'm special",
    "parameters": {"type": "object", "properties": {"arg1": {"type": "integer"}}, "required": ["arg1"]}}}
EDIT = {"type": "function", "function": {"name": "edit", "description": "Edit a file", "parameters": {
    "type": "object", "properties": {"oldString": {"type": "string"}, "newString": {"type": "string"},
                                     "replaceAll": {"type": "boolean"}},
    "required": ["oldString", "newString"]}}}
USER = [{"role": "user", "content": "Hey there!"}]
HELLO, THINKING = "Hello, world!\nWhat's up?", "I'm\nthinking"
CALL = [("special_function", '{"arg1": 1}')]


def _check(params: Any, text: str, content: str, reasoning: str, calls: list[tuple[str, str]]) -> None:
    reply = parse_reply(text, params)
    assert (reply.content, reply.reasoning_content) == (content, reasoning)
    assert [(c.name, c.arguments) for c in reply.tool_calls] == calls
    for step in (1, 3, 7, len(text)):  # a stream cut in pieces of any size adds up to the same
        got = streamed(params, text, step)
        assert (got["content"], got["reasoning"], got["calls"]) == (content, reasoning, calls), step


GPT_OSS_CASES = [  # (reply, tools, reasoning_format, content, reasoning, calls): test-chat.cpp's GPT-OSS cases
    ("<|channel|>final<|message|>" + HELLO, [], None, HELLO, "", []),
    ("<|channel|>commentary<|message|>" + HELLO, [], None, HELLO, "", []),
    ("<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>" + HELLO,
     [], "auto", HELLO, THINKING, []),
    ("<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>" + HELLO,
     [], "none", "<|channel|>analysis<|message|>I'm\nthinking<|end|>" + HELLO, "", []),
    (' to=functions.special_function<|channel|>analysis<|message|>{"arg1": 1}', [SPECIAL], "auto", "", "", CALL),
    ('<|channel|>analysis to=functions.special_function<|message|>{"arg1": 1}', [SPECIAL], "auto", "", "", CALL),
    (' to=functions.special_function<|channel|>analysis <|constrain|>json<|message|>{"arg1": 1}', [SPECIAL], "auto",
     "", "", CALL),
    ('<|channel|>commentary to=functions.special_function<|message|>{"arg1": 1}', [SPECIAL], "auto", "", "", CALL),
    ("<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant to=functions.special_function"
     '<|channel|>analysis<|message|>{"arg1": 1}', [SPECIAL], "auto", "", THINKING, CALL),
    ("<|channel|>analysis<|message|>Thinking about edit...<|end|><|start|>assistant<|channel|>commentary "
     'to=functions.edit <|constrain|>json<|message|>{"oldString": "if (part < railCount - 1) {", "newString": '
     '"if (part < 4) {", "replaceAll": false}', [EDIT], "auto", "", "Thinking about edit...",
     [("edit", '{"oldString": "if (part < railCount - 1) {", "newString": "if (part < 4) {", "replaceAll": false}')]),
    # unsolicited calls to the model's built-in tools: nothing of them is shown
    ("<|channel|>analysis<|message|>I will execute python to say hello<|end|><|start|>assistant to=container.exec"
     "<|channel|>commentary<|message|>python3 -c 'print(\"hello\")'", [], "auto", "",
     "I will execute python to say hello", []),
    ("<|channel|>analysis<|message|>I will execute python to say hello<|end|><|start|>assistant<|channel|>commentary "
     'to=python <|constrain|>code<|message|>print("hello")', [], "auto", "", "I will execute python to say hello", []),
    # a stray "<|channel|>commentary to=assistant" before a message is no recipient
    ("<|channel|>commentary to=assistant<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant"
     "<|channel|>final<|message|>" + HELLO, [], "auto", HELLO, THINKING, []),
    ("<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>commentary to=assistant"
     "<|channel|>final<|message|>" + HELLO, [], "auto", HELLO, THINKING, []),
]


@pytest.mark.parametrize("text, tools, reasoning_format, content, reasoning, calls", GPT_OSS_CASES)
def test_gpt_oss_replies(text: str, tools: list, reasoning_format: str | None, content: str, reasoning: str,
                         calls: list[tuple[str, str]]) -> None:
    fmt = "deepseek" if reasoning_format == "auto" else reasoning_format
    params = apply_chat_template(_template(GPT_OSS), USER, tools=tools, reasoning_format=fmt)
    assert params.format == ToolFormat.GPT_OSS and params.parse
    _check(params, text, content, reasoning, calls)


def test_gpt_oss_partial_reasoning_and_a_reply_that_is_not_harmony() -> None:
    params = apply_chat_template(_template(GPT_OSS), USER)
    partial = parse_reply("<|channel|>analysis<|message|>I'm\nthinking", params, partial=True)
    assert (partial.reasoning_content, partial.content) == (THINKING, "")
    assert parse_reply("plain words", params).content == "plain words"  # no channel: all content


def test_gpt_oss_template_renders_tools_calls_results_and_effort() -> None:
    tpl = _template(GPT_OSS)
    assert detect_format(tpl) == ToolFormat.GPT_OSS
    weather = {"type": "function", "function": {"name": "get_weather", "description": "The weather of a city",
                                                "parameters": {"type": "object", "properties": {
                                                    "city": {"type": "string"}}, "required": ["city"]}}}
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "reasoning_content": "Need the tool.", "tool_calls": [{
                "id": "c7", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "c7", "name": "get_weather", "content": "rain, 12 C"},
            {"role": "assistant", "content": "It rains.", "reasoning_content": "Easy."}]
    p = apply_chat_template(tpl, msgs, tools=[weather], chat_template_kwargs={"reasoning_effort": "high"},
                            add_generation_prompt=False)
    assert "Reasoning: high" in p.prompt and "type get_weather = (_: {\ncity: string,\n}) => any;" in p.prompt
    assert ('<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}'
            "<|call|>") in p.prompt
    assert '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"rain, 12 C"<|end|>' in p.prompt
    # the last turn's reasoning goes in as "thinking"; its <|return|> becomes <|end|> to go on from it
    assert p.prompt.endswith("<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final"
                             "<|message|>It rains.<|end|>")
    last = [*USER, {"role": "assistant", "content": "Hi."}]
    assert tpl.render(last, add_generation_prompt=False).endswith("<|return|>")
    assert apply_chat_template(tpl, last, add_generation_prompt=False).prompt.endswith("Hi.<|end|>")
    # OpenAI's developer role: GPT-OSS's own (other templates get it as "system", as llama.cpp maps it)
    dev = [{"role": "developer", "content": "Answer in French."}, *USER]
    assert "<|start|>developer<|message|># Instructions\n\nAnswer in French." in apply_chat_template(tpl, dev).prompt
    assert apply_chat_template(_template(QWEN3_CODER), dev).prompt.startswith("<|im_start|>system\nAnswer in French.")
    gen = apply_chat_template(tpl, USER, chat_template_kwargs={"reasoning_effort": "low"})
    assert "Reasoning: low" in gen.prompt and gen.prompt.endswith("<|start|>assistant")
    assert gen.preserved_tokens == ["<|channel|>", "<|constrain|>", "<|message|>", "<|start|>", "<|end|>"]


def _accepts(grammar: str, text: str) -> bool:
    return LlamaGrammar.from_text(grammar).validate(text)[0]


def test_gpt_oss_grammars() -> None:
    tpl = _template(GPT_OSS)
    lazy = apply_chat_template(tpl, USER, tools=[SPECIAL, EDIT])
    assert lazy.grammar_lazy and lazy.tool_names == ["special_function", "edit"]
    for call in (' to=functions.special_function<|channel|>commentary <|constrain|>json<|message|>{"arg1": 1}',
                 '<|channel|>commentary to=functions.special_function<|message|>{"arg1": 1}',
                 '<|channel|>analysis to=functions.edit json<|message|>{"oldString": "a", "newString": "b"}'):
        assert _accepts(lazy.grammar, call), call
    for bad in ('<|channel|>commentary to=functions.special_function<|message|>{"arg1": "one"}',
                '<|channel|>commentary to=functions.other<|message|>{}',
                '<|channel|>final to=functions.special_function<|message|>{"arg1": 1}'):
        assert not _accepts(lazy.grammar, bad), bad
    # the lazy grammar starts where chat.cpp's trigger patterns find a call's header
    reply = "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>commentary to=functions.edit"
    starts = [m.start(1) if m.groups() else m.start() for t in lazy.grammar_triggers
              if (m := re.search(t.value, reply)) is not None]
    assert starts == [reply.index("<|channel|>commentary")]
    assert re.search(lazy.grammar_triggers[0].value, " to") is not None
    required = apply_chat_template(tpl, USER, tools=[SPECIAL], tool_choice="required")
    assert not required.grammar_lazy
    assert _accepts(required.grammar, "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant"
                                      "<|channel|>commentary<|message|>Calling.<|end|><|start|>assistant"
                                      ' to=functions.special_function<|channel|>analysis<|message|>{"arg1": 1}')
    assert not _accepts(required.grammar, "<|channel|>analysis<|message|>hm<|end|><|start|>assistant"
                                          "<|channel|>final<|message|>no call")


def test_gpt_oss_json_schema_is_the_final_message() -> None:
    invoice = {"type": "object", "properties": {"amount": {"type": "number"}, "date": {"type": "string"}},
               "required": ["amount", "date"]}
    params = apply_chat_template(_template(GPT_OSS), USER, tools=[SPECIAL])
    build_response_format_grammar(params, invoice)  # a json_schema wins over the tools, as in llama-server
    text = ("<|channel|>analysis<|message|>I need to output the invoice details in JSON<|end|><|start|>assistant"
            '<|channel|>final <|constrain|>json<|message|>{"amount": 123.45, "date": "2025-12-03"}')
    assert not params.grammar_lazy and _accepts(params.grammar, text)
    assert not _accepts(params.grammar, text.replace("123.45", '"123.45"'))
    _check(params, text, '{"amount": 123.45, "date": "2025-12-03"}', "I need to output the invoice details in JSON",
           [])
    json.loads(parse_reply(text, params).content)


# ---------------------------------------------------------------------------------------------- Qwen3-Coder

QWEN3_CODER = "Qwen3-Coder.jinja"


def _tool(name: str, props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": name, "parameters": {
        "type": "object", "properties": props, "required": required}}}


INT, STR = {"type": "integer"}, {"type": "string"}
WITH_OPT = _tool("special_function_with_opt", {"arg1": INT, "arg2": INT}, ["arg1"])
PYTHON = _tool("python", {"code": STR}, ["code"])
HTML = _tool("html", {"markup": STR}, ["markup"])
TODO = _tool("todo_list", {"todos": {"type": "array"}}, ["todos"])
EDIT3 = _tool("edit", {"filename": STR, "oldString": STR, "newString": STR}, ["filename", "oldString", "newString"])
REQ_OPT = _tool("tool_2req_4opt", {"req1": STR, "req2": INT, "opt1": STR, "opt2": INT, "opt3": STR, "opt4": INT},
                ["req1", "req2"])
NULL_STR = _tool("set_nullable_str", {"name": {"type": ["string", "null"]}}, ["name"])
NULL_INT = _tool("set_nullable_int", {"count": {"type": ["integer", "null"]}}, ["count"])
UNION = _tool("set_union", {"value": {"type": ["string", "object"]}, "amount": {"type": ["string", "integer"]}},
              ["value", "amount"])
ENUM = _tool("set_unit", {"unit": {"enum": ["celsius", "fahrenheit"]}}, ["unit"])


def _xml(name: str, *params: tuple[str, str], opening: str = "<tool_call>\n") -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"{opening}<function={name}>\n{body}</function>\n</tool_call>"


QWEN3_CODER_CASES = [  # (reply, tools, content, calls): test-chat.cpp's Qwen3-Coder cases
    (HELLO, [], HELLO, []),
    (_xml("special_function", ("arg1", "1")), [SPECIAL], "", CALL),
    (_xml("special_function", ("arg1", "1"), opening=""), [SPECIAL], "", CALL),  # without the first <tool_call>
    ("Let me call it.\n" + _xml("special_function", ("arg1", "1"), opening=""), [SPECIAL], "Let me call it.\n", CALL),
    (_xml("special_function", ("arg1", "1"), opening="") + "\n" + _xml("special_function_with_opt", ("arg1", "1"),
                                                                         ("arg2", "2")),
     [SPECIAL, WITH_OPT], "", [*CALL, ("special_function_with_opt", '{"arg1": 1, "arg2": 2}')]),
    (_xml("python", ("code", 'def hello():\n    print("Hello, world!")\n\nhello()')), [PYTHON], "",
     [("python", '{"code": "def hello():\\n    print(\\"Hello, world!\\")\\n\\nhello()"}')]),
    (_xml("python", ("code", "格")), [PYTHON], "", [("python", '{"code": "格"}')]),
    (_xml("html", ("markup", "<html>\n <head>\n  <title>Hello!</title>\n </head>\n</html>")), [HTML], "",
     [("html", '{"markup": "<html>\\n <head>\\n  <title>Hello!</title>\\n </head>\\n</html>"}')]),
    (_xml("todo_list", ("todos", '[{"item": "Check stuff", "selected": false}, {"item": "Prepare stuff", '
                                 '"selected": true}]')), [TODO], "",
     [("todo_list", '{"todos": [{"item": "Check stuff", "selected": false}, {"item": "Prepare stuff", '
                    '"selected": true}]}')]),
    (_xml("edit", ("newString", "#include"), ("filename", "foo.c"), ("oldString", "#iclunde")), [EDIT3], "",
     [("edit", '{"newString": "#include", "filename": "foo.c", "oldString": "#iclunde"}')]),
    (_xml("tool_2req_4opt", ("req2", "42"), ("req1", "hello"), ("opt2", "200")), [REQ_OPT], "",
     [("tool_2req_4opt", '{"req2": 42, "req1": "hello", "opt2": 200}')]),
    (_xml("set_nullable_str", ("name", "hello world")), [NULL_STR], "",
     [("set_nullable_str", '{"name": "hello world"}')]),
    (_xml("set_nullable_int", ("count", "42")), [NULL_INT], "", [("set_nullable_int", '{"count": 42}')]),
    (_xml("set_nullable_str", ("name", "null")), [NULL_STR], "", [("set_nullable_str", '{"name": null}')]),
    (_xml("set_union", ("value", '{"a": 1}'), ("amount", "2 dollars")), [UNION], "",
     [("set_union", '{"value": {"a": 1}, "amount": "2 dollars"}')]),
    (_xml("set_union", ("value", "{not valid json"), ("amount", "42")), [UNION], "",
     [("set_union", '{"value": "{not valid json", "amount": 42}')]),
    (_xml("set_unit", ("unit", "celsius")), [ENUM], "", [("set_unit", '{"unit": "celsius"}')]),
]


@pytest.mark.parametrize("text, tools, content, calls", QWEN3_CODER_CASES)
def test_qwen3_coder_replies(text: str, tools: list, content: str, calls: list[tuple[str, str]]) -> None:
    params = apply_chat_template(_template(QWEN3_CODER), USER, tools=tools)
    assert params.format == (ToolFormat.QWEN3_XML if tools else ToolFormat.CONTENT_ONLY)
    _check(params, text, content, "", calls)


QWEN35_CASES = [  # (reply, enable_thinking, tools, content, reasoning, calls): test-chat.cpp's Qwen3.5 cases
    ("I'm\nthinking\n</think>\n\n" + HELLO, True, [], HELLO, THINKING, []),
    (_xml("special_function", ("arg1", "1")), False, [SPECIAL], "", "", CALL),
    ("I'm\nthinking\n</think>\n\n" + _xml("special_function", ("arg1", "1")), True, [SPECIAL], "", THINKING, CALL),
    ("I'm\nthinking\n" + _xml("special_function", ("arg1", "1")), True, [SPECIAL], "", THINKING, CALL),  # no </think>
    (_xml("edit", ("filename", "foo.c"), ("oldString", "#iclunde"), ("newString", "#include\n")), False, [EDIT3], "",
     "", [("edit", '{"filename": "foo.c", "oldString": "#iclunde", "newString": "#include\\n"}')]),
]


@pytest.mark.parametrize("text, thinking, tools, content, reasoning, calls", QWEN35_CASES)
def test_qwen35_thinking_and_xml_calls(text: str, thinking: bool, tools: list, content: str, reasoning: str,
                                       calls: list[tuple[str, str]]) -> None:
    params = apply_chat_template(_template("Qwen3.5-4B.jinja"), USER, tools=tools, enable_thinking=thinking)
    assert params.thinking_forced_open == thinking and not params.bare_first_call
    _check(params, text, content, reasoning, calls)


def test_qwen3_coder_stream_sends_a_string_value_as_it_grows() -> None:
    params = apply_chat_template(_template(QWEN3_CODER), USER, tools=[PYTHON])
    text = _xml("python", ("code", "print(1)\nprint(2)"))
    cut = text.index("(2)")
    partial = parse_reply(text[:cut], params, partial=True)
    assert [(c.name, c.arguments) for c in partial.tool_calls] == [("python", '{"code": "print(1)\\nprint')]
    held = parse_reply(text[:text.index("</parameter>") + 3], params, partial=True)  # "\n</p" may end the value
    assert held.tool_calls[0].arguments == '{"code": "print(1)\\nprint(2)'
    # a reply that stops being a call is content from there on
    broken = parse_reply("Sure.\n<tool_call>\n<function=python>\n<oops>", params)
    assert broken.tool_calls == [] and broken.content == "Sure.\n<tool_call>\n<function=python>\n<oops>"


def test_qwen3_xml_templates_render_and_are_detected() -> None:
    calls = [{"role": "user", "content": "Run it"}, {"role": "assistant", "content": None, "tool_calls": [{
        "id": "c1", "type": "function", "function": {"name": "python", "arguments": '{"code": "print(1)"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "1"}]
    p = apply_chat_template(_template(QWEN3_CODER), calls, tools=[PYTHON])
    assert p.format == ToolFormat.QWEN3_XML and p.bare_first_call
    assert "<tools>\n<function>\n<name>python</name>" in p.prompt
    assert "<tool_call>\n<function=python>\n<parameter=code>\nprint(1)\n</parameter>\n</function>\n</tool_call>" \
        in p.prompt
    assert "<tool_response>\n1\n</tool_response>" in p.prompt
    assert [t.value for t in p.grammar_triggers] == ["<tool_call>", "<function=python>"]
    assert p.preserved_tokens == ["<tool_call>", "</tool_call>"]


def test_qwen3_coder_grammars() -> None:
    tpl = _template(QWEN3_CODER)
    lazy = apply_chat_template(tpl, USER, tools=[SPECIAL, REQ_OPT, PYTHON])
    assert lazy.grammar_lazy
    for ok in (_xml("special_function", ("arg1", "-7")),
               _xml("tool_2req_4opt", ("req2", "42"), ("req1", "hello"), ("opt4", "1"), ("opt1", "x")),
               _xml("python", ("code", "a < b\n</para")) + "\n" + _xml("special_function", ("arg1", "2")),
               _xml("special_function", ("arg1", "3"), opening="")):
        assert _accepts(lazy.grammar, ok), ok
    for bad in (_xml("special_function", ("arg1", "one")),  # not an integer
                _xml("tool_2req_4opt", ("req1", "hello")),  # req2 is required
                _xml("special_function", ("arg1", "1"), ("arg9", "1")),  # no such parameter
                _xml("other", ("arg1", "1"))):
        assert not _accepts(lazy.grammar, bad), bad
    required = apply_chat_template(tpl, USER, tools=[SPECIAL], tool_choice="required", parallel_tool_calls=False)
    assert not required.grammar_lazy
    assert _accepts(required.grammar, "Calling.\n" + _xml("special_function", ("arg1", "1")))
    assert not _accepts(required.grammar, "No call at all.")
    assert not _accepts(required.grammar, _xml("special_function", ("arg1", "1")) * 2)


# ---------------------------------------------------------------------------------------------- LFM2

LFM2_TEMPLATES = ["LFM2-8B-A1B.jinja", "LFM2.5-Instruct.jinja", "LFM2.5-8B-A1B.jinja"]
GET_TIME = _tool("get_time", {"city": STR}, ["city"])
TOGGLE = _tool("toggle", {"enabled": {"type": "boolean"}}, ["enabled"])
NULLABLE = _tool("set_nullable", {"value": {"type": "null"}}, ["value"])
CONFIG = _tool("set_config", {"config": {"type": "object"}}, ["config"])
CALENDAR = _tool("Calendar.create_event", {"title": STR, "participants": {"type": "array", "items": STR},
                                           "metadata": {"type": "object"}}, ["title", "participants", "metadata"])
EMPTY = _tool("empty_args", {}, [])
LFM2_START, LFM2_END = "<|tool_call_start|>", "<|tool_call_end|>"

LFM2_CASES = [  # (reply, tools, content, calls): test-chat.cpp's test_lfm2_parser cases
    (HELLO, [], HELLO, []),
    (f"{LFM2_START}[special_function(arg1=1)]{LFM2_END}", [SPECIAL], "", CALL),
    (f'{LFM2_START}[get_time(city="XYZCITY")]{LFM2_END}', [GET_TIME], "", [("get_time", '{"city": "XYZCITY"}')]),
    (f"{LFM2_START}[toggle(enabled=True)]{LFM2_END}", [TOGGLE], "", [("toggle", '{"enabled": true}')]),
    (f"{LFM2_START}[set_nullable(value=None)]{LFM2_END}", [NULLABLE], "", [("set_nullable", '{"value": null}')]),
    (f'{LFM2_START}[set_config(config={{"enabled": True, "count": 3}})]{LFM2_END}', [CONFIG], "",
     [("set_config", '{"config": {"enabled": true, "count": 3}}')]),
    (f'{LFM2_START}[set_config(config={{"enabled": true, "note": null}})]{LFM2_END}', [CONFIG], "",
     [("set_config", '{"config": {"enabled": true, "note": null}}')]),
    (f'{LFM2_START}[Calendar.create_event(title="demo", participants=["Alice", "Bob"], metadata={{"priority": '
     f'"high", "reminder": true}})]{LFM2_END}', [CALENDAR], "",
     [("Calendar.create_event", '{"title": "demo", "participants": ["Alice", "Bob"], "metadata": {"priority": '
                                '"high", "reminder": true}}')]),
    ("Use this format: [link text](url). Example: [Wikipedia](https://www.wikipedia.org).", [GET_TIME],
     "Use this format: [link text](url). Example: [Wikipedia](https://www.wikipedia.org).", []),
    (f"{LFM2_START}[python(code=\"def hello():\\n    print('hey')\")]{LFM2_END}", [PYTHON], "",
     [("python", '{"code": "def hello():\\n    print(\'hey\')"}')]),
    (f'{LFM2_START}[python(code="First line\\nSecond line\\tindented")]{LFM2_END}', [PYTHON], "",
     [("python", '{"code": "First line\\nSecond line\\tindented"}')]),
    (f'{LFM2_START}[python(code="print(\\"hi\\")")]{LFM2_END}', [PYTHON], "",
     [("python", '{"code": "print(\\"hi\\")"}')]),
    (f'Let me check the time.{LFM2_START}[get_time(city="Paris")]{LFM2_END}', [GET_TIME], "Let me check the time.",
     [("get_time", '{"city": "Paris"}')]),
    (f"{LFM2_START}[special_function(arg1=1), special_function_with_opt(arg1=1, arg2=2)]{LFM2_END}",
     [SPECIAL, WITH_OPT], "", [*CALL, ("special_function_with_opt", '{"arg1": 1, "arg2": 2}')]),
    (f"{LFM2_START}[empty_args()]{LFM2_END}", [EMPTY], "", [("empty_args", "{}")]),
]


@pytest.mark.parametrize("text, tools, content, calls", LFM2_CASES)
def test_lfm2_replies(text: str, tools: list, content: str, calls: list[tuple[str, str]]) -> None:
    params = apply_chat_template(_template(LFM2_TEMPLATES[0]), USER, tools=tools)
    assert params.format == (ToolFormat.LFM2 if tools else ToolFormat.CONTENT_ONLY)
    _check(params, text, content, "", calls)


def test_lfm2_partial_call_and_reasoning() -> None:
    params = apply_chat_template(_template("LFM2.5-8B-A1B.jinja"), USER, tools=[SPECIAL])
    cut = parse_reply(f"{LFM2_START}[special_function(arg1=", params, partial=True)
    assert [(c.name, c.arguments) for c in cut.tool_calls] == [("special_function", '{"arg1": ')]
    # test-chat.cpp's thinking cases (LFM2.5-8B-A1B, the LFM2 template that thinks)
    _check(params, f"<think>I'm\nthinking</think>{LFM2_START}[special_function(arg1=1)]{LFM2_END}", "", THINKING, CALL)
    _check(params, f"<think>Let me think about {LFM2_START}[special_function(arg1=1)]{LFM2_END} hmm</think>"
                   f"{LFM2_START}[special_function(arg1=1)]{LFM2_END}", "",
           f"Let me think about {LFM2_START}[special_function(arg1=1)]{LFM2_END} hmm", CALL)
    time = apply_chat_template(_template("LFM2.5-8B-A1B.jinja"), USER, tools=[GET_TIME])
    _check(time, f'<think>I need to call a function</think>Let me check the time.{LFM2_START}[get_time(city="Paris")]'
                 f"{LFM2_END}", "Let me check the time.", "I need to call a function",
           [("get_time", '{"city": "Paris"}')])
    plain = apply_chat_template(_template("LFM2.5-8B-A1B.jinja"), USER)
    _check(plain, "<think>I'm\nthinking</think>" + HELLO, HELLO, THINKING, [])


@pytest.mark.parametrize("template", LFM2_TEMPLATES)
def test_lfm2_templates_render_tools_and_calls(template: str) -> None:
    round_trip = [{"role": "user", "content": "Time in Paris?"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "10:00"}]
    p = apply_chat_template(_template(template), round_trip, tools=[GET_TIME])
    assert p.format == ToolFormat.LFM2 and json.dumps(GET_TIME) in p.prompt
    # the earlier call in the model's own format (written by the template, or for it when it cannot)
    assert re.search(r"<\|tool_call_start\|>\[get_time\(city=(\"Paris\"|'Paris')\)\]<\|tool_call_end\|>", p.prompt)
    assert "10:00" in p.prompt and p.prompt.endswith("<|im_start|>assistant\n")
    assert p.grammar_triggers[0].value == LFM2_START and LFM2_START in p.preserved_tokens


def test_lfm2_grammars() -> None:
    tpl = _template("LFM2-8B-A1B.jinja")
    lazy = apply_chat_template(tpl, USER, tools=[GET_TIME, CONFIG, CALENDAR])
    assert lazy.grammar_lazy
    for ok in (f'{LFM2_START}[get_time(city="Paris")]{LFM2_END}', f"{LFM2_START}[get_time(city='Paris')]{LFM2_END}",
               f'{LFM2_START}[set_config(config={{"a": [1, True, None]}}), get_time(city="x")]{LFM2_END}',
               f'{LFM2_START}[Calendar.create_event(title="t", participants=["A"], metadata={{}})]{LFM2_END}'):
        assert _accepts(lazy.grammar, ok), ok
    for bad in (f"{LFM2_START}[get_time(city=Paris)]{LFM2_END}",  # a string parameter takes a quoted string
                f'{LFM2_START}[get_date(city="Paris")]{LFM2_END}', '[get_time(city="Paris")]'):
        assert not _accepts(lazy.grammar, bad), bad
    required = apply_chat_template(tpl, USER, tools=[GET_TIME], tool_choice="required", parallel_tool_calls=False)
    assert not required.grammar_lazy
    assert _accepts(required.grammar, f'Checking.{LFM2_START}[get_time(city="Paris")]{LFM2_END}')
    assert not _accepts(required.grammar, "Checking.")
    assert not _accepts(required.grammar, f'{LFM2_START}[get_time(city="a"), get_time(city="b")]{LFM2_END}')


# ---------------------------------------------------------------------------------------------- tagged formats

DS_CALL = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function\n```json\n"
           '{"arg1": 1}```<｜tool▁call▁end｜><｜tool▁calls▁end｜>')

TAGGED_CASES = [  # (template, reply, tools, extra kwargs, content, reasoning, calls): test-chat.cpp's cases
    ("meetkai-functionary-medium-v3.1.jinja", HELLO, [], {}, HELLO, "", []),
    ("meetkai-functionary-medium-v3.1.jinja", '<function=special_function>{"arg1": 1}</function>', [SPECIAL], {},
     "", "", CALL),
    ("meetkai-functionary-medium-v3.2.jinja", "all\n" + HELLO, [], {}, HELLO, "", []),
    ("meetkai-functionary-medium-v3.2.jinja", "all\n" + HELLO, [SPECIAL], {}, HELLO, "", []),
    ("meetkai-functionary-medium-v3.2.jinja", 'special_function\n{"arg1": 1}', [SPECIAL], {}, "", "", CALL),
    ("fireworks-ai-llama-3-firefunction-v2.jinja", HELLO, [SPECIAL], {}, HELLO, "", []),
    ("fireworks-ai-llama-3-firefunction-v2.jinja", ' functools[{"name": "special_function", "arguments": {"arg1": 1}}]',
     [SPECIAL], {}, "", "", CALL),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "I'm\nthinking</think>" + HELLO, [], {"enable_thinking": True},
     HELLO, THINKING, []),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "</think>" + HELLO, [], {"enable_thinking": True}, HELLO, "",
     []),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", DS_CALL, [SPECIAL], {"enable_thinking": False}, "", "", CALL),
    ("llama-cpp-deepseek-r1.jinja", "</think>" + DS_CALL, [SPECIAL], {"parallel_tool_calls": True}, "", "", CALL),
    ("llama-cpp-deepseek-r1.jinja", "I'm\nthinking</think>" + HELLO, [], {}, HELLO, THINKING, []),
    ("ibm-granite-granite-3.3-2B-Instruct.jinja", "<think>I'm\nthinking</think>" + HELLO, [],
     {"reasoning_format": "deepseek"}, HELLO, THINKING, []),
    ("ibm-granite-granite-3.3-2B-Instruct.jinja",
     '<|tool_call|>[{"name": "special_function", "arguments": {"arg1": 1}}]', [SPECIAL], {}, "", "", CALL),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja",
     '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "123456789"}]', [SPECIAL], {}, "", "",
     CALL),
    ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", "[THINK]I'm\nthinking[/THINK]" + HELLO, [],
     {"reasoning_format": "none"}, "[THINK]I'm\nthinking[/THINK]" + HELLO, "", []),
    ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", "[THINK]I'm\nthinking[/THINK]" + HELLO, [], {}, HELLO,
     THINKING, []),
    ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", '[TOOL_CALLS]special_function[ARGS]{"arg1":1}', [SPECIAL], {},
     "", "", [("special_function", '{"arg1":1}')]),
    ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", "[THINK]I'm\nthinking[/THINK]"
     '[TOOL_CALLS]special_function[ARGS]{"arg1":1}', [SPECIAL], {}, "", THINKING, [("special_function", '{"arg1":1}')]),
    ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}'
     '[TOOL_CALLS]special_function_with_opt[ARGS]{"arg1": 1, "arg2": 2}', [SPECIAL, WITH_OPT],
     {"parallel_tool_calls": True}, "", "", [*CALL, ("special_function_with_opt", '{"arg1": 1, "arg2": 2}')]),
    ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", '[THINK]Let me think about [TOOL_CALLS]special_function[ARGS]'
     '{"arg1":1} and more[/THINK][TOOL_CALLS]special_function[ARGS]{"arg1": 1}', [SPECIAL], {}, "",
     'Let me think about [TOOL_CALLS]special_function[ARGS]{"arg1":1} and more', CALL),
    ("Mistral-Small-3.2-24B-Instruct-2506.jinja", '[TOOL_CALLS]special_function[CALL_ID]000000001[ARGS]{"arg1": 1}'
     '[TOOL_CALLS]special_function_with_opt[CALL_ID]000000002[ARGS]{"arg1": 1, "arg2": 2}', [SPECIAL, WITH_OPT],
     {"parallel_tool_calls": True}, "", "", [*CALL, ("special_function_with_opt", '{"arg1": 1, "arg2": 2}')]),
    ("unsloth-mistral-Devstral-Small-2507.jinja", '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}', [SPECIAL], {},
     "", "", CALL),
    ("unsloth-mistral-Devstral-Small-2507.jinja", HELLO + '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}', [SPECIAL],
     {}, HELLO, "", CALL),
]


@pytest.mark.parametrize("template, text, tools, extra, content, reasoning, calls", TAGGED_CASES)
def test_tagged_formats_replies(template: str, text: str, tools: list, extra: dict[str, Any], content: str,
                                reasoning: str, calls: list[tuple[str, str]]) -> None:
    params = apply_chat_template(_template(template), USER, tools=tools, **extra)
    _check(params, text, content, reasoning, calls)


def test_mistral_call_ids_are_the_models() -> None:
    params = apply_chat_template(_template("Mistral-Small-3.2-24B-Instruct-2506.jinja"), USER, tools=[SPECIAL])
    reply = parse_reply('[TOOL_CALLS]special_function[CALL_ID]123456789[ARGS]{"arg1": 1}', params)
    assert [(c.name, c.id) for c in reply.tool_calls] == [("special_function", "123456789")]
    assert _accepts(params.grammar, '[TOOL_CALLS]special_function[CALL_ID]a1b2c3d4e[ARGS]{"arg1": 1}')


@pytest.mark.parametrize("template, fmt, call", [
    ("meetkai-functionary-medium-v3.1.jinja", ToolFormat.FUNCTIONARY_V31, '<function=get_weather>{"city": "Paris"}'
                                                                          "</function>"),
    ("meetkai-functionary-medium-v3.2.jinja", ToolFormat.FUNCTIONARY_V32, '>>>get_weather\n{"city": "Paris"}'),
    ("fireworks-ai-llama-3-firefunction-v2.jinja", ToolFormat.FIREFUNCTION, ""),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", ToolFormat.DEEPSEEK_R1,
     "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"),
    ("ibm-granite-granite-3.3-2B-Instruct.jinja", ToolFormat.GRANITE, '<|tool_call|>[{"name": "get_weather", '
                                                                      '"arguments": {"city": "Paris"}}]'),
    ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", ToolFormat.MISTRAL_ARGS,
     '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'),
    ("unsloth-mistral-Devstral-Small-2507.jinja", ToolFormat.MISTRAL_ARGS, '[TOOL_CALLS]get_weather[ARGS]{"city": '
                                                                           '"Paris"}'),
])
def test_tagged_templates_render_tools_and_calls(template: str, fmt: ToolFormat, call: str) -> None:
    weather = _tool("get_weather", {"city": STR}, ["city"])
    round_trip = [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": None,
                                                                     "tool_calls": [{
        "id": "call12345", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "rain, 12 C"}]
    p = apply_chat_template(_template(template), round_trip, tools=[weather])
    assert p.format == fmt and p.prompt.count("get_weather") >= 2  # the tool, and the call
    assert call in p.prompt and "rain, 12 C" in p.prompt
    assert _accepts(p.grammar, {
        ToolFormat.FUNCTIONARY_V31: '<function=get_weather>{"city": "Rome"}</function>',
        ToolFormat.FUNCTIONARY_V32: '>>>get_weather\n{"city": "Rome"}',
        ToolFormat.FIREFUNCTION: ' functools[{"name": "get_weather", "arguments": {"city": "Rome"}}]',
        ToolFormat.DEEPSEEK_R1: "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather"
                                '\n```json\n{"city": "Rome"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        ToolFormat.GRANITE: '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Rome"}}]',
        ToolFormat.MISTRAL_ARGS: '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}',
    }[fmt])
    assert p.grammar_lazy and p.grammar_triggers


def test_tagged_grammars_reject_bad_calls() -> None:
    v31 = apply_chat_template(_template("meetkai-functionary-medium-v3.1.jinja"), USER, tools=[SPECIAL],
                              tool_choice="required", parallel_tool_calls=False)
    assert not v31.grammar_lazy and _accepts(v31.grammar, '<function=special_function>{"arg1": 2}</function>')
    assert not _accepts(v31.grammar, '<function=special_function>{"arg1": "2"}</function>')
    assert not _accepts(v31.grammar, "Just words.")
    v32 = apply_chat_template(_template("meetkai-functionary-medium-v3.2.jinja"), USER, tools=[SPECIAL],
                              tool_choice="required")
    assert _accepts(v32.grammar, 'special_function\n{"arg1": 2}>>>special_function\n{"arg1": 3}')
    assert not _accepts(v32.grammar, "all\nJust words.")
    lazy32 = apply_chat_template(_template("meetkai-functionary-medium-v3.2.jinja"), USER, tools=[SPECIAL])
    assert re.search(lazy32.grammar_triggers[0].value, "all\nLet me see.>>>special") is not None
    assert re.search(lazy32.grammar_triggers[0].value, "all\nok") is None
    ds = apply_chat_template(_template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"), USER, tools=[SPECIAL],
                             tool_choice="required", enable_thinking=True)
    assert ds.thinking_forced_open and _accepts(ds.grammar, "hm</think>" + DS_CALL)
    assert not _accepts(ds.grammar, "hm</think>" + DS_CALL.replace('{"arg1": 1}', '{"arg2": 1}'))
    mi = apply_chat_template(_template("mistralai-Ministral-3-14B-Reasoning-2512.jinja"), USER, tools=[SPECIAL],
                             tool_choice="required")
    assert _accepts(mi.grammar, '[THINK]hm[/THINK][TOOL_CALLS]special_function[ARGS]{"arg1": 1}')
    assert not _accepts(mi.grammar, '[TOOL_CALLS]other[ARGS]{"arg1": 1}')


def test_granite4_hermes_calls_and_llama31_json_schema_replies() -> None:
    granite = apply_chat_template(_template("ibm-granite-granite-4.0.jinja"), USER, tools=[SPECIAL])
    assert granite.format == ToolFormat.HERMES and '"special_function"' in granite.prompt
    _check(granite, '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>', "", "", CALL)
    _check(granite, HELLO, HELLO, "", [])
    llama = apply_chat_template(_template("meta-llama-Llama-3.1-8B-Instruct.jinja"), USER, tools=[SPECIAL])
    assert llama.format == ToolFormat.LLAMA3
    _check(llama, HELLO, HELLO, "", [])
    build_response_format_grammar(llama, {"const": "42"})  # test-chat.cpp's const schema, with the tools
    for reply in ('```json\n"42"\n```', '"42"\n'):
        assert _accepts(llama.grammar, reply)
        _check(llama, reply, '"42"', "", [])
    assert not _accepts(llama.grammar, '"43"')


def test_json_schema_after_optional_mistral_reasoning() -> None:
    invoice = {"type": "object", "properties": {"amount": {"type": "number"}, "date": {"type": "string"}}}
    params = apply_chat_template(_template("mistralai-Ministral-3-14B-Reasoning-2512.jinja"), USER, tools=[SPECIAL])
    build_response_format_grammar(params, invoice)
    text = ('[THINK]I need to output the invoice details in JSON[/THINK]```json\n{"amount": 123.45, "date": '
            '"2025-12-03"}\n```')  # test-chat.cpp's Ministral 3 structured output
    assert _accepts(params.grammar, text) and _accepts(params.grammar, '{"amount": 1}')
    assert not _accepts(params.grammar, "[THINK]no end" + '{"amount": 1}')
    _check(params, text, '{"amount": 123.45, "date": "2025-12-03"}', "I need to output the invoice details in JSON", [])
