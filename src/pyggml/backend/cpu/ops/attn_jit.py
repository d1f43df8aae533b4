"""Compiled FLASH_ATTN_EXT with ggml-cpu's three paths and their float steps (ops.cpp, AVX2 build).

ggml picks a path per node, and each rounds differently, so llama.cpp's default (flash attention on)
logits are only reproduced by taking the same path with the same steps:

* **one chunk** (1..63 query rows, or a one-token decode over fewer than 512 cells): per query row, Q
  is rounded to K's vec_dot type (fp16 for an F16 cache), each live cell's score is
  ``ggml_vec_dot_f16``, cells whose mask is -inf are skipped, and the online softmax keeps the V
  accumulator in fp16 when V is F16 (each cell's fma rounded back to fp16, ``ggml_vec_mad_f16``);
* **tiled** (64 or more query rows): Q stays float32; tiles of 64 query rows by 64 cells get their
  scores by sequential fmas over the head dimension (simd_gemm), a softmax per row and tile with ggml's
  vector expf summed as ``ggml_vec_soft_max_f32``, and P·V accumulated by float32 fmas;
* **split KV** (a one-token decode over 512 or more cells): each thread runs the one-chunk steps over
  its share of the cells, then the partial (max, sum, accumulator) triples are merged in chunk order.
  Its bits depend on the thread count, as ggml's do.

Each query row's result depends only on its own row, its cells and the path, not on how rows are
grouped in tiles or threads (a tile whose cells are all masked for a row adds exact zeros to it), so
the rows are split over threads in plain spans. GCC builds ggml-cpu with ``-std=gnu++17``, which
contracts ``a*b + c`` in its scalar code to an fma: the score ``s*scale + mask``, the sum
``S*ms + vs`` and the merge ``acc*scale_old + part*scale_new`` take one here too. K and V must both
be F16 or both F32; a quantized or mixed cache runs the Python kernel.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ....ops.enums import Op
from ....quants.jitcache import variant
from ....tensor import Tensor
from ....types import GGMLType
from ..jit import Choice, jit_kernel, selector
from ..jit.mathf import libm_expf, v_expf
from ..jit.record import AUX, T_DST, T_SRC0, T_SRC1, T_SRC2, params_f32, rec, row_index, span
from ..native import f32_bits, f32p, fmaf, i64p, u16p
from ..simd import _AVX512, _F16C, TAB_ADDR, _fma, _splat, f16_bits, f16_mad_cells, f16_round8, f16_widen8
from ..threads import C_WDATA, available_cores, barrier
from .elementwise_jit import rows_contiguous
from .mat_f_jit import vec_dot_f16, vec_dot_f32
from .nn import FA_TILE_Q, alibi_slopes, fa_path
from .nn_jit import _row_sum_ggml

F32, F16 = GGMLType.F32, GGMLType.F16
_opts = {"inline": "always", "cache": True, "error_model": "numpy"}
#: ggml's tile sizes (GGML_FA_TILE_Q, GGML_FA_TILE_KV)
TILE_Q, TILE_KV = FA_TILE_Q, 64
#: the side record's words (an int64 array the selector fills; its address is AUX word 0)
_M_DATA, _M_NB1, _M_NB2, _M_NB3, _M_NE2, _M_NE3, _SINKS, _SLOPES = range(8)
_NEG_INF = np.float32(-np.inf)


_F32T, _I64 = ir.FloatType(), ir.IntType(64)
#: simd_gemm's register block on AVX2: 6 rows by 2 vectors of 8 (12 accumulators of the 16 registers)
GEMM_RM, GEMM_RN = 6, 2


def _gemm_tile_intrinsic(rm: int, rn: int):
    """tile(c, a, b, k, lda, ldb, ldc): C[rm x 8rn] += A[rm x k] . B[k x 8rn] as ggml's simd_gemm_ukernel:
    each output's accumulator takes one fma per kk in order (acc + B[kk, j] * A[i, kk]), so its bits do
    not depend on the blocking. Float32 row-major, strides in elements."""

    def typer(typingctx, c, a, b, k, lda, ldb, ldc):
        sig = types.void(*([types.int64] * 7))

        def codegen(context, builder, sig, args):
            c_a, a_a, b_a, k_v, lda, ldb, ldc = args
            f8 = ir.VectorType(_F32T, 8)
            cp, ap, bp = (builder.inttoptr(x, _F32T.as_pointer()) for x in (c_a, a_a, b_a))

            def at(base: ir.Value, row: ir.Value, stride: ir.Value, col: int) -> ir.Value:
                return builder.gep(base, [builder.add(builder.mul(row, stride), ir.Constant(_I64, col))])

            def vec_at(base: ir.Value, row: ir.Value, stride: ir.Value, col: int) -> ir.Value:
                return builder.bitcast(at(base, row, stride, col), f8.as_pointer())

            accs = [[cgutils.alloca_once_value(builder, builder.load(
                vec_at(cp, ir.Constant(_I64, i), ldc, 8 * r), align=4)) for r in range(rn)] for i in range(rm)]
            with cgutils.for_range(builder, k_v) as loop:
                kk = loop.index
                bv = [builder.load(vec_at(bp, kk, ldb, 8 * r), align=4) for r in range(rn)]
                for i in range(rm):
                    av = _splat(builder, builder.load(builder.gep(ap, [builder.add(
                        builder.mul(ir.Constant(_I64, i), lda), kk)])), 8)
                    for r in range(rn):
                        builder.store(_fma(builder, bv[r], av, builder.load(accs[i][r])), accs[i][r])
            for i in range(rm):
                for r in range(rn):
                    builder.store(builder.load(accs[i][r]), vec_at(cp, ir.Constant(_I64, i), ldc, 8 * r), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(typer)


_tile_6x2, _tile_1x2, _tile_6x1, _tile_1x1 = (_gemm_tile_intrinsic(m, n) for m, n in ((6, 2), (1, 2), (6, 1), (1, 1)))


@numba.njit(**_opts)
def _gemm(c, a, b, m, k, n, lda, ldb, ldc):  # pragma: no cover - compiled
    """ggml's simd_gemm: C[m x n] += A[m x k] . B[k x n] (addresses of float32, strides in elements), n a
    multiple of 8; blocks of 6 rows by 16 columns, the leftovers by 1 row or 8 columns."""
    i = 0
    while i < m:
        rows = GEMM_RM if m - i >= GEMM_RM else 1
        ci, ai = c + 4 * i * ldc, a + 4 * i * lda
        j = 0
        while j < n:
            wide = n - j >= 8 * GEMM_RN
            if rows == GEMM_RM:
                if wide:
                    _tile_6x2(ci + 4 * j, ai, b + 4 * j, k, lda, ldb, ldc)
                else:
                    _tile_6x1(ci + 4 * j, ai, b + 4 * j, k, lda, ldb, ldc)
            elif wide:
                _tile_1x2(ci + 4 * j, ai, b + 4 * j, k, lda, ldb, ldc)
            else:
                _tile_1x1(ci + 4 * j, ai, b + 4 * j, k, lda, ldb, ldc)
            j += 8 * GEMM_RN if wide else 8
        i += rows


@numba.njit(**_opts)
def _f16r(x, tab):  # pragma: no cover - compiled
    """x rounded to fp16 and widened back (GGML_CPU_FP32_TO_FP16, then _TO_FP32)."""
    return tab[f16_bits(np.uint32(f32_bits(x)))]


@numba.njit(**_opts)
def _round_f16_row(a, n, tab):  # pragma: no cover - compiled
    """Every float of ``a`` rounded to fp16 in place (vcvtps2ph, 8 at a time with F16C)."""
    n8 = n - n % 8 if _F16C else 0
    base = a.ctypes.data
    for i in range(0, n8, 8):
        f16_round8(base + 4 * i, base + 4 * i)
    for i in range(n8, n):
        a[i] = _f16r(a[i], tab)


@numba.njit(**_opts)
def _load_row(src, n, half, dst, tab):  # pragma: no cover - compiled
    """Row ``src`` (fp16 or f32) widened into the float32 array ``dst``."""
    if half:
        n8 = n - n % 8 if _F16C else 0
        for i in range(0, n8, 8):
            f16_widen8(src + 2 * i, dst.ctypes.data + 4 * i)
        h = numba.carray(u16p(src), n)
        for i in range(n8, n):
            dst[i] = tab[h[i]]
    else:
        x = numba.carray(f32p(src), n)
        for i in range(n):
            dst[i] = x[i]


#: floats a register holds in the value sums (f16_mad_cells), and the cells whose (ms, vs) are kept before they run
_MAD_W, _MAD_CELLS = (16 if _AVX512 else 8), 64
_mad8v, _mad4v, _mad2v, _mad1v = (f16_mad_cells(_MAD_W, n) for n in (8, 4, 2, 1))


@numba.njit(**_opts)
def _mad_cells(vb, nbv1, cells, msvs, n, acc, dv):  # pragma: no cover - compiled
    """The value sums of the n kept cells (f16_mad_cells), 8, 4, 2 and 1 registers of the accumulator at a time."""
    at, c_at, m_at = acc.ctypes.data, cells.ctypes.data, msvs.ctypes.data
    d = 0
    while dv - d >= 8 * _MAD_W:
        _mad8v(vb + 2 * d, nbv1, c_at, m_at, n, at + 4 * d)
        d += 8 * _MAD_W
    if dv - d >= 4 * _MAD_W:
        _mad4v(vb + 2 * d, nbv1, c_at, m_at, n, at + 4 * d)
        d += 4 * _MAD_W
    if dv - d >= 2 * _MAD_W:
        _mad2v(vb + 2 * d, nbv1, c_at, m_at, n, at + 4 * d)
        d += 2 * _MAD_W
    if dv - d >= _MAD_W:
        _mad1v(vb + 2 * d, nbv1, c_at, m_at, n, at + 4 * d)


@numba.njit(**_opts)
def _one_chunk(q, kb, nbk1, vb, nbv1, mp, slope, scale, softcap, ic0, ic1, dk, dv, half, qq, acc, vrow, cells, msvs,
               tab):  # pragma: no cover - compiled
    """ggml_compute_forward_flash_attn_ext_f16_one_chunk for one query row over cells [ic0, ic1): the row's
    accumulator (fp16 values when V is F16) in ``acc``; returns its max M and sum S. With an F16 V the value sums
    wait: each live cell's (ms, vs) is kept (``cells``, ``msvs``: _MAD_CELLS of them; empty arrays take the steps
    cell by cell) and every _MAD_CELLS of them run as one pass with the accumulator in registers (_mad_cells), in
    the same order and with the same steps."""
    xq = numba.carray(f32p(q), dk)
    for i in range(dk):
        qq[i] = xq[i]
    if half:  # Q converted to K's vec_dot type: fp16
        _round_f16_row(qq, dk, tab)
    for i in range(dv):
        acc[i] = 0.0
    m16 = numba.carray(u16p(mp), ic1)
    big, total = _NEG_INF, np.float32(0.0)
    batched = half and _F16C and dv % _MAD_W == 0 and cells.size == _MAD_CELLS
    kept = 0
    for ic in range(ic0, ic1):
        mv = slope * tab[m16[ic]] if mp != 0 else np.float32(0.0)
        if mv == _NEG_INF:
            continue
        if half:
            s = vec_dot_f16(kb + ic * nbk1, qq.ctypes.data, dk)
        else:
            s = vec_dot_f32(kb + ic * nbk1, qq.ctypes.data, dk)
        if softcap != 0.0:
            s = fmaf(softcap, np.float32(math.tanh(s * scale)), mv)
        else:
            s = fmaf(s, scale, mv)
        ms, vs = np.float32(1.0), np.float32(1.0)
        if s > big:
            ms = libm_expf(big - s)
            big = s
            if not batched:
                for i in range(dv):
                    acc[i] = acc[i] * ms
                if half:
                    _round_f16_row(acc, dv, tab)
        else:
            vs = libm_expf(s - big)
        if batched:
            cells[kept], msvs[2 * kept], msvs[2 * kept + 1] = ic, ms, vs
            kept += 1
            if kept == _MAD_CELLS:
                _mad_cells(vb, nbv1, cells, msvs, kept, acc, dv)
                kept = 0
        else:
            _load_row(vb + ic * nbv1, dv, half, vrow, tab)
            for i in range(dv):
                acc[i] = fmaf(vrow[i], vs, acc[i])
            if half:
                _round_f16_row(acc, dv, tab)
        total = fmaf(total, ms, vs)
    if kept:
        _mad_cells(vb, nbv1, cells, msvs, kept, acc, dv)
    return big, total


@numba.njit(**_opts)
def _sink(acc, dv, big, total, s):  # pragma: no cover - compiled
    """The attention sink's logit s joined to a row's softmax at the end (ggml: on the first KV chunk only)."""
    ms, vs = np.float32(1.0), np.float32(1.0)
    if s > big:
        ms = libm_expf(big - s)
        big = s
        for i in range(dv):
            acc[i] = acc[i] * ms
    else:
        vs = libm_expf(s - big)
    return big, fmaf(total, ms, vs)


@numba.njit(**_opts)
def _finish(acc, dv, total, dst):  # pragma: no cover - compiled
    out = numba.carray(f32p(dst), dv)
    inv = np.float32(0.0) if total == 0.0 else np.float32(1.0) / total
    for i in range(dv):
        out[i] = acc[i] * inv


_DEAD = np.uint16(0xFC00)  # fp16 -inf: a mask value that masks its cell (a positive slope keeps it -inf)


@numba.njit(**_opts)
def _any_live(m16, a, b):  # pragma: no cover - compiled
    """Whether any mask cell in [a, b) is not fp16 -inf: an OR over the raw bits, which vectorises."""
    acc = np.uint16(0)
    for t in range(a, b):
        acc |= m16[t] ^ _DEAD
    return acc != 0


@numba.njit(**_opts)
def _live_cells(m16, n_kv):  # pragma: no cover - compiled
    """(first, last + 1) of the cells of a mask row whose value is not fp16 -inf ((0, 0) when there is none),
    searched from both ends 64 cells at a time by an OR over the raw bits (vectorised), then cell by cell."""
    lo = 0
    while lo < n_kv:
        e = min(lo + TILE_KV, n_kv)
        if _any_live(m16, lo, e):
            break
        lo = e
    if lo >= n_kv:
        return 0, 0
    while m16[lo] == _DEAD:
        lo += 1
    hi = n_kv
    while True:
        b = max(lo, hi - TILE_KV)
        if _any_live(m16, b, hi):
            break
        hi = b
    while m16[hi - 1] == _DEAD:
        hi -= 1
    return lo, hi


@numba.njit(**_opts)
def _rows_together(live, iq1, limit):  # pragma: no cover - compiled
    """How many query rows from iq1 (at most ``limit``) one tile takes, and the span [lo, hi) of the cells they
    see: a tile ends before a row whose cells lie apart from all the tile's so far (the next sequence of a batch
    of several, whose mask is block-diagonal), so that a tile's live cells are one sequence's and not the
    several a 64-row tile spans. Rows that see no cell join any tile. The bits do not depend on the grouping
    (the module docstring)."""
    lo, hi = live[2 * iq1], live[2 * iq1 + 1]
    n = 1
    while n < limit:
        a, b = live[2 * (iq1 + n)], live[2 * (iq1 + n) + 1]
        if b > a:
            if hi > lo and (a >= hi or b <= lo):
                break
            if hi > lo:
                lo, hi = min(lo, a), max(hi, b)
            else:
                lo, hi = a, b
        n += 1
    return n, lo, hi


@numba.njit(**_opts)
def _tile(r, side, iq1, n_rows, iq2, iq3, slope, scale, softcap, half, tab, buf, lo, hi):  # pragma: no cover
    """ggml_compute_forward_flash_attn_ext_tiled for query rows [iq1, iq1 + n_rows) of head iq2 (n_rows <= 64),
    whose live cells all lie in [lo, hi): of each 64-cell tile only the columns of that span are computed (the
    scores in 8-column blocks), the rest are the -inf their mask makes them, and P.V runs over the span alone
    (the probabilities outside it are exact zeros, whose fmas change nothing). An encoder's batch of 16 texts
    of 50 tokens computed about 3.8 times the live scores with whole 64 x 64 tiles."""
    dk, nek1, dv = r[T_SRC1 + 1], r[T_SRC1 + 2], r[T_SRC2 + 1]
    qt, kq, kt, v32, vkq, big, total, row = buf
    ik2, ik3 = iq2 // (r[T_SRC0 + 3] // r[T_SRC1 + 3]), iq3 // (r[T_SRC0 + 4] // r[T_SRC1 + 4])
    iv2, iv3 = iq2 // (r[T_SRC0 + 3] // r[T_SRC2 + 3]), iq3 // (r[T_SRC0 + 4] // r[T_SRC2 + 4])
    kb = r[T_SRC1] + ik2 * r[T_SRC1 + 7] + ik3 * r[T_SRC1 + 8]
    vb = r[T_SRC2] + iv2 * r[T_SRC2 + 7] + iv3 * r[T_SRC2 + 8]
    nbk1, nbv1 = r[T_SRC1 + 6], r[T_SRC2 + 6]
    mdata = side[_M_DATA]
    for tq in range(n_rows):
        xq = numba.carray(f32p(r[T_SRC0] + (iq1 + tq) * r[T_SRC0 + 6] + iq2 * r[T_SRC0 + 7] + iq3 * r[T_SRC0 + 8]), dk)
        for i in range(dk):
            qt[tq * dk + i] = xq[i]
        for i in range(dv):
            vkq[tq * dv + i] = 0.0
        big[tq], total[tq] = _NEG_INF, 0.0
    for ic in range(0, nek1, TILE_KV):
        n_kv = min(TILE_KV, nek1 - ic)
        c0, c1 = max(lo, ic) - ic, min(hi, ic + n_kv) - ic  # the tile's columns that any row sees
        if c1 <= c0:
            continue  # (ggml skips a tile its mask covers whole)
        cs, ce = c0 - c0 % 8, min(TILE_KV, c1 + (-c1) % 8)  # the scores' columns: whole 8-lane vectors
        if mdata != 0:  # the mask, scaled by the slope; the tile is skipped when every row masks all of it
            live = False
            for tq in range(n_rows):
                mrow = (mdata + (iq1 + tq) * side[_M_NB1] + (iq2 % side[_M_NE2]) * side[_M_NB2]
                        + (iq3 % side[_M_NE3]) * side[_M_NB3])
                m16 = numba.carray(u16p(mrow), ic + c1)
                for tk in range(c0, c1):
                    mv = slope * tab[m16[ic + tk]]
                    kq[TILE_Q * TILE_KV + tq * TILE_KV + tk] = mv
                    live = live or mv != _NEG_INF
            if not live:
                continue
        for tk in range(cs, min(ce, n_kv)):  # K transposed: the cells are the contiguous dimension
            _load_row(kb + (ic + tk) * nbk1, dk, half, row, tab)
            for i in range(dk):
                kt[i * TILE_KV + tk] = row[i]
        for tq in range(n_rows):
            for tk in range(cs, ce):
                kq[tq * TILE_KV + tk] = 0.0
        _gemm(kq.ctypes.data + 4 * cs, qt.ctypes.data, kt.ctypes.data + 4 * cs, n_rows, dk, ce - cs, dk, TILE_KV,
              TILE_KV)
        for tq in range(n_rows):
            o = tq * TILE_KV
            for tk in range(TILE_KV):
                if tk < c0 or tk >= c1:
                    x = _NEG_INF  # past the cells (tk >= n_kv), or masked for every row of the tile
                else:
                    x = kq[o + tk] * scale
                    if softcap != 0.0:
                        x = np.float32(math.tanh(x)) * softcap
                    if mdata != 0:
                        x = x + kq[TILE_Q * TILE_KV + o + tk]
                kq[o + tk] = x
        for tk in range(c0, c1):
            _load_row(vb + (ic + tk) * nbv1, dv, half, row, tab)
            for i in range(dv):
                v32[tk * dv + i] = row[i]
        for tq in range(n_rows):
            o = tq * TILE_KV
            tmax = _NEG_INF
            for tk in range(TILE_KV):
                tmax = max(tmax, kq[o + tk])
            if tmax == _NEG_INF:  # nothing of this tile for the row: zeros in P, as ggml's skip[]
                for tk in range(TILE_KV):
                    kq[o + tk] = 0.0
                continue
            mold = big[tq]
            mnew = max(mold, tmax)
            if mnew > mold:
                ms = libm_expf(mold - mnew)
                for i in range(dv):
                    vkq[tq * dv + i] = vkq[tq * dv + i] * ms
                total[tq] = total[tq] * ms
            big[tq] = mnew
            for tk in range(TILE_KV):  # ggml_vec_soft_max_f32: vector expf over the 64 lanes
                kq[o + tk] = v_expf(kq[o + tk] - mnew)
            total[tq] = np.float32(np.float64(total[tq]) + _row_sum_ggml(kq[o:o + TILE_KV]))
        if dv % 8 == 0:  # VKQ += P . V over the columns [c0, c1) (the others' probabilities are 0)
            _gemm(vkq.ctypes.data, kq.ctypes.data + 4 * c0, v32.ctypes.data + 4 * c0 * dv, n_rows, c1 - c0, dv,
                  TILE_KV, dv, dv)
        else:
            for tq in range(n_rows):
                for tk in range(c0, c1):
                    p = kq[tq * TILE_KV + tk]
                    for i in range(dv):
                        vkq[tq * dv + i] = fmaf(p, v32[tk * dv + i], vkq[tq * dv + i])
    d = r[T_DST]
    for tq in range(n_rows):
        acc = vkq[tq * dv:(tq + 1) * dv]
        t = total[tq]
        if side[_SINKS] != 0:
            _, t = _sink(acc, dv, big[tq], t, numba.carray(f32p(side[_SINKS]), iq2 + 1)[iq2])
        _finish(acc, dv, t, d + (iq1 + tq) * r[T_DST + 7] + iq2 * r[T_DST + 6] + iq3 * r[T_DST + 8])


def _flash_attn_kernel(half: bool, path: str):
    """The kernel for F16 K and V (half) or F32 ones, on one of ggml's paths (the selector knows which from the
    shapes): "chunk", "split" or "tiled". ``half`` and the path are closure constants, so numba drops the other
    branches before typing them: a kernel compiles in a few seconds, and a run compiles only the paths its
    batches take (a short prompt and its decode: "chunk" alone)."""
    split, tiled = path == "split", path == "tiled"

    @numba.njit(**_opts)
    @variant(half, path)
    def flash_attn(node, ith, nth, ctrl):  # pragma: no cover - compiled
        r = rec(node)
        side = numba.carray(i64p(r[AUX]), 8)
        tab = numba.carray(f32p(r[AUX + 1]), 65536)
        p = params_f32(node)
        scale, softcap = p[0], p[2]
        if softcap != 0.0:
            scale = scale / softcap
        dk, n_q, n_head, ne3 = r[T_SRC0 + 1], r[T_SRC0 + 2], r[T_SRC0 + 3], r[T_SRC0 + 4]
        nek1, nek2, nek3, dv = r[T_SRC1 + 2], r[T_SRC1 + 3], r[T_SRC1 + 4], r[T_SRC2 + 1]
        nev2, nev3 = r[T_SRC2 + 3], r[T_SRC2 + 4]
        slopes = numba.carray(f32p(side[_SLOPES]), n_head)
        mdata = side[_M_DATA]
        qq = np.empty(dk, np.float32)
        acc = np.empty(dv, np.float32)
        vrow = np.empty(max(dk, dv), np.float32)
        cells, msvs = np.empty(_MAD_CELLS, np.int64), np.empty(2 * _MAD_CELLS, np.float32)
        if split:
            # split KV: thread ith's share of the cells for every head, then the heads' partials merged
            cs = (nek1 + nth - 1) // nth
            ic0 = ith * cs
            ic1 = min(ic0 + cs, nek1)
            width = 2 + dv
            parts = numba.carray(f32p(i64p(ctrl + 8 * C_WDATA)[0]), n_head * nth * width)
            for h in range(n_head):
                o = (h * nth + ith) * width
                if ic0 >= nek1:
                    parts[o], parts[o + 1] = _NEG_INF, 0.0
                    continue
                q = r[T_SRC0] + h * r[T_SRC0 + 7]
                kb = r[T_SRC1] + (h // (n_head // nek2)) * r[T_SRC1 + 7]
                vb = r[T_SRC2] + (h // (n_head // nev2)) * r[T_SRC2 + 7]
                mp = mdata + (h % side[_M_NE2]) * side[_M_NB2] if mdata != 0 else 0
                big, total = _one_chunk(q, kb, r[T_SRC1 + 6], vb, r[T_SRC2 + 6], mp, slopes[h], scale, softcap,
                                        ic0, ic1, dk, dv, half, qq, acc, vrow, cells, msvs, tab)
                if side[_SINKS] != 0 and ic0 == 0:
                    big, total = _sink(acc, dv, big, total, numba.carray(f32p(side[_SINKS]), n_head)[h])
                parts[o], parts[o + 1] = big, total
                for i in range(dv):
                    parts[o + 2 + i] = acc[i]
            barrier(ctrl, nth)
            for h in range(ith, n_head, nth):
                big, total = _NEG_INF, np.float32(0.0)
                for i in range(dv):
                    acc[i] = 0.0
                for c in range(nth):
                    o = (h * nth + c) * width
                    if c * cs >= nek1 or parts[o + 1] == 0.0:
                        continue
                    mnew = max(big, parts[o])
                    s_old, s_new = libm_expf(big - mnew), libm_expf(parts[o] - mnew)
                    for i in range(dv):
                        acc[i] = fmaf(acc[i], s_old, parts[o + 2 + i] * s_new)
                    total = fmaf(total, s_old, parts[o + 1] * s_new)
                    big = mnew
                _finish(acc, dv, total, r[T_DST] + h * r[T_DST + 6])
            return
        nr = n_q * n_head * ne3
        ir0, ir1 = span(nr, ith, nth)
        if tiled:
            buf = (np.empty(TILE_Q * dk, np.float32), np.empty(2 * TILE_Q * TILE_KV, np.float32),
                   np.zeros(dk * TILE_KV, np.float32), np.empty(TILE_KV * dv, np.float32),
                   np.empty(TILE_Q * dv, np.float32), np.empty(TILE_Q, np.float32), np.empty(TILE_Q, np.float32),
                   np.empty(max(dk, dv), np.float32))
            # each query row's live cells (first, last + 1), for one mask plane at a time (a mask broadcast over
            # the heads, as llama.cpp's, is read once per thread)
            live = np.empty(2 * n_q, np.int64)
            plane = -1
            ir = ir0
            while ir < ir1:
                iq1, iq2, iq3 = row_index(ir, n_q, n_head)
                limit = min(TILE_Q, ir1 - ir, n_q - iq1)
                if mdata != 0 and slopes[iq2] > 0.0:
                    p2, p3 = iq2 % side[_M_NE2], iq3 % side[_M_NE3]
                    if p2 + side[_M_NE2] * p3 != plane:
                        plane = p2 + side[_M_NE2] * p3
                        for q1 in range(n_q):
                            m16 = numba.carray(u16p(mdata + q1 * side[_M_NB1] + p2 * side[_M_NB2]
                                                    + p3 * side[_M_NB3]), nek1)
                            live[2 * q1], live[2 * q1 + 1] = _live_cells(m16, nek1)
                    n_rows, lo, hi = _rows_together(live, iq1, limit)
                else:
                    n_rows, lo, hi = limit, 0, nek1
                _tile(r, side, iq1, n_rows, iq2, iq3, slopes[iq2], scale, softcap, half, tab, buf, lo, hi)
                ir += n_rows
            return
        for ir in range(ir0, ir1):
            iq1, iq2, iq3 = row_index(ir, n_q, n_head)
            q = r[T_SRC0] + iq1 * r[T_SRC0 + 6] + iq2 * r[T_SRC0 + 7] + iq3 * r[T_SRC0 + 8]
            ik2, ik3 = iq2 // (n_head // nek2), iq3 // (ne3 // nek3)
            iv2, iv3 = iq2 // (n_head // nev2), iq3 // (ne3 // nev3)
            kb = r[T_SRC1] + ik2 * r[T_SRC1 + 7] + ik3 * r[T_SRC1 + 8]
            vb = r[T_SRC2] + iv2 * r[T_SRC2 + 7] + iv3 * r[T_SRC2 + 8]
            mp = 0
            if mdata != 0:
                mp = (mdata + iq1 * side[_M_NB1] + (iq2 % side[_M_NE2]) * side[_M_NB2]
                      + (iq3 % side[_M_NE3]) * side[_M_NB3])
            big, total = _one_chunk(q, kb, r[T_SRC1 + 6], vb, r[T_SRC2 + 6], mp, slopes[iq2], scale, softcap,
                                    0, nek1, dk, dv, half, qq, acc, vrow, cells, msvs, tab)
            if side[_SINKS] != 0:
                big, total = _sink(acc, dv, big, total, numba.carray(f32p(side[_SINKS]), n_head)[iq2])
            _finish(acc, dv, total, r[T_DST] + iq1 * r[T_DST + 7] + iq2 * r[T_DST + 6] + iq3 * r[T_DST + 8])

    return flash_attn


_fa_f16_chunk, _fa_f16_split, _fa_f16_tiled = (_flash_attn_kernel(True, p) for p in ("chunk", "split", "tiled"))
_fa_f32_chunk, _fa_f32_split, _fa_f32_tiled = (_flash_attn_kernel(False, p) for p in ("chunk", "split", "tiled"))


@jit_kernel
def k_flash_attn_f16_chunk(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _fa_f16_chunk(node, ith, nth, ctrl)


@jit_kernel
def k_flash_attn_f16_split(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _fa_f16_split(node, ith, nth, ctrl)


@jit_kernel
def k_flash_attn_f16_tiled(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _fa_f16_tiled(node, ith, nth, ctrl)


@jit_kernel
def k_flash_attn_f32_chunk(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _fa_f32_chunk(node, ith, nth, ctrl)


@jit_kernel
def k_flash_attn_f32_split(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _fa_f32_split(node, ith, nth, ctrl)


@jit_kernel
def k_flash_attn_f32_tiled(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _fa_f32_tiled(node, ith, nth, ctrl)


#: (K/V type is F16, path) -> kernel
_KERNELS = {(True, "chunk"): k_flash_attn_f16_chunk, (True, "split"): k_flash_attn_f16_split,
            (True, "tiled"): k_flash_attn_f16_tiled, (False, "chunk"): k_flash_attn_f32_chunk,
            (False, "split"): k_flash_attn_f32_split, (False, "tiled"): k_flash_attn_f32_tiled}


@selector(Op.FLASH_ATTN_EXT)
def _sel_flash_attn(node: Tensor) -> Choice | None:
    q, k, v, mask, sinks = (node.src[i] for i in range(5))
    if q.type != F32 or node.type != F32 or k.type != v.type or k.type not in (F16, F32):
        return None
    if mask is not None and (mask.type != F16 or mask.ne[0] < k.ne[1] or mask.ne[1] < q.ne[1]):
        return None
    if sinks is not None and (sinks.type != F32 or not sinks.is_contiguous() or sinks.ne[0] < q.ne[2]):
        return None
    if not (node.is_contiguous() and rows_contiguous(q, k, v, mask)):
        return None
    n_head, ne3 = q.ne[2], q.ne[3]
    if k.ne[0] != q.ne[0] or k.ne[1] != v.ne[1] or any(n_head % t.ne[2] or ne3 % t.ne[3] for t in (k, v)):
        return None
    slopes = alibi_slopes(n_head, node.get_op_params_f32(1))
    side = np.zeros(8, np.int64)
    if mask is not None:
        side[_M_DATA], side[_M_NB1], side[_M_NB2], side[_M_NB3] = mask.data, mask.nb[1], mask.nb[2], mask.nb[3]
        side[_M_NE2], side[_M_NE3] = mask.ne[2], mask.ne[3]
    side[_SINKS] = 0 if sinks is None else sinks.data
    side[_SLOPES] = slopes.ctypes.data
    path = fa_path(q.ne[1], ne3, k.ne[1])
    wsize = 4 * n_head * available_cores() * (2 + v.ne[0]) if path == "split" else 0
    return Choice(_KERNELS[k.type == F16, path], ints=(side.ctypes.data, TAB_ADDR), wsize=wsize,
                  notes={"side": side, "slopes": slopes})


__all__ = ["k_flash_attn_f16_chunk", "k_flash_attn_f16_split", "k_flash_attn_f16_tiled", "k_flash_attn_f32_chunk",
           "k_flash_attn_f32_split", "k_flash_attn_f32_tiled"]
