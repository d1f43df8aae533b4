"""``pyggml bench``: prompt processing and generation speed, measured as llama-bench measures them.

Each test gets a fresh context of ``n_prompt + n_gen`` tokens. ``pp N`` decodes N tokens (BOS, then
``rand() % n_vocab`` from glibc's unseeded rand) into an empty cache in batches of ``-b`` with one
output row; ``tg N`` decodes N single tokens. One warm-up run precedes the ``-r`` timed repetitions,
the cache is cleared before each, and t/s is the mean over repetitions of tokens / wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from .common import add_model_args, placement_from_args


def glibc_rand(n: int, seed: int = 1) -> list[int]:
    """The first n values of glibc's rand() after srand(seed) (the TYPE_3 additive generator)."""
    r = [seed]
    for i in range(1, 31):
        r.append((16807 * r[i - 1]) % 2147483647)
        if r[i] < 0:
            r[i] += 2147483647
    for i in range(31, 34):
        r.append(r[i - 31])
    out = []
    i = 34
    while len(out) < n + 310:
        r.append((r[i - 31] + r[i - 3]) & 0xFFFFFFFF)
        if i >= 344:
            out.append(r[i] >> 1)
        i += 1
    return out[:n]


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="measure prompt-processing and generation speed (like llama-bench)",
        description="Benchmark a model as llama-bench does: pp<N> tests decode N prompt tokens at once, tg<N> "
                    "tests generate N tokens one by one. Lists (-p 128,512) run one test per value.",
    )
    add_model_args(p, ctx_size=0)
    p.add_argument("-p", "--n-prompt", type=_ints, default=[512], help="prompt lengths to test (default 512)")
    p.add_argument("-n", "--n-gen", type=_ints, default=[128], help="generation lengths to test (default 128)")
    p.add_argument("-r", "--repetitions", type=int, default=5, help="timed repetitions per test (default 5)")
    p.add_argument("-o", "--output", choices=["md", "json"], default="md", help="output format (default md)")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up run")
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
    from ..llm.context import ContextParams, LlamaContext
    from ..llm.model import Model
    from ..llm.models import default_model_path
    from ..llm.vocab import Vocab
    from .main import CLIError

    if args.repetitions < 1:
        raise CLIError("-r must be at least 1")
    path = args.model or default_model_path()
    model = Model(path, progress=not args.quiet, **placement_from_args(args))
    vocab = Vocab.from_metadata(model.reader)
    hp = model.hparams
    bos = vocab.bos if vocab.add_bos and vocab.bos >= 0 else None
    threads = args.threads or os.cpu_count() or 1
    tests = [(n, 0) for n in args.n_prompt if n > 0] + [(0, n) for n in args.n_gen if n > 0]
    results = []
    for n_prompt, n_gen in tests:
        params = ContextParams(n_ctx=n_prompt + n_gen, n_batch=args.batch_size, n_ubatch=args.ubatch_size,
                               n_threads=threads, flash_attn=args.flash_attn == "on")
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
            "n_gpu_layers": args.n_gpu_layers, "flash_attn": params.flash_attn, "n_prompt": n_prompt, "n_gen": n_gen,
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
