"""Speed of the IQ2_XXS / IQ2_XS / IQ2_S / IQ1_S / IQ1_M codecs.

Prints, per type: quantize time (wall clock and CPU time of all threads) for an
(n_rows x 4096) matrix scaled up to 4096 x 4096, and dequantize throughput (MB of float32
output per second) next to gguf.quants.dequantize.

    python bench/bench_iq2.py [n_rows]      # default 4096 (the full matrix)
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

import numpy as np

import pyggml.quants as Q
from pyggml.types import GGMLType

TYPES = [GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S, GGMLType.IQ1_S, GGMLType.IQ1_M]


def _best_of(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _gguf_quants():
    """The gguf package's quants module, or None (bench/gguf.py must not shadow the package)."""
    here = str(Path(__file__).resolve().parent)
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != here]
    try:
        return importlib.import_module("gguf.quants")
    except ImportError:
        return None
    finally:
        sys.path[:] = saved


def main() -> None:
    n_rows = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    n_cols = 4096
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n_rows, n_cols), dtype=np.float32)
    imatrix = rng.uniform(0.1, 2.0, n_cols).astype(np.float32)
    gq = _gguf_quants()
    print(f"matrix {n_rows} x {n_cols}; quantize time scaled to 4096 x 4096")
    for ty in TYPES:
        warm = Q.quantize(x[:8], ty, imatrix)  # JIT compile + table build outside the timing
        Q.dequantize(warm, ty)
        t0, c0 = time.perf_counter(), time.process_time()
        q = Q.quantize(x, ty, imatrix)
        tq = (time.perf_counter() - t0) * 4096 / n_rows
        cq = (time.process_time() - c0) * 4096 / n_rows
        mb = x.nbytes / 1e6
        td = _best_of(lambda q=q, ty=ty: Q.dequantize(q, ty))
        line = f"{ty.type_name:8s} quantize {tq:6.2f} s wall {cq:6.2f} s cpu   dequantize {mb / td:6.0f} MB/s"
        if gq is not None:
            tg = _best_of(lambda q=q, ty=ty: gq.dequantize(q, ty.value), repeat=1)
            line += f"   gguf {mb / tg:7.0f} MB/s   x{tg / td:.1f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
