"""CPU kernel speed: MUL_MAT per weight type at decoder-like shapes, and per-node dispatch overhead.

    python bench/bench_cpu_kernels.py [--threads N] [--repeat R]

Shapes follow Gemma 3 270M (n_embd 640, n_ff 2048; ffn_down is the weight K-quants can hold): a
decode step is a mat-vec (n = 1), a prompt a mat-mat (n = 32). Figures are wall-clock per node,
best of R runs; on a shared machine run it when the machine is otherwise idle.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pyggml.backend.cpu.compute import graph_compute
from pyggml.context import Context
from pyggml.graph import Graph
from pyggml.ops import builders as B
from pyggml.types import GGMLType


def _timed(g: Graph, n_threads: int, repeat: int) -> float:
    graph_compute(g, n_threads)  # warm-up (numba JIT, BLAS threads)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        graph_compute(g, n_threads)
        best = min(best, time.perf_counter() - t0)
    return best


def bench_mul_mat(n_threads: int, repeat: int) -> None:
    rng = np.random.default_rng(0)
    k, m = 2048, 640
    print(f"MUL_MAT weight [{k} x {m}] (Gemma 3 270M ffn_down), best of {repeat}")
    print(f"{'type':>8} {'n':>4} {'ms/node':>9} {'GB/s weight':>12} {'GFLOP/s':>9}")
    for ty in (GGMLType.F32, GGMLType.F16, GGMLType.Q8_0, GGMLType.Q6_K, GGMLType.Q5_K, GGMLType.Q4_K,
               GGMLType.Q5_0, GGMLType.Q4_0):
        ctx = Context(256 << 20)
        w = ctx.new_tensor(ty, k, m)
        w.set(rng.uniform(-1, 1, size=(m, k)).astype(np.float32))
        for n in (1, 32):
            x = ctx.new_tensor(GGMLType.F32, k, n)
            x.set(rng.uniform(-1, 1, size=(n, k)).astype(np.float32))
            g = Graph()
            g.build_forward_expand(B.mul_mat(ctx, w, x))
            dt = _timed(g, n_threads, repeat)
            gbs = w.nbytes() / dt / 1e9
            print(f"{ty.type_name:>8} {n:>4} {dt * 1e3:9.3f} {gbs:12.2f} {2 * k * m * n / dt / 1e9:9.2f}")


def bench_output_head(n_threads: int, repeat: int) -> None:
    """Gemma 3 270M's tied output head: Q8_0 [640 x 262144], the largest matmul of a decode step."""
    rng = np.random.default_rng(0)
    k, m = 640, 262144
    ctx = Context(200 << 20)
    w = ctx.new_tensor(GGMLType.Q8_0, k, m)
    blocks = w.view4().reshape(m, k // 32, 34)
    blocks[..., 2:] = rng.integers(0, 256, size=(m, k // 32, 32), dtype=np.uint8)  # random int8 quants
    blocks[..., :2] = np.full((m, k // 32), 0.01, dtype=np.float16).view(np.uint8).reshape(m, k // 32, 2)
    x = ctx.new_tensor(GGMLType.F32, k, 1)
    x.set(rng.uniform(-1, 1, size=(1, k)).astype(np.float32))
    g = Graph()
    g.build_forward_expand(B.mul_mat(ctx, w, x))
    dt = _timed(g, n_threads, repeat)
    print(f"output head q8_0 [{k} x {m}] n=1: {dt * 1e3:.1f} ms ({w.nbytes() / dt / 1e9:.2f} GB/s)")


def bench_dispatch(n_threads: int, repeat: int) -> None:
    """A chain of small nodes: the per-node cost a decode step pays ~25 times per layer."""
    ctx = Context(64 << 20)
    x = ctx.new_tensor(GGMLType.F32, 640)
    x.set(np.ones(640, dtype=np.float32))
    w = ctx.new_tensor(GGMLType.F32, 640)
    w.set(np.ones(640, dtype=np.float32))
    t = x
    n_nodes = 600
    for i in range(n_nodes // 3):
        t = B.rms_norm(ctx, t, 1e-6)
        t = B.mul(ctx, t, w)
        t = B.add(ctx, t, x) if i % 2 else B.scale(ctx, t, 0.5)
    g = Graph(size=4096)
    g.build_forward_expand(t)
    dt = _timed(g, n_threads, repeat)
    print(f"dispatch: {g.n_nodes} small nodes (640 floats) in {dt * 1e3:.2f} ms = {dt / g.n_nodes * 1e6:.1f} us/node")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    bench_mul_mat(args.threads, args.repeat)
    bench_output_head(args.threads, args.repeat)
    bench_dispatch(args.threads, args.repeat)


if __name__ == "__main__":
    main()
