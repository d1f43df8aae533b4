"""``pyggml generate``: complete a prompt with a GGUF model (llama.cpp's llama-completion).

Only the generated text goes to stdout; logs, the load progress bar and timings go to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .common import add_model_args, add_sampling_args, load_model_and_context, sampler_from_args


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="generate text from a prompt",
        description="Generate text after a prompt with a GGUF model (default: Gemma 3 270M Q4_K_M). "
                    "The generated text is written to stdout; everything else to stderr.",
    )
    add_model_args(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("-p", "--prompt", default=None, help="the prompt text")
    g.add_argument("-f", "--file", default=None, help="read the prompt from this file")
    p.add_argument("-n", "--n-predict", type=int, default=128,
                   help="tokens to generate; -1 = until an end-of-generation token or a full context (default 128)")
    p.add_argument("--no-bos", action="store_true", help="do not add the BOS token")
    p.add_argument("--echo", action="store_true", help="also print the prompt before the generated text")
    add_sampling_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..llm.generate import generate
    from .main import CLIError

    if args.file is not None:
        try:
            prompt = Path(args.file).read_text(encoding="utf-8")
        except OSError as e:
            raise CLIError(f"cannot read prompt file {args.file}: {e.strerror}") from e
    else:
        prompt = args.prompt if args.prompt is not None else ""
    if not prompt:
        raise CLIError("no prompt: give one with -p TEXT or -f FILE")
    _model, vocab, ctx = load_model_and_context(args)
    tokens = vocab.tokenize(prompt, add_special=not args.no_bos, parse_special=True)
    sampler = sampler_from_args(args)
    if args.echo:
        sys.stdout.write(prompt)
    out = generate(ctx, vocab, tokens, sampler, args.n_predict, on_text=lambda s: (sys.stdout.write(s),
                                                                                    sys.stdout.flush()))
    sys.stdout.write("\n")
    sys.stdout.flush()
    if not args.quiet:
        print(f"\n{out.timings.summary()}", file=sys.stderr)
        print(f"stop: {out.stop_reason}; seed {sampler.seed}; graph reused {ctx.n_reused} times "
              f"({ctx.n_graph_builds} builds); threads {ctx.backend.n_threads} of {os.cpu_count()}",
              file=sys.stderr)
    return 0
