"""``pyggml bench``: prompt processing and generation speed, measured as llama-bench measures them.

Each test gets a fresh context of ``n_prompt + n_gen`` tokens. ``pp N`` decodes N tokens (BOS, then
``rand() % n_vocab`` from glibc's unseeded rand) into an empty cache in batches of ``-b`` with one
output row; ``tg N`` decodes N single tokens. One warm-up run precedes the ``-r`` timed repetitions,
the cache is cleared before each, and t/s is the mean over repetitions of tokens / wall time.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from collections import deque
from collections.abc import Iterator

from ..llm.batch import Batch
from ..llm.context import ContextParams, LlamaContext
from ..llm.model import Model
from ..llm.packaged import resolve
from ..llm.tokenizer import Vocab
from .common import (
    add_kv_unified_arg,
    add_model_args,
    apply_poll,
    flash_attn_arg,
    load_model,
    make_context,
    placement_from_args,
)
from .errors import CLIError


def glibc_rand_stream(seed: int = 1) -> Iterator[int]:
    """glibc's rand() after srand(seed), without end: the TYPE_3 additive generator, r[i] = r[i-31] + r[i-3]
    over a window of 34 values (llama-bench and llama-batched-bench draw their tokens from it)."""
    r = deque([seed], maxlen=34)
    for _ in range(1, 31):
        r.append((16807 * r[-1]) % 2147483647)
    r.extend([r[0], r[1], r[2]])
    for i in itertools.count(34):
        r.append((r[-31] + r[-3]) & 0xFFFFFFFF)
        if i >= 344:
            yield r[-1] >> 1


def glibc_rand(n: int, seed: int = 1) -> list[int]:
    """The first n values of glibc's rand() after srand(seed)."""
    return list(itertools.islice(glibc_rand_stream(seed), n))


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure prompt-processing and generation speed (like llama-bench)",
                       description="Benchmark a model as llama-bench does: pp<N> tests decode N prompt tokens at "
                                   "once, tg<N> tests generate N tokens one by one. Lists (-p 128,512) run one test "
                                   "per value.")
    add_model_args(p, ctx_size=0)
    p.add_argument("-p", "--n-prompt", type=_ints, default=[512], help="prompt lengths to test (default 512)")
    p.add_argument("-n", "--n-gen", type=_ints, default=[128], help="generation lengths to test (default 128)")
    p.add_argument("-r", "--repetitions", type=int, default=5, help="timed repetitions per test (default 5)")
    p.add_argument("-o", "--output", choices=["md", "json"], default="md", help="output format (default md)")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up run")
    g = p.add_argument_group("parallel sequences (llama-batched-bench)",
                             "with -npl, each (PP, TG, B) runs B sequences: B prompts of PP tokens (one shared "
                             "prompt with -pps) decoded, then TG steps of one token per sequence in one batch; "
                             "prints aggregate tokens/s")
    g.add_argument("-npp", type=_ints, default=None, help="prompt lengths (default 128)")
    g.add_argument("-ntg", type=_ints, default=None, help="generated tokens per sequence (default 128)")
    g.add_argument("-npl", type=_ints, default=None, help="parallel sequences, e.g. 1,2,4,8 (at most 64)")
    g.add_argument("-pps", action="store_true", help="the prompt is shared by all sequences (decoded once)")
    add_kv_unified_arg(g, default=False)
    p.set_defaults(func=run)


def _test_prompt(ctx: object, n_prompt: int, n_batch: int, bos: int | None, n_vocab: int) -> None:
    toks = [x % n_vocab for x in glibc_rand(n_prompt)]
    if bos is not None and toks:
        toks[0] = bos
    for s in range(0, n_prompt, n_batch):
        ctx.decode(toks[s : s + n_batch])


def _test_gen(ctx: object, n_gen: int, bos: int | None, n_vocab: int) -> None:
    rand = glibc_rand(n_gen)
    tok = bos if bos is not None else rand[0] % n_vocab
    for i in range(n_gen):
        ctx.decode([tok])
        tok = rand[i] % n_vocab


