"""Where a whole tool run's memory and CPU time go: ``pyggml perplexity``, ``imatrix`` or ``bench -npl`` run
in this process with probes around its steps (issue #31 item 6; bench/vs_tools.py gives the ratios).

    python bench/tool_profile.py [--ops] -- perplexity -m gemma.gguf -f text.txt -c 512 --chunks 8 -t 2
    python bench/tool_profile.py -- bench -m gemma.gguf -npp 128 -ntg 64 -npl 1,4 -c 2048 -t 2 -q

Memory: the resident set split by mapping (the GGUF file's pages, numba's LLVM library, other files,
anonymous memory) from ``/proc/self/smaps`` after the imports, the model load, the context's creation,
the first decode of every new batch shape and at the end, with the peak so far (``ru_maxrss``), and
the largest Python/numpy allocations (tracemalloc) at the peak decode. Compare llama.cpp's split with
``/proc/PID/smaps_rollup`` of its tool while it runs.

CPU: process CPU seconds (all threads; robust to a loaded machine, unlike wall time) of the graph
computes, of perplexity's log-softmax (the logits sink) and of the rest. With ``--ops`` the graphs run
node by node and each node's CPU time is summed per (op, weight type, shape): a node-by-node run adds a
round-trip per node, so small nodes read high; the big products read true.
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import sys
import time
import tracemalloc
from pathlib import Path


def rss_split(model_path: str | None) -> dict[str, int]:
    """Resident MB per kind of mapping: the model file, libllvmlite, other files, anonymous (heap included)."""
    out: collections.Counter = collections.Counter()
    kind = "anon"
    model = os.path.realpath(model_path) if model_path else None
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and not parts[0].endswith(":"):  # a mapping's header line
                path = parts[5] if len(parts) > 5 else ""
                if not path or path.startswith("["):
                    kind = "anon"
                elif model is not None and os.path.realpath(path) == model:
                    kind = "model"
                elif "llvmlite" in path:
                    kind = "llvm"
                else:
                    kind = "files"
            elif parts[0] == "Rss:":
                out[kind] += int(parts[1])
    return {k: out[k] // 1024 for k in ("model", "llvm", "files", "anon")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", action="store_true", help="CPU time per op and shape (graphs run node by node)")
    ap.add_argument("--alloc", action="store_true", help="also trace Python/numpy allocations (tracemalloc; slow)")
    ap.add_argument("--top", type=int, default=20, help="rows of the per-op table and allocations (default 20)")
    ap.add_argument("tool", nargs=argparse.REMAINDER, help="the pyggml command line after --")
    args = ap.parse_args()
    tool = args.tool[1:] if args.tool[:1] == ["--"] else args.tool
    if not tool:
        ap.error("give the pyggml command after --, e.g. -- perplexity -m model.gguf -f text.txt")
    model_path = tool[tool.index("-m") + 1] if "-m" in tool else None

    def mem(tag: str) -> None:
        split = rss_split(model_path)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        print(f"[mem] {tag:<34} rss {sum(split.values()):5d} MB = model {split['model']:4d} + llvm {split['llvm']:3d} "
              f"+ files {split['files']:3d} + anon {split['anon']:4d}; peak {peak:5d} MB", file=sys.stderr, flush=True)

    if args.alloc:
        tracemalloc.start(6)
    cpu0 = time.process_time()
    from pyggml.backend.cpu.plan import GraphPlan, _Python, available_cores, get_pool
    from pyggml.cli import perplexity as ppl_mod
    from pyggml.cli.main import main as cli_main
    from pyggml.llm import context as ctx_mod
    from pyggml.llm.model import Model

    mem("imports")
    spent: collections.Counter = collections.Counter()
    per_op: collections.Counter = collections.Counter()
    n_op: collections.Counter = collections.Counter()

    model_init = Model.__init__

    def model_init_probe(self: Model, *a: object, **k: object) -> None:
        model_init(self, *a, **k)
        mem("model loaded")

    ctx_init = ctx_mod.LlamaContext.__init__

    def ctx_init_probe(self: object, *a: object, **k: object) -> None:
        ctx_init(self, *a, **k)
        mem("context made")

    seen: set[tuple[int, int]] = set()
    peak_snap: list = [0, None]
    decode_batch = ctx_mod.LlamaContext.decode_batch

    def decode_probe(self: object, batch: object, *a: object, **k: object) -> object:
        out = decode_batch(self, batch, *a, **k)
        shape = (batch.n_tokens, sum(bool(x) for x in batch.logits) if batch.logits is not None else 1)
        if shape not in seen:
            seen.add(shape)
            mem(f"first decode of {shape[0]} tokens, {shape[1]} out")
            cur = tracemalloc.get_traced_memory()[0]
            if args.alloc and cur > peak_snap[0]:
                peak_snap[:] = [cur, tracemalloc.take_snapshot()]
        return out

    compute = GraphPlan.compute

    def compute_probe(self: GraphPlan, n_threads: int, abort_callback: object = None) -> int:
        t0 = time.process_time()
        try:
            if not args.ops:
                return compute(self, n_threads, abort_callback)
            pool = get_pool()
            pool.acquire()
            try:
                nth = pool.ensure(max(1, min(n_threads, available_cores())))
                for step in self.steps:
                    nodes = [(step.node, None)] if isinstance(step, _Python) else [
                        (self.nodes[i], i) for i in range(step.n0, step.n1)]
                    for node, i in nodes:
                        t1 = time.process_time()
                        if i is None:
                            step.fn(node, n_threads)
                        else:
                            self._run(pool, nth, i, i + 1)
                        w, x = node.src[0], node.src[1]
                        key = (node.op.name + ("" if i is not None else " (numpy)"),
                               w.type.type_name if node.op.name.startswith("MUL_MAT") and w is not None else "",
                               "x".join(map(str, node.ne[:3])) + (" <- " + "x".join(map(str, x.ne[:2]))
                                                                  if x is not None else ""))
                        per_op[key] += time.process_time() - t1
                        n_op[key] += 1
            finally:
                pool.release()
            return 0
        finally:
            spent["graph compute"] += time.process_time() - t0

    nlp = ppl_mod.neg_log_probs

    def nlp_probe(*a: object, **k: object) -> object:
        t0 = time.process_time()
        try:
            return nlp(*a, **k)
        finally:
            spent["log-softmax (logits sink)"] += time.process_time() - t0

    Model.__init__ = model_init_probe
    ctx_mod.LlamaContext.__init__ = ctx_init_probe
    ctx_mod.LlamaContext.decode_batch = decode_probe
    GraphPlan.compute = compute_probe
    ppl_mod.neg_log_probs = nlp_probe
    sys.argv = ["pyggml", *tool]
    rc = cli_main()
    mem("end")
    total = time.process_time() - cpu0
    rest = total - sum(spent.values())
    print(f"[cpu] total {total:.2f} s: " + ", ".join(f"{k} {v:.2f} s" for k, v in spent.items())
          + f", the rest (imports, load, tokenizing, Python) {rest:.2f} s; load average {os.getloadavg()[0]:.1f}",
          file=sys.stderr)
    if per_op:
        s = sum(per_op.values())
        print(f"[ops] {s:.2f} CPU s node by node; by op and weight type:", file=sys.stderr)
        by_kind: collections.Counter = collections.Counter()
        for k, v in per_op.items():
            by_kind[k[:2]] += v
        for k, v in by_kind.most_common(args.top):
            print(f"  {v:8.2f} s {v / s:6.1%}  {k[0]} {k[1]}", file=sys.stderr)
        print("[ops] by shape (dst <- src1):", file=sys.stderr)
        for k, v in per_op.most_common(args.top):
            print(f"  {v:8.2f} s {n_op[k]:6d} nodes  {k[0]} {k[1]} {k[2]}", file=sys.stderr)
    if peak_snap[1] is not None:
        stats = peak_snap[1].statistics("traceback")
        print(f"[alloc] traced Python/numpy memory at its largest first decode: {peak_snap[0] / 2**20:.1f} MB; "
              "largest:", file=sys.stderr)
        for st in stats[: args.top // 2]:
            where = " <- ".join(f"{Path(fr.filename).name}:{fr.lineno}" for fr in list(st.traceback)[::-1][:4])
            print(f"  {st.size / 2**20:8.2f} MB  {where}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
