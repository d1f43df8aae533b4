"""``pyggml embedding -m MODEL -p TEXT``: embeddings of texts, as llama-embedding computes and prints them.

The prompt is split into texts at ``--embd-separator`` (a newline by default); each is tokenized with the
model's special tokens ([CLS] ... [SEP] for BERT's WordPiece vocabulary) and the texts are decoded together,
one sequence each, as many as fit a batch of ``-b`` tokens. The model's pooling (``{arch}.pooling_type``, or
``--pooling``) turns each text into one vector (mean, cls, last), keeps one per token (none), or runs the
classifier head on it (rank: a reranker's scores; a text is then a query and a document joined by
``--cls-separator``, a tab by default). Each vector is normalised by ``--embd-normalize`` and printed in the
``--embd-output-format``. Escapes in the prompt (``\\n``, ``\\t``) are processed as llama.cpp's are.

As llama-embedding: the batch is at least the context (``-c``), and unless ``--attention causal`` is given the
whole batch is one ubatch (``-ub`` follows ``-b``), as attention without a causal mask needs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..llm.batch import Batch
from ..llm.context import ContextParams, LlamaContext
from ..llm.embeddings import embd_normalize, similarity_cos
from ..llm.hparams import PoolingType
from .common import add_model_args, flash_attn_arg, load_model
from .errors import CLIError

FORMATS = ("", "array", "json", "json+", "raw")
#: llama.cpp's LLAMA_MAX_SEQ is 256; pyggml's contexts hold at most 64 sequences
N_SEQ_MAX = 64

_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "'": "'", '"': '"', "\\": "\\"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "embedding", help="embeddings of texts (like llama-embedding)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Compute the embeddings of one or more texts with an embedding model (bert, nomic-bert, "
                    "gemma-embedding, or any model with --pooling) and print them as llama-embedding does.",
        epilog="normalisation (--embd-normalize N):\n"
               "  -1  none                      x\n"
               "   0  max absolute, int16 range 32760 * x / max|x|   (printed as integers)\n"
               "   1  taxicab                   x / sum|x|\n"
               "   2  euclidean (default)       x / sqrt(sum x^2)\n"
               "  >2  p-norm                    x / (sum |x|^p)^(1/p)\n"
               "output formats (--embd-output-format F):\n"
               "  (empty)  a summary: the first values of each embedding, and for several texts their cosine\n"
               "           similarity matrix; rerank scores for --pooling rank\n"
               "  array    [[x1,...,xn],[x1,...,xn],...]\n"
               "  json     OpenAI style: {\"object\": \"list\", \"data\": [{\"object\": \"embedding\", \"index\": "
               "i, \"embedding\": [...]}, ...]}\n"
               "  json+    json plus \"cosineSimilarity\", the matrix of cosines between the embeddings\n"
               "  raw      one embedding per line, values separated by spaces\n"
               "examples:\n"
               "  pyggml embedding -m bge-small.gguf -p 'hello world'\n"
               "  pyggml embedding -m model.gguf -p 'Castle<#sep#>Stronghold<#sep#>Dog' --embd-separator '<#sep#>' "
               "--pooling mean\n"
               "  pyggml embedding -m reranker.gguf --pooling rank --embd-normalize -1 "
               "-p 'what is panda?\\tThe giant panda is a bear.'")
    add_model_args(p, ctx_size=4096, model_help="GGUF embedding model file (bert, nomic-bert, gemma-embedding, or "
                                                 "any model with --pooling)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("-p", "--prompt", default=None, help="the text(s) to embed, split at --embd-separator")
    g.add_argument("-f", "--file", default=None, help="read the text(s) to embed from this file")
    p.add_argument("--embd-separator", default="\n", metavar="STRING",
                   help="separator of the texts (default \\n), for example \"<#sep#>\"")
    p.add_argument("--embd-normalize", type=int, default=2, metavar="N",
                   help="normalisation of each embedding: -1 none, 0 max absolute int16, 1 taxicab, "
                        "2 euclidean (default), >2 p-norm")
    p.add_argument("--embd-output-format", default="", metavar="FORMAT",
                   help="'' (default: a summary), 'array' [[],[]...], 'json' (OpenAI style), 'json+' (json and the "
                        "cosine similarity matrix), 'raw' (one embedding per line)")
    p.add_argument("--pooling", choices=["none", "mean", "cls", "last", "rank"], default=None,
                   help="pooling type for embeddings (default: the model's {arch}.pooling_type, else none)")
    p.add_argument("--attention", choices=["causal", "non-causal"], default=None,
                   help="attention type for embeddings (default: the model's); with causal the ubatch is -ub, "
                        "else the whole batch")
    p.add_argument("--cls-separator", default="\t", metavar="STRING",
                   help="with --pooling rank: separator of a query and its document in a text (default \\t)")
    p.add_argument("--no-escape", dest="escape", action="store_false",
                   help="do not process escapes (\\n, \\t, \\\\, \\xHH, ...) in the prompt or the -f file")
    p.add_argument("--verbose-prompt", action="store_true", help="print each text's tokens on stderr")
    p.set_defaults(func=run)


def process_escapes(s: str) -> str:
    """llama.cpp's string_process_escapes: \\n \\r \\t \\' \\" \\\\ and \\xHH (below 0x80: llama.cpp writes the byte,
    which above that would not be UTF-8); any other escape is kept as written."""
    out, i = [], 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            nxt = s[i + 1]
            if nxt in _ESCAPES:
                out.append(_ESCAPES[nxt])
                i += 2
                continue
            hex_digits = s[i + 2 : i + 4]
            if (nxt == "x" and len(hex_digits) == 2 and all(h in "0123456789abcdefABCDEF" for h in hex_digits)
                    and int(hex_digits, 16) < 0x80):
                out.append(chr(int(s[i + 2 : i + 4], 16)))
                i += 4
                continue
        out.append(c)
        i += 1
    return "".join(out)


def tokenize_texts(texts: list[str], vocab: Any, model: Any, pooling: PoolingType, cls_sep: str) -> list[list[int]]:
    """Each text's tokens as llama-embedding makes them: special tokens added and parsed; with RANK a text holding
    ``cls_sep`` is a query and a document, put in the model's rerank template or joined by EOS/SEP."""
    template = model.metadata("tokenizer.chat_template.rerank")
    out = []
    for text in texts:
        if pooling is PoolingType.RANK and cls_sep in text:
            pairs = text.split(cls_sep)
            if template is not None:
                text = str(template).replace("{query}", pairs[0]).replace("{document}", pairs[1])
            else:
                eos = vocab.token_get_text(vocab.eos) if vocab.add_eos and vocab.eos >= 0 else ""
                sep = vocab.token_get_text(vocab.sep) if vocab.add_sep and vocab.sep >= 0 else ""
                text = (eos + sep).join(pairs)
        out.append(vocab.tokenize(text, add_special=True, parse_special=True))
    return out