def run(args: argparse.Namespace) -> int:
    if args.npp is not None or args.ntg is not None or args.npl is not None:
        return run_batched(args)

    if args.repetitions < 1:
        raise CLIError("-r must be at least 1")
    path = resolve(args.model)
    apply_poll(args)
    model = Model(path, progress=not args.quiet, **placement_from_args(args))
    vocab = Vocab.from_metadata(model.reader)
    hp = model.hparams
    bos = vocab.bos if vocab.add_bos and vocab.bos >= 0 else None
    threads = args.threads or os.cpu_count() or 1
    tests = [(n, 0) for n in args.n_prompt if n > 0] + [(0, n) for n in args.n_gen if n > 0]
    results = []
    for n_prompt, n_gen in tests:
        params = ContextParams(n_ctx=n_prompt + n_gen, n_batch=args.batch_size, n_ubatch=args.ubatch_size,
                               n_threads=threads, flash_attn=flash_attn_arg(args))
        ctx = LlamaContext(model, params)

        def once(ctx: LlamaContext = ctx, n_prompt: int = n_prompt, n_gen: int = n_gen, warm: bool = False) -> None:
            if n_prompt:
                _test_prompt(ctx, n_prompt, ctx.n_batch, bos, hp.n_vocab)
            if n_gen:
                _test_gen(ctx, 1 if warm else n_gen, bos, hp.n_vocab)

        if not args.no_warmup:
            once(warm=True)
        samples = []
        for _ in range(args.repetitions):
            ctx.clear()
            t0 = time.perf_counter_ns()
            once()
            samples.append(time.perf_counter_ns() - t0)
        ts = [1e9 * (n_prompt + n_gen) / s for s in samples]
        results.append({
            "model_filename": str(path), "model_type": f"{hp.arch} {hp.n_layer}L", "model_size": model.size_bytes(),
            "model_n_params": model.n_params(), "n_batch": args.batch_size, "n_ubatch": args.ubatch_size,
            "n_threads": threads, "type_k": params.type_k.type_name, "type_v": params.type_v.type_name,
            "n_gpu_layers": args.n_gpu_layers, "flash_attn": ctx.flash_attn, "n_prompt": n_prompt, "n_gen": n_gen,
            "test_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "avg_ns": int(statistics.mean(samples)), "stddev_ns": int(statistics.stdev(samples)) if len(samples) > 1
            else 0, "avg_ts": statistics.mean(ts), "stddev_ts": statistics.stdev(ts) if len(ts) > 1 else 0.0,
            "samples_ns": samples, "samples_ts": ts,
            "backend": ",".join([d.name() for d in model.devices] + ["CPU"]),
        })
        if not args.quiet:
            print(f"{'pp' if n_prompt else 'tg'}{n_prompt or n_gen}: {results[-1]['avg_ts']:.2f} t/s", file=sys.stderr)
    if args.output == "json":
        print(json.dumps(results, indent=2))
    else:
        _print_markdown(results, model)
    return 0


