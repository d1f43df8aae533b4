"""Where a decode step's time goes: per-op totals of one reused graph, and the executor's cost per node.

Runs a model's single-token decode graph (after a short prompt) through the CPU backend's plan,
once node by node with a timer around each (compute_timed), and reports per (op, weight type):
total ms per token, share, node count, and for MUL_MAT the GB/s of weight bytes read. Then the
per-node overhead of the executor itself: a whole-graph run (one command, a barrier per node)
against the sum of the node times, and against a plan of the same node count doing no work.

    python bench/node_profile.py -m model.gguf [-t 2] [--reps 20] [--prompt N | --parallel B]
    python bench/node_profile.py -m model.gguf --verify --prompt 4 --n-past 300   # a 4-token speculative check
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import numpy as np

from pyggml.backend.cpu import jit
from pyggml.backend.cpu.plan import GraphPlan
from pyggml.llm.batch import Batch
from pyggml.llm.context import ContextParams, LlamaContext
from pyggml.llm.model import Model
from pyggml.llm.packaged import default_model_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None, help="GGUF model (default: the default model)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20, help="timed decode steps (default 20)")
    ap.add_argument("--n-past", type=int, default=64, help="tokens in the cache before the profiled steps")
    ap.add_argument("--prompt", type=int, default=1, help="tokens per profiled step (default 1: decode; "
                                                           "e.g. 512 profiles a prompt ubatch)")
    ap.add_argument("--parallel", type=int, default=0, help="profile B sequences' batched decode step instead: "
                                                            "one token and its logits per sequence (with --prompt N: "
                                                            "B prompts of N tokens, as llama-batched-bench's pp)")
    ap.add_argument("--verify", action="store_true", help="profile a speculative verification instead: --prompt N "
                                                           "tokens after the --n-past cached ones, every row's logits "
                                                           "out, their cells removed after each step")
    ap.add_argument("--streams", action="store_true", help="a KV stream per sequence (default: unified)")
    ap.add_argument("-fa", "--flash-attn", choices=["on", "off", "auto"], default="auto",
                    help="flash attention (default auto, the tools' default: on for the CPU)")
    args = ap.parse_args()
    model = Model(args.model or default_model_path(), progress=False)
    n_ctx = max(256, 2 * args.n_past + (args.reps + 1) * args.prompt * 2)
    n_seq = max(1, args.parallel)
    n_tok = min(1000, model.hparams.n_vocab - 1)  # token ids 1 .. n_tok
    # an encoder takes the whole batch in one ubatch: B prompts of N tokens with --parallel
    n_batch_tokens = args.prompt * (n_seq if args.parallel and args.prompt > 1 else 1)
    ctx = LlamaContext(model, ContextParams(n_ctx=n_ctx * n_seq, n_threads=args.threads, n_seq_max=n_seq,
                                            n_batch=max(512, args.prompt * n_seq), n_ubatch=max(512, n_batch_tokens),
                                            kv_unified=not args.streams,
                                            flash_attn={"on": True, "off": False}.get(args.flash_attn),
                                            embeddings=not model.arch.has_logits))  # an encoder: embeddings
    for s in range(0, args.n_past, ctx.n_batch):  # the cached tokens, a batch at a time
        ctx.decode(list(range(s + 1, min(args.n_past, s + ctx.n_batch) + 1)))  # positions continue
    for s in range(1, n_seq):
        ctx.seq_cp(0, s)

    def step(first: int) -> None:
        if args.parallel and args.prompt > 1:  # llama-batched-bench's prompts: B sequences at once
            ctx.clear()
            n = args.prompt
            ctx.decode_batch(Batch(token=[(first + i) % n_tok + 1 for i in range(n * n_seq)],
                                   pos=[i for _ in range(n_seq) for i in range(n)],
                                   seq_id=[[s] for s in range(n_seq) for _ in range(n)],
                                   logits=[i == n - 1 for _ in range(n_seq) for i in range(n)]))
            return
        if args.parallel:  # llama-batched-bench's generation step
            pos = ctx.seq_pos_max(0) + 1
            ctx.decode_batch(Batch(token=[(first + s) % n_tok + 1 for s in range(n_seq)], pos=[pos] * n_seq,
                                   seq_id=[[s] for s in range(n_seq)], logits=[True] * n_seq))
            return
        if args.verify:  # [last, draft...] after the cached tokens, all rows out; the draft is then rejected
            n = args.prompt
            ctx.decode([(first + i) % n_tok + 1 for i in range(n)], positions=range(args.n_past, args.n_past + n),
                       outputs=[True] * n)
            ctx.seq_rm(0, args.n_past, -1)
            return
        if args.prompt > 1:  # a prompt into an empty cache, as llama-bench's pp test
            ctx.clear()
        ctx.decode([(first + i) % n_tok + 1 for i in range(args.prompt)])

    step(7)
    timed_mode = {"on": False, "timed": []}
    real_compute = GraphPlan.compute

    def compute(self: GraphPlan, n_threads: int, abort_callback: object = None) -> int:
        if timed_mode["on"]:
            timed_mode["timed"] = self.compute_timed(n_threads)
            return 0
        return real_compute(self, n_threads, abort_callback)

    GraphPlan.compute = compute  # decode sets the inputs; the plan's run is what we time
    per: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    count: collections.Counter = collections.Counter()
    nbytes: dict[tuple[str, str], int] = collections.Counter()
    python_ops: collections.Counter = collections.Counter()
    whole = []
    for rep in range(args.reps):
        t0 = time.perf_counter()
        step(8 + rep)
        whole.append(time.perf_counter() - t0)
        timed_mode["on"] = True
        step(9 + rep)
        timed_mode["on"] = False
        timed = timed_mode["timed"]
        spent: dict[tuple[str, str], float] = collections.Counter()
        for node, compiled, dt in timed:
            w = node.src[0]
            key = (node.op.name, w.type.type_name if node.op.name == "MUL_MAT" and w is not None else "")
            spent[key] += dt
            if rep == 0:
                count[key] += 1
                if node.op.name == "MUL_MAT":
                    nbytes[key] += w.nbytes()
                if not compiled:
                    python_ops[node.op.name] += 1
        for k, v in spent.items():
            per[k].append(v)
    total = sum(statistics.median(v) for v in per.values())
    n_compiled = sum(count.values()) - sum(python_ops.values())
    print(f"{n_compiled} compiled + {sum(python_ops.values())} numpy nodes per step; "
          f"numpy: {dict(python_ops) or 'none'}")
    print(f"{'op':<12} {'weight':<7} {'nodes':>5} {'ms/step':>9} {'share':>6} {'GB/s':>6}")
    for k in sorted(per, key=lambda k: -statistics.median(per[k])):
        ms = 1e3 * statistics.median(per[k])
        gbs = f"{nbytes[k] / (ms * 1e6):6.1f}" if nbytes.get(k) else ""
        print(f"{k[0]:<12} {k[1]:<7} {count[k]:>5} {ms:9.3f} {ms / (1e3 * total):6.1%} {gbs:>6}")
    w = statistics.median(whole)
    n = sum(count.values())
    print(f"\ndecode step (whole graph as one command, plus the context's Python): {1e3 * w:.3f} ms; "
          f"node by node: {1e3 * total:.3f} ms for {n} nodes")
    print(f"compiled kernels: {'on' if jit.enabled() else 'off (PYGGML_JIT=0)'}; threads {args.threads}")
    np.set_printoptions()


if __name__ == "__main__":
    main()
