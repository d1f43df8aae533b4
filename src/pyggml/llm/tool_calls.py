"""Tool calls and reasoning in chat: the prompt, the grammar and the parsing of the reply.

This is what llama-server's jinja path does around a chat template (common/chat.cpp), rewritten for
the formats of the models pyggml runs:

* :func:`apply_chat_template` renders the messages with the template, handing it ``tools`` (and any
  ``chat_template_kwargs`` such as ``enable_thinking``), and returns a :class:`ChatParams`: the prompt,
  the tool-call format the template's model writes, and the grammar that makes the model's calls fit
  the tools' parameter schemas (lazy, with its trigger, when ``tool_choice`` is "auto"; from the first
  token when it is "required" or names a function).
* :func:`parse_reply` splits a model's text into ``reasoning_content`` (``<think>...</think>``),
  ``content`` and ``tool_calls``; :class:`StreamParser` does the same on a reply that arrives piece by
  piece, giving OpenAI's ``delta`` objects (``delta.tool_calls`` with index, id, name and pieces of the
  arguments), whose concatenation is exactly what :func:`parse_reply` returns for the whole text.

Formats (:class:`ToolFormat`):

* ``hermes`` (Qwen2.5, Hermes 2 Pro, Qwen3): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  one block per call; content may come before the first block.
* ``llama3`` (Llama 3.1/3.2/3.3): the reply is ``{"name": ..., "parameters": {...}}`` (optionally with
  ``"type": "function"`` first, or after ``<|python_tag|>``), several separated by ``;``.
* ``mistral`` (Mistral Nemo, Small): ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}]``.
* ``qwen3-coder`` (Qwen3-Coder, Qwen3.5, Nemotron 3 Nano; llm/qwen3_xml.py): ``<tool_call>\n<function=NAME>\n
  <parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>``, values typed by the parameters' schemas.
* ``lfm2`` (LFM2, LFM2.5; llm/lfm2_calls.py): ``<|tool_call_start|>[name(key="value", n=1)]<|tool_call_end|>``,
  Python literals as values.
* ``gpt-oss`` (GPT-OSS's harmony, llm/harmony.py): ``<|channel|>analysis<|message|>...<|end|>`` reasoning,
  ``<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}`` calls,
  ``<|channel|>final<|message|>...`` content; parsed in every reply, tools or not.
* ``generic`` (any template that cannot show tools): the tools are described in the system turn and
  the reply is one JSON object, ``{"tool_call": {"name", "arguments"}}`` (``{"tool_calls": [...]}``
  with parallel calls) or ``{"response": "text"}``; the grammar forces that shape from the first token.
  Assistant tool calls and tool results are written back in the same JSON when the template cannot
  render them itself.

A call's ``arguments`` is the JSON text the model wrote for them (a slice of the reply, so a stream's
pieces add up to it); when the model wrote them as a JSON string, the string's value.

Usage::

    params = apply_chat_template(template, messages, tools=tools, tool_choice="required")
    ...generate from params.prompt with GrammarSampler(vocab, params.grammar, lazy=params.grammar_lazy,
                                                        triggers=params.grammar_triggers)...
    msg = parse_reply(text, params)          # msg.content, msg.reasoning_content, msg.tool_calls
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import json
import re
import secrets
import string
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from . import harmony, lfm2_calls, qwen3_xml, tagged_calls
from .grammar.json_schema import SchemaConverter, format_literal, schema_document
from .grammar.parser import GrammarError
from .grammar.sampler import GrammarTrigger
from .tool_json import (
    Incomplete,
    Malformed,
    ParseState,
    expect,
    holdback,
    json_end,
    parse_call,
    partial_string,
    skip_ws,
    string_end,
    until_rule,
)


class ToolCallError(ValueError):
    """Tools, tool_choice or messages that cannot be used (the server answers 400 with the message)."""


class ToolFormat(StrEnum):
    CONTENT_ONLY = "content-only"
    GENERIC = "generic"
    HERMES = "hermes"
    LLAMA3 = "llama3"
    MISTRAL = "mistral"
    #: GPT-OSS's harmony channels (llm/harmony.py): every reply is parsed, tools or not
    GPT_OSS = "gpt-oss"
    #: Qwen3-Coder's XML calls (llm/qwen3_xml.py), also Qwen3.5's and Nemotron 3 Nano's
    QWEN3_XML = "qwen3-coder"
    #: LFM2's Python-style calls (llm/lfm2_calls.py)
    LFM2 = "lfm2"
    #: the tagged formats of llm/tagged_calls.py
    FUNCTIONARY_V31 = "functionary-v3.1"
    FUNCTIONARY_V32 = "functionary-v3.2"
    DEEPSEEK_R1 = "deepseek-r1"
    MISTRAL_ARGS = "mistral-args"
    #: a marker then a JSON list of calls, as Mistral Nemo's
    FIREFUNCTION = "firefunction-v2"
    GRANITE = "granite"
    #: a json_schema/response_format reply: the JSON, bare or in a ```json block (content: the JSON alone)
    JSON = "json"


#: llama-server's reasoning_format names ("auto" is "deepseek" here)
REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")
THINK_START, THINK_END = "<think>", "</think>"
#: Ministral 3 / Magistral's reasoning markers
MISTRAL_THINK = ("[THINK]", "[/THINK]")
HERMES_START, HERMES_END = "<tool_call>", "</tool_call>"
MISTRAL_START = "[TOOL_CALLS]"
#: the marker before the JSON list of calls, per format (Nemo's, Firefunction v2's, Granite 3.x's)
LIST_MARKERS = {"mistral": MISTRAL_START, "firefunction-v2": " functools", "granite": "<|tool_call|>"}
#: the tagged formats' markers
TAGGED = {"functionary-v3.1": tagged_calls.FUNCTIONARY_V31, "deepseek-r1": tagged_calls.DEEPSEEK_R1,
          "mistral-args": tagged_calls.MISTRAL_ARGS}
PYTHON_TAG = "<|python_tag|>"
GENERIC_INSTRUCTION = ("Respond in JSON format, either with `tool_call` (a request to call tools) or with "
                       "`response` reply to the user's request")


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text
    id: str = ""

    def to_openai(self) -> dict[str, Any]:
        return {"type": "function", "id": self.id, "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ParsedReply:
    """A model's reply split up (common_chat_msg): what the API returns as the assistant message."""

    content: str = ""
    reasoning_content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's assistant ``message`` (content null when the reply is only tool calls)."""
        msg: dict[str, Any] = {"role": "assistant",
                               "content": None if self.tool_calls and not self.content else self.content}
        if self.reasoning_content:
            msg["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            msg["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        return msg


@dataclass
class TemplateCaps:
    """What a template can render, found by rendering probes (as minja's chat_template_caps)."""

    supports_tools: bool = False
    supports_tool_calls: bool = False
    supports_tool_responses: bool = False
    supports_thinking: bool = False
    #: a call's arguments may be given as an object (else as the JSON text: Functionary v3.2)
    supports_object_arguments: bool = True


@dataclass
class ChatParams:
    """What rendering a chat produced (common_chat_params): the prompt and how to constrain and parse the reply."""

    prompt: str
    format: ToolFormat = ToolFormat.CONTENT_ONLY
    grammar: str | None = None
    grammar_lazy: bool = False
    grammar_triggers: list[GrammarTrigger] = field(default_factory=list)
    #: token texts that must come out as text (llama-server's preserved_tokens: "[TOOL_CALLS]" is a control token)
    preserved_tokens: list[str] = field(default_factory=list)
    reasoning_format: str = "deepseek"
    #: the prompt ends inside ``<think>``: the reply starts with reasoning (Qwen3, DeepSeek R1 templates)
    thinking_forced_open: bool = False
    #: the markers around the reasoning (``[THINK]``/``[/THINK]`` for Ministral 3 and Magistral)
    think_tags: tuple[str, str] = (THINK_START, THINK_END)
    #: the template's model may open a reasoning block itself (a grammar from the first token lets it)
    may_think: bool = False
    #: the reply is parsed (tool calls asked for, or reasoning to split out); otherwise it is all content
    parse: bool = False
    parallel_tool_calls: bool = False
    #: the functions the reply may call (a Hermes reply that is a bare call object must name one of them)
    tool_names: list[str] = field(default_factory=list)
    #: those functions' tools (formats whose parser reads the parameters' schemas: Qwen3-Coder's XML)
    tools: list[dict[str, Any]] = field(default_factory=list)
    #: Qwen3-Coder (no thinking): its first call may come without <tool_call>
    bare_first_call: bool = False


# ---------------------------------------------------------------------------------------------- requests

def tool_call_id() -> str:
    """A random call id as llama-server makes them (the models here do not write their own)."""
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(32))


