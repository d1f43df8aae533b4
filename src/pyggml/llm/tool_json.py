"""The pieces the tool-call parsers share: reading JSON values out of a reply that may still be
arriving (a value cut short is "incomplete", not wrong), a call object read as far as it goes, the
state a parser fills (reasoning, content, calls), and the grammar rule for "any text without these
markers" that the formats' grammars use.

The scanners raise :class:`Incomplete` when the text ends inside a construct (only an error for a
whole reply) and :class:`Malformed` when the text cannot be what the format expects there (from that
point on the reply is read as plain content, as llama.cpp's parsers fall back).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .grammar.json_schema import SchemaConverter, format_literal


class Incomplete(Exception):
    """The text ends before the construct does (only an error for a complete reply)."""


class Malformed(Exception):
    """The text cannot be what the format expects here: from this point it is plain content."""


_WS = re.compile(r"\s*")
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_LITERALS = ("true", "false", "null")


def skip_ws(text: str, pos: int) -> int:
    return _WS.match(text, pos).end()  # type: ignore[union-attr]


def json_end(text: str, pos: int) -> int:
    """Where the JSON value starting at ``pos`` ends; Incomplete when the text ends first, Malformed
    when it is not JSON. Only brackets and strings are tracked; the whole value is then checked by json."""
    if pos >= len(text):
        raise Incomplete
    c = text[pos]
    if c in "{[":
        depth, i, n = 0, pos, len(text)
        while i < n:
            ch = text[i]
            if ch == '"':
                i = string_end(text, i)
                continue
            if ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth == 0:
                    end = i + 1
                    _check_json(text[pos:end])
                    return end
            i += 1
        raise Incomplete
    if c == '"':
        end = string_end(text, pos)
        _check_json(text[pos:end])
        return end
    i = pos
    while i < len(text) and (text[i] in _NUMBER_CHARS or text[i].isalpha()):
        i += 1
    word = text[pos:i]
    if i == len(text):
        if any(lit.startswith(word) for lit in _LITERALS) or all(ch in _NUMBER_CHARS for ch in word):
            raise Incomplete
        raise Malformed
    _check_json(word)
    return i


def string_end(text: str, pos: int) -> int:
    """The index after the closing quote of the JSON string at ``pos``."""
    i, n = pos + 1, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == '"':
            return i + 1
        i += 1
    raise Incomplete


def _check_json(value: str) -> None:
    try:
        json.loads(value, strict=False)
    except (json.JSONDecodeError, RecursionError):
        raise Malformed from None


_ESCAPE_TAIL = re.compile(r'\\(u[0-9a-fA-F]{0,3})?$')
_HIGH_SURROGATE_TAIL = re.compile(r'\\u[dD][89abAB][0-9a-fA-F]{2}$')


def partial_string(text: str, pos: int) -> tuple[str, bool]:
    """The decoded value of the JSON string at ``pos`` so far, and whether it is complete; an escape
    cut short (or the first half of a surrogate pair) is held back until its end arrives."""
    try:
        end = string_end(text, pos)
    except Incomplete:
        body = text[pos + 1:]
        # drop an unfinished escape: a lone backslash or \\u with fewer than 4 digits
        m = _ESCAPE_TAIL.search(body)
        if m is not None:
            before = body[:m.start()]
            if (len(before) - len(before.rstrip("\\"))) % 2 == 0:  # this backslash is not itself escaped
                body = before
        body = _HIGH_SURROGATE_TAIL.sub("", body)
        try:
            return json.loads('"' + body + '"', strict=False), False
        except json.JSONDecodeError:
            raise Malformed from None
    try:
        return json.loads(text[pos:end], strict=False), True
    except json.JSONDecodeError:
        raise Malformed from None


@dataclass
class PartialCall:
    name: str = ""  # "" until the whole name is there
    arguments: str = ""
    id: str = ""
    complete: bool = False


def _call_head(args_key: str, typed: bool) -> re.Pattern[str]:
    typ = r'(?:"type"\s*:\s*"function"\s*,\s*)?' if typed else ""
    return re.compile(r'\{\s*' + typ + r'"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"' + args_key + r'"\s*:\s*')


_HEADS = {"arguments": _call_head("arguments", False), "parameters": _call_head("parameters", True)}


def parse_call(text: str, pos: int, args_key: str, out: list[PartialCall]) -> int:
    """Parse the call object at ``pos`` into ``out`` (appended even when incomplete, as far as it goes);
    returns where it ends. ``{"name": ..., "<args_key>": {...}, ...}`` streams its arguments as written;
    any other key order is taken whole once complete."""
    head = _HEADS[args_key].match(text, pos)
    if head is None:
        end = json_end(text, pos)  # the whole object, or Incomplete
        obj = json.loads(text[pos:end], strict=False)
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or args_key not in obj:
            raise Malformed
        args = obj[args_key]
        out.append(PartialCall(obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False),
                                str(obj.get("id") or ""), True))
        return end
    call = PartialCall(json.loads(head.group(1), strict=False))
    out.append(call)
    a = head.end()
    if a < len(text) and text[a] == '"':  # arguments as a JSON string: its value, once whole
        try:
            a_end = json_end(text, a)
        except Incomplete:
            raise
        call.arguments = json.loads(text[a:a_end], strict=False)
    else:
        try:
            a_end = json_end(text, a)
        except Incomplete:
            call.arguments = text[a:]
            raise
        call.arguments = text[a:a_end]
    end = json_end(text, pos)  # the rest of the object (an "id" key, say)
    obj = json.loads(text[pos:end], strict=False)
    if not isinstance(obj, dict):
        raise Malformed
    call.id = str(obj.get("id") or "")
    call.complete = True
    return end


def holdback(text: str, marker: str) -> int:
    """The length of the longest tail of ``text`` that is a proper start of ``marker``."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


@dataclass
class ParseState:
    reasoning: str = ""
    content: str = ""
    calls: list[PartialCall] = field(default_factory=list)



def expect(text: str, pos: int, what: str) -> None:
    """``what`` at ``pos`` (one of its characters when it is a set of one-character choices like ",]")."""
    if what in (",]",):
        if pos >= len(text):
            raise Incomplete
        if text[pos] not in what:
            raise Malformed
        return
    piece = text[pos:pos + len(what)]
    if piece == what:
        return
    if what.startswith(piece):
        raise Incomplete
    raise Malformed


def until_rule(conv: SchemaConverter, name: str, delims: list[str]) -> str:
    """A rule for any text containing none of ``delims``, built on their trie (the shape of llama.cpp's
    gbnf_excluding_grammar); returns the rule's name."""
    trie: dict[str, Any] = {}
    for d in delims:
        node = trie
        for ch in d:
            node = node.setdefault(ch, {})
        node[""] = {}

    def esc(ch: str) -> str:
        return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(ch, "\\" + ch if ch in "]\\^-" else ch)

    def visit(node: dict[str, Any]) -> str:
        alts = [f"[^{''.join(esc(c) for c in node if c)}]"]
        for ch, child in node.items():
            if ch and "" not in child:
                alts.append(f"{format_literal(ch)} ( {visit(child)} )")
        return " | ".join(alts)

    return conv.add_rule(name, f"( {visit(trie)} )*")
