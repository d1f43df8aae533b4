"""The HTTP side: starlette routes with llama-server's paths, fields and error objects.

Every handler runs through :func:`_guarded`, so whatever a client sends (garbage bytes, a body far
over the limit, fields of the wrong type, a prompt longer than the context) is answered with a
JSON error object and the server goes on. Requests are authenticated first (``--api-key``: a
``Authorization: Bearer KEY`` or ``X-Api-Key`` header; /health stays public, as in llama-server).

Completions wait on their task's queue while a watcher reads the connection's ASGI ``receive``:
an ``http.disconnect`` cancels the task, so the engine frees the slot at its next step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ..llm.chat import ChatTemplateError
from ..llm.grammar import GrammarError, GrammarSampler
from ..llm.grammar.json_schema import json_schema_to_grammar
from ..llm.samplers import dry_breakers
from ..llm.sampling import (
    LLAMA_DEFAULT_SEED,
    SamplingParams,
    dry_enabled,
    samplers_from_chars,
    samplers_from_names,
)
from ..llm.tokenizer.errors import TokenizeError
from . import metrics, multitask, oai, toolchat
from .engine import DoneEvent, Engine, ErrorEvent, Task, TaskParams, TokenEvent
from .errors import APIError, ErrorType, error_body
from .schemas import (
    FLT_MAX,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    GenerationParams,
    TokenizeRequest,
    parse,
)
from .textstop import StopSet
from .tokenwork import ClientGone, tokenize_bounded

PUBLIC_PATHS = {"/health", "/v1/health"}  # no API key needed (llama-server's public endpoints)


@dataclass
class ServerState:
    """What the routes need: the engine, the vocabulary, the chat template and the server's options."""

    engine: Engine
    vocab: Any
    model_name: str
    template: Any = None  # a ChatTemplate, or None when the model has none
    template_error: str = ""
    api_keys: list[str] = field(default_factory=list)
    metrics: bool = False
    slots: bool = True
    max_body: int = 8 << 20
    model_meta: dict[str, Any] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)  # request fields' values when a request omits them
    max_prompt_bytes: int = 0  # a prompt longer than this cannot fit a slot (0: no early check)
    registry: Any = None
    slot_save_path: str = ""  # --slot-save-path: the directory of /slots/{id}?action=save|restore files
    embd_ctx: Any = None  # --embedding: the LlamaContext of /v1/embeddings (embeddings on, the server's pooling)
    spm_infill: bool = False  # --spm-infill: /infill's prompt in suffix/prefix/middle order
    #: one text tokenization at a time: each holds the GIL for up to the bound above, and many at once
    #: would starve the decode thread (clients whose turn comes after they left are skipped)
    tokenize_lock: anyio.Lock = field(default_factory=anyio.Lock)


def json_error(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.kind.status)


Handler = Callable[[Request, ServerState], Awaitable[Response]]


def _guarded(state: ServerState, handler: Handler, public: bool = False) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            if not public and state.api_keys:
                _authenticate(request, state.api_keys)
            return await handler(request, state)
        except APIError as e:
            return json_error(e)
        except TokenizeError as e:  # text the tokenizer cannot take is the client's error
            return json_error(APIError(f"cannot tokenize the request's text: {e}"))
        except ClientGone:
            return Response(status_code=499)  # nobody reads this
        except Exception as e:  # a bug must not take the server down: a JSON 500, the server goes on
            return json_error(APIError(f"internal server error: {type(e).__name__}: {e}", ErrorType.SERVER))

    return endpoint


def _authenticate(request: Request, keys: list[str]) -> None:
    given = request.headers.get("authorization") or request.headers.get("x-api-key") or ""
    if given.startswith("Bearer "):
        given = given[len("Bearer "):]
    if given not in keys:
        raise APIError("Invalid API Key", ErrorType.AUTHENTICATION)


