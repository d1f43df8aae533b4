"""llama-server's native endpoints: /completion (and /completions), /infill, /props, /apply-template.

/completion takes a prompt as a string, token ids, ids and strings mixed (one prompt), or a list of
such prompts (one result each, answered as an array); ``n_cmpl`` (alias ``n``) more outputs per
prompt. Its reply is llama-server's: ``content``, ``tokens`` (with ``return_tokens``), ``stop``,
``stop_type`` (eos / word / limit), ``stopping_word``, ``tokens_predicted``, ``tokens_evaluated``,
``tokens_cached``, ``generation_settings``, ``timings`` and, with ``n_probs``, the
``completion_probabilities`` of every token. Streamed, each token is a ``data:`` event with the
partial fields and the last one is the full reply with empty content (no ``[DONE]``, as llama-server).

/infill is /completion over llama-server's fill-in-the-middle prompt (format_prompt_infill): the
repo-level pattern of Qwen2.5-Coder and others, ``[FIM_REP]myproject\\n [FIM_SEP]file\\n extra ...
[FIM_SEP]filename\\n [FIM_PRE]prefix [FIM_SUF]suffix [FIM_MID]prompt``, the prefix and suffix cut to fit
one batch (3:1) and the extra chunks to what the slot's context leaves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

import anyio
import numpy as np
from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..llm.chat import ChatTemplateError
from . import multitask, oai
from .app import (
    EventStream,
    ServerState,
    _check_ids,
    _check_prompt_bytes,
    _grammar_sampler,
    _watch_disconnect,
    grammar_text,
    read_body,
    task_params,
    tokenize_text,
)
from .engine import DoneEvent, ErrorEvent, Task, TaskParams, TokenEvent
from .errors import APIError, ErrorType
from .schemas import _CONFIG, ChatCompletionRequest, GenerationParams, parse
from .tokenwork import tokenize_bounded

#: what llama-server's generation_settings report for features pyggml does not have (their off values)
_FIXED_SETTINGS = {"dynatemp_range": 0.0, "dynatemp_exponent": 1.0, "adaptive_target": -1.0, "adaptive_decay": 0.9}


class NativeCompletionRequest(GenerationParams):
    """/completion's body: the shared generation fields and the native ones."""

    prompt: str | list[Any]
    return_tokens: bool = False
    id_slot: int = -1
    n_cmpl: Annotated[int, Field(ge=1)] | None = None  # outputs per prompt (llama-server reads "n" as its alias)
    post_sampling_probs: bool = False
    timings_per_token: bool = False
    response_fields: list[str] | None = None

    def n_outputs(self) -> int:
        return self.n_cmpl if self.n_cmpl is not None else self.n


class ExtraChunk(BaseModel):
    """One file of /infill's repository context."""

    model_config = _CONFIG
    text: str
    filename: str = "tmp"


class InfillRequest(NativeCompletionRequest):
    prompt: str = ""  # text after the FIM middle token (the start of the answer)
    input_prefix: str | list[Any]
    input_suffix: str | list[Any]
    input_extra: list[ExtraChunk] = Field(default_factory=list)


# ---------------------------------------------------------------------- prompts
def _is_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def split_prompts(prompt: str | list[Any]) -> list[str | list[Any]]:
    """llama-server's tokenize_input_prompts: an array without numbers is several prompts (strings, id
    lists or mixed lists); anything else is one."""
    if isinstance(prompt, list) and not any(_is_id(x) for x in prompt):
        if not prompt:
            raise APIError('"prompt" must not be empty')
        return list(prompt)
    return [prompt]


def mixed_tokens(state: ServerState, prompt: Any, add_special: bool, parse_special: bool, what: str,
                 cancelled: Callable[[], bool]) -> list[int]:
    """llama-server's tokenize_mixed: a string, or a list of ids and strings (BOS, when the vocabulary adds
    one, only before a string that comes first); every id is checked, the text bounded like a prompt."""
    parts = [prompt] if isinstance(prompt, str) else prompt
    if not isinstance(parts, list):
        raise APIError(f"{what} must be a string, token ids, or a list of both, got {type(prompt).__name__}")
    _check_prompt_bytes("".join(p for p in parts if isinstance(p, str)), state)
    limit = state.engine.n_slot_ctx - 1
    out: list[int] = []
    for i, p in enumerate(parts):
        if isinstance(p, str):
            toks = tokenize_bounded(state.vocab, p, limit, cancelled, add_special=add_special and i == 0,
                                    parse_special=parse_special)
            if toks is None:
                raise APIError(f"{what} (more than {limit} tokens) exceeds the available context size "
                               f"({state.engine.n_slot_ctx} tokens), try increasing it",
                               ErrorType.EXCEED_CONTEXT_SIZE)
            out += toks
        elif _is_id(p):
            out.append(p)
        else:
            raise APIError(f"{what}: element {i} must be a token id or a string, got {type(p).__name__}")
    _check_ids(out, state.vocab.n_tokens)
    return out


