"""Compiled MUL_MAT for few src1 rows (decode): quantized weights, and F16/F32 (the KV cache).

Quantized weights: src1 rows are quantized to the weight's vec_dot_type into the shared work
buffer (Q8_0 with the x86 rounding, or Q8_K), the threads meet at a barrier, then take chunks of
weight rows from a shared counter and run qmatmul's fused integer mat-vec kernels on them: the
same kernels, so the same bits, as the numpy path's decode products. This is ggml's MUL_MAT:
convert src1, barrier, chunked vec_dot (ggml-cpu.c:1328-1467).

F16/F32 weights (attention's KQ and KQV against the F16 cache): src1 rows are rounded to fp16
first when the weight is F16 (ggml's vec_dot_type F16), then each output is one dot of a weight
row with an activation row, 16 float lanes at a time (fp16 widened with the CPU's conversion
instruction), lanes summed in a fixed tree: the result does not depend on the thread count.

More src1 rows than qmatmul.MATVEC_MAX_COLS (prompts) take the numpy kernel: dequantized tiles
and BLAS, which is faster there.
"""

from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ....ops.enums import Op
from ....tensor import Tensor
from ....types import GGMLType
from ..actquant import F16_TO_F32, f16_bits
from ..native import atomic_add, atomic_store, f32p, i8p, i64p, u8p, u32p
from ..qmatmul import (
    MATVEC_MAX_COLS,
    _mv_iq4_nl,
    _mv_q4_k,
    _mv_q5_k,
    _mv_q6_k,
    _mv_rowdot,
    _quantize_q8_0,
    _quantize_q8_k,
)
from ..threads import C_CHUNK, C_WDATA, available_cores, barrier
from . import Choice, gemm, jit_kernel, selector
from .elementwise import _row_index
from .record import AUX, T_DST, T_SRC0, T_SRC1, rec, span

F32, F16 = GGMLType.F32, GGMLType.F16
_opts = {"inline": "always", "cache": True, "error_model": "numpy"}
_F32T = ir.FloatType()
_I64 = ir.IntType(64)
_LANES = 16


def _dot_intrinsic(half: bool):
    """dot(w_addr, x_addr, n) -> float32: sum w[i]*x[i], w fp16 (half=True) or f32, x f32.

    Products and sums are in double (16 lanes, a fixed pairwise tree), rounded to float once. Why
    double: these are attention's products, where most terms are masked zeros and which cells hold
    the live ones depends on where a sequence's tokens landed in the cache. Float lanes would sum
    the same numbers in an order set by those cell indices, so the same sequence would get other
    last bits next to other sequences; a double sum of a few float products is exact, so it does not.
    """

    def typer(typingctx, w, x, n):
        sig = types.float32(types.int64, types.int64, types.int64)

        def codegen(context, builder, sig, args):
            wty = ir.HalfType() if half else _F32T
            f64 = ir.DoubleType()
            vw = ir.VectorType(wty, _LANES)
            vf = ir.VectorType(_F32T, _LANES)
            vd = ir.VectorType(f64, _LANES)
            wbase = builder.inttoptr(args[0], wty.as_pointer())
            xbase = builder.inttoptr(args[1], _F32T.as_pointer())
            n = args[2]
            nv = builder.sdiv(n, ir.Constant(_I64, _LANES))
            acc = cgutils.alloca_once_value(builder, ir.Constant(vd, [0.0] * _LANES))
            with cgutils.for_range(builder, nv) as loop:
                i = builder.mul(loop.index, ir.Constant(_I64, _LANES))
                wv = builder.load(builder.bitcast(builder.gep(wbase, [i]), vw.as_pointer()), align=2 if half else 4)
                xv = builder.load(builder.bitcast(builder.gep(xbase, [i]), vf.as_pointer()), align=4)
                prod = builder.fmul(builder.fpext(wv, vd), builder.fpext(xv, vd))
                builder.store(builder.fadd(builder.load(acc), prod), acc)
            tail = cgutils.alloca_once_value(builder, ir.Constant(f64, 0.0))
            start = builder.mul(nv, ir.Constant(_I64, _LANES))
            with cgutils.for_range_slice(builder, start, n, ir.Constant(_I64, 1), inc=True) as (i, _):
                wi = builder.fpext(builder.load(builder.gep(wbase, [i])), f64)
                xi = builder.fpext(builder.load(builder.gep(xbase, [i])), f64)
                builder.store(builder.fadd(builder.load(tail), builder.fmul(wi, xi)), tail)
            v = builder.load(acc)
            width = _LANES
            while width > 1:  # fixed pairwise tree: lanes [0, w/2) + [w/2, w)
                width //= 2
                lo = builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                            ir.Constant(ir.VectorType(ir.IntType(32), width), list(range(width))))
                hi = builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                            ir.Constant(ir.VectorType(ir.IntType(32), width),
                                                        list(range(width, 2 * width))))
                v = builder.fadd(lo, hi)
            s = builder.fadd(builder.extract_element(v, ir.Constant(ir.IntType(32), 0)), builder.load(tail))
            return builder.fptrunc(s, _F32T)

        return sig, codegen

    return intrinsic(typer)


