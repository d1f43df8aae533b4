"""GPT-OSS's "harmony" replies: channels, recipients and calls (llama.cpp's common/parsers/gpt-oss.cpp).

A gpt-oss reply is a run of messages, each ``<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>TYPE]<|message|>BODY``
ended by ``<|end|>`` (or ``<|call|>`` after a call, ``<|return|>`` at the very end) and the next one
opened by ``<|start|>assistant`` (the prompt's generation prompt opens the first). The recipient may
also stand in the role header: ``<|start|>assistant to=functions.NAME<|channel|>commentary ...``.

* channel ``analysis``: reasoning (``reasoning_content``); with reasoning_format "none" the whole
  message, markers included, is content, as llama-server leaves it;
* channel ``final`` or ``commentary`` without a recipient: content;
* recipient ``functions.NAME`` (a tool of the request): a call, whose body is the arguments' JSON;
* any other recipient (the model's built-in ``python``, ``container.exec``...): dropped, as
  llama.cpp drops these unsolicited calls; a stray ``to=assistant`` is no recipient at all.

The grammar (:func:`harmony_grammar`) is written from after the generation prompt: with tool_choice
"required" the reply may reason and talk in ``analysis``/``commentary`` messages before its call;
otherwise it is lazy and starts at one of chat.cpp's four trigger patterns (`` to`` at the start,
``<|channel|>commentary to=functions`` at the start, or either form after ``<|start|>assistant``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .grammar.json_schema import SchemaConverter, format_literal
from .grammar.sampler import GrammarTrigger
from .tool_json import Incomplete, Malformed, ParseState, PartialCall, json_end, until_rule

START = "<|start|>assistant"
CHANNEL, MESSAGE, CONSTRAIN = "<|channel|>", "<|message|>", "<|constrain|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
#: the markers the reply must show as text (llama.cpp's preserved tokens of the format)
PRESERVED_TOKENS = [CHANNEL, CONSTRAIN, MESSAGE, "<|start|>", END]
_BODY_ENDS = (END, CALL, RETURN)
_MARKERS = (START, CHANNEL, MESSAGE, CONSTRAIN, END, CALL, RETURN)
_RECIPIENT = re.compile(r" to=([^\s<]+)")
_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"([A-Za-z0-9_-]*)")

#: chat.cpp's lazy triggers: the grammar starts where a call's header does
TRIGGERS = [
    GrammarTrigger("pattern", r"^\s+to$"),
    GrammarTrigger("pattern", r"^<\|channel\|>(?:commentary|analysis)\s+to=functions$"),
    GrammarTrigger("pattern", r"<\|start\|>assistant(\s+to)"),
    GrammarTrigger("pattern", r"<\|start\|>assistant(<\|channel\|>(?:commentary|analysis)\s+to)"),
]


def is_harmony_template(source: str) -> bool:
    """chat.cpp's test: only GPT-OSS's template writes channels."""
    return CHANNEL in source


def adjust_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The template reads an assistant turn's reasoning from ``thinking``; a turn with calls and
    reasoning drops its content (the template would otherwise write both)."""
    out = []
    for m in messages:
        if isinstance(m.get("reasoning_content"), str):
            m = {**m, "thinking": m["reasoning_content"]}
            if m.get("tool_calls"):
                m.pop("content", None)
        out.append(m)
    return out


def end_for_inference(prompt: str) -> str:
    """A prompt rendered without a generation prompt ends its last assistant turn with ``<|return|>``,
    which closes a conversation for good; to go on from it, it becomes ``<|end|>`` (llama.cpp #15417)."""
    at = prompt.rfind(RETURN)
    return prompt if at < 0 else prompt[:at] + END + prompt[at + len(RETURN):]


def _marker_tail(text: str) -> int:
    """The length of the tail of ``text`` that may be the start of a marker (held back while streaming)."""
    at = text.rfind("<", max(0, len(text) - max(map(len, _MARKERS))))
    if at < 0:
        return 0
    tail = text[at:]
    return len(tail) if any(m.startswith(tail) and m != tail for m in _MARKERS) else 0


def _header(head: str) -> tuple[str, str]:
    """The recipient (without a stray ``assistant``) and the last channel named in a message header."""
    recipients = [r for r in _RECIPIENT.findall(head) if r != "assistant"]
    channels = _CHANNEL_NAME.findall(head)
    return (recipients[-1] if recipients else ""), (channels[-1] if channels else "")