def format_infill(state: ServerState, prefix: list[int], suffix: list[int], extra: list[ExtraChunk],
                  prompt: list[int], n_predict: int) -> list[int]:
    """The FIM prompt, token for token as llama-server's format_prompt_infill lays it out (its n_batch,
    n_predict and n_ctx being this server's batch size, -n and slot context)."""
    v = state.vocab
    n_batch, n_ctx = state.engine.ctx.n_batch, state.engine.n_slot_ctx

    def tok(text: str) -> list[int]:
        return v.tokenize(text, add_special=False, parse_special=False)

    extra_tokens: list[int] = []
    if v.fim_rep >= 0:
        extra_tokens += [v.fim_rep, *tok("myproject\n")]
    for chunk in extra:
        if v.fim_sep >= 0:
            extra_tokens += [v.fim_sep, *tok(chunk.filename + "\n")]
        else:
            extra_tokens += tok("\n\n--- snippet ---\n\n")
        extra_tokens += tok(chunk.text)
    if v.fim_sep >= 0:
        extra_tokens += [v.fim_sep, *tok("filename\n")]
    n_prefix_take = min(len(prefix), 3 * (n_batch // 4))
    n_suffix_take = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))
    n_extra_take = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_tokens))
    pre = [v.fim_pre, *prefix[len(prefix) - n_prefix_take:], *prompt]
    suf = [v.fim_suf, *suffix[:n_suffix_take]]
    head, tail = (suf, pre) if state.spm_infill else (pre, suf)  # --spm-infill: suffix/prefix/middle
    if v.add_bos:
        head.insert(0, v.bos)
    return extra_tokens[len(extra_tokens) - n_extra_take:] + head + tail + [v.fim_mid]


# ---------------------------------------------------------------------- replies
def _f32(x: float) -> float:
    """llama-server keeps sampling values as float and prints them as double: 0.95 reads 0.949999988079071."""
    return float(np.float32(x))


def generation_settings(p: TaskParams, stream: bool, grammar: str, only_metrics: bool = False) -> dict[str, Any]:
    """llama-server's task_params::to_json, for the parts pyggml has (its other features at their off values)."""
    sp = p.sampling
    out: dict[str, Any] = {
        "seed": sp.seed, "temperature": _f32(sp.temp), "dynatemp_range": _FIXED_SETTINGS["dynatemp_range"],
        "dynatemp_exponent": _FIXED_SETTINGS["dynatemp_exponent"], "top_k": sp.top_k, "top_p": _f32(sp.top_p),
        "min_p": _f32(sp.min_p), "top_n_sigma": _f32(sp.top_n_sigma), "xtc_probability": _f32(sp.xtc_probability),
        "xtc_threshold": _f32(sp.xtc_threshold), "typical_p": _f32(sp.typ_p), "repeat_last_n": sp.penalty_last_n,
        "repeat_penalty": _f32(sp.penalty_repeat), "presence_penalty": _f32(sp.penalty_present),
        "frequency_penalty": _f32(sp.penalty_freq), "dry_multiplier": _f32(sp.dry_multiplier),
        "dry_base": _f32(sp.dry_base), "dry_allowed_length": sp.dry_allowed_length,
        "dry_penalty_last_n": sp.dry_penalty_last_n, "dry_sequence_breakers": list(sp.dry_sequence_breakers),
        "mirostat": sp.mirostat, "mirostat_tau": _f32(sp.mirostat_tau), "mirostat_eta": _f32(sp.mirostat_eta),
        "adaptive_target": _FIXED_SETTINGS["adaptive_target"],
        "adaptive_decay": _f32(_FIXED_SETTINGS["adaptive_decay"]),
        "stop": list(p.stop), "max_tokens": p.n_predict, "n_predict": p.n_predict, "n_keep": 0, "n_discard": 0,
        "ignore_eos": p.ignore_eos, "stream": stream,
        # a banned token's -inf bias is JSON null in llama-server's output
        "logit_bias": [{"bias": b if b != float("-inf") else None, "token": t} for t, b in sp.logit_bias],
        "n_probs": p.n_probs, "min_keep": sp.min_keep, "grammar": grammar, "grammar_lazy": False,
        "grammar_triggers": [], "preserved_tokens": [], "chat_format": "Content-only", "reasoning_format": "none",
        "reasoning_in_content": False, "generation_prompt": "", "samplers": list(sp.samplers),
        "speculative.types": "none", "timings_per_token": p.timings_per_token,
        "post_sampling_probs": p.post_sampling_probs,
        "backend_sampling": False, "lora": [],
    }
    if only_metrics:  # /props' default_generation_settings.params leaves these out
        for key in ("dry_sequence_breakers", "stop", "logit_bias", "grammar", "grammar_lazy", "grammar_triggers",
                    "preserved_tokens"):
            del out[key]
    return out