async def tokenize_text(request: Request, state: ServerState, work: Callable[[Callable[[], bool]], Any]) -> Any:
    """Run ``work(cancelled)`` (tokenizing bounded text, see tokenwork.py) in a worker thread, one at a
    time; skipped when the client has gone while it waited for its turn, stopped at its next piece when
    the client goes during it."""
    gone = threading.Event()
    outcome: dict[str, Any] = {}

    def run() -> None:  # the work's error is raised out here, not from inside the watcher's task group
        try:
            outcome["value"] = work(gone.is_set)
        except Exception as e:
            outcome["error"] = e

    async with state.tokenize_lock:
        if await request.is_disconnected():
            raise ClientGone
        async with _watch_disconnect(request.receive, gone.set):
            await anyio.to_thread.run_sync(run)
    if "error" in outcome:
        raise outcome["error"]
    if "value" not in outcome:  # the watcher cancelled the wait: the client is gone
        raise ClientGone
    return outcome["value"]


def _prompt_tokens(vocab: Any, text: str, state: ServerState, cancelled: Callable[[], bool]) -> list[int]:
    """A prompt's tokens, refused (as llama-server refuses them) once they prove more than a slot holds."""
    _check_prompt_bytes(text, state)
    limit = state.engine.n_slot_ctx - 1
    tokens = tokenize_bounded(vocab, text, limit, cancelled, add_special=True, parse_special=True)
    if tokens is None:
        raise APIError(f"request (more than {limit} tokens) exceeds the available context size "
                       f"({state.engine.n_slot_ctx} tokens), try increasing it", ErrorType.EXCEED_CONTEXT_SIZE)
    return tokens


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) as soon as it passes ``limit`` bytes, announced or not."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise APIError(f"the request body ({int(declared)} bytes) is larger than the limit of {limit} bytes",
                       ErrorType.PAYLOAD_TOO_LARGE)
    chunks, n = [], 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > limit:
            raise APIError(f"the request body is larger than the limit of {limit} bytes", ErrorType.PAYLOAD_TOO_LARGE)
        chunks.append(chunk)
    return b"".join(chunks)


# ---------------------------------------------------------------------- simple endpoints
async def health(request: Request, state: ServerState) -> Response:
    return JSONResponse({"status": "ok"})


async def models(request: Request, state: ServerState) -> Response:
    info = {"id": state.model_name, "aliases": [state.model_name], "object": "model", "created": int(time.time()),
            "owned_by": "llamacpp", "meta": state.model_meta}
    return JSONResponse({"object": "list", "data": [info]})


async def get_metrics(request: Request, state: ServerState) -> Response:
    if not state.metrics:
        raise APIError("This server does not support metrics endpoint. Start it with `--metrics`",
                       ErrorType.NOT_SUPPORTED)
    return Response(metrics.render(state.registry), media_type=metrics.CONTENT_TYPE)


async def get_slots(request: Request, state: ServerState) -> Response:
    if not state.slots:
        raise APIError("This server does not support slots endpoint. Start it with `--slots`", ErrorType.NOT_SUPPORTED)
    out = []
    for s in state.engine.slots:
        task = s.task or s.last_task
        item: dict[str, Any] = {"id": s.id, "n_ctx": s.n_ctx, "speculative": False, "is_processing": s.is_processing,
                                "state": s.state, "n_cached_tokens": len(s.cached)}
        if task is not None:
            p = task.params
            item.update({"id_task": task.id, "n_prompt_tokens": len(task.tokens),
                         "n_prompt_tokens_processed": s.n_prompt_done - s.n_cached,
                         "n_prompt_tokens_cache": s.n_cached,
                         "params": {"n_predict": p.n_predict, "temperature": p.sampling.temp,
                                    "top_k": p.sampling.top_k, "top_p": p.sampling.top_p, "min_p": p.sampling.min_p,
                                    "typical_p": p.sampling.typ_p, "top_n_sigma": p.sampling.top_n_sigma,
                                    "xtc_probability": p.sampling.xtc_probability,
                                    "dry_multiplier": p.sampling.dry_multiplier, "mirostat": p.sampling.mirostat,
                                    "samplers": list(p.sampling.samplers),
                                    "seed": p.sampling.seed, "stop": p.stop, "n_probs": p.n_probs,
                                    "cache_prompt": p.cache_prompt},
                         "next_token": [{"has_next_token": s.is_processing, "has_new_line": False,
                                         "n_remain": s.n_remain(), "n_decoded": s.n_decoded}]})
        out.append(item)
    return JSONResponse(out)


