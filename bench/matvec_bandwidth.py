"""Decode mat-vec speed per weight type, against this machine's memory read bandwidth.

Token generation reads every weight once per token, so a mat-vec kernel's speed is best told as
GB/s of weight bytes next to what the memory can deliver. This script measures

* the read bandwidth: a streaming numba int64 reduction over 1 GiB, on 1 and on N threads;
* per weight type: a MUL_MAT of a (rows x K) weight by one activation row, through the CPU
  backend's compiled graph plan (the path decode takes: Q8 activation quantization, barrier,
  chunked integer dot products), on 1 and on N threads, as GB/s of weight bytes and as a
  fraction of the measured bandwidth.

The default shape (8960 x 1536, 13.8 M weights) is Qwen2.5 1.5B's ffn_up: large enough that the
weight does not fit in cache, as in a real decode step.

    python bench/matvec_bandwidth.py [-t 2] [--rows 8960 --k 1536] [--types q4_K,q6_K] [--repack]
"""

from __future__ import annotations

import argparse
import threading
import time

import numba
import numpy as np

import pyggml as gg
from pyggml import quants
from pyggml.backend.cpu.quants import repacked
from pyggml.backend.cpu.repack_buffer import repack_buffer_type
from pyggml.types import GGMLType

DEFAULT_TYPES = "q8_0,q4_0,q5_0,iq4_nl,q4_K,q5_K,q6_K,f16"


@numba.njit(nogil=True, cache=True)
def _stream_sum(a: np.ndarray, i0: int, i1: int) -> int:  # pragma: no cover - compiled
    # a vectorized sum: the four scalar accumulators this was read 5.4 GB/s a thread on a 2-core EPYC whose
    # memory gives 27.7 (34.9 on two), so the kernels' shares of it read far above 100%
    return a[i0:i1].sum()


def _stream_once(a: np.ndarray, n_threads: int) -> float:
    """GB/s of one streaming read of all of ``a`` split between ``n_threads`` threads."""
    chunk = a.size // n_threads // 4 * 4
    ths = [threading.Thread(target=_stream_sum, args=(a, t * chunk, (t + 1) * chunk)) for t in range(n_threads)]
    t0 = time.perf_counter()
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    return n_threads * chunk * 8 / (time.perf_counter() - t0) / 1e9


