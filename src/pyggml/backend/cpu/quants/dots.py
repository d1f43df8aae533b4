"""The fused mat-vec and dequantizing kernels of the quantized matmul (numba, nogil)."""

from __future__ import annotations

import numpy as np
from numba import njit

from ....quants.jitcache import variant
from ..simd import F16_TO_F32 as _F16
from . import kq_intrinsics
from .intrinsics import _COL_BLOCK_BYTES, ROWDOT, ROWDOT_COLS, ROWDOT_ROWS, dot_q4_32, dot_q5_32

# --------------------------------------------------------------------------------------------
# fused mat-vec kernels. Shared arguments:
#   wu/wi  the weight bytes as one flat uint8 / int8 array; row r starts at r*rs
#   m      number of weight rows;  qa/da  quantized activations (n, K) and their block scales
#   out    (n, m) float32;  nch  row chunks (one per thread), each a contiguous row range
# The block dot products are the intrinsics above. Q8_0/Q4_0/Q5_0 use whole-row intrinsics that
# keep 8 float lanes like ggml's AVX2 kernels; the others combine each block in float as ggml's
# generic vec_dot (quants.c) does. Either way results match llama.cpp up to float summation order.


@njit(cache=True, inline="always")
def _h(tab, wu, o):  # pragma: no cover - compiled
    """The fp16 stored little-endian at byte o, as float32."""
    return tab[np.int64(wu[o]) | (np.int64(wu[o + 1]) << 8)]


@njit(cache=True, inline="always")
def _u32(wu, o):  # pragma: no cover - compiled
    """The little-endian u32 at byte o (Q5_0/Q5_1 high bits)."""
    return np.int64(wu[o]) | (np.int64(wu[o + 1]) << 8) | (np.int64(wu[o + 2]) << 16) | (np.int64(wu[o + 3]) << 24)


#: the row-dot kinds of _rowdot_kernel, in its order (intrinsics.ROWDOT's names)
ROWDOT_KINDS = ("q8_0", "q4_0", "q5_0", "iq4_nl")