async def tokenize(request: Request, state: ServerState) -> Response:
    req = parse(await read_body(request, state.max_body), TokenizeRequest)
    _check_text_bytes(req.content, "content", state)
    vocab, limit = state.vocab, state.engine.n_slot_ctx

    def work(cancelled: Callable[[], bool]) -> list[int]:
        toks = tokenize_bounded(vocab, req.content, limit, cancelled, req.add_special, req.parse_special)
        if toks is None:
            raise APIError(f"'content' has more than {limit} tokens, the context of a slot: this server tokenizes "
                           "no more than it could take as a prompt")
        return toks

    toks = await tokenize_text(request, state, work)
    if not req.with_pieces:
        return JSONResponse({"tokens": toks})
    pieces = []
    for t in toks:
        raw = state.vocab.token_to_piece(t, special=True)
        try:
            piece: str | list[int] = raw.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(raw)  # a piece that is not whole UTF-8: its bytes, as llama-server
        pieces.append({"id": t, "piece": piece})
    return JSONResponse({"tokens": pieces})


async def detokenize(request: Request, state: ServerState) -> Response:
    req = parse(await read_body(request, state.max_body), DetokenizeRequest)
    n_ctx = state.engine.n_slot_ctx * len(state.engine.slots)
    if len(req.tokens) > n_ctx:
        raise APIError(f"'tokens' has {len(req.tokens)} ids, more than the context of {n_ctx} tokens this server "
                       "holds")
    _check_ids(req.tokens, state.vocab.n_tokens)
    return JSONResponse({"content": state.vocab.detokenize(req.tokens)})


def _check_prompt_bytes(text: str, state: ServerState) -> None:
    """Refuse a prompt whose bytes alone prove it too long for a slot (more bytes than n_ctx tokens of the
    vocabulary's longest piece can spell), before spending seconds of CPU tokenizing megabytes."""
    n = len(text.encode("utf-8", errors="replace"))
    if state.max_prompt_bytes and n > state.max_prompt_bytes:
        raise APIError(f"request ({n} bytes) exceeds the available context size ({state.engine.n_slot_ctx} tokens): "
                       "it cannot fit whatever its tokens, try increasing it", ErrorType.EXCEED_CONTEXT_SIZE)


def _check_text_bytes(text: str, name: str, state: ServerState) -> None:
    """/tokenize's bound: text no slot could hold as a prompt is refused from its byte count, so its
    tokenizing costs at most what a prompt's does (8 MB of it took ~55 s of CPU and GBs of memory)."""
    n = len(text.encode("utf-8", errors="replace"))
    if state.max_prompt_bytes and n > state.max_prompt_bytes:
        raise APIError(f"'{name}' has {n} bytes, more than the limit of {state.max_prompt_bytes} bytes: the text "
                       f"of the longest prompt a slot ({state.engine.n_slot_ctx} tokens) can hold")


def _check_ids(tokens: list[int], n_vocab: int) -> None:
    bad = [t for t in tokens if not 0 <= t < n_vocab]
    if bad:
        raise APIError(f"invalid token id {bad[0]}: ids are 0 to {n_vocab - 1}")


