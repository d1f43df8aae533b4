"""Tool calls, reasoning and lazy grammars on /v1/chat/completions: the HTTP side of llm/tool_calls.py.

A chat request's messages (with assistant ``tool_calls`` and ``tool`` results), ``tools``,
``tool_choice``, ``parallel_tool_calls``, ``chat_template_kwargs``, ``reasoning_format`` and
``reasoning_effort`` become a prompt and a :class:`~pyggml.llm.tool_calls.ChatParams` (as
llama-server's oaicompat_chat_params_parse); the reply is then parsed into ``reasoning_content``,
``content`` and ``tool_calls``, streamed as OpenAI's deltas or returned whole with finish reason
"tool_calls". The lazy grammar fields (``grammar_lazy``, ``grammar_triggers``, ``preserved_tokens``)
are read as llama-server reads them, on both completion endpoints.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from ..llm.grammar import GrammarError, GrammarSampler, GrammarTrigger
from ..llm.tool_calls import (
    ChatParams,
    StreamParser,
    ToolCallError,
    apply_chat_template,
    build_response_format_grammar,
    parse_reply,
)
from . import multitask, oai
from .engine import DoneEvent, ErrorEvent, Task, TokenEvent
from .errors import APIError
from .schemas import ChatCompletionRequest, GenerationParams

#: llama-server's common_grammar_trigger_type numbers
TRIGGER_TYPES = {0: "token", 1: "word", 2: "pattern", 3: "pattern_full"}


def render_chat(template: Any, req: ChatCompletionRequest, json_schema: Any = None) -> ChatParams:
    """The prompt and reply handling of a chat request (400 for bad tools, tool_choice, kwargs or messages);
    ``json_schema``: the schema of its json_schema/response_format, whose grammar lets the JSON come
    bare or in a ```json block, as llama-server's; sent with tools it wins (the reply is that JSON, no
    call is parsed), as in llama.cpp's chat handlers."""
    messages = [m.to_template() for m in req.messages]
    kwargs = dict(req.chat_template_kwargs or {})
    if isinstance(kwargs.get("enable_thinking"), str):
        raise APIError('invalid type for "enable_thinking" (expected boolean, got string)')
    if req.reasoning_effort is not None:
        if req.reasoning_effort == "none":
            kwargs["enable_thinking"] = False
        else:
            kwargs["reasoning_effort"] = req.reasoning_effort
    tools = req.tools or []
    if tools and req.tool_choice != "none" and req.grammar:
        raise APIError("Cannot use custom grammar constraints with tools.")
    try:
        params = apply_chat_template(template, messages, tools=tools, tool_choice=req.tool_choice,
                                     parallel_tool_calls=req.parallel_tool_calls,
                                     reasoning_format=req.reasoning_format, chat_template_kwargs=kwargs,
                                     add_generation_prompt=req.add_generation_prompt,
                                     enable_thinking=True)  # llama-server's default: thinking on
    except ToolCallError as e:
        raise APIError(str(e)) from None
    if json_schema is not None:  # as llama-server's chat handlers: the schema wins over the tools' grammar
        try:
            build_response_format_grammar(params, json_schema)
        except GrammarError as e:
            raise APIError(f'"json_schema": {e}') from None
    if req.logprobs and req.stream and params.grammar is not None:
        raise APIError("logprobs is not supported with tools + stream")
    return params


def _triggers(vocab: Any, raw: list[dict[str, Any]], preserved: set[int]) -> list[GrammarTrigger]:
    """llama-server's grammar_triggers: a word that is one token becomes a token trigger (and must be a
    preserved token), the others are kept as they are."""
    out = []
    for i, t in enumerate(raw):
        kind = TRIGGER_TYPES.get(t.get("type")) if isinstance(t.get("type"), int) else None
        value = t.get("value", "")
        if kind is None or not isinstance(value, str):
            raise APIError(f"'grammar_triggers' item {i} must be {{\"type\": 0-3, \"value\": text}} (0 token, 1 word, "
                           "2 pattern, 3 pattern_full)")
        if kind == "token":
            tok = t.get("token")
            if not isinstance(tok, int) or isinstance(tok, bool) or not 0 <= tok < vocab.n_tokens:
                raise APIError(f"'grammar_triggers' item {i}: a token trigger needs a 'token' id of the vocabulary")
            out.append(GrammarTrigger("token", value, tok))
            continue
        if kind == "word":
            ids = vocab.tokenize(value, add_special=False, parse_special=True)
            if len(ids) == 1:
                if ids[0] not in preserved:
                    raise APIError(f"Grammar trigger word should be marked as preserved token: {value}")
                out.append(GrammarTrigger("token", value, ids[0]))
                continue
        out.append(GrammarTrigger(kind, value))
    return out


def preserved_ids(vocab: Any, texts: list[str]) -> set[int]:
    """The ids of the texts that are one token each (llama-server skips the others)."""
    out = set()
    for text in texts:
        ids = vocab.tokenize(text, add_special=False, parse_special=True)
        if len(ids) == 1:
            out.add(ids[0])
    return out


def grammar_sampler(vocab: Any, req: GenerationParams, grammar: str | None, chat: ChatParams | None,
                    preserved: set[int]) -> GrammarSampler | None:
    """The task's grammar: the tool-call grammar of ``chat`` if it has one, else ``grammar`` (the request's
    grammar/json_schema/response_format as GBNF), lazy when the request says so (with its triggers)."""
    lazy, triggers = req.grammar_lazy, list(req.grammar_triggers or [])
    if chat is not None and chat.grammar is not None:
        grammar, lazy = chat.grammar, chat.grammar_lazy
        raw = [{"type": {v: k for k, v in TRIGGER_TYPES.items()}[t.kind], "value": t.value, "token": t.token}
               for t in chat.grammar_triggers]
        triggers = raw + triggers
    if grammar is None:
        if lazy or triggers:
            raise APIError("'grammar_lazy' and 'grammar_triggers' need a grammar ('grammar' or 'json_schema')")
        return None
    trig = _triggers(vocab, triggers, preserved) if lazy else []
    if lazy and not trig:
        raise APIError("Error: no triggers set for lazy grammar!")
    try:
        return GrammarSampler(vocab, grammar, lazy=lazy, triggers=trig)
    except GrammarError as e:
        raise APIError(f"failed to parse grammar: {e}") from None


def final_message(done: DoneEvent, chat: ChatParams | None) -> tuple[dict[str, Any] | None, str | None]:
    """The parsed assistant message and finish reason of a whole reply (None, None: plain content)."""
    if chat is None or not chat.parse:
        return None, None
    reply = parse_reply(done.full_text, chat, partial=done.finish_reason == "length")
    return reply.to_openai(), _finish(done, bool(reply.tool_calls))


def _finish(done: DoneEvent, has_calls: bool) -> str:
    return "tool_calls" if has_calls and done.finish_reason == "stop" else done.finish_reason


async def stream_parsed(task: Task, fmt: oai.Formatter, include_usage: bool, chat: ChatParams) -> AsyncIterator[bytes]:
    """The chat stream of a parsed reply: reasoning, content and tool-call deltas as they become certain."""
    parser = StreamParser(chat, stream_reasoning_as_content=chat.reasoning_format == "deepseek-legacy")
    yield oai.sse(fmt.chunk(None, role=True))
    while True:
        ev = await task.queue.get()
        if isinstance(ev, ErrorEvent):
            yield oai.sse_error(ev.error.body())
            return
        if isinstance(ev, TokenEvent):
            deltas = parser.feed(ev.text)
            probs = [ev.probs] if ev.probs is not None else None
            if not deltas and probs is not None:
                deltas = [{}]
            for i, d in enumerate(deltas):
                yield oai.sse(fmt.delta_chunk(d, probs if i == 0 else None))
            continue
        assert isinstance(ev, DoneEvent)
        reply, deltas = parser.finish(truncated=ev.finish_reason == "length")
        for d in deltas:
            yield oai.sse(fmt.delta_chunk(d))
        for part in oai.stream_end(fmt, fmt.delta_chunk({}, finish=_finish(ev, bool(reply.tool_calls))), ev,
                                   include_usage):
            yield part
        return


async def stream_parsed_choices(tasks: Sequence[Task], fmt: oai.Formatter, include_usage: bool, chat: ChatParams,
                                cancel: Callable[[], None]) -> AsyncIterator[bytes]:
    """``n`` > 1 parsed choices in one stream: a parser per choice, its deltas tagged with the choice's index."""
    legacy = chat.reasoning_format == "deepseek-legacy"
    parsers = [StreamParser(chat, stream_reasoning_as_content=legacy) for _ in tasks]
    for i in range(len(tasks)):
        yield oai.sse(fmt.chunk(None, role=True, index=i))
    first: DoneEvent | None = None
    async for i, ev in multitask.merged(tasks):
        if isinstance(ev, ErrorEvent):
            cancel()
            yield oai.sse_error(ev.error.body())
            return
        if isinstance(ev, TokenEvent):
            deltas = parsers[i].feed(ev.text)
            probs = [ev.probs] if ev.probs is not None else None
            if not deltas and probs is not None:
                deltas = [{}]
            for k, d in enumerate(deltas):
                yield oai.sse(fmt.delta_chunk(d, probs if k == 0 else None, index=i))
            continue
        reply, deltas = parsers[i].finish(truncated=ev.finish_reason == "length")
        for d in deltas:
            yield oai.sse(fmt.delta_chunk(d, index=i))
        yield oai.sse(oai.with_usage(fmt.delta_chunk({}, finish=_finish(ev, bool(reply.tool_calls)), index=i), ev,
                                     include_usage))
        first = first if first is not None else ev
    if include_usage and first is not None:
        yield oai.sse(fmt.usage_chunk(first))
    yield oai.sse("[DONE]")