def _rowdot_kernel(kind: int, batch: bool):
    """Q8_0 / Q4_0 / Q5_0 / IQ4_NL (ROWDOT_KINDS[kind]) mat-vec: one whole-row vector dot per output (see
    intrinsics.RowDots). With batch and two or more columns, each row is decoded once per group of up to
    ROWDOT_COLS columns (the last 1-3 columns of a block of columns as one group), the row still in L1 for the
    next group: a batch of decodes reads the weight once, not once per column. Without batch, or for one column,
    every column goes on its own, four rows a quarter of the range apart per call (the same bits either way).
    kind and batch are constants of the closure, as are the type's intrinsics, so numba drops the branches a
    kernel cannot take before typing them (it does not for literal arguments).
    """
    one, rows, cols4, cols3, cols2 = ROWDOT[ROWDOT_KINDS[kind]]

    @njit(cache=True, nogil=True)
    @variant(kind, batch)
    def mv(wu, wi, rs, m, qa, da, asum, tab, out, r0, r1):  # pragma: no cover - compiled
        n, nb = qa.shape[0], qa.shape[1] // 32
        qf, df = qa.reshape(qa.size), da.reshape(da.size)
        if batch and n > 1:
            # prompts: columns a block at a time, so the activations a row meets stay in L2 (k bytes a column)
            cb = max(ROWDOT_COLS, (_COL_BLOCK_BYTES // (32 * nb)) // ROWDOT_COLS * ROWDOT_COLS)
            for j0 in range(0, n, cb):
                j1 = min(n, j0 + cb)
                jr = j1 - (j1 - j0) % ROWDOT_COLS  # the block's last group: columns jr..j1
                left = j1 - jr
                for r in range(r0, r1):
                    for j in range(j0, jr, ROWDOT_COLS):  # several columns per decode of the row
                        s = cols4(wi, r * rs, nb, qf, j * 32 * nb, df, j * nb, tab)
                        for c in range(ROWDOT_COLS):
                            out[j + c, r] = s[c]
                    if left == 3:
                        s3 = cols3(wi, r * rs, nb, qf, jr * 32 * nb, df, jr * nb, tab)
                        for c in range(3):
                            out[jr + c, r] = s3[c]
                    elif left == 2:
                        s2 = cols2(wi, r * rs, nb, qf, jr * 32 * nb, df, jr * nb, tab)
                        for c in range(2):
                            out[jr + c, r] = s2[c]
                    elif left == 1:
                        out[jr, r] = one(wi, r * rs, nb, qf, jr * 32 * nb, df, jr * nb, tab)
            return
        q = (r1 - r0) // ROWDOT_ROWS
        r4 = r0 + q * ROWDOT_ROWS
        for j in range(n):  # a decode: rows r0+t, r0+q+t, ... per call, four chains side by side
            for t in range(q):
                s = rows(wi, (r0 + t) * rs, q * rs, nb, qa[j], 0, da[j], 0, tab)
                for i in range(ROWDOT_ROWS):
                    out[j, r0 + i * q + t] = s[i]
            for r in range(r4, r1):
                out[j, r] = one(wi, r * rs, nb, qa[j], 0, da[j], 0, tab)

    return mv


_mv_q8_0, _mv_q4_0, _mv_q5_0, _mv_iq4_nl = (_rowdot_kernel(kind, True) for kind in range(len(ROWDOT_KINDS)))
_mv1_q8_0, _mv1_q4_0, _mv1_q5_0, _mv1_iq4_nl = (_rowdot_kernel(kind, False) for kind in range(len(ROWDOT_KINDS)))


def _q_1_kernel(five: bool):
    """Q4_1 (five False) / Q5_1 mat-vec: per block, (d_w*d_a)*sumi + m_w*s_a with the Q8_1 activations'
    block sums; five is a closure constant (see _rowdot_kernel)."""
    bpb = 24 if five else 20

    @njit(cache=True, nogil=True)
    @variant(five)
    def mv(wu, wi, rs, m, qa, da, sa, tab, out, r0, r1):  # pragma: no cover - compiled
        n, nb = qa.shape[0], qa.shape[1] // 32
        acc = np.empty(n, np.float32)
        for r in range(r0, r1):
            acc[:] = 0
            for b in range(nb):
                o = r * rs + bpb * b
                dw = _h(tab, wu, o)
                mw = _h(tab, wu, o + 2)
                qh = _u32(wu, o + 4) if five else 0
                for j in range(n):
                    if five:
                        s = dot_q5_32(wu, o + 8, qh, qa[j], 32 * b)
                    else:
                        s = dot_q4_32(wu, o + 4, qa[j], 32 * b)
                    acc[j] += (dw * da[j, b]) * np.float32(s) + mw * sa[j, b]
            for j in range(n):
                out[j, r] = acc[j]

    return mv


_mv_q4_1, _mv_q5_1 = _q_1_kernel(False), _q_1_kernel(True)


@njit(cache=True, inline="always")
def _scale_min_k4(wu, o, sc, mn):  # pragma: no cover - compiled
    """get_scale_min_k4 for all 8 sub-blocks of the 12 scale bytes at o."""
    for k in range(4):
        sc[k] = np.int32(wu[o + k]) & 63
        mn[k] = np.int32(wu[o + k + 4]) & 63
    for k in range(4, 8):
        sc[k] = (np.int32(wu[o + k + 4]) & 15) | ((np.int32(wu[o + k - 4]) >> 6) << 4)
        mn[k] = (np.int32(wu[o + k + 4]) >> 4) | ((np.int32(wu[o + k]) >> 6) << 4)


#: the superblock kinds of _k_kernel, in its order: (name, superblock bytes)
K_KINDS = tuple(kq_intrinsics.BLOCK_BYTES.items())


def _k_acc(kind: int):
    """(acc_cols, acc_rows) for K_KINDS[kind], calling its kq_intrinsics._sbacc intrinsics (closure constants):
    acc_cols(g, ...) one superblock against g = 2..4 activation rows, acc_rows(g, ...) the superblocks of g = 4
    weight rows ws bytes apart (or of one row) against one activation row, accumulated into acc."""
    name = K_KINDS[kind][0]
    rows1, rows4, cols4, cols3, cols2 = kq_intrinsics.SBACC[name]

    @njit(cache=True, inline="always")
    @variant(name)
    def acc_cols(g, wu, o, qf, ao, bf, bo, k, bk, daf, dao, dak, tab, acc):  # pragma: no cover - compiled
        if g == 4:
            cols4(wu, o, qf, ao, bf, bo, k, bk, daf, dao, dak, tab, acc)
        elif g == 3:
            cols3(wu, o, qf, ao, bf, bo, k, bk, daf, dao, dak, tab, acc)
        else:
            cols2(wu, o, qf, ao, bf, bo, k, bk, daf, dao, dak, tab, acc)

    @njit(cache=True, inline="always")
    @variant(name)
    def acc_rows(g, wu, o, ws, qf, ao, bf, bo, dab, tab, acc):  # pragma: no cover - compiled
        if g == 4:
            rows4(wu, o, ws, qf, ao, bf, bo, dab, tab, acc)
        else:
            rows1(wu, o, ws, qf, ao, bf, bo, dab, tab, acc)

    return acc_cols, acc_rows


def _k_kernel(kind: int, batch: bool):
    """Superblock rows (K_KINDS[kind]: Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_XS, IQ3_S, IQ3_XXS,
    IQ2_XXS, IQ2_XS, IQ2_S) against activation rows,
    four products per call of a kq_intrinsics._sbacc intrinsic. With batch and two or more columns, each superblock
    is decoded once per group of four columns (the last 1-3 as one group), the weight row still in L1 for the next
    group. Otherwise (a decode, or any batch without batch) each column takes four weight rows a quarter of the
    range apart at once, as the row dots do: four streams side by side, the last (r1-r0) % 4 rows one at a time.
    Every output's float steps are those of the scalar loop acc += (d*da) * sumi, accm += (dmin*da) * summ over the
    superblocks, acc - accm at the end (ggml's gemv_q4_K_8x8 order), whichever way it is grouped. Q6_K's codes are
    used unsigned and its -32 offset comes off via the block sums (see _q6_body), as do Q3_K's -4; Q2_K's mins are
    Q4_K's. kind and batch are closure constants, as in _rowdot_kernel."""
    acc_cols, acc_rows = _k_acc(kind)
    bpb = K_KINDS[kind][1]

    @njit(cache=True, nogil=True)
    @variant(kind, batch)
    def mv(wu, wi, rs, m, qa, da, bsum, tab, out, r0, r1):  # pragma: no cover - compiled
        n, nb, k = qa.shape[0], qa.shape[1] // 256, qa.shape[1]
        bk = bsum.shape[1]
        qf, bf = qa.reshape(qa.size), bsum.reshape(bsum.size)
        acc = np.zeros(2 * ROWDOT_COLS, np.float32)
        if batch and n > 1:
            daf = da.reshape(da.size)
            for r in range(r0, r1):
                for j in range(0, n, ROWDOT_COLS):
                    g = min(ROWDOT_COLS, n - j)
                    acc[:] = 0
                    for b in range(nb):
                        if g == 1:  # a last lone column: the one-row call, the same bits
                            acc_rows(1, wu, r * rs + bpb * b, 0, qf, j * k + 256 * b, bf, j * bk + 16 * b,
                                        da[j, b], tab, acc)
                        else:
                            acc_cols(g, wu, r * rs + bpb * b, qf, j * k + 256 * b, bf, j * bk + 16 * b, k,
                                        bk, daf, j * nb + b, nb, tab, acc)
                    for c in range(g):
                        out[j + c, r] = acc[c] - acc[ROWDOT_COLS + c]
            return
        q = (r1 - r0) // ROWDOT_COLS
        for j in range(n):
            for t in range(q):
                acc[:] = 0
                for b in range(nb):
                    acc_rows(ROWDOT_COLS, wu, (r0 + t) * rs + bpb * b, q * rs, qf, j * k + 256 * b, bf,
                                j * bk + 16 * b, da[j, b], tab, acc)
                for p in range(ROWDOT_COLS):
                    out[j, r0 + p * q + t] = acc[p] - acc[ROWDOT_COLS + p]
            for r in range(r0 + ROWDOT_COLS * q, r1):
                acc[:] = 0
                for b in range(nb):
                    acc_rows(1, wu, r * rs + bpb * b, 0, qf, j * k + 256 * b, bf, j * bk + 16 * b, da[j, b],
                                tab, acc)
                out[j, r] = acc[0] - acc[ROWDOT_COLS]

    return mv


(_mv_q4_k, _mv_q5_k, _mv_q6_k, _mv_q2_k, _mv_q3_k, _mv_iq4_xs, _mv_iq3_s, _mv_iq3_xxs, _mv_iq2_xxs, _mv_iq2_xs,
 _mv_iq2_s) = (_k_kernel(kind, True) for kind in range(len(K_KINDS)))
(_mv1_q4_k, _mv1_q5_k, _mv1_q6_k, _mv1_q2_k, _mv1_q3_k, _mv1_iq4_xs, _mv1_iq3_s, _mv1_iq3_xxs, _mv1_iq2_xxs,
 _mv1_iq2_xs, _mv1_iq2_s) = (_k_kernel(kind, False) for kind in range(len(K_KINDS)))


# --------------------------------------------------------------------------------------------
# dequantizers to float32 for the BLAS tiles (ggml's reference to_float, one rounding per product).


@njit(cache=True, nogil=True)
def _dq_q8_0(wu, wi, rs, r0, r1, tab, y):  # pragma: no cover - compiled
    nb = y.shape[1] // 32
    for r in range(r0, r1):
        for b in range(nb):
            o = r * rs + 34 * b
            d = _h(tab, wu, o)
            for i in range(32):
                y[r - r0, 32 * b + i] = np.float32(wi[o + 2 + i]) * d


@njit(cache=True, nogil=True)
def _dq_q4_0(wu, wi, rs, r0, r1, tab, y):  # pragma: no cover - compiled
    nb = y.shape[1] // 32
    for r in range(r0, r1):
        for b in range(nb):
            o = r * rs + 18 * b
            d = _h(tab, wu, o)
            for i in range(16):
                v = np.int32(wu[o + 2 + i])
                y[r - r0, 32 * b + i] = np.float32((v & 15) - 8) * d
                y[r - r0, 32 * b + 16 + i] = np.float32((v >> 4) - 8) * d


@njit(cache=True, nogil=True)
def _dq_q5_0(wu, wi, rs, r0, r1, tab, y):  # pragma: no cover - compiled
    nb = y.shape[1] // 32
    for r in range(r0, r1):
        for b in range(nb):
            o = r * rs + 22 * b
            d = _h(tab, wu, o)
            qh = np.int64(wu[o + 2]) | (np.int64(wu[o + 3]) << 8) | (np.int64(wu[o + 4]) << 16) | (
                np.int64(wu[o + 5]) << 24)
            for i in range(16):
                v = np.int64(wu[o + 6 + i])
                y[r - r0, 32 * b + i] = np.float32(((v & 15) | (((qh >> i) & 1) << 4)) - 16) * d
                y[r - r0, 32 * b + 16 + i] = np.float32(((v >> 4) | (((qh >> (i + 16)) & 1) << 4)) - 16) * d


@njit(cache=True, nogil=True)
def _dq_q4_k(wu, wi, rs, r0, r1, tab, y):  # pragma: no cover - compiled
    nb = y.shape[1] // 256
    for r in range(r0, r1):
        sc = np.empty(8, np.int32)
        mn = np.empty(8, np.int32)
        for b in range(nb):
            o = r * rs + 144 * b
            d = _h(tab, wu, o)
            dmin = _h(tab, wu, o + 2)
            _scale_min_k4(wu, o + 4, sc, mn)
            for g in range(4):
                d1 = d * np.float32(sc[2 * g])
                m1 = dmin * np.float32(mn[2 * g])
                d2 = d * np.float32(sc[2 * g + 1])
                m2 = dmin * np.float32(mn[2 * g + 1])
                e = 256 * b + 64 * g
                for i in range(32):
                    v = np.int32(wu[o + 16 + 32 * g + i])
                    y[r - r0, e + i] = d1 * np.float32(v & 15) - m1
                    y[r - r0, e + 32 + i] = d2 * np.float32(v >> 4) - m2


@njit(cache=True, nogil=True)
def _dq_q6_k(wu, wi, rs, r0, r1, tab, y):  # pragma: no cover - compiled
    nb = y.shape[1] // 256
    for r in range(r0, r1):
        for b in range(nb):
            o = r * rs + 210 * b
            d = _h(tab, wu, o + 208)
            for hf in range(2):
                e = 256 * b + 128 * hf
                for i in range(32):
                    v0 = np.int32(wu[o + 64 * hf + i])
                    v1 = np.int32(wu[o + 64 * hf + 32 + i])
                    h = np.int32(wu[o + 128 + 32 * hf + i])
                    so = o + 192 + 8 * hf + i // 16
                    y[r - r0, e + i] = (d * np.float32(wi[so])) * np.float32(((v0 & 15) | ((h & 3) << 4)) - 32)
                    y[r - r0, e + 32 + i] = (d * np.float32(wi[so + 2])) * np.float32(
                        ((v1 & 15) | ((h & 12) << 2)) - 32)
                    y[r - r0, e + 64 + i] = (d * np.float32(wi[so + 4])) * np.float32(((v0 >> 4) | (h & 48)) - 32)
                    y[r - r0, e + 96 + i] = (d * np.float32(wi[so + 6])) * np.float32(
                        ((v1 >> 4) | ((h & 192) >> 2)) - 32)


@njit(cache=True, nogil=True)
def _widen_f16(src, tab, dst):  # pragma: no cover - compiled
    for r in range(src.shape[0]):
        for c in range(src.shape[1]):
            dst[r, c] = tab[src[r, c]]


def widen_f16(rows: np.ndarray, out: np.ndarray) -> np.ndarray:
    """fp16 rows (r, k), any strides (e.g. a view of the transposed V cache) -> out float32 (r, k).

    A table lookup per value (exact, NaN payloads as numpy keeps them): numpy's own
    float16 -> float32 cast runs at ~1.6 ns a value here, which made widening the K/V cache
    cost more than the attention products of a decode step.
    """
    _widen_f16(rows.view(np.uint16), _F16, out)
    return out
