"""Qwen3-Coder's XML tool calls (llama.cpp's common/parsers/qwen3-coder.cpp), also written by Qwen3.5
and Nemotron 3 Nano::

    <tool_call>
    <function=NAME>
    <parameter=P>
    VALUE
    </parameter>
    </function>
    </tool_call>

A parameter's value is text: a parameter whose schema allows only strings takes it as it is; one that
allows no string takes it as JSON; one that allows both takes it as JSON when it reads as a value of
one of the other types, else as the string (``null`` for a nullable string is null). The call's
``arguments`` are the JSON object of the values, in the order written, as chat.cpp builds them; while
streaming, a string parameter's value is sent as it grows, other values once whole, and the closing
``}`` once ``</function>`` has come.

Qwen3-Coder (the template that does not think) sometimes leaves out the first ``<tool_call>``: a reply
may start its calls at ``<function=NAME>`` for a NAME among the tools, as chat.cpp allows.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

from .grammar.json_schema import SchemaConverter, format_literal
from .tool_json import Incomplete, Malformed, ParseState, PartialCall, holdback, skip_ws, until_rule

CALL_START, CALL_END = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"
_ALL_TYPES = frozenset(("string", "number", "integer", "boolean", "null", "array", "object"))


def is_qwen3_xml_template(source: str) -> bool:
    """chat.cpp's test: ``<tool_call>``, ``<function=`` and ``<parameter=`` in the template, written with
    newlines between the tags (a template that glues them is another format)."""
    return (CALL_START in source and FUNCTION in source and PARAMETER in source
            and "'<tool_call><function=' ~ tool_call.name ~ '>'" not in source)


def value_types(schema: Any, root: Any = None, seen: frozenset[int] = frozenset()) -> frozenset[str]:
    """The JSON types a schema lets a value have (common_chat_schema::value_types): ``type``, ``enum``,
    ``const``, ``anyOf``/``oneOf`` (their union), ``allOf`` (their intersection), local ``$ref``s; a
    schema that says nothing allows every type."""
    root = schema if root is None else root
    if not isinstance(schema, dict):
        return _ALL_TYPES
    if "$ref" in schema and isinstance(schema["$ref"], str) and schema["$ref"].startswith("#/"):
        if id(schema) in seen:
            return frozenset()
        target: Any = root
        for part in schema["$ref"][2:].split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        return value_types(target, root, seen | {id(schema)})
    if "type" in schema:
        t = schema["type"]
        types = frozenset(t if isinstance(t, list) else [t])
        return types | {"integer"} if "number" in types else types
    if "const" in schema:
        return frozenset([_json_type(schema["const"])])
    if isinstance(schema.get("enum"), list):
        return frozenset(_json_type(v) for v in schema["enum"])
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return frozenset().union(*(value_types(s, root, seen) for s in schema[key]))
    if isinstance(schema.get("allOf"), list):
        out = _ALL_TYPES
        for s in schema["allOf"]:
            out &= value_types(s, root, seen)
        return out
    return _ALL_TYPES


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _param_types(tool: dict[str, Any]) -> dict[str, frozenset[str]]:
    params = tool["function"].get("parameters") or {}
    props = params.get("properties") or {}
    return {k: value_types(v, params) for k, v in props.items()} if isinstance(props, dict) else {}


def _value_json(raw: str, types: frozenset[str]) -> str:
    """A parameter's text as the JSON of its value (see the module docstring)."""
    if types == {"string"}:
        return json.dumps(raw, ensure_ascii=False)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    else:
        if "string" in types and _json_type(value) not in types:
            value = raw
    return json.dumps(value, ensure_ascii=False)


