"""``pyggml batched -p PROMPT -np N``: N continuations generated together, as llama.cpp's llama-batched.

The prompt is decoded once, as sequence 0; its cells are then shared with sequences 1..N-1
(``seq_cp``: the cells, not copies; with ``-no-kvu`` each sequence has its own KV stream and gets
a copy), and every step decodes one token of every unfinished sequence in
a single batch, so each weight is read once per step for all of them. With several ``-p``, sequence i
continues prompt i % (number of prompts), each prompt decoded as its own sequence in one batch.
Each sequence samples with its own sampler (seed + i: with --temp 0 all agree with ``generate``).
The texts are printed when all sequences are done, then the aggregate speed on stderr.
"""

from __future__ import annotations

import argparse
import codecs
import dataclasses
import sys
import time

from ..llm.batch import Batch
from ..llm.sampling import Sampler
from .common import (
    add_grammar_args,
    add_kv_unified_arg,
    add_model_args,
    add_sampling_args,
    load_model,
    make_context,
    sampler_from_args,
)
from .errors import CLIError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("batched", help="generate several continuations at once (like llama-batched)",
                       description="Generate -np continuations of a prompt together: the prompt's cells are "
                                   "shared between the sequences and each step decodes one token of every "
                                   "sequence in one batch.")
    add_model_args(p, ctx_size=0)
    add_kv_unified_arg(p, default=True)  # shared prompt cells need one stream (llama-batched needs -kvu too)
    p.add_argument("-p", "--prompt", action="append", required=True,
                   help="the prompt; repeat -p for different prompts (sequence i takes prompt i %% count)")
    p.add_argument("-np", "--parallel", type=int, default=4, help="sequences to generate (default 4, at most 64)")
    p.add_argument("-n", "--n-predict", type=int, default=32, help="tokens to generate per sequence (default 32)")
    add_sampling_args(p)
    add_grammar_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    n_par, n_pred = args.parallel, args.n_predict
    if not 1 <= n_par <= 64:
        raise CLIError(f"-np/--parallel must be 1 to 64, got {n_par}")
    if n_pred < 1:
        raise CLIError(f"-n/--n-predict must be at least 1, got {n_pred}")
    if any(not p for p in args.prompt):
        raise CLIError("empty prompt: give text with -p")
    # the context: every prompt plus n_predict tokens per sequence (llama-batched's n_kv_req), unless -c
    model, vocab = load_model(args)
    prompts = [vocab.tokenize(p, add_special=True, parse_special=True) for p in args.prompt]
    seq_prompt = [i % len(prompts) for i in range(n_par)]
    n_kv_req = sum(len(p) for p in prompts) + n_pred * n_par
    if not args.kv_unified:  # a stream per sequence: each holds its prompt and its tokens
        n_kv_req = n_par * (max(len(p) for p in prompts) + n_pred)
    n_ctx = args.ctx_size or n_kv_req
    if n_kv_req > n_ctx:
        raise CLIError(f"the sequences need {n_kv_req} cells (prompts + {n_pred} tokens x {n_par}) but -c is {n_ctx}")
    n_batch = max(n_par, sum(len(p) for p in prompts))
    ctx = make_context(args, model, n_ctx=n_ctx, n_seq_max=n_par, n_batch=n_batch)
    base = sampler_from_args(args, vocab)
    samplers = [Sampler(dataclasses.replace(base.params, seed=(base.seed + i) & 0xFFFFFFFF), vocab,
                        grammar=base.grammar.clone() if base.grammar is not None else None) for i in range(n_par)]
    t0 = time.perf_counter()
    # prompts: the first sequence of each prompt decodes it, the others share its cells
    owner = {k: seq_prompt.index(k) for k in range(len(prompts)) if k in seq_prompt}
    batch_tok, batch_seq, batch_out = [], [], []
    for k, s in owner.items():
        batch_tok += prompts[k]
        batch_seq += [[s]] * len(prompts[k])
        batch_out += [False] * (len(prompts[k]) - 1) + [True]
    ctx.decode_batch(Batch(token=batch_tok, seq_id=batch_seq, logits=batch_out))
    last_row = {k: ctx.logits[row].copy() for row, k in enumerate(owner)}  # one output per prompt, in order
    for s in range(n_par):
        if owner[seq_prompt[s]] != s:
            ctx.seq_cp(owner[seq_prompt[s]], s)
    n_prompt_tokens = len(batch_tok)
    t_prompt = time.perf_counter() - t0
    logits = {s: last_row[seq_prompt[s]] for s in range(n_par)}
    for s in range(n_par):
        for t in prompts[seq_prompt[s]]:
            samplers[s].accept(t, is_generated=False)
    decoders = [codecs.getincrementaldecoder("utf-8")(errors="replace") for _ in range(n_par)]
    texts = [[] for _ in range(n_par)]
    active = list(range(n_par))
    n_decoded = 0
    t1 = time.perf_counter()
    for _ in range(n_pred):
        nxt = []
        for s in list(active):
            tok = samplers[s].sample(logits[s])
            samplers[s].accept(tok)
            if vocab.is_eog(tok):
                active.remove(s)
                continue
            texts[s].append(decoders[s].decode(vocab.token_to_piece(tok, special=False)))
            nxt.append((s, tok))
        if not nxt:
            break
        out = ctx.decode_batch(Batch(token=[t for _, t in nxt], seq_id=[[s] for s, _ in nxt],
                                     logits=[True] * len(nxt)))
        n_decoded += len(nxt)
        for i, (s, _) in enumerate(nxt):
            logits[s] = out[i]
    t_gen = time.perf_counter() - t1
    for s in range(n_par):
        texts[s].append(decoders[s].decode(b"", final=True))
        print(f"sequence {s}:\n\n{args.prompt[seq_prompt[s]]}{''.join(texts[s])}\n")
    if not args.quiet:
        print(f"prompts: {n_prompt_tokens} tokens in {t_prompt:.2f} s; generated {n_decoded} tokens in "
              f"{t_gen:.2f} s: {n_decoded / t_gen if t_gen else 0:.1f} tokens/s over {n_par} sequences",
              file=sys.stderr)
    return 0
