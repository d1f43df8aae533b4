"""``pyggml imatrix``: llama.cpp's llama-imatrix (collect, combine, inspect importance matrices).

The text is tokenized (BOS first; special tokens parsed only with --parse-special), --chunk N drops its
first N chunks of -c tokens, and at most --chunks chunks are decoded as llama-imatrix decodes them: -b / -c
chunks per batch (4 with the defaults), each a sequence in its own KV stream, every token an output; a
chunk longer than -b goes in several batches. The collector sums each weight's squared inputs; whenever
the chunk count passes a multiple of --output-frequency the imatrix is written to -o, and of
--save-frequency to a copy named ``-o`` + ``.at_<chunk count>``, as llama-imatrix names them.

One difference, on purpose: llama-imatrix tests for those writes inside its eval callback, so a file is
written as soon as the first weight (blk.0.attn_q) passes the chunk and holds every other weight one chunk
behind (its ``.at_1`` has blk.0.attn_q alone). Here the test runs once each decode is done, so every
intermediate file equals the imatrix of a run stopped at that chunk; which chunks trigger a write, and the
names, are llama-imatrix's.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from .common import add_kv_unified_arg, add_model_args


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("imatrix", help="compute an importance matrix for quantization (llama-imatrix)",
                       description="Run a model over a text in chunks of -c tokens and record, for every weight "
                                   "matrix, the per-column sums of squared activations and how many rows were summed:"
                                   " the importance matrix that `pyggml quantize --imatrix` (and llama-quantize) use."
                                   " Written in llama.cpp's GGUF imatrix format; --in-file adds existing files (GGUF "
                                   "or legacy .dat) to the result.")
    add_model_args(p, ctx_size=512)
    p._option_string_actions["-c"].help = ("tokens per chunk (default 512; must be > 0); the text needs at least "
                                           "two chunks")
    p._option_string_actions["-b"].help = (
        "logical batch size (default 2048): below -c, a chunk is decoded in several batches; otherwise it must "
        "be a multiple of -c and -b / -c chunks are decoded together, one KV stream each, as llama-imatrix does")
    add_kv_unified_arg(p, default=False)
    p.add_argument("-f", "--file", default=None, help="text file to run the model over (the calibration data)")
    p.add_argument("-o", "--output", "--output-file", dest="output_file", default="imatrix.gguf", metavar="FNAME",
                   help="output file (default imatrix.gguf)")
    p.add_argument("--output-format", choices=["gguf", "dat"], default=None,
                   help="gguf (default; keeps raw sums and counts) or dat, the legacy format of older llama.cpp; "
                        "unless given, a GGUF output whose name does not end in .gguf is warned about")
    p.add_argument("-ofreq", "--output-frequency", type=int, default=10, metavar="N",
                   help="write the imatrix to the output file every N chunks, and at the end (default 10)")
    p.add_argument("--save-frequency", type=int, default=0, metavar="N",
                   help="also save a copy every N chunks, named after the output file plus .at_<chunks> (e.g. "
                        "imatrix.gguf.at_20); 0 = no copies (default 0)")
    p.add_argument("--chunks", type=int, default=-1, metavar="N", help="chunks to process; -1 = all (default -1)")
    p.add_argument("--chunk", "--from-chunk", dest="chunk", type=int, default=0, metavar="N",
                   help="start from chunk N: drop the text's first N chunks of -c tokens (default 0)")
    p.add_argument("--process-output", action="store_true",
                   help="also collect data for output.weight (off by default, as in llama.cpp)")
    p.add_argument("--in-file", action="append", default=[], metavar="FNAME",
                   help="an imatrix to add to the result (repeatable, or comma-separated); without -f, the files "
                        "are only combined")
    p.add_argument("--show-statistics", action="store_true",
                   help="print per-tensor statistics of the one --in-file and exit")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--ppl", dest="ppl", action="store_true", default=True,
                   help="print the perplexity of each chunk's second half and the final estimate (default)")
    g.add_argument("--no-ppl", dest="ppl", action="store_false", help="skip the perplexity computation")
    p.add_argument("--parse-special", action="store_true",
                   help="parse special tokens (chat, tool, etc.) in the text (default: off, as in llama.cpp)")
    p.set_defaults(func=run)


def _check_args(args: argparse.Namespace) -> None:
    """llama-imatrix's limits, as errors naming the flag (it asserts, divides by zero or ignores instead)."""
    from .errors import CLIError

    if args.ctx_size <= 0:
        raise CLIError("-c/--ctx-size must be > 0 for imatrix")
    if args.output_frequency <= 0:
        raise CLIError(f"-ofreq/--output-frequency must be > 0, got {args.output_frequency}")
    if args.save_frequency < 0:
        raise CLIError(f"--save-frequency must be >= 0 (0 = no copies), got {args.save_frequency}")
    if args.chunks == 0 or args.chunks < -1:
        raise CLIError(f"--chunks must be -1 (all) or > 0, got {args.chunks}")
    if args.chunk < 0:
        raise CLIError(f"--chunk/--from-chunk must be >= 0, got {args.chunk}")
    if args.file is None:  # combining files decodes nothing: -b does not matter
        return
    if args.batch_size >= args.ctx_size and args.batch_size % args.ctx_size:
        raise CLIError(f"-b/--batch-size ({args.batch_size}) must be below -c/--ctx-size ({args.ctx_size}) or a "
                       "multiple of it: each batch holds whole chunks or part of one")


