"""LFM2's Python-style tool calls (llama.cpp's common/parsers/lfm2.cpp)::

    <|tool_call_start|>[get_time(city="Paris"), set_config(config={"enabled": True})]<|tool_call_end|>

The arguments are keyword arguments whose values are Python literals (strings in either quotes, numbers,
``True``/``False``/``None``, dicts, lists), JSON's ``true``/``false``/``null`` being taken too; the
call's ``arguments`` are their JSON object, in the order written. While streaming, a call is sent once
its name and ``(`` are there, then each ``"key": `` as its ``=`` comes and the value once whole.

Detection as chat.cpp's: LFM2's templates list the tools between ``<|tool_list_start|>`` and
``<|tool_list_end|>``; LFM2.5's write a plain ``List of tools: [``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .grammar.json_schema import SchemaConverter, format_literal
from .tool_json import Incomplete, Malformed, ParseState, PartialCall, holdback, skip_ws, until_rule

CALL_START, CALL_END = "<|tool_call_start|>", "<|tool_call_end|>"
LIST_START, LIST_END = "<|tool_list_start|>", "<|tool_list_end|>"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_WORDS = {"True": True, "False": False, "None": None, "true": True, "false": False, "null": None}


def is_lfm2_template(source: str) -> bool:
    return (LIST_START in source and LIST_END in source) or ("List of tools: [" in source and LIST_START not in source)


def preserved_tokens(source: str) -> list[str]:
    """The markers the reply must show as text (the tool-list ones only where the template writes them)."""
    out = [CALL_START, CALL_END, "<think>", "</think>"]
    return [*out, LIST_START, LIST_END] if LIST_START in source else out


def _string(text: str, pos: int) -> tuple[str, int]:
    """The Python string literal at ``pos`` (either quote; backslash escapes as JSON's)."""
    quote, i = text[pos], pos + 1
    out: list[str] = []
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            if i + 1 >= len(text):
                raise Incomplete
            nxt = text[i + 1]
            if nxt in "'\"":
                out.append(nxt)
                i += 2
                continue
            if nxt == "u":
                if i + 6 > len(text):
                    raise Incomplete
                esc = text[i:i + 6]
            else:
                esc = text[i:i + 2]
            try:
                out.append(json.loads('"' + esc + '"'))
            except json.JSONDecodeError:
                out.append(esc)
            i += len(esc)
            continue
        if ch == quote:
            return "".join(out), i + 1
        out.append(ch)
        i += 1
    raise Incomplete


def py_value(text: str, pos: int) -> tuple[Any, int]:
    """The Python (or JSON) literal at ``pos`` and where it ends."""
    if pos >= len(text):
        raise Incomplete
    ch = text[pos]
    if ch in "'\"":
        return _string(text, pos)
    if ch in "[{":
        close = "]" if ch == "[" else "}"
        items: list[Any] = []
        obj: dict[str, Any] = {}
        pos = skip_ws(text, pos + 1)
        if pos >= len(text):
            raise Incomplete
        if text[pos] == close:
            return (items if ch == "[" else obj), pos + 1
        while True:
            if ch == "{":
                if pos >= len(text):
                    raise Incomplete
                if text[pos] not in "'\"":
                    raise Malformed
                key, pos = _string(text, pos)
                pos = skip_ws(text, pos)
                if pos >= len(text):
                    raise Incomplete
                if text[pos] != ":":
                    raise Malformed
                obj[key], pos = py_value(text, skip_ws(text, pos + 1))
            else:
                value, pos = py_value(text, pos)
                items.append(value)
            pos = skip_ws(text, pos)
            if pos >= len(text):
                raise Incomplete
            if text[pos] == close:
                return (items if ch == "[" else obj), pos + 1
            if text[pos] != ",":
                raise Malformed
            pos = skip_ws(text, pos + 1)
    m = _NUMBER.match(text, pos)
    if m is not None and m.end() > pos:
        if m.end() == len(text):
            raise Incomplete  # more digits may come
        num = m.group()
        return (float(num) if any(c in num for c in ".eE") else int(num)), m.end()
    word = re.match(r"[A-Za-z]*", text[pos:]).group()  # type: ignore[union-attr]
    if word in _WORDS and pos + len(word) < len(text):
        return _WORDS[word], pos + len(word)
    if pos + len(word) == len(text) and (ch == "-" or any(w.startswith(word) for w in _WORDS)):
        raise Incomplete
    raise Malformed


def _read_call(text: str, pos: int, names: list[str], calls: list[PartialCall]) -> int:
    """``name(key=value, ...)`` at ``pos``, appended to ``calls`` as far as it goes; returns its end."""
    if pos >= len(text):
        raise Incomplete
    m = _NAME.match(text, pos)
    if m is None:
        raise Malformed
    if m.end() == len(text):
        raise Incomplete
    name = m.group()
    if name not in names or text[m.end()] != "(":
        raise Malformed
    call = PartialCall(name, "{")
    calls.append(call)
    pairs: list[str] = []
    pos = skip_ws(text, m.end() + 1)
    while True:
        if pos >= len(text):
            raise Incomplete
        if text[pos] == ")":
            call.arguments = "{" + ", ".join(pairs) + "}"
            call.complete = True
            return pos + 1
        if pairs:
            if text[pos] != ",":
                raise Malformed
            pos = skip_ws(text, pos + 1)
        k = _NAME.match(text, pos)
        if k is None:
            raise Incomplete if pos >= len(text) else Malformed
        if k.end() >= len(text):
            raise Incomplete
        if text[k.end()] != "=":
            raise Malformed
        key = json.dumps(k.group()) + ": "
        call.arguments = "{" + "".join(p + ", " for p in pairs) + key
        value, pos = py_value(text, k.end() + 1)
        pairs.append(key + json.dumps(value, ensure_ascii=False))
        call.arguments = "{" + ", ".join(pairs)
        pos = skip_ws(text, pos)


def parse_lfm2(text: str, partial: bool, res: ParseState, names: list[str]) -> None:
    """Content up to ``<|tool_call_start|>``, then the list of calls up to ``<|tool_call_end|>``; a list
    that is not calls to the tools is content."""
    at = text.find(CALL_START)
    if at < 0:
        res.content = text[:len(text) - holdback(text, CALL_START)] if partial else text
        return
    res.content = text[:at]
    pos = skip_ws(text, at + len(CALL_START))
    try:
        if pos >= len(text):
            raise Incomplete
        if text[pos] != "[":
            raise Malformed
        pos = skip_ws(text, pos + 1)
        while True:
            pos = skip_ws(text, _read_call(text, pos, names, res.calls))
            if pos >= len(text):
                raise Incomplete
            if text[pos] == "]":
                pos = skip_ws(text, pos + 1)
                break
            if text[pos] != ",":
                raise Malformed
            pos = skip_ws(text, pos + 1)
        rest = text[pos:]
        if rest.startswith(CALL_END):
            rest = rest[len(CALL_END):]
        elif partial and CALL_END.startswith(rest):
            return
        if rest.strip():  # text after the calls: kept as content
            res.content += rest
    except Incomplete:
        if not partial:
            _as_content(res, text, at)
    except Malformed:
        _as_content(res, text, at)


def _as_content(res: ParseState, text: str, at: int) -> None:
    res.calls.clear()
    res.content = text


_PY_RULES = {
    "py-value": "py-dict | py-array | py-string | py-number | py-bool | py-null",
    "py-dict": '"{" space ( "}" | py-member ( space "," space py-member )* space "}" ) space',
    "py-member": 'py-string space ":" space py-value',
    "py-array": '"[" space ( "]" | py-value ( "," space py-value )* space "]" ) space',
    "py-string": '"\\"" ( [^"\\\\] | "\\\\" . )* "\\"" | "\'" ( [^\'\\\\] | "\\\\" . )* "\'"',
    "py-number": '"-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?',
    "py-bool": '"True" | "False" | "true" | "false"',
    "py-null": '"None" | "null"',
}


def lfm2_grammar(conv: SchemaConverter, tools: list[dict[str, Any]], required: bool, parallel: bool) -> str:
    """chat.cpp's grammar: a string parameter takes a quoted string, any other a Python/JSON literal;
    the calls are one list in the markers, content may come first when the calls are required."""
    for name, body in _PY_RULES.items():
        conv.add_rule(name, body)
    alts = []
    for t in tools:
        fn = t["function"]
        props = (fn.get("parameters") or {}).get("properties") or {}
        args = [format_literal(f"{k}=") + (" py-string" if isinstance(v, dict) and v.get("type") == "string"
                                           else " py-value") for k, v in props.items()]
        arg = " | ".join(f"( {a} )" for a in args)
        inner = f'( {arg} ) ( "," space ( {arg} ) )*' if args else ""
        rule_name = "tool-" + re.sub(r"[^A-Za-z0-9-]", "-", fn["name"])
        alts.append(conv.add_rule(rule_name, f'{format_literal(fn["name"] + "(")} space {inner} space ")"'))
    call = " | ".join(alts)
    items = f"( {call} ) ( \",\" space ( {call} ) )*" if parallel else f"( {call} )"
    calls = conv.add_rule("tool-calls", f'"{CALL_START}" "[" space {items} space "]" "{CALL_END}"')
    if not required:
        return calls
    return f"{until_rule(conv, 'lfm2-content', [CALL_START])} {calls}"


def render_calls(calls: list[dict[str, Any]]) -> str:
    """An assistant turn's calls written as the model writes them (for templates that do not show calls)."""
    def lit(v: Any) -> str:
        return json.dumps(v, ensure_ascii=False) if isinstance(v, str | dict | list) or v is None else \
            {True: "True", False: "False"}.get(v, str(v)) if isinstance(v, bool) else str(v)

    out = []
    for c in calls:
        fn = c.get("function", {})
        args = fn.get("arguments") or {}
        text = ", ".join(f"{k}={lit(v)}" for k, v in args.items()) if isinstance(args, dict) else str(args)
        out.append(f"{fn.get('name', '')}({text})")
    return f"{CALL_START}[{', '.join(out)}]{CALL_END}"
