"""The serve engine with the context's graph cache on and off, in one process, taking turns.

Two engines over the same model (``pyggml serve``'s context: -c 8192 -np 8 -t 2, unified KV cache), one with
``n_graph_cache`` 8 (the default) and one with 0 (one graph kept, as before the cache), run the same load in
turns, level by level and round by round, so both meet the same machine load: where other work shares the
CPU, a comparison of two server processes run one after the other measures the load more than the servers.
Per level: C concurrent clients, each sending serve_load.py's prompts one after another (32 greedy tokens,
``ignore_eos``, no prompt cache); printed: TTFT p50 (submit to the first text) and aggregate tokens/s, and
the medians over rounds with their ratios. The HTTP side is left out (it is the same for both).

    python bench/serve_graph_cache.py                       # 1, 4 and 8 clients, 2 rounds
    python bench/serve_graph_cache.py -c 1 --rounds 3 -m MODEL.gguf
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pyggml.llm.context import ContextParams, LlamaContext
from pyggml.llm.model import Model
from pyggml.llm.sampling import SamplingParams
from pyggml.llm.tokenizer import Vocab
from pyggml.serve.engine import DoneEvent, Engine, ErrorEvent, Task, TaskParams, TokenEvent

QWEN_05B = Path.home() / ".cache/pyggml/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
TOPICS = ["a lighthouse", "the moon", "a cat", "trains", "the sea", "a robot", "rain", "mountains", "a library",
          "coffee", "winter", "a garden", "bees", "a clock", "rivers", "a violin"]


async def one(eng: Engine, vocab: Vocab, i: int, n: int) -> tuple[float, int]:
    """One request: (seconds to its first text, tokens generated)."""
    text = f"Request {i}. Write a short story about {TOPICS[i % len(TOPICS)]} number {i}:"
    toks = vocab.tokenize(text, add_special=True, parse_special=True)
    task = Task(toks, TaskParams(n_predict=n, sampling=SamplingParams(temp=0.0), ignore_eos=True, cache_prompt=False))
    t0 = time.perf_counter()
    eng.submit(task)
    ttft = None
    while True:
        ev = await task.queue.get()
        if isinstance(ev, TokenEvent) and ttft is None and ev.text:
            ttft = time.perf_counter() - t0
        elif isinstance(ev, DoneEvent):
            return (ttft if ttft is not None else time.perf_counter() - t0), ev.n_decoded
        elif isinstance(ev, ErrorEvent):
            raise RuntimeError(ev.error)


async def level(eng: Engine, vocab: Vocab, clients: int, n_requests: int, n: int) -> tuple[float, float]:
    """(TTFT p50 seconds, aggregate tokens/s) of ``clients`` concurrent clients sharing ``n_requests``."""
    counter = iter(range(n_requests))
    ttfts: list[float] = []
    tokens = 0

    async def worker() -> None:
        nonlocal tokens
        for i in counter:
            t, k = await one(eng, vocab, i, n)
            ttfts.append(t)
            tokens += k

    await one(eng, vocab, 10_000, 4)  # warm-up, not counted
    t0 = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(clients)])
    return statistics.median(ttfts), tokens / (time.perf_counter() - t0)


async def run(engines: dict[str, Engine], vocab: Vocab, args: argparse.Namespace) -> None:
    res: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        for k, c in enumerate(args.clients):
            names = list(engines) if (r + k) % 2 == 0 else list(engines)[::-1]  # who goes first alternates
            for name in names:
                ttft, tps = await level(engines[name], vocab, c, max(6, 2 * c), args.n)
                res.setdefault((name, c), []).append((ttft, tps))
                ctx = engines[name].ctx
                print(f"round {r} clients {c} {name}: TTFT p50 {ttft * 1e3:7.0f} ms  {tps:7.2f} tok/s  "
                      f"(graphs built {ctx.n_graph_builds}, restored {ctx.n_graph_restores})", flush=True)
    print("\n| clients | cache on TTFT p50 | cache off TTFT p50 | ratio | cache on tok/s | cache off tok/s | ratio |\n"
          "|---|---|---|---|---|---|---|")
    for c in args.clients:
        on, off = res[("cache on", c)], res[("cache off", c)]
        t_on, t_off = (statistics.median(x[0] for x in v) * 1e3 for v in (on, off))
        p_on, p_off = (statistics.median(x[1] for x in v) for v in (on, off))
        print(f"| {c} | {t_on:.0f} ms | {t_off:.0f} ms | {t_on / t_off:.2f}x | {p_on:.2f} | {p_off:.2f} | "
              f"{p_on / p_off:.2f}x |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=str(QWEN_05B))
    ap.add_argument("-c", "--clients", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("-n", type=int, default=32, help="tokens per request (default 32)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    model = Model(args.model, progress=False)
    vocab = Vocab.from_metadata(model.reader)
    print(f"# {' '.join(sys.argv)}")
    engines = {}
    for name, cache in (("cache on", 8), ("cache off", 0)):
        ctx = LlamaContext(model, ContextParams(n_ctx=8192, n_batch=2048, n_ubatch=512, n_threads=args.threads,
                                                flash_attn=None, n_seq_max=8, kv_unified=True, n_graph_cache=cache))
        engines[name] = Engine(ctx, vocab, 8, 8192)
        engines[name].start()
    try:
        asyncio.run(run(engines, vocab, args))
    finally:
        for e in engines.values():
            e.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