# ---------------------------------------------------------------------- completions
def task_params(req: GenerationParams, n_probs: int, defaults: dict[str, Any] | None = None,
                vocab: Any = None) -> TaskParams:
    """The task's parameters: the request's fields, and for those it leaves out the server's defaults
    (its --temp, --top-k, ... -n flags, as llama-server's command-line sampling settings). ``vocab``
    checks and tokenizes ``logit_bias`` (without it, ``logit_bias`` is refused)."""
    d = defaults or {}
    given = req.model_fields_set

    def pick(name: str) -> Any:
        return getattr(req, name) if name in given or name not in d else d[name]

    seed = pick("seed")
    seed = LLAMA_DEFAULT_SEED if seed is None or seed < 0 else seed & 0xFFFFFFFF
    base = SamplingParams()
    dry_base = pick("dry_base")
    breakers = req.dry_sequence_breakers if req.dry_sequence_breakers is not None else \
        d.get("dry_sequence_breakers", base.dry_sequence_breakers)
    bias = _logit_bias(req.logit_bias, vocab) if req.logit_bias is not None else d.get("logit_bias", ())
    if req.ignore_eos and vocab is not None:  # llama-server bans every end-of-generation token (logit_bias_eog)
        bias = [*bias, *((t, -math.inf) for t in sorted(vocab.eog_ids))]
    sp = SamplingParams(seed=seed, top_k=pick("top_k"), top_p=pick("top_p"), min_p=pick("min_p"),
                        temp=pick("temperature"), penalty_last_n=pick("repeat_last_n"),
                        penalty_repeat=pick("repeat_penalty"), penalty_freq=pick("frequency_penalty"),
                        penalty_present=pick("presence_penalty"), typ_p=pick("typical_p"),
                        top_n_sigma=pick("top_n_sigma"), xtc_probability=pick("xtc_probability"),
                        xtc_threshold=pick("xtc_threshold"), dry_multiplier=pick("dry_multiplier"),
                        dry_base=dry_base if dry_base >= 1.0 else d.get("dry_base", base.dry_base),
                        dry_allowed_length=pick("dry_allowed_length"), dry_penalty_last_n=pick("dry_penalty_last_n"),
                        dry_sequence_breakers=tuple(breakers), mirostat=pick("mirostat"),
                        mirostat_tau=pick("mirostat_tau"), mirostat_eta=pick("mirostat_eta"),
                        min_keep=req.min_keep, logit_bias=tuple(bias),
                        samplers=_samplers(req.samplers) if req.samplers is not None else
                        d.get("samplers", base.samplers))
    n_predict = req.n_predict_value(d.get("n_predict", -1))
    stop = req.stop_list()
    # DRY's breakers are tokenized here, in the request's thread, not by the engine between two decodes
    breakers = dry_breakers(vocab, sp.dry_sequence_breakers) if dry_enabled(sp) and vocab is not None else None
    return TaskParams(n_predict=n_predict, sampling=sp, stop=stop, stops=StopSet(stop), n_probs=n_probs,
                      cache_prompt=req.cache_prompt, ignore_eos=req.ignore_eos, dry_breakers=breakers)


def _samplers(value: list[str] | str) -> tuple[str, ...]:
    """``samplers``: llama.cpp's names, or a string of their letters; an unknown one is a 400 naming it."""
    try:
        return samplers_from_chars(value) if isinstance(value, str) else samplers_from_names(value)
    except ValueError as e:
        raise APIError(f"'samplers': {e}") from None


def _logit_bias(value: list[Any] | dict[str, Any], vocab: Any) -> list[tuple[int, float]]:
    """``logit_bias`` as llama-server reads it: ``[[token, bias], ...]`` or ``{"token": bias}``, a token being
    an id or a text (each of its tokens gets the bias), a bias a number or ``false`` (banned). Unlike
    llama-server, which skips what it cannot read, a bad entry is a 400 naming it."""
    if vocab is None:
        raise APIError("'logit_bias' is not supported here", ErrorType.NOT_SUPPORTED)
    pairs = value.items() if isinstance(value, dict) else value
    out: list[tuple[int, float]] = []
    for i, entry in enumerate(pairs):
        if not isinstance(value, dict) and (not isinstance(entry, list) or len(entry) != 2):
            raise APIError(f"'logit_bias' entry {i} must be a [token, bias] pair, got {json_preview(entry)}")
        key, bias = entry
        if bias is False:
            b = -math.inf
        elif isinstance(bias, int | float) and not isinstance(bias, bool) and math.isfinite(bias):
            b = float(min(max(bias, -FLT_MAX), FLT_MAX))
        else:
            raise APIError(f"'logit_bias' entry {i}: the bias must be a finite number or false, got "
                           f"{json_preview(bias)}")
        if isinstance(value, dict) and key.lstrip("-").isdigit():
            key = int(key)
        if isinstance(key, int) and not isinstance(key, bool):
            if not 0 <= key < vocab.n_tokens:
                raise APIError(f"'logit_bias' entry {i}: token {key} is not in the vocabulary "
                               f"(ids 0 to {vocab.n_tokens - 1})")
            out.append((key, b))
        elif isinstance(key, str):
            out += [(t, b) for t in vocab.tokenize(key, add_special=False, parse_special=False)]
        else:
            raise APIError(f"'logit_bias' entry {i}: the token must be an id or a text, got {json_preview(key)}")
    return out


def json_preview(v: Any) -> str:
    return json.dumps(v)[:60] if isinstance(v, str | int | float | bool | type(None)) else type(v).__name__