def check_tools(tools: Any) -> list[dict[str, Any]]:
    """OpenAI's ``tools`` list, checked: each ``{"type": "function", "function": {"name", "parameters"?, ...}}``."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ToolCallError("'tools' must be an array of tools")
    out = []
    names: set[str] = set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise ToolCallError(f"'tools' item {i} must be {{\"type\": \"function\", \"function\": {{...}}}}")
        fn = tool["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise ToolCallError(f"'tools' item {i}: the function needs a non-empty string 'name'")
        if name in names:
            raise ToolCallError(f"'tools' item {i}: the function name {name!r} is given twice")
        names.add(name)
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ToolCallError(f"'tools' item {i}: 'parameters' of {name!r} must be a JSON schema object")
        out.append(tool)
    return out


def check_tool_choice(tool_choice: Any, tools: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """``tool_choice`` as ("auto" | "none" | "required", the tools the reply may call). A named function
    ({"type": "function", "function": {"name": ...}}) is "required" with only that tool."""
    if tool_choice is None:
        return "auto", tools
    if isinstance(tool_choice, str):
        if tool_choice not in ("auto", "none", "required"):
            raise ToolCallError(f"Invalid tool_choice: {tool_choice}")
        if tool_choice == "required" and not tools:
            raise ToolCallError("tool_choice is \"required\" but no tools are given")
        return tool_choice, tools
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function" \
            and isinstance(tool_choice.get("function"), dict):
        name = tool_choice["function"].get("name")
        chosen = [t for t in tools if t["function"]["name"] == name]
        if not chosen:
            raise ToolCallError(f"tool_choice names the function {name!r}, which is not among the tools")
        return "required", chosen
    raise ToolCallError('Invalid tool_choice: expected "auto", "none", "required" or '
                        '{"type": "function", "function": {"name": ...}}')


# ---------------------------------------------------------------------------------------------- rendering

_PROBE_TOOL = {"type": "function", "function": {"name": "pyggml_probe_tool", "description": "probe",
                                                "parameters": {"type": "object", "properties": {}}}}
_PROBE_CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call_pyggml_probe", "type": "function", "function": {"name": "pyggml_probe_call",
                                                                 "arguments": {"arg": "pyggml_probe_arg"}}}]}


def template_caps(template: Any) -> TemplateCaps:
    """Probe what ``template`` renders (cached on the template object: the probes cost a few renders)."""
    cached = getattr(template, "_pyggml_caps", None)
    if cached is not None:
        return cached

    def renders(needle: str, messages: list[dict[str, Any]], **ctx: Any) -> bool:
        try:
            return needle in template.render(messages, add_generation_prompt=False, **ctx)
        except Exception:
            return False

    user = {"role": "user", "content": "hi"}
    call = _PROBE_CALL
    object_args = renders("pyggml_probe_call", [user, call])
    string_args = False
    if not object_args:  # a template that concatenates the arguments' text?
        text_call = copy.deepcopy(_PROBE_CALL)
        fn = text_call["tool_calls"][0]["function"]
        fn["arguments"] = json.dumps(fn["arguments"])
        string_args = renders("pyggml_probe_call", [user, text_call])
        call = text_call if string_args else call
    caps = TemplateCaps(
        supports_tools=renders("pyggml_probe_tool", [user], tools=[_PROBE_TOOL]),
        supports_tool_calls=object_args or string_args,
        supports_tool_responses=renders("pyggml_probe_result", [user, call, {
            "role": "tool", "tool_call_id": "call_pyggml_probe", "name": "pyggml_probe_call",
            "content": "pyggml_probe_result"}]),
        supports_object_arguments=not string_args,
        supports_thinking=THINK_START in (template.source or "") or MISTRAL_THINK[0] in (template.source or "")
        or harmony.is_harmony_template(template.source or ""))
    with contextlib.suppress(AttributeError):
        template._pyggml_caps = caps
    return caps


def detect_format(template: Any) -> ToolFormat:
    """The tool-call format of a template's model, from what its source writes (common/chat.cpp's
    template detection): Hermes ``<tool_call>``, Mistral ``[TOOL_CALLS]``, Llama 3.x ``ipython``;
    anything else (or a template that cannot show tools at all) gets the generic JSON format."""
    src = template.source or ""
    if harmony.is_harmony_template(src):
        return ToolFormat.GPT_OSS
    if tagged_calls.is_functionary_v32(src):
        return ToolFormat.FUNCTIONARY_V32
    if lfm2_calls.is_lfm2_template(src):
        return ToolFormat.LFM2
    tagged = tagged_calls.detect(src)
    if tagged is not None:
        return ToolFormat(next(k for k, v in TAGGED.items() if v is tagged))
    if " functools[" in src:
        return ToolFormat.FIREFUNCTION
    if LIST_MARKERS["granite"] in src:
        return ToolFormat.GRANITE
    caps = template_caps(template)
    if caps.supports_tools or caps.supports_tool_calls:
        if qwen3_xml.is_qwen3_xml_template(src):  # before Hermes: it writes <tool_call> too
            return ToolFormat.QWEN3_XML
        if HERMES_START in src:
            return ToolFormat.HERMES
        if MISTRAL_START in src:
            return ToolFormat.MISTRAL
        if "<|start_header_id|>" in src and ("ipython" in src or PYTHON_TAG in src):
            return ToolFormat.LLAMA3
    return ToolFormat.GENERIC


def _normalize_messages(messages: list[dict[str, Any]], object_arguments: bool = True,
                        developer_role: bool = False) -> list[dict[str, Any]]:
    """llama.cpp's workarounds before rendering: null content becomes "" (templates concatenate it), a
    call's JSON-string arguments become an object (templates write them with ``tojson``) unless the
    template writes the text, and OpenAI's "developer" role is "system" (only GPT-OSS's template,
    ``developer_role``, knows it)."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("role") == "developer" and not developer_role:
            m["role"] = "system"
        if m.get("content") is None:
            m["content"] = ""
        calls = m.get("tool_calls")
        if calls:
            fixed = []
            for c in calls:
                c = copy.deepcopy(c)
                fn = c.get("function", {})
                if isinstance(fn.get("arguments"), str) and object_arguments:
                    with contextlib.suppress(json.JSONDecodeError):  # not JSON: the template gets the text
                        fn["arguments"] = json.loads(fn["arguments"])
                elif not isinstance(fn.get("arguments"), str) and not object_arguments:
                    fn["arguments"] = json.dumps(fn.get("arguments", {}), ensure_ascii=False)
                fixed.append(c)
            m["tool_calls"] = fixed
        out.append(m)
    return out


