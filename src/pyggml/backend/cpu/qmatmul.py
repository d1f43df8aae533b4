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

Why the numba loops look the way they do (measured, see bench/bench_matvec.py):

* numba types ``int32 * int32`` as int64; an int64 reduction vectorizes into 8-lane quadword
  multiplies. Re-casting the accumulator every step (``s = np.int32(s + a * b)``) lets LLVM keep
  32-bit lanes and form ``vpmaddwd`` (32 int8 products per instruction on AVX-512).
* A loop with a constant trip count of 16 or 32 is fully unrolled before the loop vectorizer
  runs, and the unrolled scalar code is then not re-vectorized: the block lengths are therefore
  passed in as run-time arguments (``n16``, ``n32``), which keeps them loops the vectorizer takes.
* Rows are addressed through one flat byte array and a row stride, so strided row views (rows
  of a larger buffer) need no copy and the innermost loops always see unit stride.

Entry point: :func:`mul_mat_q`.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import njit, prange

from ... import quants
from ...types import GGMLType
from ._simd import dot_nib_32, dot_q4_32, dot_q5_32, dot_q5k_32, dot_q6_16, rowdot_q4_0, rowdot_q5_0, rowdot_q8_0

#: fp16 bit pattern -> float32 (exact, as GGML_FP16_TO_FP32)
_F16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
#: IQ4_NL / IQ4_XS code book (kvalues_iq4nl)
_KV_IQ4 = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)

Q8_0_FAMILY = (GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.IQ4_NL)
Q8_1_FAMILY = (GGMLType.Q4_1, GGMLType.Q5_1)
Q8_K_FAMILY = (GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K)
#: weight types with a fused integer mat-vec kernel
FUSED = frozenset(Q8_0_FAMILY + Q8_1_FAMILY + Q8_K_FAMILY)

#: src1 rows up to which the fused kernels beat dequantize + BLAS (measured on 2 cores, see bench)
MATVEC_MAX_COLS = 8
#: bytes of float32 weight per dequantized tile: about half an L2, so the tile stays cached
#: while BLAS streams the activations past it
_TILE_BYTES = 512 * 1024


# --------------------------------------------------------------------------------------------
# activation quantizers (ggml-cpu's from_float on x86), in numba so a decode step costs microseconds


@njit(cache=True, inline="always")
def _round_fp16(v):  # pragma: no cover - compiled
    """float32 v >= 0 rounded to the nearest fp16 value (RNE), returned as float32.

    ggml stores Q8_0's d as fp16, and the dot uses the rounded value; numba has no float16
    arithmetic, so round to 11 significant bits (normal range) or to a multiple of 2^-24
    (subnormal range) directly; both steps are exact in float64 except the intended rint.
    """
    x = np.float64(v)
    if x < 6.103515625e-05:  # below the smallest normal fp16: fixed quantum 2^-24
        return np.float32(np.rint(x * 16777216.0) / 16777216.0)
    mant, ex = math.frexp(x)
    r = math.ldexp(np.rint(mant * 2048.0), ex - 11)
    if r > 65504.0:
        return np.float32(np.inf)
    return np.float32(r)