def _print_markdown(results: list[dict], model: object) -> None:
    hdr = ["model", "size", "params", "backend", "threads", "test", "t/s"]
    rows = []
    for r in results:
        test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
        rows.append([r["model_type"], f"{r['model_size'] / 2**20:.2f} MiB", f"{r['model_n_params'] / 1e6:.2f} M",
                     r["backend"], str(r["n_threads"]), test, f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}"])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(hdr)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(hdr, widths, strict=True)) + " |")
    print("| " + " | ".join("-" * (w - 1) + (":" if i >= 4 else "-") for i, w in enumerate(widths)) + " |")
    for row in rows:
        print("| " + " | ".join(c.rjust(w) if i >= 4 else c.ljust(w) for i, (c, w) in
                                enumerate(zip(row, widths, strict=True))) + " |")


def run_batched(args: argparse.Namespace) -> int:
    """llama-batched-bench: for every (PP, TG, B), B sequences' prompts then TG batched generation steps."""

    n_pp, n_tg, n_pl = args.npp or [128], args.ntg or [128], args.npl or [1]
    shared = args.pps

    unified = args.kv_unified

    def cells(pp: int, tg: int, pl: int) -> int:
        """KV cells a test fills: the prompts (one if shared in one stream) and every sequence's tokens."""
        return (pp if shared and unified else pl * pp) + pl * tg

    need = max(cells(pp, tg, pl) for pp in n_pp for tg in n_tg for pl in n_pl)
    if not unified:  # equal streams: the longest test's sequence in each
        need = max(n_pl) * max(pp + tg for pp in n_pp for tg in n_tg)
    model, _ = load_model(args, vocab=False)  # random token ids: no tokenizer
    n_vocab = model.hparams.n_vocab
    rand = glibc_rand_stream()
    ctx = make_context(args, model, n_ctx=args.ctx_size or need, n_seq_max=max(n_pl),
                       n_batch=min(args.batch_size, args.ctx_size or need))
    n_batch = ctx.n_batch

    def decode_all(tokens: list[int], pos: list[int], seqs: list[int], out: list[bool]) -> None:
        for i in range(0, len(tokens), n_batch):  # llama-batched-bench's decode_helper
            ctx.decode_batch(Batch(token=tokens[i : i + n_batch], pos=pos[i : i + n_batch],
                                   seq_id=[[s] for s in seqs[i : i + n_batch]], logits=out[i : i + n_batch]))

    decode_all([next(rand) % n_vocab for _ in range(16)], list(range(16)), [0] * 16, [False] * 15 + [True])  # warm-up
    tests = [(pp, tg, pl) for pp in n_pp for tg in n_tg for pl in n_pl
             if cells(pp, tg, pl) <= ctx.n_ctx and (unified or pp + tg <= ctx.n_ctx_seq)]
    if not tests:
        per_seq = "" if unified else f", {ctx.n_ctx_seq} per sequence"
        raise CLIError(f"no test fits the context of {ctx.n_ctx} cells (-c{per_seq})")
    if args.output != "json":
        print(f"n_kv_max = {ctx.n_ctx}, n_batch = {n_batch}, n_ubatch = {ctx.n_ubatch}, is_pp_shared = {int(shared)}, "
              f"n_threads = {ctx.backend.n_threads}\n")
        print(f"|{'PP':>6} | {'TG':>6} | {'B':>4} | {'N_KV':>6} | {'T_PP s':>8} | {'S_PP t/s':>8} | {'T_TG s':>8} | "
              f"{'S_TG t/s':>8} | {'T s':>8} | {'S t/s':>8} |")
        print("|" + "|".join(["-" * 7, "-" * 8, "-" * 6, "-" * 8] + ["-" * 10] * 6) + "|")
    for pp, tg, pl in tests:
        n_kv, n_prompt = cells(pp, tg, pl), pp * (1 if shared else pl)
        ctx.clear()
        prompts = range(1 if shared else pl)
        t0 = time.perf_counter()
        decode_all([next(rand) % n_vocab for _ in prompts for _ in range(pp)],
                   [i for _ in prompts for i in range(pp)], [j for j in prompts for _ in range(pp)],
                   [i == pp - 1 for _ in prompts for i in range(pp)])
        t_pp = time.perf_counter() - t0
        if shared:  # the cells, or with a stream per sequence copies of them (not timed, as in llama.cpp)
            for j in range(1, pl):
                ctx.seq_cp(0, j)
        t1 = time.perf_counter()
        for i in range(tg):
            decode_all([next(rand) % n_vocab for _ in range(pl)], [pp + i] * pl, list(range(pl)), [True] * pl)
        t_tg = time.perf_counter() - t1
        t = t_pp + t_tg
        row = {"pp": pp, "tg": tg, "pl": pl, "n_kv": n_kv, "t_pp": t_pp,
               "speed_pp": n_prompt / t_pp, "t_tg": t_tg, "speed_tg": pl * tg / t_tg,
               "t": t, "speed": n_kv / t, "is_pp_shared": int(shared),
               "n_batch": n_batch, "n_ubatch": ctx.n_ubatch, "n_threads": ctx.backend.n_threads}
        if args.output == "json":
            print(json.dumps(row))
        else:
            print(f"|{pp:6d} | {tg:6d} | {pl:4d} | {n_kv:6d} | {t_pp:8.3f} | {row['speed_pp']:8.2f} | "
                  f"{t_tg:8.3f} | {row['speed_tg']:8.2f} | {t:8.3f} | {row['speed']:8.2f} |", flush=True)
    return 0