def _generic_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]], caps: TemplateCaps,
                      parallel: bool, with_tools: bool) -> list[dict[str, Any]]:
    """The polyfills of a template that cannot show tools: the tools and the JSON reply format in the
    system turn, assistant calls and tool results written as the JSON the generic format uses."""
    out: list[dict[str, Any]] = []
    call_names: dict[str, str] = {}
    for m in messages:
        m = dict(m)
        if m["role"] == "assistant" and m.get("tool_calls") and not caps.supports_tool_calls:
            calls = []
            for c in m.pop("tool_calls"):
                fn = c.get("function", {})
                call_names[c.get("id", "")] = fn.get("name", "")
                calls.append({"name": fn.get("name", ""), "arguments": fn.get("arguments", {}),
                              **({"id": c["id"]} if c.get("id") else {})})
            body: dict[str, Any] = {"tool_calls": calls} if parallel or len(calls) > 1 else {"tool_call": calls[0]}
            if m.get("content"):
                body["content"] = m["content"]
            m["content"] = json.dumps(body, ensure_ascii=False)
        elif m["role"] == "tool" and not caps.supports_tool_responses:
            name = m.get("name") or call_names.get(m.get("tool_call_id", ""), "")
            resp: dict[str, Any] = {"tool": name, "content": m.get("content", "")}
            if m.get("tool_call_id"):
                resp["tool_call_id"] = m["tool_call_id"]
            m = {"role": "user", "content": json.dumps({"tool_response": resp}, ensure_ascii=False)}
        out.append(m)
    if with_tools:
        text = ""
        if not caps.supports_tools:
            text = ("You can call any of the following tools to satisfy the user's requests: "
                    + json.dumps(tools, ensure_ascii=False, indent=2) + "\n\n")
        text += GENERIC_INSTRUCTION
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": (out[0].get("content") or "") + "\n\n" + text}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out