dot_f16_f32 = _dot_intrinsic(True)
dot_f32_f32 = _dot_intrinsic(False)

#: rows of the weight per work chunk (ggml's chunk_size for a one-column product)
_CHUNK_ROWS = 64


@numba.njit(**_opts)
def _n_chunks(rows, nth):  # pragma: no cover - compiled
    """ggml's rule: chunks of _CHUNK_ROWS rows, or one per thread when that makes fewer than 4*nth."""
    n = (rows + _CHUNK_ROWS - 1) // _CHUNK_ROWS
    return nth if n < 4 * nth else n


# ------------------------------------------------------------------------------ quantized
# The activation quantizer and the row kernel are passed as functions, so each kernel compiles
# only its own (see elementwise.py).


def _rowdot_kernel(kind: int):
    """qmatmul._mv_rowdot for one of its kinds, with the other _mv_* kernels' signature."""

    @numba.njit(**_opts)
    def mv(wu, wi, rs, m, qa, da, ex, tab, out, r0, r1):  # pragma: no cover - compiled
        _mv_rowdot(kind, wu, wi, rs, m, qa, da, ex, tab, out, r0, r1)

    return mv


_mv_q8_0 = _rowdot_kernel(0)
_mv_q4_0 = _rowdot_kernel(1)
_mv_q5_0 = _rowdot_kernel(2)


@numba.njit(**_opts)
def _matvec_q(node, ith, nth, ctrl, quantize, bs, es, mv):  # pragma: no cover - compiled
    """dst (n, m) = Q8(src1 rows) . weight rows, n = ne11*ne12*ne13 rows of K."""
    r = rec(node)
    tab = numba.carray(f32p(r[AUX]), 65536)
    w, m, rs = r[T_SRC0], r[T_SRC0 + 2], r[T_SRC0 + 6]
    _, _, _, qa, da, ex, n = gemm.quantize_src1(node, ith, nth, ctrl, quantize, bs, es)
    wu = numba.carray(u8p(w), m * rs)
    wi = numba.carray(i8p(w), m * rs)
    out = numba.carray(f32p(r[T_DST]), (n, m))
    nchunk = _n_chunks(m, nth)
    c = ith
    while c < nchunk:
        r0, r1 = m * c // nchunk, m * (c + 1) // nchunk
        mv(wu, wi, rs, m, qa, da, ex, tab, out, r0, r1)
        c = atomic_add(ctrl + 8 * C_CHUNK, 1)


@jit_kernel
def k_mm_q8_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv_q8_0)


@jit_kernel
def k_mm_q4_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv_q4_0)


@jit_kernel
def k_mm_q5_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv_q5_0)


@jit_kernel
def k_mm_iq4_nl(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv_iq4_nl)


@jit_kernel
def k_mm_q4_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv_q4_k)


@jit_kernel
def k_mm_q5_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv_q5_k)


@jit_kernel
def k_mm_q6_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv_q6_k)


