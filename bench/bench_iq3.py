"""IQ3_XXS / IQ3_S speed: quantize a 4096x4096 matrix, dequantize vs the ``gguf`` package.

Run: ``python -P bench/bench_iq3.py [--rows N] [--cols N]`` (``-P`` keeps bench/gguf.py from shadowing
the gguf package). Prints seconds and MB/s; asserts nothing.
"""

from __future__ import annotations

import argparse
import time

import gguf.quants
import numpy as np

from pyggml.quants import dequantize, quantize


def _best_of(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    x = np.random.default_rng(0).standard_normal((args.rows, args.cols)).astype(np.float32)
    imatrix = np.random.default_rng(1).uniform(0.1, 2.0, args.cols).astype(np.float32)
    quantize(x[:1, :256], "iq3_xxs")  # compile / load the numba caches and build the tables
    quantize(x[:1, :256], "iq3_s")

    for name, gtype in (("iq3_xxs", gguf.GGMLQuantizationType.IQ3_XXS), ("iq3_s", gguf.GGMLQuantizationType.IQ3_S)):
        t0, c0 = time.perf_counter(), time.process_time()
        q = quantize(x, name)
        t_q, c_q = time.perf_counter() - t0, time.process_time() - c0
        t0 = time.perf_counter()
        quantize(x, name, imatrix)
        t_qi = time.perf_counter() - t0

        out_mb = x.nbytes / 1e6  # throughput counted on the float32 output
        t_ours = _best_of(lambda q=q, name=name: dequantize(q, name), args.repeat)
        t_gguf = _best_of(lambda q=q, gtype=gtype: gguf.quants.dequantize(q, gtype), args.repeat)
        same = np.array_equal(dequantize(q, name), gguf.quants.dequantize(q, gtype))
        print(
            f"{name:8s} {args.rows}x{args.cols}: quantize {t_q:6.2f} s (CPU {c_q:6.2f} s; imatrix {t_qi:6.2f} s) | "
            f"dequantize {out_mb / t_ours:8.1f} MB/s vs gguf {out_mb / t_gguf:7.1f} MB/s "
            f"({t_gguf / t_ours:5.1f}x, same values: {same})"
        )


if __name__ == "__main__":
    main()
