"""Fused quantized mat-vec products (numba) for the weight types of common GGUF models.

A decode step multiplies every weight by one activation row. Dequantizing the weight to float32
first writes and re-reads 4 bytes per weight; these kernels read the quantized blocks directly
and do what ggml's ``vec_dot`` does: the activation row is quantized to the weight's
``vec_dot_type`` (Q8_0 or Q8_K, see actquant), each block's integer dot product is exact, and
the block scales are applied in float32. Rows are split over ``n_threads`` numba threads, each
output element being one sequential dot, so results do not depend on the thread count.

Covered: Q8_0, Q4_0, Q5_0 (x Q8_0) and Q4_K, Q6_K (x Q8_K) - the types of Q4_K_M models.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from ...types import GGMLType
from .actquant import _q8_0_parts, _q8_k_parts

#: fp16 bit pattern -> float32, for the block scales (exact, like GGML_FP16_TO_FP32)
_F16_TABLE = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


@njit(cache=True, inline="always")
def _half(tab, lo, hi):  # pragma: no cover - compiled
    """The fp16 stored in two little-endian bytes, as float32."""
    return tab[np.int64(lo) | (np.int64(hi) << 8)]


@njit(parallel=True, cache=True)
def _mv_q8_0(w, wi, tab, qa, da, out):  # pragma: no cover - compiled
    m, nb = w.shape[0], qa.shape[1]
    for r in prange(m):
        for j in range(qa.shape[0]):
            acc = np.float32(0.0)
            for b in range(nb):
                o = b * 34
                s = np.int32(0)
                for i in range(32):
                    s += np.int32(wi[r, o + 2 + i]) * np.int32(qa[j, b, i])
                acc += np.float32(s) * (_half(tab, w[r, o], w[r, o + 1]) * da[j, b])
            out[j, r] = acc


@njit(parallel=True, cache=True)
def _mv_q4_0(w, wi, tab, qa, da, out):  # pragma: no cover - compiled
    m, nb = w.shape[0], qa.shape[1]
    for r in prange(m):
        for j in range(qa.shape[0]):
            acc = np.float32(0.0)
            for b in range(nb):
                o = b * 18
                s = np.int32(0)
                for i in range(16):
                    byte = np.int32(w[r, o + 2 + i])
                    s += ((byte & 15) - 8) * np.int32(qa[j, b, i])
                    s += ((byte >> 4) - 8) * np.int32(qa[j, b, i + 16])
                acc += (np.float32(s) * _half(tab, w[r, o], w[r, o + 1])) * da[j, b]
            out[j, r] = acc


@njit(parallel=True, cache=True)
def _mv_q5_0(w, wi, tab, qa, da, out):  # pragma: no cover - compiled
    m, nb = w.shape[0], qa.shape[1]
    for r in prange(m):
        for j in range(qa.shape[0]):
            acc = np.float32(0.0)
            for b in range(nb):
                o = b * 22
                qh = (np.uint32(w[r, o + 2]) | (np.uint32(w[r, o + 3]) << np.uint32(8))
                      | (np.uint32(w[r, o + 4]) << np.uint32(16)) | (np.uint32(w[r, o + 5]) << np.uint32(24)))
                s = np.int32(0)
                for i in range(16):
                    byte = np.int32(w[r, o + 6 + i])
                    lo = (byte & 15) | np.int32(((qh >> np.uint32(i)) & np.uint32(1)) << np.uint32(4))
                    hi = (byte >> 4) | np.int32(((qh >> np.uint32(i + 16)) & np.uint32(1)) << np.uint32(4))
                    s += (lo - 16) * np.int32(qa[j, b, i]) + (hi - 16) * np.int32(qa[j, b, i + 16])
                acc += (_half(tab, w[r, o], w[r, o + 1]) * da[j, b]) * np.float32(s)
            out[j, r] = acc


@njit(parallel=True, cache=True)
def _mv_q4_k(w, wi, tab, qa, da, out):  # pragma: no cover - compiled
    m, nb = w.shape[0], qa.shape[1]
    for r in prange(m):
        sc = np.empty(8, np.int32)
        mn = np.empty(8, np.int32)
        for j in range(qa.shape[0]):
            acc = np.float32(0.0)
            for b in range(nb):
                o = b * 144
                d = _half(tab, w[r, o], w[r, o + 1])
                dmin = _half(tab, w[r, o + 2], w[r, o + 3])
                for k in range(8):  # get_scale_min_k4
                    if k < 4:
                        sc[k] = np.int32(w[r, o + 4 + k]) & 63
                        mn[k] = np.int32(w[r, o + 4 + k + 4]) & 63
                    else:
                        sc[k] = (np.int32(w[r, o + 4 + k + 4]) & 15) | ((np.int32(w[r, o + 4 + k - 4]) >> 6) << 4)
                        mn[k] = (np.int32(w[r, o + 4 + k + 4]) >> 4) | ((np.int32(w[r, o + 4 + k]) >> 6) << 4)
                sum_q = np.int32(0)
                sum_m = np.int32(0)
                for c in range(4):
                    s_lo = np.int32(0)
                    s_hi = np.int32(0)
                    a_lo = np.int32(0)
                    a_hi = np.int32(0)
                    for l in range(32):
                        byte = np.int32(w[r, o + 16 + 32 * c + l])
                        alo = np.int32(qa[j, b, 64 * c + l])
                        ahi = np.int32(qa[j, b, 64 * c + 32 + l])
                        s_lo += (byte & 15) * alo
                        s_hi += (byte >> 4) * ahi
                        a_lo += alo
                        a_hi += ahi
                    sum_q += sc[2 * c] * s_lo + sc[2 * c + 1] * s_hi
                    sum_m += mn[2 * c] * a_lo + mn[2 * c + 1] * a_hi
                acc += (d * da[j, b]) * np.float32(sum_q) - (dmin * da[j, b]) * np.float32(sum_m)
            out[j, r] = acc


@njit(parallel=True, cache=True)
def _mv_q6_k(w, wi, tab, qa, da, out):  # pragma: no cover - compiled
    m, nb = w.shape[0], qa.shape[1]
    for r in prange(m):
        for j in range(qa.shape[0]):
            acc = np.float32(0.0)
            for b in range(nb):
                o = b * 210
                d = _half(tab, w[r, o + 208], w[r, o + 209])
                total = np.int32(0)
                for h in range(2):
                    ql = o + 64 * h
                    qh = o + 128 + 32 * h
                    base = 128 * h
                    s0 = np.int32(0)
                    s1 = np.int32(0)
                    s2 = np.int32(0)
                    s3 = np.int32(0)
                    for l in range(32):
                        b_lo = np.int32(w[r, ql + l])
                        b_hi = np.int32(w[r, ql + 32 + l])
                        hb = np.int32(w[r, qh + l])
                        q0 = ((b_lo & 15) | ((hb & 3) << 4)) - 32
                        q1 = ((b_hi & 15) | (((hb >> 2) & 3) << 4)) - 32
                        q2 = ((b_lo >> 4) | (((hb >> 4) & 3) << 4)) - 32
                        q3 = ((b_hi >> 4) | (((hb >> 6) & 3) << 4)) - 32
                        # scale index = element // 16; l // 16 picks the half of each 32-run
                        sidx = l // 16
                        s0 += q0 * np.int32(qa[j, b, base + l]) * np.int32(wi[r, o + 192 + 8 * h + sidx])
                        s1 += q1 * np.int32(qa[j, b, base + 32 + l]) * np.int32(wi[r, o + 192 + 8 * h + 2 + sidx])
                        s2 += q2 * np.int32(qa[j, b, base + 64 + l]) * np.int32(wi[r, o + 192 + 8 * h + 4 + sidx])
                        s3 += q3 * np.int32(qa[j, b, base + 96 + l]) * np.int32(wi[r, o + 192 + 8 * h + 6 + sidx])
                    total += s0 + s1 + s2 + s3
                acc += (d * da[j, b]) * np.float32(total)
            out[j, r] = acc


_Q8_0_WEIGHTS = {GGMLType.Q8_0: _mv_q8_0, GGMLType.Q4_0: _mv_q4_0, GGMLType.Q5_0: _mv_q5_0}
_Q8_K_WEIGHTS = {GGMLType.Q4_K: _mv_q4_k, GGMLType.Q6_K: _mv_q6_k}
SUPPORTED = frozenset(_Q8_0_WEIGHTS) | frozenset(_Q8_K_WEIGHTS)


def matvec(w: np.ndarray, ty: GGMLType, x: np.ndarray, n_threads: int) -> np.ndarray:
    """Rows ``x`` (n, k) float32 times quantized weight rows ``w`` (m, row_bytes) -> (n, m) float32."""
    n = x.shape[0]
    out = np.empty((n, w.shape[0]), dtype=np.float32)
    x = np.ascontiguousarray(x, dtype=np.float32)
    prev = numba.get_num_threads()
    numba.set_num_threads(max(1, min(n_threads, numba.config.NUMBA_NUM_THREADS)))
    try:
        if ty in _Q8_0_WEIGHTS:
            _, d16, q = _q8_0_parts(x)
            _Q8_0_WEIGHTS[ty](w, w.view(np.int8), _F16_TABLE, q, d16.astype(np.float32), out)
        else:
            d, q = _q8_k_parts(x)
            _Q8_K_WEIGHTS[ty](w, w.view(np.int8), _F16_TABLE, q, d, out)
    finally:
        numba.set_num_threads(prev)  # the thread count is per calling thread; leave it as found
    return out