_MATVEC = {
    GGMLType.Q8_0: (k_mm_q8_0, 32), GGMLType.Q4_0: (k_mm_q4_0, 32), GGMLType.Q5_0: (k_mm_q5_0, 32),
    GGMLType.IQ4_NL: (k_mm_iq4_nl, 32), GGMLType.Q4_K: (k_mm_q4_k, 256), GGMLType.Q5_K: (k_mm_q5_k, 256),
    GGMLType.Q6_K: (k_mm_q6_k, 256),
}


def _pad64(n: int) -> int:
    return (n + 63) // 64 * 64


@jit_kernel
def k_gemm_q4_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    gemm.gemm_tiles(node, ith, nth, ctrl, rec(node)[AUX + 1], 256, gemm.SB_BYTES, 16, _quantize_q8_k,
                    gemm.repack_q4_k, gemm._q4k_4, gemm._q4k_1, _mv_q4_k)


@jit_kernel
def k_gemm_q6_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    gemm.gemm_tiles(node, ith, nth, ctrl, rec(node)[AUX + 1], 256, gemm.Q6_BYTES, 16, _quantize_q8_k,
                    gemm.repack_q6_k, gemm._q6k_4, gemm._q6k_1, _mv_q6_k)


@jit_kernel
def k_gemm_q4_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    gemm.gemm_tiles(node, ith, nth, ctrl, rec(node)[AUX + 1], 32, gemm.Q0_BLOCK, 32, _quantize_q8_0,
                    gemm.repack_q4_0, gemm._q4_0_4, gemm._q4_0_1, _mv_q4_0)


@jit_kernel
def k_gemm_q5_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    gemm.gemm_tiles(node, ith, nth, ctrl, rec(node)[AUX + 1], 32, gemm.Q0_BLOCK, 32, _quantize_q8_0,
                    gemm.repack_q5_0, gemm._q5_0_4, gemm._q5_0_1, _mv_q5_0)


#: prompt-size products run as integer GEMMs over interleaved 8-row tiles (gemm.py) for these types:
#: kernel, values per block, tile bytes per block
_GEMM = {GGMLType.Q4_K: (k_gemm_q4_k, 256, gemm.SB_BYTES), GGMLType.Q6_K: (k_gemm_q6_k, 256, gemm.Q6_BYTES),
         GGMLType.Q4_0: (k_gemm_q4_0, 32, gemm.Q0_BLOCK), GGMLType.Q5_0: (k_gemm_q5_0, 32, gemm.Q0_BLOCK)}