def grammar_text(req: GenerationParams, as_schema: bool = False) -> Any:
    """The GBNF a request asks for, as llama-server reads it: "grammar", or "json_schema" converted (an
    empty schema is any object; on /v1/completions it wins over "grammar", on chat both are refused),
    and on chat requests OpenAI's "response_format" ("json_object", with an optional "schema", or
    "json_schema": {"schema": ...}). ``as_schema``: the JSON schema itself (None when there is none),
    which a chat wraps as llama-server does (tool_calls.build_response_format_grammar)."""
    schema: Any = req.json_schema
    grammar = req.grammar or ""
    if isinstance(req, ChatCompletionRequest) and schema is not None and grammar:  # oaicompat_chat_params_parse
        raise APIError("Cannot use both json_schema and grammar")
    fmt = getattr(req, "response_format", None)
    if fmt is not None:
        kind = fmt.get("type", "")
        kind = kind if isinstance(kind, str) else ""
        if kind == "json_object":
            if "schema" in fmt or not schema:
                schema = fmt.get("schema", {})
        elif kind == "json_schema":
            wrapper = fmt.get("json_schema", {})
            schema = wrapper.get("schema", {}) if isinstance(wrapper, dict) else {}
        elif kind and kind != "text":
            raise APIError(f'response_format type must be one of "text" or "json_object", but got: {kind}')
        if schema is not None and grammar:
            raise APIError("Cannot use both json_schema and grammar")
    if schema is not None and not grammar:
        if isinstance(schema, dict) and not schema:
            schema = {"type": "object"}  # an empty schema means any object
        if as_schema:
            return schema
        try:
            return json_schema_to_grammar(schema, warn=lambda _msg: None)
        except GrammarError as e:
            raise APIError(f'"json_schema": {e}') from None
    return None if as_schema else grammar or None


async def _grammar_sampler(state: ServerState, req: GenerationParams, chat: Any = None,
                           preserved: set[int] | None = None) -> GrammarSampler | None:
    """The request's grammar over the model's vocabulary (parsed before the task is queued, so a bad
    grammar is a 400 error): a chat's tool-call grammar, or the request's, lazy when it asks
    (toolchat.grammar_sampler)."""
    text = grammar_text(req) if chat is None or chat.grammar is None else None
    if text is None and chat is None and not req.grammar_lazy and not req.grammar_triggers:
        return None

    def build() -> GrammarSampler | None:
        return toolchat.grammar_sampler(state.vocab, req, text, chat, preserved or set())

    return await anyio.to_thread.run_sync(build)


async def completions(request: Request, state: ServerState) -> Response:
    req = parse(await read_body(request, state.max_body), CompletionRequest)
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:  # several prompts: a choice each (times n), as llama-server
            texts, vocab = list(prompt), state.vocab
            prompts = await tokenize_text(request, state, lambda cancelled: [
                _prompt_tokens(vocab, t, state, cancelled) for t in texts])
            return await _run(request, state, req, prompts[0], req.n_probs_value(), chat=False, prompts=prompts)
        prompt = prompt[0]
    if isinstance(prompt, str):
        text, vocab = prompt, state.vocab
        tokens = await tokenize_text(request, state, lambda cancelled: _prompt_tokens(vocab, text, state, cancelled))
    else:
        tokens = list(prompt)
        _check_ids(tokens, state.vocab.n_tokens)
    return await _run(request, state, req, tokens, req.n_probs_value(), chat=False)


async def chat_completions(request: Request, state: ServerState) -> Response:
    req = parse(await read_body(request, state.max_body), ChatCompletionRequest)
    if state.template is None:
        raise APIError(state.template_error, ErrorType.NOT_SUPPORTED)
    rendered: list[Any] = []

    def render(cancelled: Callable[[], bool]) -> list[int]:
        try:  # tools, tool_choice, reasoning and template kwargs: toolchat.py
            rendered.append(toolchat.render_chat(state.template, req, grammar_text(req, as_schema=True)))
        except ChatTemplateError as e:
            raise APIError(str(e)) from None
        return _prompt_tokens(state.vocab, rendered[0].prompt, state, cancelled)

    tokens = await tokenize_text(request, state, render)
    return await _run(request, state, req, tokens, req.n_probs_value(), chat=True, chat_params=rendered[0])


