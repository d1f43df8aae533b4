"""The executor's cost per node: a long chain of tiny ops, numpy kernels vs the compiled plan.

A decode step of a small model is hundreds of nodes doing microseconds of work each, so what the
executor spends per node decides the token rate as much as the kernels do. This runs a chain of
N tiny nodes (RMS_NORM, MUL, ADD, SCALE on 64 floats, repeating) through ``graph_compute`` with
the compiled kernels off (``PYGGML_JIT=0``: a Python kernel call per node) and on (one command for
the whole chain: each thread walks the nodes, a barrier after each), and prints microseconds per
node. The graph is reused between runs, as the scheduler reuses a decode graph.

    python bench/node_overhead.py [--nodes 600] [-t 2] [--reps 50]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import pyggml as gg
from pyggml.backend.cpu.compute import graph_compute


def chain(n_nodes: int) -> gg.Graph:
    ctx = gg.init(64 * 1024 * 1024)
    x = ctx.new_tensor(gg.GGMLType.F32, 64)
    w = ctx.new_tensor(gg.GGMLType.F32, 64)
    x.set(np.linspace(-1, 1, 64, dtype=np.float32))
    w.set(np.full(64, 0.5, np.float32))
    cur = x
    for i in range(n_nodes):
        op = i % 4
        if op == 0:
            cur = gg.rms_norm(ctx, cur, 1e-6)
        elif op == 1:
            cur = gg.mul(ctx, cur, w)
        elif op == 2:
            cur = gg.add(ctx, cur, x)
        else:
            cur = gg.scale(ctx, cur, 0.9)
    gf = gg.new_graph_custom(ctx, n_nodes + 16) if hasattr(gg, "new_graph_custom") else gg.new_graph(ctx)
    gg.build_forward_expand(gf, cur)
    gf._keep = ctx  # the context owns the tensors' memory
    return gf


def per_node_us(gf: gg.Graph, n_threads: int, reps: int) -> float:
    graph_compute(gf, n_threads)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        graph_compute(gf, n_threads)
        times.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(times) / len(gf.nodes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=600)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    gf = chain(args.nodes)
    results = {}
    for mode in ("0", "1"):
        os.environ["PYGGML_JIT"] = mode
        gf._cpu_plan = None
        results[mode] = per_node_us(gf, args.threads, args.reps)
    print(f"{args.nodes} tiny nodes, {args.threads} threads, median of {args.reps} runs:")
    print(f"  numpy kernels (one Python call per node): {results['0']:7.2f} us/node")
    print(f"  compiled plan (one command per graph):    {results['1']:7.2f} us/node "
          f"({results['0'] / results['1']:.0f}x less)")


if __name__ == "__main__":
    main()