def embed(ctx: LlamaContext, inputs: list[list[int]], n_batch: int, norm: int) -> np.ndarray:
    """The normalised embeddings of ``inputs``: one row per token (pooling none) or per input, decoded in batches
    of at most ``n_batch`` tokens and N_SEQ_MAX sequences, the memory cleared before each."""
    pooled = ctx.pooling_type is not PoolingType.NONE
    rows: list[np.ndarray] = []
    group: list[list[int]] = []

    def flush() -> None:
        if not group:
            return
        ctx.clear()
        ctx.decode_batch(Batch(token=[t for toks in group for t in toks],
                               pos=[p for toks in group for p in range(len(toks))],
                               seq_id=[s for s, toks in enumerate(group) for _ in toks]))
        if pooled:
            rows.extend(ctx.get_embeddings_seq(s) for s in range(len(group)))
        else:
            rows.append(ctx.get_embeddings())
        group.clear()

    for toks in inputs:
        if sum(map(len, group)) + len(toks) > n_batch or len(group) >= N_SEQ_MAX:
            flush()
        group.append(toks)
    flush()
    emb = np.stack(rows) if pooled else np.concatenate(rows)
    return embd_normalize(emb, norm)


def _num(v: float, norm: int) -> str:
    return f"{v:.0f}" if norm == 0 else f"{v:.7f}"


def format_output(emb: np.ndarray, texts: list[str], fmt: str, norm: int, pooling: PoolingType,
                  labels: list[str]) -> str:
    """What llama-embedding prints on stdout for ``fmt`` (and, for the default format, its summary)."""
    out: list[str] = []
    n, width = emb.shape
    if fmt == "":
        out.append("\n")
        cell = (lambda v: f"{v:6.0f} ") if norm == 0 else (lambda v: f"{v:9.6f} ")
        if pooling is PoolingType.NONE:
            for j in range(n):
                head = "".join(cell(v) for v in emb[j, : min(3, width)])
                tail = "".join(cell(v) for v in emb[j, max(width - 3, 0) :])
                out.append(f"embedding {j}: {head} ... {tail}\n")
        elif pooling is PoolingType.RANK:
            for j in range(n):
                for i in range(width):
                    label = f" [{labels[i] if i < len(labels) and labels[i] else i}]" if width > 1 else ""
                    out.append(f"rerank score {j}: {emb[j, i]:8.3f}{label}\n")
        else:
            for j in range(n):
                vals = emb[j, : min(16, width) if len(texts) > 1 else width]
                out.append(f"embedding {j}: " + "".join(cell(v) for v in vals) + "\n")
            if len(texts) > 1:
                out.append("\ncosine similarity matrix:\n\n")
                out.append("".join(f"{t[:6]:>6} " for t in texts) + "\n")
                for i in range(len(texts)):
                    sims = "".join(f"{similarity_cos(emb[i], emb[j]):6.2f} " for j in range(len(texts)))
                    out.append(sims + texts[i][:10] + "\n")
    elif fmt in ("json", "json+", "array"):
        items = ["[" + ",".join(_num(v, norm) for v in row) + "]" for row in emb]
        if fmt == "array":
            out.append("[" + ",".join(items) + "]\n")
        else:
            out.append('{\n  "object": "list",\n  "data": [\n')
            out.append(",\n".join(f'    {{\n      "object": "embedding",\n      "index": {j},\n      "embedding": '
                                  f"{item}\n    }}" for j, item in enumerate(items)))
            out.append("\n  ]")
            if fmt == "json+" and len(texts) > 1:
                out.append(',\n  "cosineSimilarity": [\n')
                out.append(",\n".join("    [" + ", ".join(f"{similarity_cos(emb[i], emb[j]):6.2f}" for j in range(n))
                                      + " ]" for i in range(n)))
                out.append("\n  ]")
            out.append("\n}\n")
    elif fmt == "raw":
        for row in emb:
            out.append(" ".join(_num(v, norm) for v in row) + "\n")
    out.append("\n")
    return "".join(out)