def stop_type(done: DoneEvent) -> str:
    if done.finish_reason == "length":
        return "limit"
    return "word" if done.stopping_word else "eos"


@dataclasses.dataclass
class NativeFormatter:
    """Builds /completion's and /infill's reply objects (one per output, ``index`` telling which)."""

    state: ServerState
    req: NativeCompletionRequest
    params: TaskParams
    grammar: str

    def final(self, done: DoneEvent, prompt: list[int], probs: list[dict[str, Any]] | None, index: int) -> dict:
        stream = self.req.stream
        text = "" if stream else done.full_text
        body: dict[str, Any] = {
            "index": index, "content": text,
            "tokens": [] if stream or not self.req.return_tokens else list(done.tokens),
            "id_slot": done.id_slot, "stop": True, "model": self.req.model or self.state.model_name,
            "tokens_predicted": done.n_decoded, "tokens_evaluated": done.n_prompt,
            "generation_settings": generation_settings(self.params, stream, self.grammar),
            "prompt": self.state.vocab.detokenize(prompt, unparse_special=True),
            "has_new_line": "\n" in done.full_text, "truncated": False, "stop_type": stop_type(done),
            "stopping_word": done.stopping_word,
            # the last sampled token is never decoded: the cache holds the prompt and the others
            "tokens_cached": done.n_prompt + max(done.n_decoded - 1, 0),
            "timings": done.timings,
        }
        if not stream and probs:
            body["completion_probabilities"] = probs
        return _pick(body, self.req.response_fields)

    def partial(self, ev: TokenEvent, n_decoded: int, n_prompt: int, index: int) -> dict[str, Any]:
        body: dict[str, Any] = {"index": index, "content": ev.text, "tokens": [ev.token], "stop": False,
                                "id_slot": -1, "tokens_predicted": n_decoded, "tokens_evaluated": n_prompt}
        if ev.timings is not None:
            body["timings"] = ev.timings
        if ev.probs is not None:
            body["completion_probabilities"] = [ev.probs]
        return body


def _pick(body: dict[str, Any], fields: list[str] | None) -> dict[str, Any]:
    """``response_fields``: only these fields, a ``a/b`` path reaching into nested objects (llama-server's
    json_get_nested_values; a missing one is left out)."""
    if not fields:
        return body
    out: dict[str, Any] = {}
    for path in fields:
        node: Any = body
        for key in path.split("/"):
            if not isinstance(node, dict) or key not in node:
                break
            node = node[key]
        else:
            out[path] = node
    return out


# ---------------------------------------------------------------------- running
async def _run_native(request: Request, state: ServerState, req: NativeCompletionRequest,
                      prompts: list[list[int]]) -> Response:
    """Every prompt ``n_cmpl`` times, one task each; one reply object, or an array when there are several."""
    n = req.n_outputs()
    multitask.check_n(n, len(state.engine.slots), "n_cmpl")
    if not -1 <= req.id_slot < len(state.engine.slots):
        raise APIError(f"'id_slot' {req.id_slot} is not a slot: this server has slots 0 to "
                       f"{len(state.engine.slots) - 1} (-1: any)")
    base = await anyio.to_thread.run_sync(task_params, req, req.n_probs, state.defaults, state.vocab)
    base.id_slot = req.id_slot
    base.timings_per_token = req.timings_per_token
    base.post_sampling_probs = req.post_sampling_probs
    if base.post_sampling_probs and base.sampling.mirostat:
        raise APIError("'post_sampling_probs' with mirostat is not supported (its kept candidates are not kept here)",
                       ErrorType.NOT_SUPPORTED)
    grammar = grammar_text(req) or ""
    per_task, plist = [], []
    for tokens in prompts:
        for _ in range(n):
            per_task.append(tokens)
            plist.append(dataclasses.replace(base, grammar=await _grammar_sampler(state, req)))
    fmt = NativeFormatter(state, req, base, grammar)
    tasks = multitask.submit_all(state.engine, per_task, plist)
    cancel = multitask.cancel_all(state.engine, tasks)
    if req.stream:
        return EventStream(_stream_native(tasks, fmt, cancel), cancel)
    async with _watch_disconnect(request.receive, cancel):
        outs = await multitask.collect(tasks, req.n_probs > 0)
        bodies = [fmt.final(o.done, t.tokens, o.probs, i) for i, (o, t) in enumerate(zip(outs, tasks, strict=True))]
        return JSONResponse(bodies[0] if len(bodies) == 1 else bodies)
    return Response(status_code=499)  # the client went away (nobody reads this)