async def _run(request: Request, state: ServerState, req: GenerationParams, tokens: list[int], n_probs: int,
               chat: bool, chat_params: Any = None, prompts: list[list[int]] | None = None) -> Response:
    # compiles the stop list, tokenizes logit_bias texts
    multitask.check_n(req.n, len(state.engine.slots))
    params = await anyio.to_thread.run_sync(task_params, req, n_probs, state.defaults, state.vocab)
    preserved = toolchat.preserved_ids(state.vocab, (req.preserved_tokens or [])
                                       + (chat_params.preserved_tokens if chat_params is not None else []))
    params.preserved = frozenset(preserved)
    params.grammar = await _grammar_sampler(state, req, chat_params, preserved)
    if req.n > 1 or prompts is not None:
        return await _run_choices(request, state, req, prompts or [tokens], params, n_probs, chat, chat_params)
    task = Task(tokens, params)
    state.engine.submit(task)
    fmt = oai.Formatter(chat, req.model or state.model_name)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        body = toolchat.stream_parsed(task, fmt, include_usage, chat_params) if chat_params is not None \
            and chat_params.parse else _stream(task, fmt, include_usage)
        return EventStream(body, lambda: state.engine.cancel(task))
    probs: list[dict[str, Any]] = []
    async with _watch_disconnect(request.receive, lambda: state.engine.cancel(task)):
        while True:
            ev = await task.queue.get()
            if isinstance(ev, ErrorEvent):
                raise ev.error
            if isinstance(ev, TokenEvent):
                if ev.probs is not None:
                    probs.append(ev.probs)
                continue
            message, finish = toolchat.final_message(ev, chat_params)
            return JSONResponse(fmt.full(ev, probs if n_probs > 0 else None, message=message, finish=finish))
    return Response(status_code=499)  # the client went away (nobody reads this)


async def _run_choices(request: Request, state: ServerState, req: GenerationParams, prompts: list[list[int]],
                       params: TaskParams, n_probs: int, chat: bool, chat_params: Any = None) -> Response:
    """``n`` > 1 or several prompts: one task per choice, as llama-server's tasks and child tasks (each its own
    grammar state); the choices are indexed prompt by prompt, n each, and, as in llama-server, ``usage`` is the
    first choice's."""
    n_tasks = len(prompts) * req.n
    plist = [params] + [dataclasses.replace(params, grammar=await _grammar_sampler(state, req, chat_params,
                                                                                 set(params.preserved)))
                        for _ in range(n_tasks - 1)]
    tasks = multitask.submit_all(state.engine, [t for t in prompts for _ in range(req.n)], plist)
    cancel = multitask.cancel_all(state.engine, tasks)
    fmt = oai.Formatter(chat, req.model or state.model_name)
    parsed = chat_params is not None and chat_params.parse  # each choice parsed on its own
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        body = toolchat.stream_parsed_choices(tasks, fmt, include_usage, chat_params, cancel) if parsed \
            else _stream_choices(tasks, fmt, include_usage, cancel)
        return EventStream(body, cancel)
    async with _watch_disconnect(request.receive, cancel):
        outs = await multitask.collect(tasks, n_probs > 0)
        choices = []
        for i, o in enumerate(outs):
            message, finish = toolchat.final_message(o.done, chat_params)
            choices.append(fmt.full(o.done, o.probs if n_probs > 0 else None, i, message=message,
                                    finish=finish)["choices"][0])
        body = fmt.full(outs[0].done, None)
        body["choices"] = choices
        return JSONResponse(body)
    return Response(status_code=499)  # the client went away (nobody reads this)


async def _stream_choices(tasks: list[Task], fmt: oai.Formatter, include_usage: bool,
                          cancel: Callable[[], None]) -> AsyncIterator[bytes]:
    if fmt.chat:
        for i in range(len(tasks)):
            yield oai.sse(fmt.chunk(None, role=True, index=i))
    first: DoneEvent | None = None
    async for i, ev in multitask.merged(tasks):
        if isinstance(ev, ErrorEvent):
            cancel()
            yield oai.sse_error(ev.error.body())
            return
        if isinstance(ev, TokenEvent):
            if ev.text or ev.probs is not None:
                yield oai.sse(fmt.chunk(ev.text, [ev.probs] if ev.probs is not None else None, index=i))
            continue
        yield oai.sse(oai.with_usage(fmt.chunk(None if fmt.chat else "", finish=ev.finish_reason, index=i), ev,
                                     include_usage))
        first = first if first is not None else ev
    if include_usage and first is not None:
        yield oai.sse(fmt.usage_chunk(first))
    yield oai.sse("[DONE]")