def _in_files(args: argparse.Namespace) -> list[str]:
    """--in-file values, each possibly a comma-separated list (llama.cpp's parse_csv_row)."""
    return [f.strip() for v in args.in_file for f in v.split(",") if f.strip()]


def run(args: argparse.Namespace) -> int:
    from ..quantize import IMatrixCollector, load_imatrix
    from .errors import CLIError

    in_files = _in_files(args)
    if args.show_statistics:
        if len(in_files) != 1:
            raise CLIError("--show-statistics needs exactly one --in-file")
        from ..quantize.imatrix_stats import format_statistics

        print(format_statistics(load_imatrix(in_files[0])), end="")
        return 0
    _check_args(args)
    if args.output_format is None and not args.output_file.endswith(".gguf") and not args.quiet:
        print("imatrix: saving imatrix using GGUF format with a different suffix than .gguf; "
              "if you want the previous imatrix format, use --output-format dat", file=sys.stderr)
    col = IMatrixCollector(chunk_size=args.ctx_size, process_output=args.process_output)
    for f in in_files:
        if not args.quiet:
            print(f"imatrix: loading imatrix from '{f}'", file=sys.stderr)
        col.add(load_imatrix(f))
    if args.file is None:
        if not in_files:
            raise CLIError("no text (-f FILE) and no imatrix files (--in-file) to combine")
        save(args, col, args.output_file)
        if not args.quiet:
            what = "imatrix" if len(in_files) == 1 else "combined imatrix"
            print(f"saved the {what} to {args.output_file}", file=sys.stderr)
        return 0
    try:
        text = Path(args.file).read_text(encoding="utf-8")
    except OSError as e:
        raise CLIError(f"cannot read text file {args.file}: {e.strerror}") from e
    except UnicodeDecodeError:
        raise CLIError(f"text file {args.file} is not UTF-8") from None
    t0 = time.perf_counter()
    n_chunks = compute(args, col, text)
    save(args, col, args.output_file)
    if not args.quiet:
        print(f"processed {n_chunks} chunks in {time.perf_counter() - t0:.1f} s; saved {args.output_file}",
              file=sys.stderr)
    return 0


def save(args: argparse.Namespace, col: Any, path: str) -> None:
    """Write the collector's imatrix to ``path`` in --output-format (the text file, if any, as its dataset)."""
    from ..quantize.imatrix_io import save_imatrix, save_imatrix_legacy

    im = col.result([args.file] if args.file is not None else [])
    if args.output_format == "dat":
        save_imatrix_legacy(im, path, args.file or "")
    else:
        save_imatrix(im, path)


def _same_destination(a: Any, b: Any) -> bool:
    """True when the two streams write to the same file or terminal (e.g. both to a terminal, or 2>&1)."""
    try:
        sa, sb = os.fstat(a.fileno()), os.fstat(b.fileno())
    except (AttributeError, OSError, ValueError):  # not backed by a file descriptor (a test's capture)
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _due(last: int, step: int, freq: int) -> bool:
    """llama-imatrix's test after the chunk count rose by ``step`` to ``last``: a multiple of ``freq`` was
    reached within the step (``(last % freq) / step == 0`` in integers)."""
    return (last % freq) // step == 0


