"""``/v1/embeddings`` (OpenAI's) and ``/embedding`` / ``/embeddings`` (llama-server's), with ``--embedding``.

The server then holds a second context of the model with embeddings on and the ``--pooling`` asked
for (the model's own by default), its batch and ubatch both ``-ub`` (llama-server makes them equal for
embeddings: a non-causal model needs a whole input in one ubatch). A request's inputs are decoded in
the engine's thread between two generation steps, as many sequences per batch as fit (as
``pyggml embedding`` does), so embeddings and completions never compute at once.

Inputs as llama-server reads them: ``input`` (or ``content``, which always answers in the native
layout) is a string, token ids, ids and strings mixed, or a list of those (one embedding each).
OpenAI's reply: ``data`` of ``{"embedding", "index", "object"}`` with ``usage``; ``encoding_format``
``base64`` gives each vector as the base64 of its little-endian float32 bytes. The native reply is a
list of ``{"index", "embedding": [[...]]}``: one vector pooled, one per token with pooling none
(unnormalised, as llama-server). ``embd_normalize`` chooses the norm (2, euclidean, by default).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from typing import Any

import numpy as np
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..llm.batch import Batch
from ..llm.embeddings import embd_normalize
from ..llm.hparams import PoolingType
from .app import ServerState, read_body, tokenize_text
from .errors import APIError, ErrorType
from .native import mixed_tokens, split_prompts
from .schemas import _CONFIG, parse

#: inputs of one request (llama-server takes any number; each is a task there)
MAX_INPUTS = 2048


class EmbeddingRequest(BaseModel):
    model_config = _CONFIG
    input: str | list[Any] | None = None
    content: str | list[Any] | None = None
    model: str | None = None
    encoding_format: str = "float"
    embd_normalize: int = 2


async def embeddings_oai(request: Request, state: ServerState) -> Response:
    return await _embeddings(request, state, oai=True)


async def embeddings_native(request: Request, state: ServerState) -> Response:
    return await _embeddings(request, state, oai=False)


async def _embeddings(request: Request, state: ServerState, oai: bool) -> Response:
    ctx = state.embd_ctx
    if ctx is None:
        raise APIError("This server does not support embeddings. Start it with `--embeddings`", ErrorType.NOT_SUPPORTED)
    pooling = ctx.pooling_type
    if oai and pooling is PoolingType.NONE:
        raise APIError("Pooling type 'none' is not OAI compatible. Please use a different pooling type")
    if pooling is PoolingType.RANK:
        raise APIError("this server's pooling is 'rank' (a reranker's scores): /rerank is not served",
                       ErrorType.NOT_SUPPORTED)
    req = parse(await read_body(request, state.max_body), EmbeddingRequest)
    if req.input is not None:
        prompt = req.input
    elif req.content is not None:
        prompt, oai = req.content, False  # "content" is not OpenAI's field: the native layout
    else:
        raise APIError('"input" or "content" must be provided')
    if req.encoding_format not in ("float", "base64"):
        raise APIError("The format to return the embeddings in. Can be either float or base64")
    parts = split_prompts(prompt)
    if len(parts) > MAX_INPUTS:
        raise APIError(f'"input" has {len(parts)} inputs, more than the limit of {MAX_INPUTS} per request')
    n_ubatch = ctx.n_ubatch

    def work(cancelled: Callable[[], bool]) -> list[list[int]]:
        out = [mixed_tokens(state, p, True, True, '"input"', cancelled) for p in parts]
        for toks in out:
            if not toks:
                raise APIError("Input content cannot be empty")
            if len(toks) > n_ubatch:
                raise APIError(f"input ({len(toks)} tokens) is too large to process. increase the physical batch "
                               f"size (current batch size: {n_ubatch})")
        return out

    inputs = await tokenize_text(request, state, work)
    norm = req.embd_normalize if pooling is not PoolingType.NONE else -1  # llama-server: no norm without pooling
    vectors = await asyncio.wrap_future(state.engine.call(lambda: _compute(ctx, inputs, norm)))
    if not oai:
        if pooling is PoolingType.NONE:
            rows, at = [], 0
            for toks in inputs:
                rows.append(vectors[at:at + len(toks)].tolist())
                at += len(toks)
        else:
            rows = [[v.tolist()] for v in vectors]
        return JSONResponse([{"index": i, "embedding": r} for i, r in enumerate(rows)])
    data = []
    for i, v in enumerate(vectors):
        if req.encoding_format == "base64":
            data.append({"embedding": base64.b64encode(v.astype("<f4").tobytes()).decode("ascii"), "index": i,
                         "object": "embedding", "encoding_format": "base64"})
        else:
            data.append({"embedding": v.tolist(), "index": i, "object": "embedding"})
    n = sum(map(len, inputs))
    return JSONResponse({"model": req.model or state.model_name, "object": "list",
                         "usage": {"prompt_tokens": n, "total_tokens": n}, "data": data})


def _compute(ctx: Any, inputs: list[list[int]], norm: int) -> np.ndarray:
    """The normalised embeddings of ``inputs`` (rows per token with pooling none, else one per input): as
    many inputs per decode as the batch and the context's sequences allow, the memory cleared before each."""
    pooled = ctx.pooling_type is not PoolingType.NONE
    rows: list[np.ndarray] = []
    group: list[list[int]] = []

    def flush() -> None:
        ctx.clear()
        ctx.decode_batch(Batch(token=[t for toks in group for t in toks],
                               pos=[p for toks in group for p in range(len(toks))],
                               seq_id=[s for s, toks in enumerate(group) for _ in toks]))
        rows.extend([ctx.get_embeddings_seq(s) for s in range(len(group))] if pooled else [ctx.get_embeddings()])
        group.clear()

    for toks in inputs:
        if group and (sum(map(len, group)) + len(toks) > ctx.n_batch or len(group) >= ctx.n_seq_max):
            flush()
        group.append(toks)
    if group:
        flush()
    emb = np.stack(rows) if pooled else np.concatenate(rows)
    return embd_normalize(emb, norm).astype(np.float32)