async def _stream_native(tasks: list[Task], fmt: NativeFormatter, cancel: Callable[[], None]) -> AsyncIterator[bytes]:
    n_decoded = [0] * len(tasks)
    async for i, ev in multitask.merged(tasks):
        if isinstance(ev, ErrorEvent):
            cancel()
            yield oai.sse_error(ev.error.body())
            return
        if isinstance(ev, TokenEvent):
            n_decoded[i] += 1
            if ev.text or ev.probs is not None:
                yield oai.sse(fmt.partial(ev, n_decoded[i], len(tasks[i].tokens), i))
            continue
        yield oai.sse(fmt.final(ev, tasks[i].tokens, None, i))


# ---------------------------------------------------------------------- handlers
async def completion(request: Request, state: ServerState) -> Response:
    req = parse(await read_body(request, state.max_body), NativeCompletionRequest)
    parts = split_prompts(req.prompt)

    def work(cancelled: Callable[[], bool]) -> list[list[int]]:
        return [mixed_tokens(state, p, True, True, '"prompt"', cancelled) for p in parts]

    prompts = await tokenize_text(request, state, work)
    return await _run_native(request, state, req, prompts)


async def infill(request: Request, state: ServerState) -> Response:
    v = state.vocab
    missing = [name for name, t in (("prefix", v.fim_pre), ("suffix", v.fim_suf), ("middle", v.fim_mid)) if t < 0]
    if missing:
        raise APIError("Infill is not supported by this model: " + " ".join(f"{m} token is missing." for m in missing),
                       ErrorType.NOT_SUPPORTED)
    req = parse(await read_body(request, state.max_body), InfillRequest)
    n_predict = state.defaults.get("n_predict", -1)

    def work(cancelled: Callable[[], bool]) -> list[list[int]]:
        prefix = mixed_tokens(state, req.input_prefix, False, False, '"input_prefix"', cancelled)
        suffix = mixed_tokens(state, req.input_suffix, False, False, '"input_suffix"', cancelled)
        prompt = mixed_tokens(state, req.prompt, False, True, '"prompt"', cancelled)
        return [format_infill(state, prefix, suffix, req.input_extra, prompt, n_predict)]

    prompts = await tokenize_text(request, state, work)
    return await _run_native(request, state, req, prompts)


async def props(request: Request, state: ServerState) -> Response:
    """GET /props: the server's defaults and model facts, in llama-server's fields."""
    params = task_params(GenerationParams(), 0, state.defaults, state.vocab)
    v, tpl = state.vocab, state.template

    def piece(t: int) -> str:
        return v.token_to_piece(t, special=True).decode("utf-8", errors="replace") if t >= 0 else ""

    body = {
        "default_generation_settings": {"params": generation_settings(params, False, "", only_metrics=True),
                                        "n_ctx": state.engine.n_slot_ctx},
        "total_slots": len(state.engine.slots), "model_alias": state.model_name, "model_path": state.model_name,
        "modalities": {"vision": False, "video": False, "audio": False},
        "endpoint_slots": state.slots, "endpoint_props": False, "endpoint_metrics": state.metrics,
        "chat_template": tpl.source if tpl is not None else "",
        "bos_token": piece(v.bos), "eos_token": piece(v.eos), "build_info": "pyggml", "is_sleeping": False,
    }
    return JSONResponse(body)


async def post_props(request: Request, state: ServerState) -> Response:
    raise APIError("This server does not support changing global properties. Start it with `--props`",
                   ErrorType.NOT_SUPPORTED)


async def apply_template(request: Request, state: ServerState) -> Response:
    """POST /apply-template: the chat prompt a /v1/chat/completions request would decode, as text."""
    req = parse(await read_body(request, state.max_body), ChatCompletionRequest)
    if state.template is None:
        raise APIError(state.template_error, ErrorType.NOT_SUPPORTED)
    messages = [{"role": m.role, "content": m.text()} for m in req.messages]
    try:
        text = state.template.render(messages, add_generation_prompt=True)
    except ChatTemplateError as e:
        raise APIError(str(e)) from None
    return JSONResponse({"prompt": text})
