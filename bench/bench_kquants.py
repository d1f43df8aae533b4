"""K-quant and IQ4 speed: quantize a 4096x4096 matrix, dequantize vs the ``gguf`` package.

Run: ``python bench/bench_kquants.py [--rows N] [--cols N] [--types q4_K,iq4_xs]``.
Prints seconds and MB/s (counted on the float32 side); asserts nothing.
"""

from __future__ import annotations

import argparse
import time

import gguf
import gguf.quants
import numpy as np

from pyggml.quants import chunks, dequantize, quantize

TYPES = ("q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "iq4_nl", "iq4_xs")


def _best_of(fn, repeat: int, clock=time.perf_counter) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
    return best


def _single_thread_cpu(fn, repeat: int) -> float:
    """Best CPU time of ``fn`` quantizing on one thread: a fairer figure than wall time on a
    shared machine, where the other processes decide how much of the wall clock we get."""
    with chunks.using_threads(1):
        return _best_of(fn, repeat, time.process_time)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--types", default=",".join(TYPES))
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.rows, args.cols)).astype(np.float32)
    imatrix = rng.uniform(0.1, 2.0, args.cols).astype(np.float32)
    mb = x.nbytes / 1e6
    print(f"threads: {chunks.n_threads()}, matrix {args.rows}x{args.cols} ({mb:.0f} MB float32)")
    for name in args.types.split(","):
        gtype = getattr(gguf.GGMLQuantizationType, name.upper())
        quantize(x[:1, :256], name)  # load the numba caches
        quantize(x[:1, :256], name, imatrix[:256])
        t_q = _best_of(lambda name=name: quantize(x, name), 1)
        t_qi = _best_of(lambda name=name: quantize(x, name, imatrix), 1)
        q = quantize(x, name)
        dequantize(q[:1], name)
        ours = lambda q=q, name=name: dequantize(q, name)  # noqa: E731
        theirs = lambda q=q, gtype=gtype: gguf.quants.dequantize(q, gtype)  # noqa: E731
        t_ours = _best_of(ours, args.repeat)
        t_gguf = _best_of(theirs, args.repeat)
        cpu_ours = _single_thread_cpu(ours, args.repeat)
        cpu_gguf = _best_of(theirs, args.repeat, time.process_time)
        same = np.array_equal(ours().view(np.uint32), theirs().view(np.uint32))
        print(
            f"{name:7s} quantize {t_q:6.2f} s (imatrix {t_qi:6.2f} s) | "
            f"dequantize {mb / t_ours:7.1f} MB/s vs gguf {mb / t_gguf:6.1f} MB/s ({t_gguf / t_ours:4.1f}x wall, "
            f"{cpu_gguf / cpu_ours:4.1f}x single-thread CPU; bit-identical to gguf: {same})"
        )


if __name__ == "__main__":
    main()
