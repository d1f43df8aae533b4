"""The compiled drivers of the quantized products (ggml's MUL_MAT and MUL_MAT_ID for a quantized weight):
src1 quantized to the weight's vec_dot_type into the shared work buffer, a barrier, then chunks of weight rows
from a shared counter through a row kernel (dots.py). traits.py makes each type's kernels of them."""

from __future__ import annotations

import numba

from ..jit.mathf import LANES
from ..jit.record import AUX, CHUNK_ROWS, T_DST, T_SRC0, T_SRC1, T_SRC2, chunk_bounds, n_chunks, rec
from ..native import atomic_add, f32p, i8p, i32p, u8p
from ..threads import C_CHUNK
from . import gemm

_opts = {"inline": "always", "cache": True, "error_model": "numpy"}


#: weight bytes per work chunk of the fused mat-vec: its row dots stream four ranges of the chunk's rows
#: at once, and 64-row chunks made those streams too short for the hardware prefetcher (Q4_K 8960 x 1536,
#: 2 threads, bench/matvec_bandwidth.py: 15.6 GB/s with 64 rows a chunk, 25.3 with 1024)
_MV_CHUNK_BYTES = 1 << 20


@numba.njit(**_opts)
def _mv_chunks(node, n, nth):  # pragma: no cover - compiled
    """Work chunks of a mat-vec: about _MV_CHUNK_BYTES of weight rows each (ggml's rule below 4 a thread)."""
    r = rec(node)
    return n_chunks(r[T_SRC0 + 2], nth, max(CHUNK_ROWS, _MV_CHUNK_BYTES // r[T_SRC0 + 6]))


@numba.njit(**_opts)
def mv_run(node, c, n_chunks, q, ith, mv):  # pragma: no cover - compiled
    """Chunk c's weight rows against every quantized activation row (``q``: quantize_src1's result), with the
    row kernel ``mv`` (passed, not closed over: numba will not cache a kernel whose closure holds it);
    returns the rows. Chunk bounds are multiples of mathf.LANES (or m), so an activation fused over a chunk's
    outputs takes the row's own vector/tail split."""
    r = rec(node)
    tab = numba.carray(f32p(r[AUX]), 65536)
    w, m, rs = r[T_SRC0], r[T_SRC0 + 2], r[T_SRC0 + 6]
    _, _, _, qa, da, ex, n = q
    r0, r1 = chunk_bounds(m, c, n_chunks, LANES)
    mv(numba.carray(u8p(w), m * rs), numba.carray(i8p(w), m * rs), rs, m, qa, da, ex, tab,
       numba.carray(f32p(r[T_DST]), (n, m)), r0, r1)
    return r0, r1


@numba.njit(**_opts)
def _matvec_q(node, ith, nth, ctrl, quantize, bs, es, mv):  # pragma: no cover - compiled
    """dst (n, m) = Q8(src1 rows) . weight rows, n = ne11*ne12*ne13 rows of K."""
    gemm.walk(node, ith, nth, ctrl, quantize, bs, es, _mv_chunks, mv_run, mv)


@numba.njit(**_opts)
def _mul_mat_id(node, ith, nth, ctrl, quantize, bs, es, mv):  # pragma: no cover - compiled
    r = rec(node)
    tab = numba.carray(f32p(r[AUX]), 65536)
    _, _, _, qa, da, ex, _ = gemm.quantize_src1(node, ith, nth, ctrl, quantize, bs, es)
    w, m, n_expert, rs, nb02 = r[T_SRC0], r[T_SRC0 + 2], r[T_SRC0 + 3], r[T_SRC0 + 6], r[T_SRC0 + 7]
    ne11 = r[T_SRC1 + 2]
    ids_at, n_used, n_tok, ids_nb1 = r[T_SRC2], r[T_SRC2 + 1], r[T_SRC2 + 2], r[T_SRC2 + 6]
    dst, d_nb1, d_nb2 = r[T_DST], r[T_DST + 6], r[T_DST + 7]
    rows = max(CHUNK_ROWS, _MV_CHUNK_BYTES // rs)
    per_expert = (m + rows - 1) // rows
    n_chunks = n_expert * per_expert
    c = ith
    while c < n_chunks:
        e, ci = c // per_expert, c % per_expert
        r0, r1 = chunk_bounds(m, ci, per_expert, LANES)
        we = w + e * nb02
        wu, wi = numba.carray(u8p(we), m * rs), numba.carray(i8p(we), m * rs)
        for t in range(n_tok):
            ids = numba.carray(i32p(ids_at + t * ids_nb1), n_used)
            for s in range(n_used):
                if ids[s] == e:
                    j = s % ne11 + t * ne11
                    out = numba.carray(f32p(dst + s * d_nb1 + t * d_nb2), (1, m))
                    mv(wu, wi, rs, m, qa[j : j + 1], da[j : j + 1], ex[j : j + 1], tab, out, r0, r1)
        c = atomic_add(ctrl + 8 * C_CHUNK, 1)