def parse_harmony(text: str, partial: bool, res: ParseState, *, reasoning: bool, tool_names: list[str]) -> None:
    """Read a gpt-oss reply (the text after the generation prompt) into ``res``; ``tool_names``: the
    functions the request offers (empty: a ``functions.`` recipient is an unsolicited call, dropped).
    A reply that is not harmony at all (no channel or recipient first) is all content."""
    pos, first = 0, True
    while first or pos < len(text):
        if not first:
            if text.startswith(START, pos):
                pos += len(START)
            elif partial and START.startswith(text[pos:]):
                return
            else:  # stray text after a message: kept as content
                tail = text[pos:]
                res.content += tail[:len(tail) - _marker_tail(tail)] if partial else tail
                return
        elif not (text.startswith(CHANNEL) or text.startswith(" to=")):
            if partial and (CHANNEL.startswith(text) or " to=".startswith(text)):
                return
            res.content = text[:len(text) - _marker_tail(text)] if partial else text
            return
        first = False
        m = text.find(MESSAGE, pos)
        if m < 0:  # the header is not whole yet (or the reply stops inside it)
            return
        head = text[pos:m]
        body = m + len(MESSAGE)
        recipient, channel = _header(head)
        if recipient.startswith("functions.") and recipient[len("functions."):] in tool_names:
            pos = _read_call(text, body, recipient[len("functions."):], partial, res)
            if pos < 0:
                return
            continue
        ends = [(e, mk) for mk in _BODY_ENDS if (e := text.find(mk, body)) >= 0]
        if ends:
            stop, marker = min(ends)
            msg, pos = text[body:stop], stop + len(marker)
        else:
            msg, pos = text[body:], len(text)
            if partial:
                msg = msg[:len(msg) - _marker_tail(msg)]
        if recipient:  # an unsolicited call: nothing of it is shown
            pass
        elif channel == "analysis":
            if reasoning:
                res.reasoning += msg
            else:
                res.content += head + MESSAGE + msg + (END if ends else "")
        else:
            res.content += msg
        if not ends:
            return


def _read_call(text: str, body: int, name: str, partial: bool, res: ParseState) -> int:
    """The arguments' JSON of a call at ``body``; returns where the next message may start (-1: the end)."""
    call = PartialCall(name)
    res.calls.append(call)
    try:
        end = json_end(text, body)
    except Incomplete:
        if partial:
            call.arguments = text[body:]
        else:  # the reply stopped inside the arguments: no call, the text is content
            res.calls.pop()
            res.content += text[body:]
        return -1
    except Malformed:
        res.calls.pop()
        stop = min([e for mk in _BODY_ENDS if (e := text.find(mk, body)) >= 0] or [len(text)])
        res.content += text[body:stop]
        return -1 if stop == len(text) else stop + len(END if text.startswith(END, stop) else CALL)
    call.arguments = text[body:end]
    call.complete = True
    for mk in (CALL, END):
        if text.startswith(mk, end):
            return end + len(mk)
    return end if end < len(text) else -1


def harmony_grammar(conv: SchemaConverter, tools: list[dict[str, Any]], required: bool,
                    rule: Callable[[dict[str, Any], str], str]) -> str:
    """The grammar body of calls to ``tools`` (``rule`` turns a parameters schema into a rule): the
    whole reply with ``required``, else the call alone (the lazy grammar starts at its trigger)."""
    body_text = until_rule(conv, "harmony-body", [END])
    conv.add_rule("harmony-constrain", '( space "<|constrain|>"? [A-Za-z0-9_-]+ )?')
    conv.add_rule("harmony-channel", '"<|channel|>" ( "commentary" | "analysis" )')
    alts = []
    for t in tools:
        fn = t["function"]
        args = rule(fn.get("parameters") or {"type": "object", "properties": {}}, f"tool-{fn['name']}-args")
        to = format_literal(" to=functions." + fn["name"])
        tail = f'harmony-constrain "<|message|>" {args}'
        alts.append(conv.add_rule(f"tool-{fn['name']}", f"{to} harmony-channel {tail} | harmony-channel {to} {tail}"))
    call = conv.add_rule("tool-call", " | ".join(alts))
    if not required:
        return call
    conv.add_rule("harmony-stray", '( "<|channel|>commentary" " to=assistant"? )?')
    conv.add_rule("harmony-any", f'harmony-stray "<|channel|>analysis<|message|>" {body_text} "<|end|>" | '
                                 f'"<|channel|>commentary<|message|>" {body_text} "<|end|>"')
    return f'( harmony-any "<|start|>assistant" )* {call}'


def response_format_grammar(conv: SchemaConverter, json_rule: str) -> str:
    """A json_schema reply: any reasoning messages, then the final channel holding the JSON (chat.cpp's
    response-format rule, which wins over tools for this format)."""
    body_text = until_rule(conv, "harmony-body", [END])
    conv.add_rule("harmony-constrain", '( space "<|constrain|>"? [A-Za-z0-9_-]+ )?')
    conv.add_rule("harmony-stray", '( "<|channel|>commentary" " to=assistant"? )?')
    conv.add_rule("harmony-analysis", f'harmony-stray "<|channel|>analysis<|message|>" {body_text} "<|end|>"')
    return f'( harmony-analysis "<|start|>assistant" )* "<|channel|>final" harmony-constrain "<|message|>" {json_rule}'

