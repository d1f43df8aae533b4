"""Tool calls written as a name between markers followed by its arguments' JSON: the formats of
Functionary v3.1 and v3.2, DeepSeek R1 and Mistral's ``[ARGS]`` models (Ministral 3, Magistral,
Mistral Small 3.2, Devstral). llama.cpp parses Functionary v3.2 with a dedicated handler and the
others with what its differential autoparser finds in their templates; the shapes below are those
the templates write and llama.cpp's tests/test-chat.cpp expects:

* Functionary v3.1: ``<function=NAME>{...}</function>``, repeated; content may come first.
* DeepSeek R1: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}```
  <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>`` (the reasoning before it is the ``<think>`` block).
* Mistral ``[ARGS]``: ``[TOOL_CALLS]NAME[ARGS]{...}`` (Mistral Small 3.2: ``[TOOL_CALLS]NAME[CALL_ID]ID
  [ARGS]{...}``, the model writing the call's id), repeated.
* Functionary v3.2: the generation prompt ends with ``>>>``: the reply names its recipient first,
  ``all\\n`` then content, or ``NAME\\n{...}`` a call; later messages start again with ``>>>``.

A call's arguments stream as they are written (the JSON text itself), as the other JSON formats'.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .grammar.json_schema import SchemaConverter, format_literal
from .tool_json import Incomplete, Malformed, ParseState, PartialCall, holdback, json_end, skip_ws


@dataclass(frozen=True)
class TaggedFormat:
    """Where a run of calls starts and ends, and the markers around each call's name and arguments."""

    section_start: str  # "" when each call stands alone
    section_end: str
    call_start: str
    name_end: str
    call_end: str
    id_marker: str = ""  # the model writes the call's id after this marker, before args_marker
    args_marker: str = ""
    #: special tokens among the markers (sent as text so the parser sees them)
    preserved: tuple[str, ...] = ()

    @property
    def trigger(self) -> str:
        return self.section_start or self.call_start


FUNCTIONARY_V31 = TaggedFormat("", "", "<function=", ">", "</function>")
DEEPSEEK_R1 = TaggedFormat(
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>function<｜tool▁sep｜>", "\n```json\n",
    "```<｜tool▁call▁end｜>",
    preserved=("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
               "<｜tool▁calls▁end｜>"))
MISTRAL_ARGS = TaggedFormat("", "", "[TOOL_CALLS]", "", "", id_marker="[CALL_ID]", args_marker="[ARGS]",
                            preserved=("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"))


def detect(source: str) -> TaggedFormat | None:
    """The format a template's source writes, if one of these (chat.cpp's tests for Ministral 3 come
    first; the others are the markers the templates write their calls with)."""
    if "[TOOL_CALLS]" in source and "[ARGS]" in source:
        return MISTRAL_ARGS
    if "<｜tool▁calls▁begin｜>" in source and "```json" in source:  # (DeepSeek V3.1 writes no ```json)
        return DEEPSEEK_R1
    if "<function=" in source and "</function>" in source and "<|start_header_id|>" in source:
        return FUNCTIONARY_V31
    return None


def is_functionary_v32(source: str) -> bool:
    """chat.cpp's test for Functionary v3.2's recipient format."""
    return ">>>all" in source and ">>>${recipient}" in source


def _holdback_any(text: str, markers: list[str]) -> int:
    return max((holdback(text, m) for m in markers if m), default=0)


def _expect(text: str, pos: int, marker: str) -> int:
    """The index after ``marker`` at ``pos`` (Incomplete when the text stops inside it)."""
    piece = text[pos:pos + len(marker)]
    if piece == marker:
        return pos + len(marker)
    if marker.startswith(piece) and pos + len(piece) == len(text):
        raise Incomplete
    raise Malformed


def _read_args(text: str, pos: int, call: PartialCall) -> int:
    """The arguments' JSON at ``pos``, kept in ``call`` as far as it goes."""
    try:
        end = json_end(text, pos)
    except Incomplete:
        call.arguments = text[pos:]
        raise
    call.arguments = text[pos:end]
    call.complete = True
    return end


def _read_call(text: str, pos: int, fmt: TaggedFormat, names: list[str], calls: list[PartialCall]) -> int:
    pos = _expect(text, pos, fmt.call_start)
    stop = fmt.name_end or fmt.args_marker
    ends = [e for m in (stop, fmt.id_marker) if m and (e := text.find(m, pos)) >= 0]
    if not ends:
        if len(text) - pos > 256:  # no function name is that long
            raise Malformed
        raise Incomplete
    end = min(ends)
    name = text[pos:end].strip()
    if name not in names:
        raise Malformed
    call = PartialCall(name)
    calls.append(call)
    pos = end
    if fmt.id_marker and text.startswith(fmt.id_marker, pos):
        at = text.find(fmt.args_marker, pos)
        if at < 0:
            raise Incomplete
        call.id = text[pos + len(fmt.id_marker):at].strip()
        pos = at
    pos = _expect(text, pos, stop)
    pos = skip_ws(text, _read_args(text, skip_ws(text, pos), call))
    if fmt.call_end and pos < len(text):  # (a reply may stop right after the arguments)
        call.complete = False
        pos = _expect(text, pos, fmt.call_end)
        call.complete = True
    return pos