def apply_chat_template(template: Any, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
                        tool_choice: Any = "auto", parallel_tool_calls: bool | None = None,
                        reasoning_format: str | None = None, chat_template_kwargs: dict[str, Any] | None = None,
                        add_generation_prompt: bool = True, enable_thinking: bool | None = None) -> ChatParams:
    """Render a chat for generation (common_chat_templates_apply): see the module docstring.

    ``messages`` are OpenAI's (assistant ``tool_calls``, ``tool`` messages with ``tool_call_id``);
    ``reasoning_format`` is llama-server's ("none" leaves ``<think>`` in the content; None: "deepseek"
    when the template thinks, else "none"); ``parallel_tool_calls`` defaults to what the template can
    render; ``enable_thinking``: the template variable's value unless the kwargs set it (llama-server
    sets it, true unless reasoning is off: None leaves it undefined). Raises :class:`ToolCallError` for
    bad tools/tool_choice."""
    if enable_thinking is not None and "enable_thinking" not in (chat_template_kwargs or {}):
        chat_template_kwargs = {**(chat_template_kwargs or {}), "enable_thinking": enable_thinking}
    tools = check_tools(tools)
    choice, allowed = check_tool_choice(tool_choice, tools)
    caps = template_caps(template)
    if reasoning_format is not None and reasoning_format not in REASONING_FORMATS:
        raise ToolCallError(f"Unknown reasoning format: {reasoning_format}")
    if reasoning_format is None:
        reasoning_format = "deepseek" if caps.supports_thinking else "none"
    use_tools = bool(tools) and choice != "none"
    native = detect_format(template)
    if native == ToolFormat.GPT_OSS:  # channels to parse in every reply, tools or not
        return _apply_harmony(template, messages, tools, allowed, choice, use_tools, reasoning_format,
                              chat_template_kwargs, add_generation_prompt)
    # Functionary v3.2's replies always name their recipient first: parsed with tools or not
    fmt = native if use_tools or native == ToolFormat.FUNCTIONARY_V32 else ToolFormat.CONTENT_ONLY
    if parallel_tool_calls is None:
        parallel_tool_calls = fmt not in (ToolFormat.GENERIC, ToolFormat.CONTENT_ONLY)
    msgs = _normalize_messages(messages, caps.supports_object_arguments)
    if native in (ToolFormat.LFM2, ToolFormat.GRANITE):
        msgs = _native_call_messages(msgs, caps, native)
    if native == ToolFormat.MISTRAL_ARGS and "[CALL_ID]" not in (template.source or ""):
        msgs = _ministral_messages(msgs)
    if fmt == ToolFormat.GENERIC or not caps.supports_tool_calls or not caps.supports_tool_responses:
        msgs = _generic_messages(msgs, tools, caps, parallel_tool_calls, with_tools=fmt == ToolFormat.GENERIC)
    if use_tools and not caps.supports_tools and fmt not in (ToolFormat.GENERIC, ToolFormat.FIREFUNCTION):
        msgs = _describe_tools(msgs, tools)  # (DeepSeek R1's template writes calls but not the tools)
    ctx = {**_extra_context(), **(chat_template_kwargs or {})}
    if tools and fmt != ToolFormat.GENERIC:
        ctx["tools"] = tools  # the template shows the tools (even with tool_choice "none", as llama-server)
    if native == ToolFormat.FIREFUNCTION:  # its template reads the tools as JSON text in "functions"
        ctx.setdefault("functions", json.dumps(tools, indent=2, ensure_ascii=False) if tools else "")
    prompt = template.render(msgs, add_generation_prompt=add_generation_prompt, **ctx)
    tags = MISTRAL_THINK if MISTRAL_THINK[0] in (template.source or "") else (THINK_START, THINK_END)
    forced_open = reasoning_format != "none" and prompt.rstrip().endswith(tags[0])
    params = ChatParams(prompt=prompt, format=fmt, reasoning_format=reasoning_format,
                        thinking_forced_open=forced_open, parallel_tool_calls=parallel_tool_calls,
                        parse=use_tools or reasoning_format != "none" or fmt == ToolFormat.FUNCTIONARY_V32,
                        think_tags=tags, may_think=caps.supports_thinking)
    if use_tools:
        params.tool_names = [t["function"]["name"] for t in allowed]
        params.tools = allowed
        params.bare_first_call = fmt == ToolFormat.QWEN3_XML and not caps.supports_thinking
        if fmt == ToolFormat.LFM2:
            params.preserved_tokens = lfm2_calls.preserved_tokens(template.source or "")
        build_tool_grammar(params, allowed, required=choice == "required", may_think=caps.supports_thinking)
    if params.parse and tags == MISTRAL_THINK:  # control tokens: sent as text so that the reasoning parses
        params.preserved_tokens += [t for t in tags if t not in params.preserved_tokens]
    return params


