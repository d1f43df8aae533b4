"""Fast MUL_MAT with a quantized weight: fused integer mat-vec for decode, tiled BLAS for prompts.

Why two paths. A decode step multiplies each weight by one (or a few) activation rows: it is
memory-bound, so the weight must be read once, in its quantized form, and never expanded to
float32 (that writes and re-reads 4 bytes per weight). A prompt multiplies by hundreds of rows:
it is compute-bound, and the fastest multiply numpy has is BLAS sgemm, so the weight is
dequantized a tile of rows at a time (the tile stays in cache) and each tile goes through BLAS.

Numerics follow ggml (ggml-cpu-kernels.md §1-2): the activations are first quantized to the
weight's ``vec_dot_type`` with the x86 quantizers (Q8_0/Q8_1: ``id = 127/amax``, ``rint``, fp16
d; Q8_K: ``-127/max``, f32 d), the per-block integer dot products are exact int32 and the block
scales are applied in float32. The BLAS path multiplies the dequantized weight with these same
quantized activations dequantized ("fake quant"), which equals ggml's integer dot up to float
summation order.

Why the kernels look the way they do (measured, see bench/bench_matvec.py):

* The block dot products are LLVM vector IR emitted by the intrinsics below. Plain
  numba loops over a 16- or 32-code block came out 2-3x slower: numba types ``int32 * int32`` as
  int64, a constant trip count is unrolled to scalar code, and a run-time one is vectorized for
  64 codes per iteration so a block runs in the 8-lane epilogue.
* Q8_0/Q4_0/Q5_0 (most of a Q4_K_M model's decode bytes) use whole-row intrinsics that keep 8
  float lanes across the row like ggml's AVX2 kernels, instead of a horizontal sum per block.
* Rows are addressed through one flat byte array and a row stride, so strided row views (rows
  of a larger buffer) need no copy.
* The activations are quantized once per call, not once per weight row chunk.
* Threads are the CPU backend's persistent workers running ``nogil`` kernels on rows claimed
  first come, first served (:func:`parallel_ranges`), not numba's OpenMP prange: on a busy
  machine an OpenMP region waits for every worker to be scheduled, which cost milliseconds per call.

Entry point: :func:`mul_mat_q`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import numpy as np

from .... import quants
from ....types import GGMLType
from .. import blas, jit, threads
from ..quants.actquant import fake_quant
from ..quants.quantize import _q8_1_sums, _quantize_q8_0, _quantize_q8_k, _scale_blocks
from ..simd import F16_TO_F32
from ..traits import traits

#: fp16 bit pattern -> float32 (exact, as GGML_FP16_TO_FP32)
_F16 = F16_TO_F32


#: fused products reading fewer weight bytes than this (times columns) run on one thread: waking a
#: helper thread costs 20-50 us, and Gemma's 0.4-1.1 MB layer weights (0.05-0.13 ms) measured 20-40%
#: slower on 2 threads; the 178 MB output head is the one that gains (9.6 -> 5.8 ms)
PARALLEL_MIN_BYTES = 4 << 20
#: products smaller than this many flops run BLAS on one thread, for the same reason
BLAS_PARALLEL_MIN_FLOPS = 64_000_000
#: bytes of float32 weight per dequantized tile: about half an L2, so the tile stays cached
#: while BLAS streams the activations past it
_TILE_BYTES = 512 * 1024




# --------------------------------------------------------------------------------------------
# Python side


def _flat_rows(w: np.ndarray) -> tuple[np.ndarray, int]:
    """(flat uint8 view of the rows' memory, row stride in bytes), without copying when rows are
    unit-stride inside; the flat view runs from the first byte of row 0 to the last of row m-1.

    The view is always read-only: weights mmapped from a GGUF are, and numba compiles (and
    caches) a separate specialization per writeability, so one kind means one compile per kernel.
    """
    if w.dtype != np.uint8:
        w = w.view(np.uint8)
    m, rb = w.shape
    if w.strides[1] != 1 or w.strides[0] < rb or m == 0:
        w = np.ascontiguousarray(w)
    if w.flags.c_contiguous:
        flat, rs = w.reshape(-1).view(), rb
    else:
        rs = w.strides[0]
        flat = np.lib.stride_tricks.as_strided(w, shape=((m - 1) * rs + rb,), strides=(1,))
    flat.flags.writeable = False
    return flat, rs


def parallel_ranges(fn: Callable[[int, int], None], total: int, n_threads: int, n_chunks: int) -> None:
    """Run fn(i0, i1) over [0, total) cut into n_chunks ranges, on the caller and n_threads-1 workers.

    The workers are the CPU backend's persistent ones (threads.py): the same threads that run the
    compiled kernels, so a numpy node between two compiled runs never competes with a spinning
    worker for a core. Chunks are claimed first come, first served and the caller works too: it
    only ever waits for chunks a worker has actually started, so a late worker costs nothing and
    the worst case is the single-thread time. ``fn`` should spend its time in ``nogil`` numba
    kernels or BLAS, so the threads really run at once.
    """
    if n_threads <= 1 or n_chunks <= 1 or total <= 1 or not _pool_compiled():
        fn(0, total)
        return
    pool = threads.get_pool()
    if not pool.acquire():  # another thread holds the workers: this product runs alone
        fn(0, total)
        return
    try:
        nth = pool.ensure(min(n_threads, threads.available_cores()))
        n_chunks = min(n_chunks, total)
        bounds = [total * i // n_chunks for i in range(n_chunks + 1)]
        cond = threading.Condition()
        state = {"next": 0, "done": 0}
        errors: list[BaseException] = []

        def work() -> None:
            while True:
                with cond:
                    i = state["next"]
                    if i >= n_chunks:
                        return
                    state["next"] = i + 1
                try:
                    fn(bounds[i], bounds[i + 1])
                except BaseException as e:  # re-raised in the caller
                    errors.append(e)
                with cond:
                    state["done"] += 1
                    cond.notify_all()

        pool.run_python(work, min(nth, n_chunks))
        with cond:
            while state["done"] < n_chunks:
                cond.wait()
    finally:
        pool.release()
    if errors:
        raise errors[0]


def _pool_compiled() -> bool:
    """Whether the workers can run: their loop is compiled, or may be compiled now. A first run's Python kernels
    (jit.deferring) stay on one thread until a background process has compiled it, rather than wait for it."""
    return not jit.deferring() or all(f.load_cached() for f in jit.POOL_FUNCTIONS)


def quantize_activations(x: np.ndarray, vec_dot_type: GGMLType) -> tuple[np.ndarray, ...]:
    """x (n, K) float32 -> (qa int8 (n, K), da f32 per block, extra int32/f32 per block) as ggml-cpu.

    extra is the per-32 sum of q for Q8_0 (asum), s = fp16(d*sum q) for Q8_1, bsums per 16 for Q8_K.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    n, k = x.shape
    qa = np.empty((n, k), np.int8)
    if vec_dot_type == GGMLType.Q8_K:
        da = np.empty((n, k // 256), np.float32)
        bs = np.empty((n, k // 16), np.int32)
        _quantize_q8_k(x, qa, da, bs)
        return qa, da, bs
    da = np.empty((n, k // 32), np.float32)
    asum = np.empty((n, k // 32), np.int32)
    _quantize_q8_0(x, qa, da, asum)
    if vec_dot_type == GGMLType.Q8_1:
        sa = np.empty((n, k // 32), np.float32)
        _q8_1_sums(x, da, asum, sa)
        return qa, da, sa
    return qa, da, asum


def vec_dot_type_of(qtype: GGMLType) -> GGMLType:
    """The type ggml converts src1 to before multiplying with a ``qtype`` weight."""
    if qtype in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):
        return qtype
    return quants.get_codec(qtype).vec_dot_type


def row_dot(qtype: GGMLType) -> Callable:
    """The type's fused row dots; on a first run (jit.deferring: these Python kernels run while the compiled ones
    build aside) the ones taking the activation rows one at a time where the type has them: the same bits,
    compiled in about half the time (Q4_K 1.6 against 2.6 CPU s, Q6_K 1.3 against 2.8, Q8_0 0.6 against 0.9),
    and these compiles are most of a first run's wait for its first token."""
    tr = traits(qtype)
    return tr.row_dot1 if tr.row_dot1 is not None and jit.deferring() else tr.row_dot


def matvec_q(w_rows: np.ndarray, qtype: GGMLType, x: np.ndarray, out: np.ndarray, n_threads: int) -> None:
    """Fused integer path: out[j, r] = ggml vec_dot(w row r, Q8(x[j])) for a type in FUSED.

    Reads the weight once per call in its quantized form; cost grows with x's row count, so it
    is meant for few rows (decode). Rows are split into contiguous ranges shared by the threads
    (parallel_ranges); each output element is one sequential dot, so the result does not depend
    on n_threads.
    """
    wf, rs = _flat_rows(w_rows)
    wi = wf.view(np.int8)
    m = w_rows.shape[0]
    qa, da, extra = quantize_activations(x, vec_dot_type_of(qtype))
    kern = row_dot(qtype)

    def rows(r0: int, r1: int) -> None:
        kern(wf, wi, rs, m, qa, da, extra, _F16, out, r0, r1)

    work_bytes = m * w_rows.shape[1] * x.shape[0]
    nt = n_threads if work_bytes >= PARALLEL_MIN_BYTES else 1
    parallel_ranges(rows, m, nt, min(4 * nt, max(1, m // 64)))


def dequantize_rows(w_rows: np.ndarray, qtype: GGMLType, r0: int, r1: int, y: np.ndarray | None = None) -> np.ndarray:
    """Weight rows r0..r1 as float32 (ggml's to_float), into ``y`` (r1-r0, K) when given."""
    kern = traits(qtype).to_float
    if kern is not None:
        wf, rs = _flat_rows(w_rows)
        k = w_rows.shape[1] // qtype.type_size * qtype.blck_size
        if y is None:
            y = np.empty((r1 - r0, k), np.float32)
        kern(wf, wf.view(np.int8), rs, r0, r1, _F16, y)
        return y
    rows = w_rows[r0:r1]
    if qtype == GGMLType.F32:
        vals = rows.view(np.float32)
    elif qtype == GGMLType.F16:
        vals = rows.view(np.float16).astype(np.float32)
    elif qtype == GGMLType.BF16:
        vals = (rows.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        vals = quants.dequantize(np.ascontiguousarray(rows.view(np.uint8)), qtype)
    if y is None:
        return np.ascontiguousarray(vals, dtype=np.float32)
    y[...] = vals
    return y


#: largest per-thread scratch buffer kept between calls (bytes); bigger ones are allocated fresh
SCRATCH_MAX_BYTES = 32 << 20
_TLS = threading.local()


def scratch(slot: str, shape: tuple[int, ...], dtype: type = np.float32) -> np.ndarray:
    """A C-contiguous uninitialized array of ``shape``, reused by the next call with the same slot
    on this thread (so valid only until then): the caller must be done with it, or copy it, first.

    Why: a fresh np.empty of more than 128 KB comes from mmap, and every one of its pages then
    page-faults (and is zeroed) on the first write. A 512-token prompt allocated ~250 MB of such
    temporaries per decode (dequantized tiles, sgemm results, quantized activations): ~55k minor
    faults, measured 0.2-0.3 s of a 1.65 s pp512. Arrays over SCRATCH_MAX_BYTES are not kept.
    """
    dt = np.dtype(dtype)
    nbytes = math.prod(shape) * dt.itemsize
    if nbytes > SCRATCH_MAX_BYTES:
        return np.empty(shape, dt)
    bufs = _TLS.__dict__.setdefault("bufs", {})
    buf = bufs.get(slot)
    if buf is None or buf.size < nbytes:
        buf = bufs[slot] = np.empty(max(nbytes, 64), np.uint8)
    return buf[:nbytes].view(dt).reshape(shape)


#: activation rows from which _fake_quant_scratch splits the rows between threads (a 640-wide
#: row takes ~1 us to quantize and scale; waking a helper 20-50 us)
_FQ_PARALLEL_ROWS = 128


def _fake_quant_scratch(x: np.ndarray, vec_dot_type: GGMLType, n_threads: int = 1) -> np.ndarray:
    """actquant.fake_quant(x, vec_dot_type) with the compiled quantizers, into this thread's scratch
    (slot "xf"), for the Q8 types; rows are independent, so many rows are split between ``n_threads``
    threads (same bytes)."""
    if vec_dot_type not in (GGMLType.Q8_0, GGMLType.Q8_1, GGMLType.Q8_K):
        return fake_quant(x, vec_dot_type)
    x = np.ascontiguousarray(x, dtype=np.float32)
    n, k = x.shape
    qa = scratch("qa", (n, k), np.int8)
    y = scratch("xf", (n, k))
    if vec_dot_type == GGMLType.Q8_K:
        da = scratch("da", (n, k // 256))
        extra = scratch("extra", (n, k // 16), np.int32)
        quantize = _quantize_q8_k
    else:  # Q8_1's s is not needed for d * q
        da = scratch("da", (n, k // 32))
        extra = scratch("extra", (n, k // 32), np.int32)
        quantize = _quantize_q8_0

    def rows(i0: int, i1: int) -> None:
        quantize(x[i0:i1], qa[i0:i1], da[i0:i1], extra[i0:i1])
        _scale_blocks(qa[i0:i1], da[i0:i1], y[i0:i1])

    nt = n_threads if n >= _FQ_PARALLEL_ROWS else 1
    parallel_ranges(rows, n, nt, nt)
    return y


def matmul_tiles(w_rows: np.ndarray, qtype: GGMLType, x: np.ndarray, out: np.ndarray, n_threads: int) -> None:
    """BLAS path: out = fake_quant(x) @ dequant(w)^T, the weight dequantized a row tile at a time.

    Works for every type with a dequantizer. The tile holds about _TILE_BYTES of float32 so it
    stays in L2 while sgemm streams x past it. Tiles are shared by ``n_threads`` threads
    (parallel_ranges), each dequantizing its tile into its own scratch buffer and running a
    one-thread sgemm that writes straight into out's columns (no temporary, no copy).
    """
    m = w_rows.shape[0]
    xf = _fake_quant_scratch(x, vec_dot_type_of(qtype), n_threads)
    k = xf.shape[1]
    if qtype == GGMLType.F32 and w_rows.dtype == np.float32:
        w_rows = w_rows.view(np.uint8)
    blas.set_threads(1)  # the threads are ours (parallel_ranges), one sgemm per tile each
    nt = n_threads if 2 * m * k * xf.shape[0] >= BLAS_PARALLEL_MIN_FLOPS else 1
    tile = max(8, min(m, _TILE_BYTES // (4 * max(k, 1)) // 8 * 8))
    if nt > 1:  # at least two tiles per thread, so both threads have work on small weights
        tile = max(8, min(tile, (m + 2 * nt - 1) // (2 * nt) + 7) // 8 * 8)
    n_tiles = (m + tile - 1) // tile
    # numpy's matmul calls sgemm on an out= view only if its rows are unit-stride float32
    # (otherwise it silently takes its slow non-BLAS loop): then a temporary and a copy
    direct = out.strides[1] == 4 and out.strides[0] % 4 == 0 and out.strides[0] >= 4 * m

    def tiles(t0: int, t1: int) -> None:
        buf = scratch("tile", (tile, k))
        for t in range(t0, t1):
            r0, r1 = t * tile, min(m, (t + 1) * tile)
            wt = dequantize_rows(w_rows, qtype, r0, r1, buf[: r1 - r0])
            if direct:
                np.matmul(xf, wt.T, out=out[:, r0:r1])
            else:
                out[:, r0:r1] = xf @ wt.T

    parallel_ranges(tiles, n_tiles, nt, n_tiles)


def mul_mat_q(w_rows: np.ndarray, qtype: GGMLType, x: np.ndarray, out: np.ndarray | None = None,
              n_threads: int = 1) -> np.ndarray:
    """out (n, m) float32 = rows of x (n, K) dotted with the m weight rows of ``qtype``, as ggml.

    w_rows: uint8 (m, row_bytes), rows may be strided (a view into a bigger buffer) but each row
    must be contiguous bytes. Few x rows (<= MATVEC_MAX_COLS[qtype]) of a FUSED type take the fused
    integer kernels; everything else goes through dequantized row tiles and BLAS. ``out`` may be
    a strided float32 (n, m) view (e.g. the destination tensor's slice); it is returned.
    """
    qtype = GGMLType(qtype)
    x = np.ascontiguousarray(x, dtype=np.float32)
    n = x.shape[0]
    m, row_bytes = w_rows.shape[0], w_rows.shape[1] * w_rows.itemsize
    if x.ndim != 2 or w_rows.ndim != 2:
        raise ValueError(f"mul_mat_q: w_rows and x must be 2-d, got {w_rows.shape} and {x.shape}")
    if row_bytes % qtype.type_size:
        raise ValueError(f"mul_mat_q: rows of {row_bytes} bytes are not whole {qtype.type_name} blocks")
    k = row_bytes // qtype.type_size * qtype.blck_size
    if x.shape[1] != k:
        raise ValueError(f"mul_mat_q: {qtype.type_name} rows hold {k} values but x rows have {x.shape[1]}")
    if w_rows.dtype != np.uint8:
        w_rows = w_rows.view(np.uint8)
    if out is None:
        out = np.empty((n, m), np.float32)
    elif out.shape != (n, m) or out.dtype != np.float32:
        raise ValueError(f"mul_mat_q: out must be float32 {(n, m)}, got {out.dtype} {out.shape}")
    if n == 0 or m == 0:
        return out
    if n <= traits(qtype).matvec_max_cols:
        target = out if out.flags.c_contiguous else np.empty((n, m), np.float32)
        matvec_q(w_rows, qtype, x, target, n_threads)
        if target is not out:
            out[...] = target
    else:
        matmul_tiles(w_rows, qtype, x, out, n_threads)
    return out