def compute(args: argparse.Namespace, col: Any, text: str) -> int:
    """llama-imatrix's ``compute_imatrix``: tokenize, drop --chunk chunks, decode -b / -c chunks per batch with
    every token an output, print the running perplexity, write the imatrix at --output-frequency and copies
    at --save-frequency. Returns the number of chunks processed."""
    from .common import load_model, make_context
    from .errors import CLIError
    from .perplexity import chunk_nlls

    n_ctx = args.ctx_size
    n_seq = max(1, args.batch_size // n_ctx)  # chunks per batch, one sequence (and KV stream) each
    n_batch = min(args.batch_size, n_ctx * n_seq)
    model, vocab = load_model(args)
    tokens = vocab.tokenize(text, add_special=True, parse_special=args.parse_special)
    if args.chunk > 0:
        if (args.chunk + 2) * n_ctx >= len(tokens):
            raise CLIError(f"--chunk {args.chunk}: there will be not enough tokens left after removing "
                           f"{args.chunk} chunks ({args.file} tokenizes to {len(tokens)}, chunks of {n_ctx})")
        if not args.quiet:
            print(f"imatrix: removing initial {args.chunk} chunks ({args.chunk * n_ctx} tokens)", file=sys.stderr)
        tokens = tokens[args.chunk * n_ctx:]
    if len(tokens) < 2 * n_ctx:
        raise CLIError(f"you need at least {2 * n_ctx} tokens for a context of {n_ctx} tokens; "
                       f"{args.file} tokenizes to only {len(tokens)}")
    n_max = len(tokens) // n_ctx
    n_chunk = n_max if args.chunks < 0 else min(args.chunks, n_max)
    ctx = make_context(args, model, n_ctx=n_ctx * n_seq, n_seq_max=n_seq, n_batch=n_batch)
    if n_ctx * n_seq > model.hparams.n_ctx_train and not args.quiet:  # llama.cpp warns the same way and goes on
        print(f"imatrix: warning: the model was trained on only {model.hparams.n_ctx_train} context tokens "
              f"({n_ctx * n_seq} specified)", file=sys.stderr)
    if not args.quiet:
        print(f"imatrix: computing over {n_chunk} chunks, n_ctx={n_ctx}, batch_size={n_batch}, n_seq={n_seq}",
              file=sys.stderr)
    last = col.last_chunk

    def after_decode() -> None:  # llama-imatrix's saves, tested once a decode is done rather than mid-graph
        nonlocal last
        step = col.last_chunk - last
        if step <= 0:
            return
        last = col.last_chunk
        if _due(last, step, args.output_frequency):
            save(args, col, args.output_file)
        if args.save_frequency > 0 and _due(last, step, args.save_frequency):
            save(args, col, f"{args.output_file}.at_{last}")

    bar = None
    if not args.quiet:
        from tqdm import tqdm

        bar = tqdm(total=n_chunk, desc="imatrix", unit="chunk", file=sys.stderr, leave=False)
    # llama-imatrix prints "[1]9.1234,[2]..." on stdout as chunks finish. When stdout and the bar's stderr go
    # to one place (a terminal, or 2>&1), the two would be mixed on one line: the running figure is shown in
    # the bar instead, and the line printed whole once the bar is gone.
    held: list[str] | None = [] if bar is not None and _same_destination(sys.stdout, sys.stderr) else None
    nll = nll2 = 0.0
    count = 0
    bos = vocab.bos if vocab.add_bos and vocab.bos >= 0 else -1
    try:
        with col.attach(ctx):
            # every token an output, as llama-imatrix asks: the last layer then sees every row
            for c, v in chunk_nlls(ctx, tokens, n_ctx, n_seq, n_batch, n_chunk, bos, 0, after_decode):
                if args.ppl:  # llama-imatrix's process_logits: the second half predicts its next tokens
                    nll += float(v.sum())
                    nll2 += float((v * v).sum())
                    count += len(v)
                    figure = f"[{c + 1}]{math.exp(nll / count):.4f},"
                    if held is None:
                        print(figure, end="", flush=True)
                    else:
                        held.append(figure)
                        bar.set_postfix_str(f"PPL {math.exp(nll / count):.4f}", refresh=False)
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        if held:
            print("".join(held), end="", flush=True)
    if args.ppl and count:
        print()
        ppl = math.exp(nll / count)
        var = nll2 / count - (nll / count) ** 2
        if var > 0:
            print(f"Final estimate: PPL = {ppl:.4f} +/- {math.sqrt(var / (count - 1)) * ppl:.5f}")
        else:
            print("Unexpected negative standard deviation of log(prob)")
    return n_chunk