async def _stream(task: Task, fmt: oai.Formatter, include_usage: bool) -> AsyncIterator[bytes]:
    if fmt.chat:
        yield oai.sse(fmt.chunk(None, role=True))
    while True:
        ev = await task.queue.get()
        if isinstance(ev, ErrorEvent):
            yield oai.sse_error(ev.error.body())
            return
        if isinstance(ev, TokenEvent):
            if ev.text or ev.probs is not None:
                yield oai.sse(fmt.chunk(ev.text, [ev.probs] if ev.probs is not None else None))
            continue
        assert isinstance(ev, DoneEvent)
        for part in oai.stream_end(fmt, fmt.chunk(None if fmt.chat else "", finish=ev.finish_reason), ev,
                                   include_usage):
            yield part
        return


@contextlib.asynccontextmanager
async def _watch_disconnect(receive: Receive, on_disconnect: Callable[[], None]) -> AsyncIterator[None]:
    """Run the body of the ``with`` while reading ``receive``: a disconnect calls ``on_disconnect`` and
    cancels the body. Leaving the block early (an error) also calls it, so no slot is left working."""
    done = False
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    on_disconnect()
                    tg.cancel_scope.cancel()
                    return

        tg.start_soon(watch)
        try:
            yield
            done = True
        finally:
            if not done:
                on_disconnect()
            tg.cancel_scope.cancel()


class EventStream(Response):
    """A text/event-stream response that cancels its task when the client goes away.

    Starlette's StreamingResponse no longer watches for disconnects under ASGI 2.4; this one reads
    ``receive`` beside the stream, as llama-server checks its socket, so a client that drops mid-stream
    frees its slot within one decode step.
    """

    media_type = "text/event-stream"

    def __init__(self, body: AsyncIterator[bytes], on_disconnect: Callable[[], None]) -> None:
        self.status_code = 200
        self.background = None
        # no content-length: the body is sent in pieces
        self.raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
        self.body_iter = body
        self.on_disconnect = on_disconnect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        finished = False
        try:
            async with _watch_disconnect(receive, self.on_disconnect):
                async for chunk in self.body_iter:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                finished = True
        except OSError:  # the client is gone
            self.on_disconnect()
        finally:
            if not finished:
                self.on_disconnect()
            with contextlib.suppress(Exception):
                await self.body_iter.aclose()  # type: ignore[attr-defined]


# ---------------------------------------------------------------------- the application
async def not_found(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 404)
    if status == 405:
        body = error_body(f"method {request.method} is not allowed on {request.url.path}", ErrorType.INVALID_REQUEST)
        body["error"]["code"] = 405
        return JSONResponse(body, status_code=405)
    return JSONResponse(error_body(f"File Not Found: {request.url.path}", ErrorType.NOT_FOUND), status_code=404)


def create_app(state: ServerState) -> Starlette:
    if state.registry is None:
        state.registry = metrics.make_registry(state.engine)

    def route(path: str, handler: Handler, method: str) -> Route:
        return Route(path, _guarded(state, handler, public=path in PUBLIC_PATHS), methods=[method])

    routes = [
        route("/health", health, "GET"), route("/v1/health", health, "GET"),
        route("/v1/models", models, "GET"), route("/models", models, "GET"),
        route("/metrics", get_metrics, "GET"), route("/slots", get_slots, "GET"),
        route("/tokenize", tokenize, "POST"), route("/detokenize", detokenize, "POST"),
        route("/v1/completions", completions, "POST"),
        route("/v1/chat/completions", chat_completions, "POST"), route("/chat/completions", chat_completions, "POST"),
    ]
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})
    # no 307 to the path without its trailing slash (its Location would be built from the Host header):
    # an unknown path is a 404, as llama-server's
    app.router.redirect_slashes = False
    return app