def parse_tagged(text: str, partial: bool, res: ParseState, fmt: TaggedFormat, names: list[str]) -> None:
    """Content up to the first call (or run of calls), then the calls; text that stops being calls is
    content from where it does."""
    at = text.find(fmt.trigger)
    if at < 0:
        res.content = text[:len(text) - _holdback_any(text, [fmt.trigger])] if partial else text
        return
    res.content = text[:at]
    pos = block = at
    try:
        if fmt.section_start:
            pos = skip_ws(text, _expect(text, pos, fmt.section_start))
        while True:
            block = pos
            pos = skip_ws(text, _read_call(text, pos, fmt, names, res.calls))
            if fmt.section_end and text.startswith(fmt.section_end, pos):
                pos = skip_ws(text, pos + len(fmt.section_end))
                break
            if pos == len(text):
                if fmt.section_end and not partial:
                    break  # a whole reply may stop without closing the run
                return
            rest = text[pos:]
            if rest.startswith(fmt.call_start):
                continue
            if partial and (fmt.call_start.startswith(rest) or fmt.section_end.startswith(rest)):
                return
            break
        if text[pos:].strip():
            res.content += text[pos:]
    except Incomplete:
        if not partial:
            _tail(res, text, block)
    except Malformed:
        _tail(res, text, block)


def _tail(res: ParseState, text: str, pos: int) -> None:
    if res.calls and not res.calls[-1].complete:
        res.calls.pop()
    res.content += text[pos:]


def parse_functionary_v32(text: str, partial: bool, res: ParseState, names: list[str]) -> None:
    """``all\\n`` content and ``NAME\\n{...}`` calls, each message after the first opened by ``>>>``;
    a recipient that is neither is content from there on."""
    pos = 0
    while True:
        nl = text.find("\n", pos)
        if nl < 0:  # the recipient is not whole yet
            if not partial or not any(r.startswith(text[pos:]) for r in ["all", *names]):
                res.content += text[pos:]
            return
        recipient = text[pos:nl]
        if recipient == "all":
            end = text.find(">>>", nl + 1)
            body = text[nl + 1:] if end < 0 else text[nl + 1:end]
            if end < 0 and partial:
                body = body[:len(body) - holdback(body, ">>>")]
            res.content += body
            if end < 0:
                return
            pos = end + 3
            continue
        if recipient not in names:
            res.content += text[pos:]
            return
        call = PartialCall(recipient)
        res.calls.append(call)
        try:
            end = skip_ws(text, _read_args(text, nl + 1, call))
        except Incomplete:
            if not partial:
                res.calls.pop()
                res.content += text[pos:]
            return
        except Malformed:
            res.calls.pop()
            res.content += text[pos:]
            return
        if end == len(text):
            return
        if text.startswith(">>>", end):
            pos = end + 3
            continue
        if not (partial and ">>>".startswith(text[end:])):
            res.content += text[end:]
        return


def tagged_grammar(conv: SchemaConverter, tools: list[dict[str, Any]], fmt: TaggedFormat, parallel: bool,
                   rule: Callable[[dict[str, Any], str], str]) -> str:
    """The calls' grammar: each tool's name between the markers, its parameters' JSON after."""
    alts = []
    for t in tools:
        fn = t["function"]
        name = fn["name"]
        args = rule(fn.get("parameters") or {"type": "object", "properties": {}}, f"tool-{_rule_name(name)}-args")
        head = format_literal(fmt.call_start + name + fmt.name_end)
        if fmt.args_marker:
            ident = f' ( {format_literal(fmt.id_marker)} [a-zA-Z0-9]{{9}} )?' if fmt.id_marker else ""
            head += f"{ident} {format_literal(fmt.args_marker)}"
        tail = f" space {format_literal(fmt.call_end)}" if fmt.call_end else ""
        alts.append(conv.add_rule(f"tool-{_rule_name(name)}", f"{head} {args}{tail}"))
    call = conv.add_rule("tool-call", " | ".join(alts))
    calls = f"{call} ( space {call} )*" if parallel else call
    if fmt.section_start:
        calls = f"{format_literal(fmt.section_start)} {calls} space {format_literal(fmt.section_end)}"
    return calls


def functionary_v32_grammar(conv: SchemaConverter, tools: list[dict[str, Any]], required: bool, parallel: bool,
                            rule: Callable[[dict[str, Any], str], str]) -> str:
    """Calls after ``>>>`` (the trigger, a recipient other than ``all``), or from the reply's first
    token when they are required (the generation prompt has written the first ``>>>``)."""
    alts = []
    for t in tools:
        fn = t["function"]
        args = rule(fn.get("parameters") or {"type": "object", "properties": {}}, f"tool-{_rule_name(fn['name'])}-args")
        alts.append(conv.add_rule(f"tool-{_rule_name(fn['name'])}", f"{format_literal(fn['name'] + chr(10))} {args}"))
    call = conv.add_rule("tool-call", " | ".join(alts))
    calls = f'{call} ( ">>>" {call} )*' if parallel else call
    return calls if required else f'">>>" {calls}'  # a lazy grammar starts at the trigger's ">>>"


def _rule_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", name)