def read_bandwidth(n_threads: int, nbytes: int = 1 << 30, reps: int = 3) -> float:
    """GB/s of a streaming read of ``nbytes`` split between ``n_threads`` threads (best of reps)."""
    a = np.ones(nbytes // 8, np.int64)
    _stream_sum(a, 0, 64)
    return max(_stream_once(a, n_threads) for _ in range(reps))


#: total weight bytes one timed graph reads: several copies of the weight, well past the L3 cache,
#: so every product streams from memory as in a real decode step
STREAM_BYTES = 192 << 20


def matvec_gbs(ty: GGMLType, rows: int, k: int, n_threads: int, reps: int, repack: bool = False,
               cols: int = 1, best: bool = False) -> float:
    """GB/s of weight bytes of MUL_MATs by ``cols`` activation rows (see matvec_share)."""
    return matvec_share(ty, rows, k, n_threads, reps, repack, cols, best)[0]


def matvec_share(ty: GGMLType, rows: int, k: int, n_threads: int, reps: int, repack: bool = False,
                 cols: int = 1, best: bool = False, stream: np.ndarray | None = None) -> tuple[float, float]:
    """GB/s of weight bytes of MUL_MATs by ``cols`` activation rows through the CPU plan (median of reps);
    repack: the weights in the CPU_REPACK buffer type (bytes counted in the GGUF layout either way); best: the
    fastest rep instead of the median (on a shared machine, the run least disturbed by other work), timed in CPU time
    on one thread. stream: an int64 array read (on n_threads threads) just before each rep; then the second
    value is the median over the reps of the product's GB/s over that read's, a share of the bandwidth that
    holds up on a machine whose load changes from second to second (else nan)."""
    rng = np.random.default_rng(0)
    w_f32 = rng.standard_normal((rows, k)).astype(np.float32)
    # the IQ1/IQ2 types require an importance matrix: a flat one
    imatrix = np.ones(k, np.float32) if ty.is_quantized and quants.requires_imatrix(ty) else None
    wbytes = (w_f32.astype(np.float16).view(np.uint8) if ty == GGMLType.F16
              else quants.quantize(w_f32, ty, imatrix=imatrix))
    copies = max(1, -(-STREAM_BYTES // wbytes.nbytes))
    wctx = gg.init(copies * 1024 + 4096, no_alloc=True)
    ctx = gg.init(copies * (4 * rows * cols + 1024) + 4 * k * cols + 16 * 1024 * 1024)
    x = ctx.new_tensor(GGMLType.F32, k, cols)
    x.set(rng.standard_normal((cols, k)).astype(np.float32))
    ws = [wctx.new_tensor(ty, k, rows) for _ in range(copies)]
    buft = repack_buffer_type() if repack else gg.backend_cpu_buffer_type()
    buf = gg.backend_alloc_ctx_tensors_from_buft(wctx, buft)
    gf = gg.new_graph(ctx)
    for w in ws:
        gg.backend_tensor_set(w, wbytes)
        gg.build_forward_expand(gf, gg.mul_mat(ctx, w, x))
    gg.graph_compute_with_ctx(ctx, gf, n_threads)
    times, shares = [], []
    # one thread: the caller's CPU time, which a descheduling by other work on a shared machine leaves out
    clock = time.thread_time if best and n_threads == 1 else time.perf_counter
    nbytes = copies * wbytes.nbytes
    for _ in range(reps):
        bw = _stream_once(stream, n_threads) if stream is not None else float("nan")
        t0 = clock()
        gg.graph_compute_with_ctx(ctx, gf, n_threads)
        times.append(clock() - t0)
        shares.append(nbytes / times[-1] / 1e9 / bw)
    buf.free()
    return nbytes / float(np.min(times) if best else np.median(times)) / 1e9, float(np.median(shares))


def column_costs(args: argparse.Namespace) -> None:
    """Per type, the time of an n-row product over the one-row time (fastest of the reps), and the cost of each
    extra row (in one-row products): 1.0 would be every row re-reading the weight, 0 the weight read once for
    all rows. Repackable types are timed as the model runner stores them (repacked) when --repack is given."""
    cols = sorted({1, *(int(c) for c in args.cols.split(","))})
    print(f"{args.rows} x {args.k}, {args.threads} threads: time of n activation rows / time of 1 (extra-row cost)")
    print(f"{'type':<10}" + "".join(f"{f'n={c}':>16}" for c in cols))
    for name in args.types.split(","):
        ty = GGMLType[name.upper()]
        rp = args.repack and ty in repacked.TYPES
        gbs = {c: matvec_gbs(ty, args.rows, args.k, args.threads, args.reps, rp, c, best=True) for c in cols}
        base = gbs[1]
        cells = []
        for c in cols:
            ratio = base / gbs[c]  # time ratio: bytes are the same for every c
            cells.append(f"{ratio:6.2f} ({(ratio - 1) / max(c - 1, 1):5.2f})")
        print(f"{name + (' rp' if rp else ''):<10}" + "".join(f"{c:>16}" for c in cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=8960)
    ap.add_argument("--k", type=int, default=1536)
    ap.add_argument("--types", default=DEFAULT_TYPES)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--cols", default="",
                    help="comma-separated activation row counts (e.g. 1,2,4,8): instead of the bandwidth table, the "
                         "time of a product by each count as a multiple of the one-row time (a batch of decodes)")
    ap.add_argument("--repack", action="store_true",
                    help="also time each type the CPU_REPACK buffer type takes, its weights repacked")
    args = ap.parse_args()
    if args.cols:
        column_costs(args)
        return
    bw = {1: read_bandwidth(1), args.threads: read_bandwidth(args.threads)}
    print(f"memory read bandwidth: {bw[1]:.1f} GB/s on 1 thread, {bw[args.threads]:.1f} GB/s on {args.threads}")
    print(f"mat-vec {args.rows} x {args.k}, one activation row, GB/s of weight bytes (share of the bandwidth above; "
          "in [], the median share of a streaming read of as many bytes just before each rep)")
    print(f"{'type':<8} {'1 thread':>22} {f'{args.threads} threads':>22}")
    stream = np.ones(STREAM_BYTES // 8, np.int64)
    for name in args.types.split(","):
        ty = GGMLType[name.upper()]
        variants = [False] + ([True] if args.repack and ty in repacked.TYPES else [])
        for rp in variants:
            g1, s1 = matvec_share(ty, args.rows, args.k, 1, args.reps, rp, stream=stream)
            gn, sn = matvec_share(ty, args.rows, args.k, args.threads, args.reps, rp, stream=stream)
            print(f"{name + (' rp' if rp else ''):<8} {g1:7.1f} ({g1 / bw[1]:4.0%}) [{s1:4.0%}] "
                  f"{gn:7.1f} ({gn / bw[args.threads]:4.0%}) [{sn:4.0%}]")


if __name__ == "__main__":
    main()
