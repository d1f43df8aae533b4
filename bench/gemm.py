"""Prompt-size MUL_MAT speed per weight type: the integer GEMM (quants/gemm.py) against the numpy kernel's
dequantized tiles + BLAS sgemm, in GOPS (2 * rows * K * activation rows per second).

    python bench/gemm.py [-t 2] [--shape 8960x1536] [--cols 512] [--types q4_K,q6_K,q4_0,q5_0]
    python bench/gemm.py --mv --cols 16,32,64,96,128 --types q4_K,q5_K,q6_K,q8_0,q4_0,q5_0

``--types f16,f32`` measures the float tiles (attention's KQ and KQV products with an F16 cache).

``--mv`` instead compares the fused mat-vec kernels (several activation rows per weight decode)
with what larger products take (the GEMM, or dequantize + BLAS for types without one): where the
two cross is traits.MATVEC_MAX_COLS.

The default shape is Qwen2.5 1.5B's ffn_up (8960 rows of 1536); ``--shape 1536x8960`` is its ffn_down.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import numpy as np

import pyggml as gg
from pyggml import quants
from pyggml.backend.cpu import traits
from pyggml.backend.cpu.compute import graph_compute


def gops(ty: gg.GGMLType, rows: int, k: int, cols: int, n_threads: int, jit: bool, reps: int) -> float:
    rng = np.random.default_rng(0)
    ctx = gg.init(rows * k + 8 * k * cols + 64 * 1024 * 1024)
    w = ctx.new_tensor(ty, k, rows)
    values = rng.standard_normal((rows, k)).astype(np.float32)
    if ty in (gg.GGMLType.F16, gg.GGMLType.F32):
        w.set(values)
    else:
        w.numpy()[...] = quants.quantize(values, ty)
    x = ctx.new_tensor(gg.GGMLType.F32, k, cols)
    x.set(rng.standard_normal((cols, k)).astype(np.float32))
    gf = gg.new_graph(ctx)
    gg.build_forward_expand(gf, gg.mul_mat(ctx, w, x))
    os.environ["PYGGML_JIT"] = "1" if jit else "0"
    graph_compute(gf, n_threads)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        graph_compute(gf, n_threads)
        times.append(time.perf_counter() - t0)
    return 2 * rows * k * cols / statistics.median(times) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--shape", default="8960x1536", help="ROWSxK of the weight")
    ap.add_argument("--cols", default="512", help="activation rows (prompt tokens), comma-separated")
    ap.add_argument("--mv", action="store_true", help="fused mat-vec against GEMM/BLAS (see above)")
    ap.add_argument("--types", default="q4_K,q6_K,q4_0,q5_0")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    rows, k = (int(v) for v in args.shape.split("x"))
    heads = ("fused mat-vec", "GEMM or BLAS") if args.mv else ("integer GEMM", "dequant+BLAS")
    print(f"MUL_MAT {rows} x {k} weight, {args.threads} threads, GOPS (median of {args.reps}):")
    print(f"{'type':<6} {'rows':>5} {heads[0]:>13} {heads[1]:>13} {'ratio':>6}")
    for name in args.types.split(","):
        ty = gg.GGMLType[name.upper()]
        for cols in (int(c) for c in args.cols.split(",")):
            if args.mv:
                row = traits.TYPE_TRAITS_CPU[ty]  # the selectors read the row's limit
                traits.TYPE_TRAITS_CPU[ty] = dataclasses.replace(row, matvec_max_cols=cols)
                a = gops(ty, rows, k, cols, args.threads, True, args.reps)
                traits.TYPE_TRAITS_CPU[ty] = dataclasses.replace(row, matvec_max_cols=0)
                b = gops(ty, rows, k, cols, args.threads, True, args.reps)
                traits.TYPE_TRAITS_CPU[ty] = row
            else:
                a = gops(ty, rows, k, cols, args.threads, True, args.reps)
                b = gops(ty, rows, k, cols, args.threads, False, args.reps)
            print(f"{name:<6} {cols:5d} {a:13.1f} {b:13.1f} {a / b:5.2f}x", flush=True)


if __name__ == "__main__":
    main()