def run(args: argparse.Namespace) -> int:
    if args.embd_output_format not in FORMATS:
        raise CLIError(f"--embd-output-format {args.embd_output_format!r} is not a format: expected '' (default), "
                       "'array', 'json', 'json+' or 'raw'")
    if not args.embd_separator:
        raise CLIError("--embd-separator must not be empty")
    if args.prompt is None and args.file is None:
        raise CLIError("no text to embed: give -p TEXT or -f FILE")
    if args.file is not None:
        try:
            text = Path(args.file).read_text(encoding="utf-8")
        except OSError as e:
            raise CLIError(f"cannot read {args.file}: {e.strerror}") from e
        text = text.removesuffix("\n")  # as llama.cpp's -f: the file's last newline ends it, not a text
    else:
        text = args.prompt
    if args.escape:
        text = process_escapes(text)
    model, vocab = load_model(args)
    hp = model.hparams
    n_ctx = args.ctx_size or hp.n_ctx_train
    n_batch = max(args.batch_size, n_ctx)  # llama-embedding: the batch holds the full context
    pooling = PoolingType.UNSPECIFIED if args.pooling is None else PoolingType.parse(args.pooling)
    # llama-embedding: unless the attention is said to be causal the ubatch is the batch (non-causal models need it)
    causal = None if args.attention is None else args.attention == "causal"
    ctx = LlamaContext(model, ContextParams(n_ctx=n_ctx, n_batch=n_batch,
                                            n_ubatch=args.ubatch_size if causal else n_batch, n_threads=args.threads,
                                            flash_attn=flash_attn_arg(args), n_seq_max=N_SEQ_MAX, kv_unified=True,
                                            embeddings=True, pooling_type=pooling, causal_attn=causal))
    pooling = ctx.pooling_type
    texts = text.split(args.embd_separator)
    inputs = tokenize_texts(texts, vocab, model, pooling, args.cls_separator)
    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    if n_ctx > hp.n_ctx_train:
        log(f"embedding: warning: the model was trained on only {hp.n_ctx_train} context tokens ({n_ctx} specified)")
    for i, toks in enumerate(inputs):
        if len(toks) > n_batch:
            raise CLIError(f"text {i} has {len(toks)} tokens, more than the batch size ({n_batch}): increase -b")
        if model.pos_embd is not None and len(toks) > hp.n_ctx_train:
            raise CLIError(f"text {i} has {len(toks)} tokens, more than the {hp.n_ctx_train} positions the model "
                           "has embeddings for")
        if not toks or toks[-1] not in (vocab.sep, vocab.eos):
            log(f"embedding: warning: the last token of text {i} is not SEP or EOS "
                "('tokenizer.ggml.add_eos_token' should be true in the GGUF header)")
        if args.verbose_prompt:  # asked for: printed even with -q
            print(f"embedding: prompt {i}: {texts[i]!r}\nembedding: number of tokens in prompt = {len(toks)}",
                  file=sys.stderr)
            for t in toks:
                print(f"{t:6d} -> {vocab.token_to_piece(t).decode('utf-8', 'replace')!r}", file=sys.stderr)
    t0 = time.perf_counter()
    emb = embed(ctx, inputs, n_batch, args.embd_normalize)
    dt = time.perf_counter() - t0
    sys.stdout.write(format_output(emb, texts, args.embd_output_format, args.embd_normalize, pooling, hp.cls_labels))
    sys.stdout.flush()
    n_tok = sum(map(len, inputs))
    log(f"embedding: {len(inputs)} texts, {n_tok} tokens, pooling {pooling.name.lower()}: {dt * 1e3:.2f} ms "
        f"({n_tok / dt if dt > 0 else 0.0:.2f} tokens per second)")
    return 0
