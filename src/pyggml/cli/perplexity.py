"""``pyggml perplexity -f FILE``: perplexity of a text, computed as llama-perplexity computes it.

The whole file is tokenized with BOS and no special-token parsing, split into chunks of ``-c``
tokens (default 512). Each chunk is evaluated in a fresh cache with its first token replaced by BOS;
only the second half is scored: the logits at positions first+i (first = n_ctx/2) predict token
first+i+1. The running estimate ``[k]ppl`` is printed after each chunk, then PPL = exp(mean NLL)
with its standard error.

As llama-perplexity, ``-b / -c`` chunks (4 with the defaults) are decoded together, as sequences of
one batch, each in its own KV stream of ``-c`` cells: the weights are read once for all of them.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numba
import numpy as np

from ..llm.batch import Batch
from .common import add_kv_unified_arg, add_model_args, load_model, make_context
from .errors import CLIError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("perplexity", help="perplexity of a text file (like llama-perplexity)",
                       description="Compute the perplexity of a model on a text file, chunk by chunk, "
                                   "scoring the second half of each chunk as llama-perplexity does.")
    add_model_args(p, ctx_size=512)
    add_kv_unified_arg(p, default=False)
    p.add_argument("-f", "--file", required=True, help="text file to evaluate")
    p.add_argument("--chunks", type=int, default=-1, help="evaluate at most this many chunks (default: all)")
    p.set_defaults(func=run)


@numba.njit(cache=True, nogil=True)
def _log_softmax_nll(logits: np.ndarray, rows: np.ndarray, targets: np.ndarray, out: np.ndarray) -> None:
    """llama-perplexity's log_softmax for ``logits[rows[k]]``: the max, then the float32 ``expf`` terms
    summed in double in index order, ``-log p = log(sum) - (x[t] - max)``. Compiled (libm's expf, as
    llama.cpp calls it) and without the GIL, so that the rows can be shared out over threads as
    llama-perplexity shares them; in numpy a 262k-vocabulary row cost 2x more on one core."""
    n_vocab = logits.shape[1]
    for k in range(rows.shape[0]):
        x = logits[rows[k]]
        mx = x[0]
        for i in range(1, n_vocab):
            if x[i] > mx:
                mx = x[i]
        s = 0.0
        for i in range(n_vocab):
            s += np.exp(x[i] - mx)
        out[k] = np.log(s) - np.float64(x[targets[k]] - mx)


def neg_log_probs(logits: np.ndarray, targets: Sequence[int], rows: np.ndarray | None = None,
                  n_threads: int = 1) -> np.ndarray:
    """-log p(target) (float64) for rows ``rows`` of ``logits`` (every row when None), the rows split over
    ``n_threads`` threads. ``logits`` is read in place: a ubatch's 262k-vocabulary outputs are not copied."""
    x = np.ascontiguousarray(logits, dtype=np.float32)
    r = np.arange(len(x), dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
    t = np.asarray(targets, dtype=np.int64)
    if len(t) != len(r):
        raise ValueError(f"{len(t)} targets for {len(r)} rows")
    if len(t) and (t.min() < 0 or t.max() >= x.shape[1]):
        raise ValueError(f"a target is outside the vocabulary of {x.shape[1]} tokens")
    out = np.empty(len(r), dtype=np.float64)
    n = max(1, min(n_threads, len(r)))
    if n == 1:
        _log_softmax_nll(x, r, t, out)
        return out
    bounds = np.linspace(0, len(r), n + 1).astype(np.int64)
    with ThreadPoolExecutor(n) as pool:
        list(pool.map(lambda i: _log_softmax_nll(x, r[bounds[i]:bounds[i + 1]], t[bounds[i]:bounds[i + 1]],
                                                 out[bounds[i]:bounds[i + 1]]), range(n)))
    return out


def chunk_nlls(ctx: Any, tokens: Sequence[int], n_ctx: int, n_seq: int, n_batch: int, n_chunk: int, bos: int,
               first_output: int, after_decode: Callable[[], None] | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """Decode chunks ``0..n_chunk-1`` of ``tokens`` (``n_ctx`` tokens each) as llama-perplexity and llama-imatrix
    do: ``n_seq`` chunks at a time, one sequence (KV stream) each, in a cleared cache, in batches of ``n_batch``
    tokens per chunk span (several batches per chunk when ``n_batch < n_ctx``); each chunk's first token is
    replaced by ``bos`` when ``bos >= 0``. Positions ``>= first_output`` are outputs (imatrix asks for every
    one, so that the last layer sees every row); ``after_decode`` runs after every decode. Yields, chunk by
    chunk once its group is done, ``(chunk index, -log p of each next token from the second half's positions
    n_ctx/2 .. n_ctx-2)``. The scores are taken ubatch by ubatch (LlamaContext's logits sink), so no more
    than one ubatch's logits live at once."""
    first = n_ctx // 2
    toks = np.asarray(tokens, dtype=np.int64)
    n_threads = ctx.params.n_threads or os.cpu_count() or 1
    for c0 in range(0, n_chunk, n_seq):
        group = range(c0, min(c0 + n_seq, n_chunk))
        ctx.clear()
        chunks = []
        for c in group:
            chunk = list(tokens[c * n_ctx : (c + 1) * n_ctx])
            if bos >= 0:
                chunk[0] = bos
            chunks.append(chunk)
        nlls = np.zeros((len(chunks), n_ctx - first - 1), dtype=np.float64)
        for b0 in range(0, n_ctx, n_batch):  # the same span of every chunk per batch
            b1 = min(b0 + n_batch, n_ctx)
            pos = np.tile(np.arange(b0, b1), len(chunks))
            which = np.repeat(np.arange(len(chunks)), b1 - b0)
            targets = toks[np.minimum((c0 + which) * n_ctx + pos + 1, len(toks) - 1)]
            ctx.decode_batch(Batch(token=[t for ch in chunks for t in ch[b0:b1]], pos=pos.tolist(),
                                   seq_id=which.tolist(), logits=(pos >= first_output).tolist()),
                             logits_sink=partial(_score, nlls, which, pos, targets, first, n_threads))
            if after_decode is not None:
                after_decode()
        for k, c in enumerate(group):
            yield c, nlls[k]


def _score(nlls: np.ndarray, which: np.ndarray, pos: np.ndarray, targets: np.ndarray, first: int, n_threads: int,
           idx: np.ndarray, logits: np.ndarray) -> None:
    """A ubatch's share of chunk_nlls: the scores of its outputs at positions first .. n_ctx-2 into ``nlls``."""
    keep = (pos[idx] >= first) & (pos[idx] < first + nlls.shape[1])
    nlls[which[idx][keep], pos[idx][keep] - first] = neg_log_probs(logits, targets[idx][keep], np.flatnonzero(keep),
                                                                   n_threads)


def _eta(seconds: float) -> str:
    """llama-perplexity's ETA: hours when over an hour, then minutes with two decimals."""
    total = int(seconds)
    hours = f"{total // 3600} hours " if total >= 3600 else ""
    return f"{hours}{(total % 3600) / 60.0:.2f} minutes"


def run(args: argparse.Namespace) -> int:
    try:
        text = Path(args.file).read_text(encoding="utf-8")
    except OSError as e:
        raise CLIError(f"cannot read {args.file}: {e.strerror}") from e
    if args.ctx_size < 8:
        raise CLIError("perplexity needs --ctx-size of at least 8")
    n_ctx = args.ctx_size
    if args.batch_size >= n_ctx and args.batch_size % n_ctx:
        raise CLIError(f"--batch-size ({args.batch_size}) must be below --ctx-size ({n_ctx}) or a multiple of it: "
                       "each batch holds whole chunks or part of one")
    n_seq = max(1, args.batch_size // n_ctx)  # chunks per batch, one sequence (and KV stream) each
    n_batch = min(args.batch_size, n_ctx * n_seq)
    model, vocab = load_model(args)
    ctx = make_context(args, model, n_ctx=n_ctx * n_seq, n_seq_max=n_seq, n_batch=n_batch)
    n_train = model.hparams.n_ctx_train
    if n_ctx > n_train and not args.quiet:  # llama.cpp warns the same way and goes on
        print(f"perplexity: warning: the model was trained on only {n_train} context tokens ({n_ctx} specified)",
              file=sys.stderr)
    tokens = vocab.tokenize(text, add_special=True, parse_special=False)
    if len(tokens) < 2 * n_ctx:
        raise CLIError(f"you need at least {2 * n_ctx} tokens to evaluate perplexity with a context of {n_ctx}; "
                       f"{args.file} has {len(tokens)}")
    n_chunk = len(tokens) // n_ctx
    if args.chunks > 0:
        n_chunk = min(n_chunk, args.chunks)
    first = n_ctx // 2
    add_bos = bool(vocab.add_bos) and vocab.bos >= 0
    nlls: list[float] = []
    if not args.quiet:
        cells = ctx.n_ctx_seq
        why = "" if cells == n_ctx else f" (KV streams of {cells} cells: a multiple of 256)"
        print(f"perplexity: {len(tokens)} tokens, computing over {n_chunk} chunks, n_ctx={n_ctx}{why}, "
              f"batch_size={n_batch}, n_seq={n_seq}", file=sys.stderr)
    t_start = time.perf_counter()
    for c, chunk in chunk_nlls(ctx, tokens, n_ctx, n_seq, n_batch, n_chunk, vocab.bos if add_bos else -1, first):
        nlls += chunk.tolist()
        if c == 0 and not args.quiet:  # llama-perplexity's estimate after the first pass
            t_pass = time.perf_counter() - t_start
            print(f"perplexity: {t_pass:.2f} seconds per pass - ETA {_eta(t_pass * n_chunk / n_seq)}",
                  file=sys.stderr)
        print(f"[{c + 1}]{math.exp(sum(nlls) / len(nlls)):.4f},", end="", flush=True)
    mean = sum(nlls) / len(nlls)
    var = sum(x * x for x in nlls) / len(nlls) - mean * mean
    ppl = math.exp(mean)
    err = math.sqrt(max(var, 0.0) / (len(nlls) - 1)) * ppl if len(nlls) > 1 else 0.0
    print(f"\nFinal estimate: PPL = {ppl:.4f} +/- {err:.5f}")
    return 0
