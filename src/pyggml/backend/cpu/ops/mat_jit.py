"""Compiled MUL_MAT: the selector, and quantized weights for few src1 rows (decode); F16/F32 weights are
matmul_f.py's, repacked weights repacked.py's.

Quantized weights: src1 rows are quantized to the weight's vec_dot_type into the shared work
buffer (Q8_0 with the x86 rounding, or Q8_K), the threads meet at a barrier, then take chunks of
weight rows from a shared counter and run matmul.kernels' fused integer mat-vec kernels on them: the
same kernels, so the same bits, as the numpy path's decode products. This is ggml's MUL_MAT:
convert src1, barrier, chunked vec_dot (ggml-cpu.c:1328-1467).

Quantized prompts: Q4_K/Q6_K take the integer GEMM tiles (gemm.py), which give the mat-vec
kernels' bits; Q8_0/Q4_0/Q5_0 the mat-vec kernels at every size (llama.cpp's tinyBLAS_Q0 is the
same per-output dot); other types past matmul.MATVEC_MAX_COLS the numpy kernel (dequantized
tiles and BLAS).
"""

from __future__ import annotations

import numba

from ....ops.enums import Op
from ....tensor import Tensor
from ....types import GGMLType
from ..jit import Choice, jit_kernel, lean_unless_ready, selector
from ..jit.mathf import LANES
from ..jit.record import AUX, CHUNK_ROWS, T_DST, T_SRC0, chunk_bounds, n_chunks, rec
from ..native import f32p, i8p, u8p
from ..quants import gemm, q0tiles, repacked
from ..quants.dots import (
    _mv1_q4_0,
    _mv1_q4_k,
    _mv1_q5_0,
    _mv1_q5_k,
    _mv1_q6_k,
    _mv1_q8_0,
    _mv_iq4_nl,
    _mv_q4_0,
    _mv_q4_k,
    _mv_q5_0,
    _mv_q5_k,
    _mv_q6_k,
    _mv_q8_0,
)
from ..quants.intrinsics import _COL_BLOCK_BYTES, ROWDOT_COLS
from ..quants.quantize import _quantize_q8_0, _quantize_q8_k
from ..repack_buffer import is_repacked
from ..repack_buffer import supports_op as repack_supports_op
from ..simd import TAB_ADDR
from ..threads import available_cores
from .mat_f_jit import float_choice
from .mat_q import MATVEC_MAX_COLS

F32, F16 = GGMLType.F32, GGMLType.F16
_opts = {"inline": "always", "cache": True, "error_model": "numpy"}

#: weight bytes per work chunk of the fused mat-vec: its row dots stream four ranges of the chunk's rows
#: at once, and 64-row chunks made those streams too short for the hardware prefetcher (Q4_K 8960 x 1536,
#: 2 threads, bench/matvec_bandwidth.py: 15.6 GB/s with 64 rows a chunk, 25.3 with 1024)
_MV_CHUNK_BYTES = 1 << 20


# ------------------------------------------------------------------------------ quantized
# The activation quantizer and the row kernel are passed as functions, so each kernel compiles
# only its own (see elementwise.py).


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


# k_mm_*: groups of ROWDOT_COLS activation rows share each weight decode (small batches); k_mv_*: one
# activation row at a time, for decodes and the shortest prompts (compiled only when a graph has one)
@jit_kernel
def k_mm_q8_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv_q8_0)


@jit_kernel
def k_mv_q8_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv1_q8_0)


@jit_kernel
def k_mm_q4_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv_q4_0)


@jit_kernel
def k_mv_q4_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv1_q4_0)


@jit_kernel
def k_mm_q5_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv_q5_0)


@jit_kernel
def k_mv_q5_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv1_q5_0)


@jit_kernel
def k_mm_iq4_nl(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv_iq4_nl)


@jit_kernel
def k_mm_q4_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv_q4_k)


@jit_kernel
def k_mv_q4_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_q4_k)


@jit_kernel
def k_mm_q5_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv_q5_k)


@jit_kernel
def k_mv_q5_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_q5_k)


@jit_kernel
def k_mm_q6_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv_q6_k)


@jit_kernel
def k_mv_q6_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_q6_k)


#: weight type -> (kernel for ROWDOT_COLS or more activation rows, kernel for fewer, values per block)
_MATVEC = {
    GGMLType.Q8_0: (k_mm_q8_0, k_mv_q8_0, 32), GGMLType.Q4_0: (k_mm_q4_0, k_mv_q4_0, 32),
    GGMLType.Q5_0: (k_mm_q5_0, k_mv_q5_0, 32), GGMLType.IQ4_NL: (k_mm_iq4_nl, k_mm_iq4_nl, 32),
    GGMLType.Q4_K: (k_mm_q4_k, k_mv_q4_k, 256), GGMLType.Q5_K: (k_mm_q5_k, k_mv_q5_k, 256),
    GGMLType.Q6_K: (k_mm_q6_k, k_mv_q6_k, 256),
}



