"""llm/tool_calls.py without a model: chat templates rendered with tools, the tool-call grammars (checked
with pyggml's grammar engine on strings written here), and the reply parsers of every format, whole and
streamed in pieces of every size (the deltas must add up to the whole reply)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from helpers.chat_model import CHAT_TEMPLATE
from helpers.tool_stream import streamed
from helpers.tool_templates import HERMES_THINKING, LLAMA3, MISTRAL
from pyggml.llm.chat import ChatTemplate
from pyggml.llm.grammar import LlamaGrammar
from pyggml.llm.tool_calls import (
    ChatParams,
    StreamParser,
    ToolCallError,
    ToolFormat,
    apply_chat_template,
    build_response_format_grammar,
    detect_format,
    parse_reply,
    template_caps,
)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
    "required": ["zone"], "additionalProperties": False}}}
USER = [{"role": "user", "content": "Weather in Paris?"}]
ROUND_TRIP = [
    *USER,
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_7", "content": "rain, 12 C"}]


CASES = [  # (format, reply, content, reasoning, [(name, arguments)], extra ChatParams fields)
    (ToolFormat.HERMES, 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par\\u00eds"}}\n'
     '</tool_call>\n<tool_call>{"arguments": {"zone": 1}, "name": "get_time"}</tool_call>', "Let me look.", "",
     [("get_weather", '{"city": "Par\\u00eds"}'), ("get_time", '{"zone": 1}')], {}),
    (ToolFormat.HERMES, "a < b, <tool isn't a tag", "a < b, <tool isn't a tag", "", [], {}),
    (ToolFormat.HERMES, '<think>\nfirst, the city\n</think>\n\n<tool_call>{"name": "get_time", "arguments": {}}'
     '</tool_call>', "", "first, the city", [("get_time", "{}")], {}),
    (ToolFormat.HERMES, '<tool_call>{"name": "f", "arguments": {"q": [1, {"z": "}\\""}]}}</tool_call> trailing',
     "trailing", "", [("f", '{"q": [1, {"z": "}\\""}]}')], {}),
    (ToolFormat.HERMES, '{"name": "get_weather", "arguments": {"city": "Oslo"}}', "", "",
     [("get_weather", '{"city": "Oslo"}')], {"tool_names": ["get_weather"]}),
    (ToolFormat.HERMES, '{"name": "not_a_tool", "arguments": {}}', '{"name": "not_a_tool", "arguments": {}}', "",
     [], {"tool_names": ["get_weather"]}),
    (ToolFormat.GENERIC, '{"tool_call": {"name": "get_weather", "arguments": {"city": "Rome", "unit": "C"}}}', "",
     "", [("get_weather", '{"city": "Rome", "unit": "C"}')], {}),
    (ToolFormat.GENERIC, '{"tool_calls": [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]}',
     "", "", [("a", '{"x": 1}'), ("b", "{}")], {}),
    (ToolFormat.GENERIC, '{"response": "He said \\"hi\\" \\ud83d\\ude00\\n"}', 'He said "hi" \U0001f600\n', "", [], {}),
    (ToolFormat.GENERIC, "not JSON at all", "not JSON at all", "", [], {}),
    (ToolFormat.GENERIC, '{"weather": "sunny"}', '{"weather": "sunny"}', "", [], {}),
    (ToolFormat.LLAMA3, '{"type": "function", "name": "get_time", "parameters": {"zone": 2}}', "", "",
     [("get_time", '{"zone": 2}')], {}),
    (ToolFormat.LLAMA3, '<|python_tag|>{"name": "a", "parameters": {"v": null}}; {"name": "b", "parameters": {}}',
     "", "", [("a", '{"v": null}'), ("b", "{}")], {}),
    (ToolFormat.LLAMA3, "It is sunny.", "It is sunny.", "", [], {}),
    (ToolFormat.MISTRAL, 'Sure. [TOOL_CALLS][{"name": "a", "arguments": {"k": "v"}, "id": "abcdefghi"}, '
     '{"name": "b", "arguments": {}}]', "Sure.", "", [("a", '{"k": "v"}'), ("b", "{}")], {}),
    (ToolFormat.CONTENT_ONLY, "<think> weighing it\n</think>\nThe answer.", "The answer.", "weighing it", [], {}),
    (ToolFormat.CONTENT_ONLY, "already thinking</think>Done", "Done", "already thinking", [],
     {"thinking_forced_open": True}),
    (ToolFormat.CONTENT_ONLY, "<thinking is not a tag", "<thinking is not a tag", "", [], {}),
    (ToolFormat.JSON, ' ```json\n{"a": [1, 2]}\n``` ', '{"a": [1, 2]}', "", [], {}),
    (ToolFormat.JSON, '\n{"a": "`"}\n', '{"a": "`"}', "", [], {}),
]


@pytest.mark.parametrize("fmt, text, content, reasoning, calls, extra", CASES,
                         ids=[f"{c[0].value}-{i}" for i, c in enumerate(CASES)])
def test_parse_reply_whole_and_streamed(fmt: ToolFormat, text: str, content: str, reasoning: str,
                                        calls: list[tuple[str, str]], extra: dict[str, Any]) -> None:
    params = ChatParams(prompt="", format=fmt, parse=True, **extra)
    reply = parse_reply(text, params)
    assert (reply.content, reply.reasoning_content) == (content, reasoning)
    assert [(c.name, c.arguments) for c in reply.tool_calls] == calls
    for c in reply.tool_calls:
        json.loads(c.arguments)
        assert len(c.id) >= 9
    for step in range(1, len(text) + 1, 3):  # a model's output split across stream chunks of every size
        got = streamed(params, text, step)
        assert (got["content"], got["reasoning"], got["calls"]) == (content, reasoning, calls), step


def test_stream_holds_back_what_may_still_change_and_reads_a_truncated_call() -> None:
    params = ChatParams(prompt="", format=ToolFormat.HERMES, parse=True)
    sp = StreamParser(params)
    assert sp.feed("Checking  ") == [{"content": "Checking"}]  # trailing blanks may come before a call
    assert sp.feed("<tool_") == []  # may be the start of a tag
    assert sp.feed('call>{"name": "get_weather"') == []  # the name's end is not known yet
    first = sp.feed(', "arguments": {"ci')
    assert first[0]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}
    assert first[1]["tool_calls"][0]["function"] == {"arguments": '{"ci'}
    reply, _ = sp.finish(truncated=True)  # cut by max_tokens: the call as far as it went
    assert reply.tool_calls[0].arguments == '{"ci' and reply.content == "Checking"
    cut = parse_reply('Checking <tool_call>{"name": "get_weather", "arguments": {"ci', params, partial=True)
    assert [(c.name, c.arguments) for c in cut.tool_calls] == [("get_weather", '{"ci')]


def test_template_caps_and_format_detection() -> None:
    tiny = ChatTemplate(CHAT_TEMPLATE)
    caps = template_caps(tiny)
    assert not caps.supports_tools and not caps.supports_tool_calls and not caps.supports_thinking
    assert detect_format(tiny) == ToolFormat.GENERIC
    hermes = ChatTemplate(HERMES_THINKING)
    caps = template_caps(hermes)
    assert caps.supports_tools and caps.supports_tool_calls and caps.supports_tool_responses and caps.supports_thinking
    assert detect_format(hermes) == ToolFormat.HERMES
    assert detect_format(ChatTemplate(LLAMA3)) == ToolFormat.LLAMA3
    assert detect_format(ChatTemplate(MISTRAL)) == ToolFormat.MISTRAL


def _accepts(grammar: str, text: str) -> bool:
    return LlamaGrammar.from_text(grammar).validate(text)[0]


def test_hermes_prompt_and_grammar() -> None:
    tpl = ChatTemplate(HERMES_THINKING)
    p = apply_chat_template(tpl, ROUND_TRIP, tools=[WEATHER, TIME])
    # the tools, the earlier call (arguments as an object) and its result, in the template's own format
    assert json.dumps(WEATHER) in p.prompt
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in p.prompt
    assert "<tool_response>\nrain, 12 C\n</tool_response>" in p.prompt
    assert p.format == ToolFormat.HERMES and p.grammar_lazy and p.parallel_tool_calls
    assert p.grammar_triggers[0].value == "<tool_call>"
    good = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "unit": "F"}}\n</tool_call>'
    assert _accepts(p.grammar, good) and _accepts(p.grammar, good + "\n" + good)
    assert _accepts(p.grammar, '{"name": "get_time", "arguments": {"zone": -3}}')  # the bare call small models write
    for bad in ('<tool_call>{"name": "get_weather", "arguments": {"unit": "C"}}</tool_call>',  # city is required
                '<tool_call>{"name": "get_time", "arguments": {"zone": 15}}</tool_call>',  # above the maximum
                '<tool_call>{"name": "other", "arguments": {}}</tool_call>'):
        assert not _accepts(p.grammar, bad), bad
    # "required" forces a tagged call from the first token; a named function allows only that one
    req = apply_chat_template(tpl, USER, tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False)
    assert not req.grammar_lazy and not _accepts(req.grammar, '{"name": "get_time", "arguments": {"zone": 1}}')
    assert not _accepts(req.grammar, good + good)
    named = apply_chat_template(tpl, USER, tools=[WEATHER, TIME],
                                tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert not named.grammar_lazy and named.tool_names == ["get_time"]
    assert _accepts(named.grammar, '<tool_call>{"name": "get_time", "arguments": {"zone": 0}}</tool_call>')
    assert not _accepts(named.grammar, good)
    # tool_choice "none": the template still lists the tools, but nothing constrains or parses the reply
    none = apply_chat_template(tpl, USER, tools=[WEATHER], tool_choice="none")
    assert none.grammar is None and json.dumps(WEATHER) in none.prompt and none.format == ToolFormat.CONTENT_ONLY


def test_generic_prompt_and_grammar() -> None:
    tpl = ChatTemplate(CHAT_TEMPLATE)  # no tools in the template: the generic JSON format
    p = apply_chat_template(tpl, ROUND_TRIP, tools=[WEATHER])
    assert p.prompt.startswith("<|im_start|>system\nYou can call any of the following tools")
    assert '"get_weather"' in p.prompt and "`tool_call`" in p.prompt
    # the earlier call as the JSON the model is asked to write
    assert '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}, "id": "call_7"}}' in p.prompt
    assert p.format == ToolFormat.GENERIC and not p.grammar_lazy and not p.parallel_tool_calls
    assert _accepts(p.grammar, '{"tool_call": {"name": "get_weather", "arguments": {"city": "Rome"}}}')
    assert _accepts(p.grammar, '{"response": "It rains."}')
    assert not _accepts(p.grammar, "It rains.")
    req = apply_chat_template(tpl, USER, tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=True)
    assert not _accepts(req.grammar, '{"response": "It rains."}')
    assert _accepts(req.grammar, '{"tool_calls": [{"name": "get_time", "arguments": {"zone": 3}}, '
                                 '{"name": "get_weather", "arguments": {"city": "Rome"}}]}')


def test_llama3_and_mistral_grammars() -> None:
    p = apply_chat_template(ChatTemplate(LLAMA3), USER, tools=[WEATHER, TIME], tool_choice="required")
    assert _accepts(p.grammar, '{"name": "get_time", "parameters": {"zone": 5}}')  # as Llama 3.1's template asks
    assert not _accepts(p.grammar, '{"name": "get_time", "arguments": {"zone": 5}}')
    lazy = apply_chat_template(ChatTemplate(LLAMA3), USER, tools=[WEATHER])
    assert lazy.grammar_lazy and lazy.grammar_triggers[0].kind == "pattern_full"
    m = apply_chat_template(ChatTemplate(MISTRAL), USER, tools=[WEATHER, TIME])
    assert m.grammar_lazy and m.preserved_tokens == ["[TOOL_CALLS]"] and '[AVAILABLE_TOOLS]' in m.prompt
    assert _accepts(m.grammar, '[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": 1}}, '
                               '{"name": "get_weather", "arguments": {"city": "Rome"}}]')


def test_thinking_template_kwargs_and_reasoning_formats() -> None:
    tpl = ChatTemplate(HERMES_THINKING)
    off = apply_chat_template(tpl, USER)
    on = apply_chat_template(tpl, USER, chat_template_kwargs={"enable_thinking": True})
    assert not off.prompt.endswith("<think>\n") and on.prompt.endswith("<think>\n")
    assert on.thinking_forced_open and on.reasoning_format == "deepseek" and on.parse
    reply = parse_reply("let me see</think>\n\nIt is 4.", on)
    assert (reply.reasoning_content, reply.content) == ("let me see", "It is 4.")
    raw = apply_chat_template(tpl, USER, reasoning_format="none", chat_template_kwargs={"enable_thinking": True})
    assert parse_reply("let me see</think>It is 4.", raw).content == "let me see</think>It is 4."
    plain = apply_chat_template(ChatTemplate(CHAT_TEMPLATE), USER)  # a template that does not think
    assert plain.reasoning_format == "none" and not plain.parse


def test_required_calls_may_follow_a_thinking_models_reasoning() -> None:
    tpl = ChatTemplate(HERMES_THINKING)
    call = '<tool_call>{"name": "get_time", "arguments": {"zone": 2}}</tool_call>'
    forced = apply_chat_template(tpl, USER, tools=[TIME], tool_choice="required",
                                 chat_template_kwargs={"enable_thinking": True})
    assert forced.thinking_forced_open and not forced.grammar_lazy
    assert _accepts(forced.grammar, "Paris is UTC+1, <so> 2 in summer.</think>\n" + call)
    assert not _accepts(forced.grammar, call) and not _accepts(forced.grammar, "no end of thinking " + call)
    reply = parse_reply("UTC+2 in summer</think>\n" + call, forced)
    assert reply.reasoning_content == "UTC+2 in summer" and reply.tool_calls[0].name == "get_time"
    optional = apply_chat_template(tpl, USER, tools=[TIME], tool_choice="required")  # may open <think> itself
    assert _accepts(optional.grammar, call) and _accepts(optional.grammar, "<think>hm</think>" + call)
    assert not _accepts(optional.grammar, "hm</think>" + call)
    plain = apply_chat_template(tpl, USER, tools=[TIME], tool_choice="required", reasoning_format="none")
    assert not _accepts(plain.grammar, "<think>hm</think>" + call)


def test_response_format_grammar_takes_a_json_block_or_bare_json() -> None:
    p = ChatParams(prompt="")
    build_response_format_grammar(p, {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    for ok in ('{"n": 1}', ' ```json\n{"n": 2}\n```', '\n\n{"n": 3} '):
        assert _accepts(p.grammar, ok), ok
        assert json.loads(parse_reply(ok, p).content)["n"] in (1, 2, 3)
    assert not _accepts(p.grammar, '{"n": "x"}') and not _accepts(p.grammar, 'text {"n": 1}')
    thinking = apply_chat_template(ChatTemplate(HERMES_THINKING), USER, chat_template_kwargs={"enable_thinking": True})
    build_response_format_grammar(thinking, {"type": "object"})
    assert _accepts(thinking.grammar, 'an object will do</think>\n{"k": 1}')
    assert parse_reply('an object will do</think>\n{"k": 1}', thinking).content == '{"k": 1}'


@pytest.mark.parametrize("tools, choice, message", [
    ([WEATHER], "sometimes", "Invalid tool_choice: sometimes"),
    ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "'nope', which is not among the tools"),
    ([], "required", "no tools are given"),
    ([{"type": "function", "function": {"description": "no name"}}], "auto", "non-empty string 'name'"),
    ([WEATHER, WEATHER], "auto", "given twice"),
    ([{"type": "code_interpreter"}], "auto", "must be {\"type\": \"function\""),
])
def test_bad_tools_and_tool_choice_are_refused(tools: list, choice: Any, message: str) -> None:
    with pytest.raises(ToolCallError, match=message.replace("(", r"\(").replace("{", r"\{")):
        apply_chat_template(ChatTemplate(CHAT_TEMPLATE), USER, tools=tools, tool_choice=choice)