def _quantized_choice(node: Tensor, a: Tensor, b: Tensor) -> Choice | None:
    kern, bs = _MATVEC.get(a.type, (None, 0))
    n = b.ne[1] * b.ne[2] * b.ne[3]
    if kern is None or a.ne[2] != 1 or a.ne[3] != 1 or not node.is_contiguous() or a.nb[0] != a.type.type_size:
        return None
    k = a.ne[0]
    es = 16 if bs == 256 else 32
    act = _pad64(n * k) + _pad64(4 * n * (k // bs)) + _pad64(4 * n * (k // es))
    if n <= MATVEC_MAX_COLS.get(a.type, 0):
        return Choice(kern, ints=(_TAB,), wsize=act)
    if a.type in _GEMM and gemm.AVAILABLE:
        kern, blk_len, blk_bytes = _GEMM[a.type]
        return Choice(kern, ints=(_TAB, act), wsize=act + available_cores() * gemm.tile_bytes(k, blk_len, blk_bytes))
    return None


# ------------------------------------------------------------------------------ F16 / F32
@numba.njit(**_opts)
def _matmul_f(node, ith, nth, ctrl, half):  # pragma: no cover - compiled
    """dst[i01, i11, i12, i13] = dot(src0 row (i01, i12/r2, i13/r3), src1 row (i11, i12, i13))."""
    r = rec(node)
    tab = numba.carray(f32p(r[AUX]), 65536)
    d, nd0, nd1, nd2, nd3 = r[T_DST], r[T_DST + 5], r[T_DST + 6], r[T_DST + 7], r[T_DST + 8]
    w, k, ne01, ne02, ne03 = r[T_SRC0], r[T_SRC0 + 1], r[T_SRC0 + 2], r[T_SRC0 + 3], r[T_SRC0 + 4]
    nw1, nw2, nw3 = r[T_SRC0 + 6], r[T_SRC0 + 7], r[T_SRC0 + 8]
    x, ne11, ne12, ne13 = r[T_SRC1], r[T_SRC1 + 2], r[T_SRC1 + 3], r[T_SRC1 + 4]
    nx1, nx2, nx3 = r[T_SRC1 + 6], r[T_SRC1 + 7], r[T_SRC1 + 8]
    r2, r3 = ne12 // ne02, ne13 // ne03
    n = ne11 * ne12 * ne13
    xq = i64p(ctrl + 8 * C_WDATA)[0]
    if half:  # ggml converts src1 to fp16 first (vec_dot_type F16)
        j0, j1 = span(n, ith, nth)
        for j in range(j0, j1):
            i1, i2, i3 = _row_index(j, ne11, ne12)
            src = numba.carray(u32p(x + i1 * nx1 + i2 * nx2 + i3 * nx3), k)
            dst = numba.carray(f32p(xq + 4 * k * j), k)
            for i in range(k):
                dst[i] = tab[f16_bits(src[i])]
        if ith == 0:
            atomic_store(ctrl + 8 * C_CHUNK, nth)
        barrier(ctrl, nth)
    elif ith == 0:
        atomic_store(ctrl + 8 * C_CHUNK, nth)
        barrier(ctrl, nth)
    else:
        barrier(ctrl, nth)
    nrc = _n_chunks(ne01, nth)
    nchunk = nrc * ne12 * ne13
    c = ith
    while c < nchunk:
        plane = c // nrc
        rc = c - plane * nrc
        i12 = plane % ne12
        i13 = plane // ne12
        r0, r1 = ne01 * rc // nrc, ne01 * (rc + 1) // nrc
        wp = w + (i12 // r2) * nw2 + (i13 // r3) * nw3
        for i11 in range(ne11):
            if half:
                xp = xq + 4 * k * (i11 + ne11 * (i12 + ne12 * i13))
            else:
                xp = x + i11 * nx1 + i12 * nx2 + i13 * nx3
            dp = d + i11 * nd1 + i12 * nd2 + i13 * nd3
            for i01 in range(r0, r1):
                if half:
                    v = dot_f16_f32(wp + i01 * nw1, xp, k)
                else:
                    v = dot_f32_f32(wp + i01 * nw1, xp, k)
                f32p(dp + i01 * nd0)[0] = v
        c = atomic_add(ctrl + 8 * C_CHUNK, 1)


@jit_kernel
def k_mm_f16(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matmul_f(node, ith, nth, ctrl, True)


@jit_kernel
def k_mm_f32(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matmul_f(node, ith, nth, ctrl, False)


#: src1 rows up to which F16/F32 products run compiled (above: BLAS in the numpy kernel)
FLOAT_MAX_COLS = 16


def _float_choice(node: Tensor, a: Tensor, b: Tensor) -> Choice | None:
    if node.type != F32 or b.ne[1] > FLOAT_MAX_COLS or b.nb[0] != 4 or a.nb[0] != a.type.type_size:
        return None
    if b.ne[2] % a.ne[2] or b.ne[3] % a.ne[3] or node.ne != [a.ne[1], b.ne[1], b.ne[2], b.ne[3]]:
        return None
    if a.type == F16:
        return Choice(k_mm_f16, ints=(_TAB,), wsize=4 * a.ne[0] * b.ne[1] * b.ne[2] * b.ne[3])
    return Choice(k_mm_f32, ints=(_TAB,))


_TAB = int(F16_TO_F32.ctypes.data)


@selector(Op.MUL_MAT)
def _sel_mul_mat(node: Tensor) -> Choice | None:
    a, b = node.src[0], node.src[1]
    if node.get_op_params_i32(1) != 0 or b.type != F32 or node.type != F32 or a.ne[0] != b.ne[0]:
        return None  # the Hadamard hint, other src1 types and bad shapes go to the numpy kernel
    if b.nb[0] != 4:
        return None
    if a.type in (F16, F32):
        return _float_choice(node, a, b)
    return _quantized_choice(node, a, b)
