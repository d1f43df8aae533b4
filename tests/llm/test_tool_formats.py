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
    for step in (1, 2, 3, 5, 8, 13, len(text)):  # a stream cut in pieces of every size adds up to the same
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