@jit_kernel
def k_gemm_q4_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    gemm.gemm_tiles(node, ith, nth, ctrl, rec(node)[AUX + 1], 256, gemm.SB_BYTES, 16, _quantize_q8_k,
                    gemm.repack_q4_k, gemm._q4k_4, gemm._q4k_1, gemm._q4k_one4, gemm._q4k_one1, _mv_q4_k)


@jit_kernel
def k_gemm_q6_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    gemm.gemm_tiles(node, ith, nth, ctrl, rec(node)[AUX + 1], 256, gemm.Q6_BYTES, 16, _quantize_q8_k,
                    gemm.repack_q6_k, gemm._q6k_4, gemm._q6k_1, gemm._q6k_one4, gemm._q6k_one1, _mv_q6_k)


_q0_tiles_q8_0, _q0_tiles_q4_0, _q0_tiles_q5_0 = (q0tiles.q0_tiles_kernel(kind) for kind in range(3))


@jit_kernel
def k_tiles_q8_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _q0_tiles_q8_0(node, ith, nth, ctrl, _COL_BLOCK_BYTES)


@jit_kernel
def k_tiles_q4_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _q0_tiles_q4_0(node, ith, nth, ctrl, _COL_BLOCK_BYTES)


@jit_kernel
def k_tiles_q5_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _q0_tiles_q5_0(node, ith, nth, ctrl, _COL_BLOCK_BYTES)


#: Q8_0/Q4_0/Q5_0 products of at least this many src1 rows decode their weight rows once into register
#: tiles (q0tiles.q0_tiles_kernel); fewer take the row dots directly. Both give the same bits.
Q0_TILE_MIN_COLS = 8
_Q0_TILES = {GGMLType.Q8_0: k_tiles_q8_0, GGMLType.Q4_0: k_tiles_q4_0, GGMLType.Q5_0: k_tiles_q5_0}

#: prompt-size products run as integer GEMMs over interleaved 8-row tiles (gemm.py) for these types:
#: kernel, values per block, tile bytes per block
_GEMM = {GGMLType.Q4_K: (k_gemm_q4_k, 256, gemm.SB_BYTES), GGMLType.Q6_K: (k_gemm_q6_k, 256, gemm.Q6_BYTES)}


def _quantized_choice(node: Tensor, a: Tensor, b: Tensor) -> Choice | None:
    kern, kern1, bs = _MATVEC.get(a.type, (None, None, 0))
    n = b.ne[1] * b.ne[2] * b.ne[3]
    if kern is None or a.ne[2] != 1 or a.ne[3] != 1 or not node.is_contiguous() or a.nb[0] != a.type.type_size:
        return None
    k = a.ne[0]
    act = gemm.act_bytes(n, k, bs, 16 if bs == 256 else 32)
    if a.type in _Q0_TILES and n >= Q0_TILE_MIN_COLS and gemm.AVAILABLE:
        per_thread = q0tiles.q0_scratch_bytes(k)
        return Choice(_Q0_TILES[a.type], ints=(TAB_ADDR, act, per_thread, q0tiles.q0_chunk_bytes(k)),
                      wsize=act + available_cores() * per_thread)
    if n <= MATVEC_MAX_COLS.get(a.type, 0):
        return Choice(kern if n >= ROWDOT_COLS else lean_unless_ready(kern1, kern), ints=(TAB_ADDR,), wsize=act)
    if a.type in _GEMM and gemm.AVAILABLE:
        kern, blk_len, blk_bytes = _GEMM[a.type]
        scratch = available_cores() * gemm.tiles_scratch_bytes(k, blk_len, blk_bytes)
        return Choice(kern, ints=(TAB_ADDR, act), wsize=act + scratch)
    return None


@selector(Op.MUL_MAT)
def _sel_mul_mat(node: Tensor) -> Choice | None:
    a, b = node.src[0], node.src[1]
    if node.get_op_params_i32(1) != 0 or b.type != F32 or node.type != F32 or a.ne[0] != b.ne[0]:
        return None  # the Hadamard hint, other src1 types and bad shapes go to the numpy kernel
    if b.nb[0] != 4:
        return None
    if a.type in (F16, F32):
        return float_choice(node, a, b)
    if is_repacked(a):
        return repacked.choice(node, a, b) if repack_supports_op(node) else None
    return _quantized_choice(node, a, b)