class _Call:
    """A call read as far as the text goes: its name, its finished ``"key": value`` pairs and the text
    of a string value still being written."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.pairs: list[str] = []
        self.growing = ""
        self.closed = False

    def arguments(self) -> str:
        body = ", ".join(self.pairs + ([self.growing] if self.growing else []))
        return "{" + body + ("}" if self.closed else "")


def _read_call(text: str, pos: int, tools: dict[str, dict[str, frozenset[str]]], partial: bool,
               calls: list[PartialCall]) -> int:
    """The ``<function=NAME>...</function>`` at ``pos``: appended to ``calls`` as far as it goes; returns
    the index after ``</function>``."""
    head = text[pos:pos + len(FUNCTION)]
    if head != FUNCTION:
        raise Incomplete if FUNCTION.startswith(head) and pos + len(head) == len(text) else Malformed
    close = text.find(">", pos)
    if close < 0:
        if "\n" in text[pos:]:
            raise Malformed
        raise Incomplete
    name = text[pos + len(FUNCTION):close]
    if name not in tools:
        raise Malformed
    types = tools[name]
    call = _Call(name)
    out = PartialCall(name)
    calls.append(out)
    pos = skip_ws(text, close + 1)
    try:
        while True:
            if text.startswith(FUNCTION_END, pos):
                call.closed = True
                out.arguments, out.complete = call.arguments(), True
                return pos + len(FUNCTION_END)
            rest = text[pos:]
            if not rest or FUNCTION_END.startswith(rest) or PARAMETER.startswith(rest):
                raise Incomplete
            if not rest.startswith(PARAMETER):
                raise Malformed
            close = text.find(">", pos)
            if close < 0:
                raise Incomplete
            key = text[pos + len(PARAMETER):close]
            start = close + 1
            if start == len(text):
                raise Incomplete
            if text[start] == "\n":
                start += 1
            end = text.find(PARAMETER_END, start)
            kinds = types.get(key, _ALL_TYPES)
            if end < 0:
                if kinds == {"string"}:  # a string is sent as it grows (not its possible last newline)
                    raw = text[start:]
                    raw = raw[:len(raw) - max(holdback(raw, "\n" + PARAMETER_END), holdback(raw, PARAMETER_END))]
                    raw = raw[:-1] if raw.endswith("\n") else raw
                    call.growing = json.dumps(key, ensure_ascii=False) + ": " + json.dumps(raw, ensure_ascii=False)[:-1]
                raise Incomplete
            raw = text[start:end]
            raw = raw[:-1] if raw.endswith("\n") else raw
            call.growing = ""
            call.pairs.append(json.dumps(key, ensure_ascii=False) + ": " + _value_json(raw, kinds))
            pos = skip_ws(text, end + len(PARAMETER_END))
    finally:
        if not out.complete:
            out.arguments = call.arguments()


def parse_qwen3_xml(text: str, partial: bool, res: ParseState, tools: list[dict[str, Any]],
                    bare_first: bool) -> None:
    """Content, then the calls; ``bare_first``: the first call may come without ``<tool_call>``."""
    by_name = {t["function"]["name"]: _param_types(t) for t in tools}
    starts = [CALL_START] + ([FUNCTION + n + ">" for n in by_name] if bare_first else [])
    found = [(at, s) for s in starts if (at := text.find(s)) >= 0]
    if not found:
        if partial:
            text = text[:len(text) - max(holdback(text, s) for s in starts)]
        res.content = text
        return
    at, first = min(found)
    res.content = text[:at]
    pos = block = at
    bare = first != CALL_START  # the first call may lack its <tool_call>
    try:
        while True:
            block = pos
            if text.startswith(CALL_START, pos):
                pos = skip_ws(text, pos + len(CALL_START))
            elif not bare:
                if partial and CALL_START.startswith(text[pos:]):
                    return
                raise Malformed
            bare = False
            pos = skip_ws(text, _read_call(text, pos, by_name, partial, res.calls))
            rest = text[pos:]
            if rest.startswith(CALL_END):
                pos = skip_ws(text, pos + len(CALL_END))
            elif not rest or (partial and CALL_END.startswith(rest)):
                return  # (a whole reply may stop without its last </tool_call>)
            else:
                raise Malformed
            if pos == len(text):
                return
    except Incomplete:
        if not partial:
            _tail(res, text, block)
    except Malformed:
        _tail(res, text, block)


def _tail(res: ParseState, text: str, pos: int) -> None:
    """Text that stops being calls at ``pos``: an unfinished call is dropped, the rest is content."""
    if res.calls and not res.calls[-1].complete:
        res.calls.pop()
    tail = text[pos:].strip()
    if tail:
        res.content = (res.content.rstrip() + "\n" + tail) if res.content.strip() else tail


def qwen3_xml_grammar(conv: SchemaConverter, tools: list[dict[str, Any]], required: bool, parallel: bool,
                      bare_first: bool, rule: Callable[[dict[str, Any], str], str]) -> str:
    """The calls' grammar (chat.cpp's): required parameters in any order, then any optional ones; a
    string parameter is any text up to ``\\n</parameter>\\n``, another is its schema's JSON. With
    ``required`` the reply may write content first (chat.cpp's grammar allows it), then the calls;
    otherwise the lazy grammar starts at a call's trigger."""
    string_value = until_rule(conv, "xml-arg-string", ["\n" + PARAMETER_END + "\n"])
    alts = []
    for t in tools:
        fn = t["function"]
        name = fn["name"]
        params = fn.get("parameters") or {}
        props = params.get("properties") or {}
        req = [k for k in props if k in (params.get("required") or [])]
        args: dict[str, str] = {}
        for key, schema in props.items():
            kinds = value_types(schema, params)
            if "string" in kinds:
                value = string_value
            else:
                sub = {**schema, **{k: params[k] for k in ("$defs", "definitions") if k in params}}
                value = rule(sub, f"tool-{name}-arg-{key}-value")
            opening, closing = format_literal(f"{PARAMETER}{key}>\n"), format_literal(f"\n{PARAMETER_END}\n")
            args[key] = conv.add_rule(f"tool-{name}-arg-{key}", f"{opening} {value} {closing}")
        orders = list(itertools.permutations(req)) if len(req) <= 4 else [tuple(req)]
        required_part = " | ".join(" ".join(args[k] for k in order) or '""' for order in orders)
        optional = [args[k] for k in props if k not in req]
        body = f"( {required_part} )" + (f" ( {' | '.join(optional)} )*" if optional else "")
        opening, closing = format_literal(FUNCTION + name + ">\n"), format_literal(FUNCTION_END + "\n")
        alts.append(conv.add_rule(f"tool-{name}", f"{opening} {body} {closing}"))
    choice = " | ".join(alts)
    start = format_literal(f"{CALL_START}\n")
    conv.add_rule("tool-call", f'{start} ( {choice} ) "</tool_call>" space')
    first = "tool-call"
    if bare_first:
        first = conv.add_rule("tool-call-first", f'{start}? ( {choice} ) "</tool_call>" space')
    calls = f"{first} tool-call*" if parallel else first
    if not required:
        return calls
    starts = [CALL_START] + ([FUNCTION] if bare_first else [])
    content = until_rule(conv, "xml-content", starts)
    return f"{content} {calls}"
