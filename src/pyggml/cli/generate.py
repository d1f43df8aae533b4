"""``pyggml generate``: complete a prompt with a GGUF model (llama.cpp's llama-completion).

Only the generated text goes to stdout; logs, the load progress bar and timings go to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from ..llm.generate import Generation, GenerationInterrupted, generate
from ..llm.speculative import Speculator
from .common import (
    add_grammar_args,
    add_model_args,
    add_sampling_args,
    answer_while_compiling,
    load_model_and_context,
    sampler_from_args,
    usable_ctx,
)
from .errors import CLIError
from .spec_args import add_speculative_args, drafters_from_args, spec_params_from_args


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text from a prompt",
                       description="Generate text after a prompt with a GGUF model (default: Gemma 3 270M Q4_K_M). "
                                   "The generated text is written to stdout; everything else to stderr.")
    add_model_args(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("-p", "--prompt", default=None, help="the prompt text")
    g.add_argument("-f", "--file", default=None, help="read the prompt from this file")
    p.add_argument("-n", "--n-predict", type=int, default=128,
                   help="tokens to generate; -1 = until an end-of-generation token (or a full context, without "
                        "--context-shift) (default 128)")
    p.add_argument("--context-shift", action="store_true",
                   help="when the context is full, drop the older half of it (after --keep tokens) and go on, "
                        "as llama.cpp's --context-shift (default: stop)")
    p.add_argument("--keep", type=int, default=0,
                   help="prompt tokens kept through context shifts; -1 = the whole prompt (default 0; the BOS "
                        "token is always kept)")
    p.add_argument("--no-bos", action="store_true", help="do not add the BOS token")
    p.add_argument("--ignore-eos", action="store_true",
                   help="keep generating after an end-of-generation token (llama.cpp's --ignore-eos)")
    p.add_argument("--echo", action="store_true", help="also print the prompt before the generated text")
    add_sampling_args(p)
    add_grammar_args(p)
    add_speculative_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    answer_while_compiling()
    if args.file is not None:
        try:
            prompt = Path(args.file).read_text(encoding="utf-8")
        except OSError as e:
            raise CLIError(f"cannot read prompt file {args.file}: {e.strerror}") from e
        if not prompt:
            raise CLIError(f"the prompt is empty: the file {args.file} has no text")
    elif args.prompt is None:
        raise CLIError("no prompt: give one with -p TEXT or -f FILE")
    elif not args.prompt:
        raise CLIError('the prompt is empty (-p ""): give the text to continue')
    else:
        prompt = args.prompt
    if args.n_predict < -1:
        raise CLIError(f"-n/--n-predict must be -1 (no limit) or a count >= 0, got {args.n_predict}")
    if args.keep < -1:
        raise CLIError(f"--keep must be -1 (the whole prompt) or a count >= 0, got {args.keep}")
    spec_params_from_args(args)  # bad speculative flags fail before any model loads
    _model, vocab, ctx = load_model_and_context(args)
    drafters, pad_to = drafters_from_args(args, vocab)
    speculator = Speculator(ctx, drafters, pad_to=pad_to) if drafters else None
    add_bos = not args.no_bos
    tokens = vocab.tokenize(prompt, add_special=add_bos, parse_special=True)
    bos = 1 if add_bos and vocab.add_bos and tokens and tokens[0] == vocab.bos else 0
    # llama.cpp: -1 (or more than the prompt) keeps the whole prompt, otherwise the BOS token is kept too
    n_keep = len(tokens) if args.keep < 0 or args.keep > len(tokens) else args.keep + bos
    sampler = sampler_from_args(args, vocab)
    if args.echo:
        sys.stdout.write(prompt)
    n_ctx = usable_ctx(args, ctx)
    first: list[float] = []  # seconds from the process start to the first generated text on stdout

    def on_text(s: str) -> None:
        sys.stdout.write(s)
        sys.stdout.flush()
        if not first:
            first.append(seconds_since_start())

    try:
        out = generate(ctx, vocab, tokens, sampler, args.n_predict, on_text=on_text,
                       context_shift=args.context_shift, n_keep=min(n_keep, n_ctx // 2), ignore_eos=args.ignore_eos,
                       n_ctx=n_ctx, speculator=speculator)
    except GenerationInterrupted as e:  # Ctrl-C: what was done so far, then main's "error: interrupted"
        sys.stdout.write("\n")
        sys.stdout.flush()
        if not args.quiet:
            _report(e.generation, ctx, sampler.seed, speculator, first)
        raise
    sys.stdout.write("\n")
    sys.stdout.flush()
    if out.stop_reason == "context full" and not args.quiet:
        print(f"\ncontext full ({n_ctx} tokens) and context shift is off: stopping "
              "(use --context-shift to go on, or a larger -c)", file=sys.stderr)
    if not args.quiet:
        _report(out, ctx, sampler.seed, speculator, first)
    return 0


def seconds_since_start() -> float:
    """Wall seconds since this process started (Linux: from /proc, so the interpreter's start and the imports
    count, as a user waiting for the first token sees them), else since pyggml's CLI module was imported."""
    try:
        with open("/proc/self/stat", "rb") as f:
            start_ticks = int(f.read().rsplit(b")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORTED


_IMPORTED = time.perf_counter()


def _report(out: Generation, ctx: Any, seed: int, speculator: Speculator | None = None,
            first: list[float] | None = None) -> None:
    """The timings and the stop reason, on stderr (after a normal end or a Ctrl-C); ``first`` holds the
    seconds to the first generated text (time to first token, from the process start), when there was one."""
    print(f"\n{out.timings.summary()}", file=sys.stderr)
    if first:
        print(f"time to first token: {first[0] * 1e3:.0f} ms from the process start", file=sys.stderr)
    shifts = f"; {out.n_shifts} context shifts" if out.n_shifts else ""
    print(f"stop: {out.stop_reason}{shifts}; seed {seed}; graph reused {ctx.n_reused} times "
          f"({ctx.n_graph_builds} builds); threads {ctx.backend.n_threads} of {os.cpu_count()}", file=sys.stderr)
    if speculator is not None:
        print(speculator.stats.summary(), file=sys.stderr)