@njit(cache=True)
def _quantize_q8_0(x, qa, da, asum):  # pragma: no cover - compiled
    """x (n, K) f32 -> qa int8 (n, K), da f32 (n, K/32) = fp16-rounded d, asum int32 (n, K/32) = sum of q.

    The x86 quantize_row_q8_0: ``id = 127/amax`` (not 1/d) and round-half-even. ``asum`` lets
    offset weight codes (Q4_0's ``q - 8``) subtract their offset once per block.
    """
    n, k = x.shape
    for j in range(n):
        for b in range(k // 32):
            amax = np.float32(0.0)
            for i in range(32):
                a = abs(x[j, 32 * b + i])
                if a > amax:
                    amax = a
            d = amax / np.float32(127.0)
            inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
            s = 0
            for i in range(32):
                q = np.int32(np.rint(x[j, 32 * b + i] * inv))
                qa[j, 32 * b + i] = q
                s += q
            da[j, b] = _round_fp16(d)
            asum[j, b] = s


@njit(cache=True)
def _q8_1_sums(x, da, asum, sa):  # pragma: no cover - compiled
    """Q8_1's extra field s = fp16(d_f32 * sum q), from the Q8_0 parts (d before fp16 rounding)."""
    n, k = x.shape
    for j in range(n):
        for b in range(k // 32):
            amax = np.float32(0.0)
            for i in range(32):
                a = abs(x[j, 32 * b + i])
                if a > amax:
                    amax = a
            d = amax / np.float32(127.0)
            v = d * np.float32(asum[j, b])
            sa[j, b] = _round_fp16(v) if v >= 0 else -_round_fp16(-v)


@njit(cache=True)
def _quantize_q8_k(x, qa, da, bsum):  # pragma: no cover - compiled
    """x (n, K) f32 -> qa int8, da f32 (n, K/256), bsum int32 (n, K/16): quantize_row_q8_K_ref.

    The first element of largest magnitude sets ``iscale = -127/max`` (so d is negative when that
    element is positive), values are ``min(127, rint(iscale*x))``; an all-zero block has d = 0.
    """
    n, k = x.shape
    for j in range(n):
        for b in range(k // 256):
            o = 256 * b
            mx = np.float32(0.0)
            amax = np.float32(0.0)
            for i in range(256):
                a = abs(x[j, o + i])
                if a > amax:
                    amax = a
                    mx = x[j, o + i]
            if amax == 0:
                da[j, b] = 0.0
                for i in range(256):
                    qa[j, o + i] = 0
                for g in range(16):
                    bsum[j, 16 * b + g] = 0
                continue
            iscale = np.float32(-127.0) / mx
            for i in range(256):
                qa[j, o + i] = min(127, np.int32(np.rint(iscale * x[j, o + i])))
            da[j, b] = np.float32(1.0) / iscale
            for g in range(16):
                s = 0
                for i in range(16):
                    s += qa[j, o + 16 * g + i]
                bsum[j, 16 * b + g] = s


# --------------------------------------------------------------------------------------------
# fused mat-vec kernels. Shared arguments:
#   wu/wi  the weight bytes as one flat uint8 / int8 array; row r starts at r*rs
#   m      number of weight rows;  qa/da  quantized activations (n, K) and their block scales
#   out    (n, m) float32;  nch  row chunks (one per thread), each a contiguous row range
# The block dot products are the _simd intrinsics. Q8_0/Q4_0/Q5_0 use whole-row intrinsics that
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


@njit(parallel=True, cache=True)
def _mv_rowdot(kind, wu, wi, rs, m, qa, da, asum, tab, out, nch):  # pragma: no cover - compiled
    """Q8_0 / Q4_0 / Q5_0 (kind 0/1/2): one whole-row vector dot per output (see _simd.rowdot_*)."""
    n, nb = qa.shape[0], qa.shape[1] // 32
    step = (m + nch - 1) // nch
    for c in prange(nch):
        for r in range(c * step, min(m, (c + 1) * step)):
            for j in range(n):
                if kind == 0:
                    out[j, r] = rowdot_q8_0(wi, r * rs, nb, qa[j], 0, da[j], 0, tab)
                elif kind == 1:
                    out[j, r] = rowdot_q4_0(wi, r * rs, nb, qa[j], 0, da[j], 0, tab)
                else:
                    out[j, r] = rowdot_q5_0(wi, r * rs, nb, qa[j], 0, da[j], 0, tab)


@njit(parallel=True, cache=True)
def _mv_iq4_nl(wu, wi, rs, m, qa, da, asum, tab, out, nch):  # pragma: no cover - compiled
    """IQ4_NL's codes index a 16-entry table, which no portable vector op expresses: plain loop."""
    n, nb = qa.shape[0], qa.shape[1] // 32
    kv = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int32)
    step = (m + nch - 1) // nch
    for c in prange(nch):
        acc = np.empty(n, np.float32)
        for r in range(c * step, min(m, (c + 1) * step)):
            acc[:] = 0
            for b in range(nb):
                o = r * rs + 18 * b
                dw = _h(tab, wu, o)
                for j in range(n):
                    s = np.int32(0)
                    for i in range(16):
                        v = np.int32(wu[o + 2 + i])
                        s = np.int32(s + kv[v & 15] * np.int32(qa[j, 32 * b + i])
                                     + kv[v >> 4] * np.int32(qa[j, 32 * b + 16 + i]))
                    acc[j] += (dw * da[j, b]) * np.float32(s)
            for j in range(n):
                out[j, r] = acc[j]


@njit(parallel=True, cache=True)
def _mv_q4_1(wu, wi, rs, m, qa, da, sa, tab, out, nch):  # pragma: no cover - compiled
    n, nb = qa.shape[0], qa.shape[1] // 32
    step = (m + nch - 1) // nch
    for c in prange(nch):
        acc = np.empty(n, np.float32)
        for r in range(c * step, min(m, (c + 1) * step)):
            acc[:] = 0
            for b in range(nb):
                o = r * rs + 20 * b
                dw = _h(tab, wu, o)
                mw = _h(tab, wu, o + 2)
                for j in range(n):
                    s = dot_q4_32(wu, o + 4, qa[j], 32 * b)
                    acc[j] += (dw * da[j, b]) * np.float32(s) + mw * sa[j, b]
            for j in range(n):
                out[j, r] = acc[j]


@njit(parallel=True, cache=True)
def _mv_q5_1(wu, wi, rs, m, qa, da, sa, tab, out, nch):  # pragma: no cover - compiled
    n, nb = qa.shape[0], qa.shape[1] // 32
    step = (m + nch - 1) // nch
    for c in prange(nch):
        acc = np.empty(n, np.float32)
        for r in range(c * step, min(m, (c + 1) * step)):
            acc[:] = 0
            for b in range(nb):
                o = r * rs + 24 * b
                dw = _h(tab, wu, o)
                mw = _h(tab, wu, o + 2)
                qh = _u32(wu, o + 4)
                for j in range(n):
                    s = dot_q5_32(wu, o + 8, qh, qa[j], 32 * b)
                    acc[j] += (dw * da[j, b]) * np.float32(s) + mw * sa[j, b]
            for j in range(n):
                out[j, r] = acc[j]


@njit(cache=True, inline="always")
def _scale_min_k4(wu, o, sc, mn):  # pragma: no cover - compiled
    """get_scale_min_k4 for all 8 sub-blocks of the 12 scale bytes at o."""
    for k in range(4):
        sc[k] = np.int32(wu[o + k]) & 63
        mn[k] = np.int32(wu[o + k + 4]) & 63
    for k in range(4, 8):
        sc[k] = (np.int32(wu[o + k + 4]) & 15) | ((np.int32(wu[o + k - 4]) >> 6) << 4)
        mn[k] = (np.int32(wu[o + k + 4]) >> 4) | ((np.int32(wu[o + k]) >> 6) << 4)


@njit(cache=True, inline="always")
def _mins_k(mn, bsum, j, b):  # pragma: no cover - compiled
    """sum over the 8 sub-blocks of min * (sum of their activation codes), from the 16-sums."""
    s = np.int32(0)
    for k in range(8):
        s = np.int32(s + mn[k] * (bsum[j, 16 * b + 2 * k] + bsum[j, 16 * b + 2 * k + 1]))
    return s


@njit(parallel=True, cache=True)
def _mv_q4_k(wu, wi, rs, m, qa, da, bsum, tab, out, nch):  # pragma: no cover - compiled
    n, nb = qa.shape[0], qa.shape[1] // 256
    step = (m + nch - 1) // nch
    for c in prange(nch):
        acc = np.empty(n, np.float32)
        sc = np.empty(8, np.int32)
        mn = np.empty(8, np.int32)
        for r in range(c * step, min(m, (c + 1) * step)):
            acc[:] = 0
            for b in range(nb):
                o = r * rs + 144 * b
                d = _h(tab, wu, o)
                dmin = _h(tab, wu, o + 2)
                _scale_min_k4(wu, o + 4, sc, mn)
                for j in range(n):
                    a = qa[j]
                    e = 256 * b
                    sumi = np.int32(0)
                    for g in range(4):
                        q = o + 16 + 32 * g
                        sumi += sc[2 * g] * dot_nib_32(wu, q, 0, a, e + 64 * g)
                        sumi += sc[2 * g + 1] * dot_nib_32(wu, q, 4, a, e + 64 * g + 32)
                    summ = _mins_k(mn, bsum, j, b)
                    acc[j] += (d * da[j, b]) * np.float32(sumi) - (dmin * da[j, b]) * np.float32(summ)
            for j in range(n):
                out[j, r] = acc[j]


@njit(parallel=True, cache=True)
def _mv_q5_k(wu, wi, rs, m, qa, da, bsum, tab, out, nch):  # pragma: no cover - compiled
    n, nb = qa.shape[0], qa.shape[1] // 256
    step = (m + nch - 1) // nch
    for c in prange(nch):
        acc = np.empty(n, np.float32)
        sc = np.empty(8, np.int32)
        mn = np.empty(8, np.int32)
        for r in range(c * step, min(m, (c + 1) * step)):
            acc[:] = 0
            for b in range(nb):
                o = r * rs + 176 * b
                d = _h(tab, wu, o)
                dmin = _h(tab, wu, o + 2)
                _scale_min_k4(wu, o + 4, sc, mn)
                for j in range(n):
                    a = qa[j]
                    e = 256 * b
                    sumi = np.int32(0)
                    for g in range(4):
                        q = o + 48 + 32 * g
                        sumi += sc[2 * g] * dot_q5k_32(wu, q, 0, wu, o + 16, 2 * g, a, e + 64 * g)
                        sumi += sc[2 * g + 1] * dot_q5k_32(wu, q, 4, wu, o + 16, 2 * g + 1, a, e + 64 * g + 32)
                    summ = _mins_k(mn, bsum, j, b)
                    acc[j] += (d * da[j, b]) * np.float32(sumi) - (dmin * da[j, b]) * np.float32(summ)
            for j in range(n):
                out[j, r] = acc[j]


@njit(parallel=True, cache=True)
def _mv_q6_k(wu, wi, rs, m, qa, da, bsum, tab, out, nch):  # pragma: no cover - compiled
    """Codes are used unsigned (0..63) and the -32 offset is taken off once via the block sums,
    as ggml's AVX2 kernel does: sum sc*(q-32)*a = sum sc*q*a - 32*sum sc*bsum."""
    n, nb = qa.shape[0], qa.shape[1] // 256
    step = (m + nch - 1) // nch
    for c in prange(nch):
        acc = np.empty(n, np.float32)
        for r in range(c * step, min(m, (c + 1) * step)):
            acc[:] = 0
            for b in range(nb):
                o = r * rs + 210 * b
                d = _h(tab, wu, o + 208)
                for j in range(n):
                    a = qa[j]
                    sumi = np.int32(0)
                    off = np.int32(0)
                    for hf in range(2):
                        for g in range(2):
                            ql = o + 64 * hf + 16 * g
                            qh = o + 128 + 32 * hf + 16 * g
                            e = 256 * b + 128 * hf + 16 * g
                            so = o + 192 + 8 * hf + g
                            sumi += np.int32(wi[so]) * dot_q6_16(wu, ql, 0, wu, qh, 0, a, e)
                            sumi += np.int32(wi[so + 2]) * dot_q6_16(wu, ql + 32, 0, wu, qh, 2, a, e + 32)
                            sumi += np.int32(wi[so + 4]) * dot_q6_16(wu, ql, 4, wu, qh, 4, a, e + 64)
                            sumi += np.int32(wi[so + 6]) * dot_q6_16(wu, ql + 32, 4, wu, qh, 6, a, e + 96)
                    for k in range(16):
                        off += np.int32(wi[o + 192 + k]) * bsum[j, 16 * b + k]
                    acc[j] += (d * da[j, b]) * np.float32(sumi - 32 * off)
            for j in range(n):
                out[j, r] = acc[j]


# --------------------------------------------------------------------------------------------
# dequantizers to float32 for the BLAS tiles (ggml's reference to_float, one rounding per product).
# Serial on purpose: BLAS runs the product on its own threads right after, and numba's OpenMP
# workers spinning next to OpenBLAS's made a 512-column product 20x slower on a busy 2-core box.


@njit(cache=True)
def _dq_q8_0(wu, wi, rs, r0, r1, tab, y):  # pragma: no cover - compiled
    nb = y.shape[1] // 32
    for r in range(r0, r1):
        for b in range(nb):
            o = r * rs + 34 * b
            d = _h(tab, wu, o)
            for i in range(32):
                y[r - r0, 32 * b + i] = np.float32(wi[o + 2 + i]) * d


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
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


#: type -> (kernel, kind): kind selects the row-dot intrinsic of _mv_rowdot (-1: own kernel)
_MATVEC = {
    GGMLType.Q8_0: (_mv_rowdot, 0), GGMLType.Q4_0: (_mv_rowdot, 1), GGMLType.Q5_0: (_mv_rowdot, 2),
    GGMLType.IQ4_NL: (_mv_iq4_nl, -1), GGMLType.Q4_1: (_mv_q4_1, -1), GGMLType.Q5_1: (_mv_q5_1, -1),
    GGMLType.Q4_K: (_mv_q4_k, -1), GGMLType.Q5_K: (_mv_q5_k, -1), GGMLType.Q6_K: (_mv_q6_k, -1),
}
_DEQUANT = {
    GGMLType.Q8_0: _dq_q8_0, GGMLType.Q4_0: _dq_q4_0, GGMLType.Q5_0: _dq_q5_0,
    GGMLType.Q4_K: _dq_q4_k, GGMLType.Q6_K: _dq_q6_k,
}


# --------------------------------------------------------------------------------------------
# Python side


def _flat_rows(w: np.ndarray) -> tuple[np.ndarray, int]:
    """(flat uint8 view of the rows' memory, row stride in bytes), without copying when rows are
    unit-stride inside; the flat view runs from the first byte of row 0 to the last of row m-1."""
    if w.dtype != np.uint8:
        w = w.view(np.uint8)
    m, rb = w.shape
    if w.strides[1] != 1 or w.strides[0] < rb or m == 0:
        w = np.ascontiguousarray(w)
    if w.flags.c_contiguous:
        return w.reshape(-1), rb
    rs = w.strides[0]
    span = (m - 1) * rs + rb
    return np.lib.stride_tricks.as_strided(w, shape=(span,), strides=(1,), writeable=False), rs


def _threads(n_threads: int) -> int:
    nt = max(1, min(int(n_threads), numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(nt)
    return nt


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


def fake_quant(x: np.ndarray, vec_dot_type: GGMLType) -> np.ndarray:
    """The activations ggml's integer dot really multiplies, as float32 (n, K): d * q per block."""
    if vec_dot_type not in (GGMLType.Q8_0, GGMLType.Q8_1, GGMLType.Q8_K):
        if vec_dot_type == GGMLType.F16:
            return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)
        if vec_dot_type == GGMLType.BF16:
            from ...convert import bf16_to_f32, f32_to_bf16

            return bf16_to_f32(f32_to_bf16(np.ascontiguousarray(x, dtype=np.float32)))
        return np.ascontiguousarray(x, dtype=np.float32)
    qa, da, _ = quantize_activations(x, vec_dot_type)
    n, k = qa.shape
    nb = da.shape[1]
    return (qa.reshape(n, nb, k // nb) * da[:, :, None]).reshape(n, k)


def vec_dot_type_of(qtype: GGMLType) -> GGMLType:
    """The type ggml converts src1 to before multiplying with a ``qtype`` weight."""
    if qtype in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):
        return qtype
    return quants.get_codec(qtype).vec_dot_type


def matvec_q(w_rows: np.ndarray, qtype: GGMLType, x: np.ndarray, out: np.ndarray, n_threads: int) -> None:
    """Fused integer path: out[j, r] = ggml vec_dot(w row r, Q8(x[j])) for a type in FUSED.

    Reads the weight once per call in its quantized form; cost grows with x's row count, so it
    is meant for few rows (decode). Rows are split into contiguous ranges, one per thread; each
    output element is one sequential dot, so the result does not depend on n_threads.
    """
    wf, rs = _flat_rows(w_rows)
    m = w_rows.shape[0]
    nt = _threads(n_threads)
    qa, da, extra = quantize_activations(x, vec_dot_type_of(qtype))
    kern, kind = _MATVEC[qtype]
    if kind >= 0:
        kern(kind, wf, wf.view(np.int8), rs, m, qa, da, extra, _F16, out, nt)
    else:
        kern(wf, wf.view(np.int8), rs, m, qa, da, extra, _F16, out, nt)


def dequantize_rows(w_rows: np.ndarray, qtype: GGMLType, r0: int, r1: int, y: np.ndarray | None = None) -> np.ndarray:
    """Weight rows r0..r1 as float32 (ggml's to_float), into ``y`` (r1-r0, K) when given."""
    kern = _DEQUANT.get(qtype)
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


def matmul_tiles(w_rows: np.ndarray, qtype: GGMLType, x: np.ndarray, out: np.ndarray, n_threads: int) -> None:
    """BLAS path: out = fake_quant(x) @ dequant(w)^T, the weight dequantized a row tile at a time.

    Works for every type with a dequantizer. The tile holds about _TILE_BYTES of float32 so it
    stays in L2 while sgemm streams x past it; the product runs on ``n_threads`` BLAS threads,
    the (much cheaper) dequantization on the calling thread.
    """
    from . import blas

    m = w_rows.shape[0]
    xf = fake_quant(x, vec_dot_type_of(qtype))
    k = xf.shape[1]
    if qtype == GGMLType.F32 and w_rows.dtype == np.float32:
        w_rows = w_rows.view(np.uint8)
    blas.set_threads(n_threads)
    tile = max(8, min(m, _TILE_BYTES // (4 * max(k, 1)) // 8 * 8))
    buf = np.empty((tile, k), np.float32)
    contiguous_out = out.flags.c_contiguous
    for r0 in range(0, m, tile):
        r1 = min(m, r0 + tile)
        wt = dequantize_rows(w_rows, qtype, r0, r1, buf[: r1 - r0])
        if contiguous_out and r1 - r0 == m:
            np.matmul(xf, wt.T, out=out)
        else:
            out[:, r0:r1] = xf @ wt.T


def mul_mat_q(w_rows: np.ndarray, qtype: GGMLType, x: np.ndarray, out: np.ndarray | None = None,
              n_threads: int = 1) -> np.ndarray:
    """out (n, m) float32 = rows of x (n, K) dotted with the m weight rows of ``qtype``, as ggml.

    w_rows: uint8 (m, row_bytes), rows may be strided (a view into a bigger buffer) but each row
    must be contiguous bytes. Few x rows (<= MATVEC_MAX_COLS) of a FUSED type take the fused
    integer kernels; everything else goes through dequantized row tiles and BLAS.
    """
    qtype = GGMLType(qtype)
    x = np.ascontiguousarray(x, dtype=np.float32)
    n = x.shape[0]
    m = w_rows.shape[0]
    if out is None:
        out = np.empty((n, m), np.float32)
    if n == 0 or m == 0:
        return out
    if qtype in FUSED and n <= MATVEC_MAX_COLS:
        target = out if out.flags.c_contiguous else np.empty((n, m), np.float32)
        matvec_q(w_rows, qtype, x, target, n_threads)
        if target is not out:
            out[...] = target
    else:
        matmul_tiles(w_rows, qtype, x, out, n_threads)
    return out