def _describe_tools(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools in the system turn, for a template that cannot show them (minja's polyfill)."""
    text = "You can call any of the following tools to satisfy the user's requests: " + json.dumps(
        tools, ensure_ascii=False, indent=2)
    if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
        return [{**messages[0], "content": messages[0]["content"] + "\n\n" + text}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _extra_context() -> dict[str, str]:
    """The date variables llama.cpp gives every template (common_chat_extra_context)."""
    now = datetime.datetime.now()
    return {"datetime": now.strftime("%b %d %Y"), "date_string": now.strftime("%d %b %Y")}


def _ministral_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ministral 3 / Magistral's templates read system and assistant turns as content blocks, the
    reasoning as a "thinking" block (chat.cpp's ministral_3 handler)."""
    out = []
    for m in messages:
        if m.get("role") in ("system", "assistant"):
            blocks: list[dict[str, Any]] = []
            if isinstance(m.get("reasoning_content"), str):
                blocks.append({"type": "thinking", "thinking": m["reasoning_content"]})
            if isinstance(m.get("content"), str):
                blocks.append({"type": "text", "text": m["content"]})
            m = {k: v for k, v in m.items() if k != "reasoning_content"} | {"content": blocks}
        out.append(m)
    return out


def _native_call_messages(messages: list[dict[str, Any]], caps: TemplateCaps, fmt: ToolFormat) -> list[dict[str, Any]]:
    """Templates that do not show an assistant turn's calls (LFM2's first, Granite 3.x) get them written
    into the content in the model's own format; LFM2's read the reasoning from ``thinking``."""
    out = []
    for m in messages:
        if m.get("role") == "assistant":
            m = dict(m)
            if fmt == ToolFormat.LFM2 and isinstance(m.get("reasoning_content"), str):
                m["thinking"] = m["reasoning_content"]
            if m.get("tool_calls") and not caps.supports_tool_calls:
                calls = m.pop("tool_calls")
                if fmt == ToolFormat.LFM2:
                    text = lfm2_calls.render_calls(calls)
                else:
                    text = LIST_MARKERS[fmt.value] + json.dumps(
                        [{"name": c["function"]["name"], "arguments": c["function"].get("arguments", {})}
                         for c in calls], ensure_ascii=False)
                m["content"] = (m.get("content") or "") + text
        out.append(m)
    return out


def _apply_harmony(template: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                   allowed: list[dict[str, Any]], choice: str, use_tools: bool, reasoning_format: str,
                   chat_template_kwargs: dict[str, Any] | None, add_generation_prompt: bool) -> ChatParams:
    """GPT-OSS (chat.cpp's dedicated handler): the template writes tools, calls, results and reasoning
    itself (``reasoning_effort`` is its kwarg); one call per reply, the channel markers kept as text."""
    msgs = harmony.adjust_messages(_normalize_messages(messages, developer_role=True))
    ctx = dict(chat_template_kwargs or {})
    if tools:
        ctx["tools"] = tools
    prompt = template.render(msgs, add_generation_prompt=add_generation_prompt, **ctx)
    if not add_generation_prompt:
        prompt = harmony.end_for_inference(prompt)
    params = ChatParams(prompt=prompt, format=ToolFormat.GPT_OSS, reasoning_format=reasoning_format, parse=True,
                        preserved_tokens=list(harmony.PRESERVED_TOKENS))
    if use_tools:
        params.tool_names = [t["function"]["name"] for t in allowed]
        build_tool_grammar(params, allowed, required=choice == "required")
    return params


# ---------------------------------------------------------------------------------------------- grammar

def _call_schema(tool: dict[str, Any], args_key: str, typed: bool = False) -> dict[str, Any]:
    fn = tool["function"]
    props: dict[str, Any] = {}
    if typed:
        props["type"] = {"const": "function"}
    props["name"] = {"const": fn["name"]}
    props[args_key] = fn.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def _any_of(schemas: list[dict[str, Any]]) -> dict[str, Any]:
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def build_tool_grammar(params: ChatParams, tools: list[dict[str, Any]], required: bool,
                       may_think: bool = False) -> None:
    """Fill ``params.grammar``/``grammar_lazy``/``grammar_triggers``: the calls' JSON fits the tools'
    parameter schemas; with ``required`` the reply must be calls from its first token, otherwise the
    grammar waits for the format's trigger (the generic format has none: its reply is always JSON).
    A grammar active from the first token lets the reasoning of a thinking model come first: the rest
    of an open ``<think>`` block (``params.thinking_forced_open``), or with ``may_think`` an optional one."""
    conv = SchemaConverter(False)

    def rule(schema: dict[str, Any], name: str) -> str:
        try:
            node = schema_document(schema)
        except GrammarError as e:
            raise ToolCallError(f"a tool's 'parameters' schema cannot be used: {e}") from None
        return conv.visit(node, name)

    fmt, parallel = params.format, params.parallel_tool_calls
    if fmt == ToolFormat.GENERIC:
        calls = _any_of([_call_schema(t, "arguments") for t in tools])
        if parallel:
            call_obj = {"type": "object", "properties": {"tool_calls": {"type": "array", "items": calls,
                                                                       "minItems": 1}},
                        "required": ["tool_calls"], "additionalProperties": False}
        else:
            call_obj = {"type": "object", "properties": {"tool_call": calls}, "required": ["tool_call"],
                        "additionalProperties": False}
        response = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"],
                    "additionalProperties": False}
        body = rule(call_obj if required else {"anyOf": [call_obj, response]}, "tool-reply")
        params.grammar_lazy = False
    elif fmt == ToolFormat.HERMES:
        call = rule(_any_of([_call_schema(t, "arguments") for t in tools]), "tool-call-object")
        conv.add_rule("tool-call", f'{format_literal(HERMES_START)} space {call} space {format_literal(HERMES_END)}')
        calls = "tool-call (space tool-call)*" if parallel else "tool-call"
        params.grammar_lazy = not required
        params.grammar_triggers = [GrammarTrigger("word", HERMES_START)]
        if not required:
            # small Qwen models often write the call without its tags: a reply that opens with a call
            # object naming a tool is held to the schema too (and parsed as a call)
            names = "|".join(re.escape(t["function"]["name"]) for t in tools)
            params.grammar_triggers.append(GrammarTrigger(
                "pattern_full", r'\s*(\{\s*"name"\s*:\s*"(?:' + names + r')")[\s\S]*'))
            calls = f"{calls} | {call}"
        body = calls
        params.preserved_tokens = [HERMES_START, HERMES_END]
    elif fmt == ToolFormat.LLAMA3:
        call = rule(_any_of([_call_schema(t, "parameters") for t in tools]), "tool-call")
        body = f'{call} (";" space {call})*' if parallel else call
        params.grammar_lazy = not required
        # the reply opens with a call object: the grammar starts at its "{"
        params.grammar_triggers = [GrammarTrigger("pattern_full", r'\s*(\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?'
                                                                  r'"name"\s*:)[\s\S]*')]
    elif fmt == ToolFormat.QWEN3_XML:
        body = qwen3_xml.qwen3_xml_grammar(conv, tools, required, parallel, params.bare_first_call, rule)
        params.grammar_lazy = not required
        params.grammar_triggers = [GrammarTrigger("word", qwen3_xml.CALL_START)]
        if params.bare_first_call:
            params.grammar_triggers += [GrammarTrigger("word", f"{qwen3_xml.FUNCTION}{t['function']['name']}>")
                                        for t in tools]
        params.preserved_tokens = [HERMES_START, HERMES_END] + ([] if params.bare_first_call else
                                                                list(params.think_tags))
    elif fmt == ToolFormat.LFM2:
        body = lfm2_calls.lfm2_grammar(conv, tools, required, parallel)
        params.grammar_lazy = not required
        params.grammar_triggers = [GrammarTrigger("word", lfm2_calls.CALL_START)]
    elif fmt == ToolFormat.GPT_OSS:
        body = harmony.harmony_grammar(conv, tools, required, rule)
        params.grammar_lazy = not required
        params.grammar_triggers = list(harmony.TRIGGERS)
    elif fmt.value in LIST_MARKERS:
        marker = LIST_MARKERS[fmt.value]
        call = rule(_any_of([_call_schema(t, "arguments") for t in tools]), "tool-call")
        items = f"{call} (\",\" space {call})*" if parallel else call
        body = f'{format_literal(marker)} "[" space {items} "]"'
        params.grammar_lazy = not required
        params.grammar_triggers = [GrammarTrigger("word", marker + ("[" if fmt == ToolFormat.FIREFUNCTION else ""))]
        params.preserved_tokens = [] if fmt == ToolFormat.FIREFUNCTION else [marker]
    elif fmt.value in TAGGED:
        tagged = TAGGED[fmt.value]
        body = tagged_calls.tagged_grammar(conv, tools, tagged, parallel, rule)
        params.grammar_lazy = not required
        params.grammar_triggers = [GrammarTrigger("word", tagged.trigger)]
        params.preserved_tokens = list(tagged.preserved)
    elif fmt == ToolFormat.FUNCTIONARY_V32:
        body = tagged_calls.functionary_v32_grammar(conv, tools, required, parallel, rule)
        params.grammar_lazy = not required
        params.grammar_triggers = [GrammarTrigger("pattern", ">>>(?!all)")]
        params.preserved_tokens = [">>>all"]
    else:
        return
    if not params.grammar_lazy and params.reasoning_format != "none" and fmt != ToolFormat.GPT_OSS:
        if params.thinking_forced_open:
            think, end = until_rule(conv, "think-body", [params.think_tags[1]]), format_literal(params.think_tags[1])
            body = f'{think} {end} space ({body})'
        elif may_think:
            start, end = (format_literal(t) for t in params.think_tags)
            body = f'({start} {until_rule(conv, "think-body", [params.think_tags[1]])} {end} space)? ({body})'
    conv.add_rule("root", body)
    conv.check_errors(warn=lambda _m: None)
    params.grammar = conv.format_grammar()


def build_response_format_grammar(params: ChatParams, schema: Any) -> None:
    """A chat's json_schema/response_format as llama-server's jinja path constrains it: the JSON may come
    after blanks and inside a ```json block (small models like to write one), and the reply's content
    is the JSON alone (``params.format`` becomes JSON). Raises GrammarError for a schema it cannot take."""
    try:
        node = schema_document(schema)
    except GrammarError as e:
        raise GrammarError(f"JSON schema conversion failed:\n{e}") from None
    conv = SchemaConverter(False)
    body = conv.visit(node, "response-format")
    conv.check_errors(warn=lambda _m: None)
    params.grammar_lazy, params.grammar_triggers = False, []
    params.parse = True
    if params.format == ToolFormat.GPT_OSS:  # the JSON is the final channel's message; tools are not parsed
        conv.add_rule("root", harmony.response_format_grammar(conv, body))
        params.grammar = conv.format_grammar()
        params.tool_names = []
        return
    reply = f'space space ("```json" space {body} space "```" | space {body} space)'
    if params.reasoning_format != "none" and (params.thinking_forced_open or params.may_think):
        think = until_rule(conv, "think-body", [params.think_tags[1]])
        start, end = (format_literal(t) for t in params.think_tags)
        if params.thinking_forced_open:  # the open <think> block ends first
            reply = f'{think} {end} {reply}'
        else:  # the model may reason first (chat.cpp's optional reasoning before the JSON)
            reply = f'( {start} {think} {end} )? {reply}'
    conv.add_rule("root", reply)
    params.grammar = conv.format_grammar()
    params.grammar_lazy = False
    params.format = ToolFormat.JSON
    params.parse = True


# ---------------------------------------------------------------------------------------------- parsing

def _split_reasoning(text: str, params: ChatParams, partial: bool, res: ParseState) -> str:
    """Take ``<think>...</think>`` off the start of the reply into ``res.reasoning``; returns the rest."""
    if params.reasoning_format == "none":
        return text
    start_tag, end_tag = params.think_tags
    start = 0
    if not params.thinking_forced_open:
        lead = skip_ws(text, 0)
        if not text.startswith(start_tag, lead):
            if partial and start_tag.startswith(text[lead:]) and text[lead:]:
                return ""  # may still become "<think>": wait
            return text
        start = lead + len(start_tag)
    end = text.find(end_tag, start)
    # Qwen3.5 and Nemotron may start calling without closing the reasoning: <tool_call> ends it too
    call = text.find(HERMES_START, start) if params.format == ToolFormat.QWEN3_XML else -1
    if call >= 0 and (end < 0 or call < end):
        res.reasoning = text[start:call].strip()
        return text[call:]
    if end < 0:
        body = text[start:]
        if partial:
            keep = holdback(body, end_tag)
            if params.format == ToolFormat.QWEN3_XML:
                keep = max(keep, holdback(body, HERMES_START))
            body = body[:len(body) - keep]
        res.reasoning = body.strip()  # while streaming, trailing blanks wait (they may end the reasoning)
        return ""
    res.reasoning = text[start:end].strip()
    return text[end + len(end_tag):].lstrip()


def _parse(text: str, params: ChatParams, partial: bool) -> ParseState:
    res = ParseState()
    fmt = params.format
    if fmt == ToolFormat.GPT_OSS:
        harmony.parse_harmony(text, partial, res, reasoning=params.reasoning_format != "none",
                              tool_names=params.tool_names)
        return res
    rest = _split_reasoning(text, params, partial, res)
    if fmt == ToolFormat.CONTENT_ONLY:
        res.content = rest
        return res
    if fmt == ToolFormat.JSON:
        _parse_json_reply(rest, partial, res)
    elif fmt == ToolFormat.GENERIC:
        _parse_generic(rest, partial, res)
    elif fmt == ToolFormat.HERMES or fmt.value in LIST_MARKERS:
        _parse_marked(rest, partial, res, HERMES_START if fmt == ToolFormat.HERMES else LIST_MARKERS[fmt.value].strip(),
                      fmt, params.tool_names)
    elif fmt.value in TAGGED:
        tagged_calls.parse_tagged(rest, partial, res, TAGGED[fmt.value], params.tool_names)
    elif fmt == ToolFormat.FUNCTIONARY_V32:
        tagged_calls.parse_functionary_v32(rest, partial, res, params.tool_names)
    elif fmt == ToolFormat.LLAMA3:
        _parse_llama3(rest, partial, res)
    elif fmt == ToolFormat.LFM2:
        lfm2_calls.parse_lfm2(rest, partial, res, params.tool_names)
    elif fmt == ToolFormat.QWEN3_XML:
        qwen3_xml.parse_qwen3_xml(rest, partial, res, params.tools, params.bare_first_call)
    return res


def _content(res: ParseState, text: str) -> None:
    """Content before tool calls: trailing whitespace is not part of it (held back while streaming)."""
    res.content = text.rstrip()


_FENCE, _FENCE_END = "```json", "```"


def _parse_json_reply(text: str, partial: bool, res: ParseState) -> None:
    """The JSON of a response_format reply, without the blanks around it or its ```json block."""
    body = text[skip_ws(text, 0):]
    if body.startswith(_FENCE):
        body = body[len(_FENCE):]
        end = body.find(_FENCE_END)
        if end >= 0:
            body = body[:end]
        elif partial:
            body = body[:len(body) - holdback(body, _FENCE_END)]
    elif partial and body and _FENCE.startswith(body):
        return  # may still be the opening of a block
    res.content = body.strip()


def _parse_bare_call(text: str, partial: bool, res: ParseState, names: list[str]) -> None:
    """A Hermes reply that is one call object without its ``<tool_call>`` tags (what the lazy grammar's
    second trigger allows): a call if it names one of the tools, else content."""
    pos = skip_ws(text, 0)
    try:
        end = skip_ws(text, parse_call(text, pos, "arguments", res.calls))
        if end != len(text):
            raise Malformed
    except Incomplete:
        if partial and (not res.calls or not res.calls[-1].name or res.calls[-1].name in names):
            return
        res.calls.clear()
        res.content = text.strip()
        return
    except Malformed:
        res.calls.clear()
        res.content = text.strip()
        return
    if res.calls[-1].name not in names:
        res.calls.clear()
        res.content = text.strip()


def _parse_marked(text: str, partial: bool, res: ParseState, marker: str, fmt: ToolFormat,
                  names: list[str] = ()) -> None:  # type: ignore[assignment]
    """Hermes (``<tool_call>{...}</tool_call>``...) and the marker + JSON list formats (Mistral Nemo's
    ``[TOOL_CALLS][{...}, ...]``, Firefunction v2's `` functools[...]``, Granite's ``<|tool_call|>[...]``)."""
    at = text.find(marker)
    if at < 0 and fmt == ToolFormat.HERMES and text.lstrip().startswith("{") and names:
        _parse_bare_call(text, partial, res, names)
        return
    if at < 0:
        _content(res, text[:len(text) - holdback(text, marker)] if partial else text)
        return
    _content(res, text[:at])
    pos = block = at
    try:
        if fmt == ToolFormat.HERMES:
            while True:
                block = pos
                pos = skip_ws(text, pos + len(HERMES_START))
                pos = parse_call(text, pos, "arguments", res.calls)
                pos = skip_ws(text, pos)
                expect(text, pos, HERMES_END)
                pos = block = skip_ws(text, pos + len(HERMES_END))
                if pos == len(text):
                    break
                expect(text, pos, HERMES_START)
        else:
            pos = skip_ws(text, pos + len(marker))
            expect(text, pos, "[")
            pos = skip_ws(text, pos + 1)
            while True:
                block = pos
                pos = skip_ws(text, parse_call(text, pos, "arguments", res.calls))
                expect(text, pos, ",]")
                if text[pos] == "]":
                    pos = skip_ws(text, pos + 1)
                    break
                pos = skip_ws(text, pos + 1)
            if pos != len(text):
                raise Malformed
    except Incomplete:
        if not partial:
            _tail_as_content(res, text, block)
    except Malformed:
        _tail_as_content(res, text, block)


def _tail_as_content(res: ParseState, text: str, pos: int) -> None:
    """A reply that stops being a tool call at ``pos``: the incomplete call is dropped and the text
    from where the calls stopped making sense is content (as a model without a grammar may write)."""
    if res.calls and not res.calls[-1].complete:
        res.calls.pop()
    tail = text[pos:].strip()
    if tail:
        res.content = (res.content + "\n" + tail) if res.content else tail


def _parse_llama3(text: str, partial: bool, res: ParseState) -> None:
    pos = skip_ws(text, 0)
    tagged = text.startswith(PYTHON_TAG, pos)
    if tagged:
        pos = skip_ws(text, pos + len(PYTHON_TAG))
    elif partial and text[pos:] and PYTHON_TAG.startswith(text[pos:]):
        return
    if pos >= len(text):
        res.content = "" if tagged or partial else text.strip()
        return
    if text[pos] != "{":
        res.content = text.strip()
        return
    start = pos
    try:
        while True:
            pos = skip_ws(text, parse_call(text, pos, "parameters", res.calls))
            if pos == len(text):
                break
            expect(text, pos, ";")
            pos = skip_ws(text, pos + 1)
    except Incomplete:
        if not partial:
            _llama3_fallback(res, text, start)
    except Malformed:
        _llama3_fallback(res, text, start)


def _llama3_fallback(res: ParseState, text: str, start: int) -> None:
    """A reply starting with "{" that is not a call: all content, unless some calls were complete."""
    if any(c.complete for c in res.calls):
        res.calls = [c for c in res.calls if c.complete]
        return
    res.calls.clear()
    res.content = text.strip()


_GENERIC_HEAD = re.compile(r'\{\s*"(tool_calls|tool_call|response)"\s*:\s*')


def _parse_generic(text: str, partial: bool, res: ParseState) -> None:
    """``{"tool_call": {...}}``, ``{"tool_calls": [...]}`` or ``{"response": "..."}``; anything else is content."""
    lead = skip_ws(text, 0)
    if lead == len(text):
        res.content = "" if partial else text.strip()
        return
    if text[lead] != "{":
        res.content = text.strip()
        return
    head = _GENERIC_HEAD.match(text, lead)
    try:
        if head is None:
            json_end(text, lead)  # Incomplete while it may still become one
            raise Malformed
        pos = head.end()
        kind = head.group(1)
        if kind == "response":
            if pos >= len(text):
                raise Incomplete
            if text[pos] != '"':
                raise Malformed
            value, complete = partial_string(text, pos)
            res.content = value
            if not complete:
                raise Incomplete
            pos = string_end(text, pos)
        elif kind == "tool_call":
            pos = parse_call(text, pos, "arguments", res.calls)
        else:
            expect(text, pos, "[")
            pos = skip_ws(text, pos + 1)
            while True:
                pos = skip_ws(text, parse_call(text, pos, "arguments", res.calls))
                expect(text, pos, ",]")
                if text[pos] == "]":
                    pos += 1
                    break
                pos = skip_ws(text, pos + 1)
        pos = skip_ws(text, pos)
        # the wrapper may carry other keys (a "content" beside the calls): take them once whole
        end = json_end(text, lead)
        obj = json.loads(text[lead:end], strict=False)
        if isinstance(obj, dict) and isinstance(obj.get("content"), str) and kind != "response":
            res.content = obj["content"]
        if text[end:].strip():
            raise Malformed
    except Incomplete:
        if not partial:
            _generic_fallback(res, text)
    except Malformed:
        _generic_fallback(res, text)


def _generic_fallback(res: ParseState, text: str) -> None:
    """Not the generic JSON after all (a model writing without the grammar): the reply is content."""
    if any(c.complete for c in res.calls):
        res.calls = [c for c in res.calls if c.complete]
        return
    res.calls.clear()
    res.content = text.strip()


def parse_reply(text: str, params: ChatParams, partial: bool = False) -> ParsedReply:
    """Split a whole reply (``partial``: the reply so far) into reasoning, content and tool calls.
    Calls get fresh ids unless the model wrote its own."""
    res = _parse(text, params, partial)
    calls = [ToolCall(c.name, c.arguments, c.id or tool_call_id()) for c in res.calls if c.name]
    return ParsedReply(res.content, res.reasoning, calls)


class StreamParser:
    """Turns a reply arriving in pieces into OpenAI's streamed ``delta`` objects.

    Each :meth:`feed` re-reads the reply so far as a partial reply and sends what is new: text of
    ``reasoning_content`` and ``content`` only once it can no longer change (a possible start of a
    marker, or trailing blanks before a call, wait), a call's index, id and name once its name is
    whole, then its arguments as they grow. :meth:`finish` reads the whole reply (``truncated``: it was
    cut by the token limit, so an unfinished call is read as far as it went) and returns the final
    :class:`ParsedReply` with the last deltas; the deltas together always add up to that reply.
    """

    def __init__(self, params: ChatParams, stream_reasoning_as_content: bool = False) -> None:
        self.params = params
        self.text = ""
        self.sent_reasoning = ""
        self.sent_content = ""
        self.sent_calls: list[ToolCall] = []  # arguments: what was sent so far
        #: deepseek-legacy in a stream: the reasoning stays in the content (with its tags), as llama-server
        self.reasoning_in_content = stream_reasoning_as_content

    def feed(self, piece: str) -> list[dict[str, Any]]:
        self.text += piece
        if not piece:
            return []
        return self._deltas(_parse(self.text, self._effective_params(), partial=True))

    def finish(self, truncated: bool = False) -> tuple[ParsedReply, list[dict[str, Any]]]:
        res = _parse(self.text, self._effective_params(), partial=truncated)
        deltas = self._deltas(res)
        reply = ParsedReply(self.sent_content, self.sent_reasoning,
                            [ToolCall(c.name, c.arguments, c.id) for c in self.sent_calls])
        return reply, deltas

    def _effective_params(self) -> ChatParams:
        if not self.reasoning_in_content:
            return self.params
        p = copy.copy(self.params)
        p.reasoning_format = "none"
        return p

    def _deltas(self, res: ParseState) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if res.reasoning.startswith(self.sent_reasoning) and len(res.reasoning) > len(self.sent_reasoning):
            out.append({"reasoning_content": res.reasoning[len(self.sent_reasoning):]})
            self.sent_reasoning = res.reasoning
        content = res.content
        if content.startswith(self.sent_content) and len(content) > len(self.sent_content):
            out.append({"content": content[len(self.sent_content):]})
            self.sent_content = content
        for i, call in enumerate(res.calls):
            if not call.name:
                break
            if i == len(self.sent_calls):
                sent = ToolCall(call.name, "", call.id or tool_call_id())
                self.sent_calls.append(sent)
                out.append({"tool_calls": [{"index": i, "id": sent.id, "type": "function",
                                            "function": {"name": call.name, "arguments": ""}}]})
            sent = self.sent_calls[i]
            if call.arguments.startswith(sent.arguments) and len(call.arguments) > len(sent.arguments):
                more = call.arguments[len(sent.arguments):]
                out.append({"tool_calls": [{"index": i, "function": {"arguments": more}}]})
                sent.arguments = call.arguments
        return out
