"""The original block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q8_1 (32 elements a block).

Quantizing follows ``ggml_quantize_chunk``: without an importance matrix each type runs its
``quantize_row_*_ref`` (ggml-quants.c); with one, Q4_0/Q5_0 search a symmetric scale with
``make_qx_quants`` and Q4_1/Q5_1 fit scale and minimum with ``make_qkx3_quants``, both weighted
by ``imatrix * sqrt(sigma2 + x^2)``. Q8_0 ignores the imatrix and Q8_1 is only ever produced by
its reference row quantizer (ggml quantizes activations to it).

ggml's reference code is plain float32 C built without FMA, so the kernels below keep every
intermediate in float32 and keep ggml's operation order. The C float->int8 casts are emulated
with x86's truncating conversion (NaN and overflow give INT_MIN, of which the low byte is kept),
so that non-finite input too gets the bytes ggml produces on x86. Every kernel is compiled with
numba's ``error_model="numpy"``: a float division by zero must give inf/NaN as in C, not raise.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from ..types import GGMLType
from ._blocks import (
    assemble,
    fp16_bytes,
    pack_bits,
    pack_nibbles,
    put_fields,
    read_fp16,
)
from .codec import BlockCodec, QuantError, register
from .fp import nearest_int_nb, roundf_nb, trunc_to_i8_nb
from .ksearch import (
    FLT_MAX,
    absmax_macro,
    imatrix_weights,
    make_qkx3_quants,
    make_qx_quants,
    signed_absmax,
    sum_squares,
)

QK = 32
F32 = np.float32

BLOCK_Q4_0 = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])
BLOCK_Q4_1 = np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", (16,))])
BLOCK_Q5_0 = np.dtype([("d", "<f2"), ("qh", "u1", (4,)), ("qs", "u1", (16,))])
BLOCK_Q5_1 = np.dtype([("d", "<f2"), ("m", "<f2"), ("qh", "u1", (4,)), ("qs", "u1", (16,))])
BLOCK_Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", (32,))])
BLOCK_Q8_1 = np.dtype([("d", "<f2"), ("s", "<f2"), ("qs", "i1", (32,))])

# ---------------------------------------------------------------------------------------------
# reference (imatrix-free) quantizers: one numba kernel per type, parallel over rows
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True, error_model="numpy")
def _min_max(x: np.ndarray) -> tuple[np.float32, np.float32]:
    """(min, max) started from +-FLT_MAX as ggml does, so an all-NaN block gives the same d and m."""
    lo = FLT_MAX
    hi = -lo
    for v in x:
        if v < lo:
            lo = v
        if v > hi:
            hi = v
    return lo, hi


@nb.njit(cache=True, nogil=True, error_model="numpy")
def _ref_symmetric(x: np.ndarray, nmax: int, d_out: np.ndarray, levels: np.ndarray) -> None:
    """quantize_row_q4_0_ref / q5_0_ref: d = max/-nmax, level = MIN(2nmax-1, (int8)(x*id + nmax+0.5))."""
    n_rows, n = x.shape
    top = 2 * nmax - 1
    offset = F32(nmax) + F32(0.5)
    for r in range(n_rows):
        for ib in range(n // QK):
            xb = x[r, ib * QK : (ib + 1) * QK]
            _amax, vmax = signed_absmax(xb)
            d = vmax / F32(-nmax)
            inv = F32(1.0) / d if d != 0 else F32(0.0)
            d_out[r, ib] = d
            for j in range(QK):
                v = F32(xb[j] * inv)
                levels[r, ib * QK + j] = min(top, trunc_to_i8_nb(F32(v + offset))) & 0xFF


@nb.njit(cache=True, nogil=True, error_model="numpy")
def _ref_affine(
    x: np.ndarray, nmax: int, clamp: bool, d_out: np.ndarray, m_out: np.ndarray, levels: np.ndarray
) -> None:
    """quantize_row_q4_1_ref / q5_1_ref: d = (max-min)/nmax, level = (x-min)*id + 0.5 truncated.

    Q4_1 clamps with MIN(15, (int8)...); Q5_1 stores ``(uint8)`` of the sum unclamped.
    """
    n_rows, n = x.shape
    for r in range(n_rows):
        for ib in range(n // QK):
            xb = x[r, ib * QK : (ib + 1) * QK]
            lo, hi = _min_max(xb)
            d = F32(hi - lo) / F32(nmax)
            inv = F32(1.0) / d if d != 0 else F32(0.0)
            d_out[r, ib] = d
            m_out[r, ib] = lo
            for j in range(QK):
                v = F32(F32(xb[j] - lo) * inv)
                q = trunc_to_i8_nb(F32(v + F32(0.5)))
                if clamp:
                    q = min(nmax, q)
                levels[r, ib * QK + j] = q & 0xFF


@nb.njit(cache=True, nogil=True, error_model="numpy")
def _ref_q8(x: np.ndarray, d_out: np.ndarray, s_out: np.ndarray, levels: np.ndarray) -> None:
    """quantize_row_q8_0_ref / q8_1_ref: d = amax/127, q = roundf(x*(1/d)); s = sum(q)*d for Q8_1."""
    n_rows, n = x.shape
    for r in range(n_rows):
        for ib in range(n // QK):
            xb = x[r, ib * QK : (ib + 1) * QK]
            amax = absmax_macro(xb)
            d = amax / F32(127.0)
            inv = F32(1.0) / d if d != 0 else F32(0.0)
            d_out[r, ib] = d
            total = 0
            for j in range(QK):
                q = trunc_to_i8_nb(roundf_nb(F32(xb[j] * inv)))
                levels[r, ib * QK + j] = q & 0xFF
                total += q
            s_out[r, ib] = F32(F32(total) * d)


# ---------------------------------------------------------------------------------------------
# importance-weighted quantizers (quantize_row_q4_0_impl and friends)
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True, nogil=True, error_model="numpy")
def _impl_symmetric(x: np.ndarray, qw: np.ndarray, nmax: int, d_out: np.ndarray, levels: np.ndarray) -> None:
    """quantize_row_q4_0_impl / q5_0_impl: ``make_qx_quants`` (rmse_type 1) on the weights."""
    n_rows, n = x.shape
    for r in range(n_rows):
        sigma2 = F32(sum_squares(x[r]) / F32(n))
        weight = np.empty(QK, dtype=np.float32)
        for ib in range(n // QK):
            sl = slice(ib * QK, (ib + 1) * QK)
            xb = x[r, sl]
            imatrix_weights(xb, qw[sl], sigma2, weight)
            d_out[r, ib] = make_qx_quants(nmax, xb, levels[r, sl], weight, True)


@nb.njit(cache=True, nogil=True, error_model="numpy")
def _impl_affine(
    x: np.ndarray, qw: np.ndarray, nmax: int, d_out: np.ndarray, m_out: np.ndarray, levels: np.ndarray
) -> None:
    """quantize_row_q4_1_impl / q5_1_impl: ``make_qkx3_quants(rmin=-0.9, rdelta=0.05, nstep=36,
    use_mad=false)`` on the weights; the block minimum is stored as m = -the_min."""
    n_rows, n = x.shape
    for r in range(n_rows):
        sigma2 = F32(sum_squares(x[r]) / F32(n))
        weight = np.empty(QK, dtype=np.float32)
        aux = np.empty(QK, dtype=np.uint8)
        for ib in range(n // QK):
            sl = slice(ib * QK, (ib + 1) * QK)
            xb = x[r, sl]
            imatrix_weights(xb, qw[sl], sigma2, weight)
            d, the_min = make_qkx3_quants(nmax, xb, weight, levels[r, sl], aux, F32(-0.9), F32(0.05), 36, False)
            d_out[r, ib] = d
            m_out[r, ib] = -the_min


# ---------------------------------------------------------------------------------------------
# dequantization: one pass over the blocks (the fp16 scales are widened beforehand by numpy)
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True, error_model="numpy")
def _deq_nibbles(
    blocks: np.ndarray,
    d: np.ndarray,
    m: np.ndarray,
    has_min: bool,
    qh_off: int,
    qs_off: int,
    bias: int,
    out: np.ndarray,
) -> None:
    """dequantize_row_q4_0/q4_1/q5_0/q5_1: level j in the low nibble of qs[j], j+16 in the high
    one, a fifth bit from the u32 ``qh`` (when qh_off >= 0); y = (level - bias)*d, or level*d + m.

    The product is rounded to float32 before m is added, as in ggml's ``x0*d + m`` (no FMA).
    """
    n_rows, n_blocks, _ = blocks.shape
    for r in range(n_rows):
        for b in range(n_blocks):
            db = d[r, b]
            mb = m[r, b]
            qh = 0
            if qh_off >= 0:
                for k in range(4):
                    qh |= np.int64(blocks[r, b, qh_off + k]) << (8 * k)
            base = b * QK
            for j in range(16):
                v = np.int64(blocks[r, b, qs_off + j])
                lo = (v & 15) | (((qh >> j) & 1) << 4)
                hi = (v >> 4) | (((qh >> (j + 16)) & 1) << 4)
                if has_min:
                    out[r, base + j] = F32(F32(lo) * db) + mb
                    out[r, base + j + 16] = F32(F32(hi) * db) + mb
                else:
                    out[r, base + j] = F32(lo - bias) * db
                    out[r, base + j + 16] = F32(hi - bias) * db


@nb.njit(cache=True, error_model="numpy")
def _deq_int8(blocks: np.ndarray, d: np.ndarray, qs_off: int, out: np.ndarray) -> None:
    """dequantize_row_q8_0 (and Q8_1's d*q): y = int8 * d."""
    n_rows, n_blocks, _ = blocks.shape
    for r in range(n_rows):
        for b in range(n_blocks):
            db = d[r, b]
            for j in range(QK):
                v = np.int64(blocks[r, b, qs_off + j])
                out[r, b * QK + j] = F32(v - 256 if v >= 128 else v) * db


# ---------------------------------------------------------------------------------------------
# layout
# ---------------------------------------------------------------------------------------------


def _q5_split(levels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """5-bit levels (..., 32) -> (qh, qs). qh is the u32 whose bit j is bit 4 of level j, which in
    little-endian bytes is simply the fifth bits packed LSB first."""
    qs = pack_nibbles(levels & np.uint8(0x0F))
    return pack_bits((levels >> np.uint8(4)) & np.uint8(1)), qs


class _LegacyCodec(BlockCodec):
    """Shared plumbing: allocate scale/level buffers, run a kernel, lay out the blocks.

    Dequantization reads the fp16 d at byte 0 (and m at byte 2 with ``has_min``), and levels at
    ``qs_off``: nibbles with ``bias`` subtracted and a fifth bit at ``qh_off`` (>= 0), or int8
    (``int8``)."""

    qs_off: int
    has_min = False
    qh_off = -1
    bias = 0
    int8 = False

    def _buffers(self, x: np.ndarray) -> tuple[int, int, np.ndarray, np.ndarray]:
        n_rows, n = x.shape
        n_blocks = n // QK
        return n_rows, n_blocks, np.empty((n_rows, n_blocks), np.float32), np.empty((n_rows, n), np.uint8)

    def _dequantize_blocks(self, blocks: np.ndarray, y: np.ndarray) -> None:
        d = read_fp16(blocks, 0)
        if self.int8:
            _deq_int8(blocks, d, self.qs_off, y)
            return
        m = read_fp16(blocks, 2) if self.has_min else d
        _deq_nibbles(blocks, d, m, self.has_min, self.qh_off, self.qs_off, self.bias, y)


class _SymmetricCodec(_LegacyCodec):
    nmax: int

    def _levels(self, x: np.ndarray, imatrix: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        n_rows, n_blocks, d, levels = self._buffers(x)
        if imatrix is None:
            _ref_symmetric(x, self.nmax, d, levels)
        else:
            _impl_symmetric(x, imatrix, self.nmax, d, levels)
        return d, levels.reshape(n_rows, n_blocks, QK)


class _AffineCodec(_LegacyCodec):
    nmax: int

    def _levels(self, x: np.ndarray, imatrix: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n_rows, n_blocks, d, levels = self._buffers(x)
        m = np.empty_like(d)
        if imatrix is None:
            _ref_affine(x, self.nmax, self.nmax == 15, d, m, levels)
        else:
            _impl_affine(x, imatrix, self.nmax, d, m, levels)
        return d, m, levels.reshape(n_rows, n_blocks, QK)


@register
class Q4_0Codec(_SymmetricCodec):
    qtype = GGMLType.Q4_0
    vec_dot_type = GGMLType.Q8_0
    block_dtype = BLOCK_Q4_0
    nmax = 8
    qs_off, bias = 2, 8

    def _quantize_blocks(self, x: np.ndarray, imatrix: np.ndarray | None, out: np.ndarray) -> None:
        d, levels = self._levels(x, imatrix)
        put_fields(out, [(0, fp16_bytes(d)), (2, pack_nibbles(levels))])


@register
class Q4_1Codec(_AffineCodec):
    qtype = GGMLType.Q4_1
    vec_dot_type = GGMLType.Q8_1
    block_dtype = BLOCK_Q4_1
    nmax = 15
    qs_off, has_min = 4, True

    def _quantize_blocks(self, x: np.ndarray, imatrix: np.ndarray | None, out: np.ndarray) -> None:
        d, m, levels = self._levels(x, imatrix)
        put_fields(out, [(0, fp16_bytes(d)), (2, fp16_bytes(m)), (4, pack_nibbles(levels))])


@register
class Q5_0Codec(_SymmetricCodec):
    qtype = GGMLType.Q5_0
    vec_dot_type = GGMLType.Q8_0
    block_dtype = BLOCK_Q5_0
    nmax = 16
    qh_off, qs_off, bias = 2, 6, 16

    def _quantize_blocks(self, x: np.ndarray, imatrix: np.ndarray | None, out: np.ndarray) -> None:
        d, levels = self._levels(x, imatrix)
        qh, qs = _q5_split(levels)
        put_fields(out, [(0, fp16_bytes(d)), (2, qh), (6, qs)])


@register
class Q5_1Codec(_AffineCodec):
    qtype = GGMLType.Q5_1
    vec_dot_type = GGMLType.Q8_1
    block_dtype = BLOCK_Q5_1
    nmax = 31
    qh_off, qs_off, has_min = 4, 8, True

    def _quantize_blocks(self, x: np.ndarray, imatrix: np.ndarray | None, out: np.ndarray) -> None:
        d, m, levels = self._levels(x, imatrix)
        qh, qs = _q5_split(levels)
        put_fields(out, [(0, fp16_bytes(d)), (2, fp16_bytes(m)), (4, qh), (8, qs)])


# ---------------------------------------------------------------------------------------------
# activation quantizers: what ggml-cpu's matmul uses for src1 (not the _ref code above)
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True, nogil=True, error_model="numpy")
def _q8_activations(x: np.ndarray, d_out: np.ndarray, s_out: np.ndarray, levels: np.ndarray) -> None:
    """quantize_row_q8_0 / q8_1 of ggml-cpu's x86 AVX path: id = 127/amax (not 1/d), levels
    rounded half to even (``_mm256_round_ps``) and saturated to int8; s = d * sum(q) with the
    unrounded d. NaN becomes -128, as cvtps2dq's "integer indefinite" saturated to int8."""
    n_rows, n = x.shape
    for r in range(n_rows):
        for ib in range(n // QK):
            xb = x[r, ib * QK : (ib + 1) * QK]
            amax = F32(0.0)
            for v in xb:
                a = abs(v)
                if a > amax:
                    amax = a
            d = F32(amax / F32(127.0))
            inv = F32(F32(127.0) / amax) if amax != 0 else F32(0.0)
            d_out[r, ib] = d
            total = 0
            for j in range(QK):
                v = F32(xb[j] * inv)
                q = -128 if v != v else max(-128, min(127, nearest_int_nb(v)))
                levels[r, ib * QK + j] = q & 0xFF
                total += q
            s_out[r, ib] = F32(d * F32(total))


def _activation_blocks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % QK:
        raise QuantError(f"activations must be 2-d with rows a multiple of {QK}, got shape {x.shape}")
    n_rows, n = x.shape
    d = np.empty((n_rows, n // QK), np.float32)
    s = np.empty_like(d)
    levels = np.empty((n_rows, n), np.uint8)
    _q8_activations(x, d, s, levels)
    return d, s, levels.reshape(n_rows, n // QK, QK)


def quantize_q8_0_activations(x: np.ndarray) -> np.ndarray:
    """Rows of float32 -> Q8_0 bytes exactly as ggml-cpu converts a matmul's src1 on x86.

    This differs from ``quantize(x, Q8_0)`` (ggml's reference): e.g. with amax 127 the value 2.5
    becomes 2 here and 3 there. Bit-exact for finite input.
    """
    d, _s, levels = _activation_blocks(x)
    n_rows, n_blocks = d.shape
    return assemble(n_rows, n_blocks, 34, [(0, fp16_bytes(d)), (2, levels)])


def quantize_q8_1_activations(x: np.ndarray) -> np.ndarray:
    """Rows of float32 -> Q8_1 bytes as ggml-cpu's x86 ``quantize_row_q8_1`` (Q4_1/Q5_1 matmuls)."""
    d, s, levels = _activation_blocks(x)
    n_rows, n_blocks = d.shape
    return assemble(n_rows, n_blocks, 36, [(0, fp16_bytes(d)), (2, fp16_bytes(s)), (4, levels)])


class _Q8Codec(_LegacyCodec):
    int8 = True

    def _levels(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n_rows, n_blocks, d, levels = self._buffers(x)
        s = np.empty_like(d)
        _ref_q8(x, d, s, levels)
        return d, s, levels.reshape(n_rows, n_blocks, QK)


@register
class Q8_0Codec(_Q8Codec):
    """ggml's quantize_q8_0 ignores the importance matrix: 8 bits leave nothing to weigh."""

    qtype = GGMLType.Q8_0
    vec_dot_type = GGMLType.Q8_0
    block_dtype = BLOCK_Q8_0
    qs_off = 2

    def _quantize_blocks(self, x: np.ndarray, imatrix: np.ndarray | None, out: np.ndarray) -> None:
        d, _s, levels = self._levels(x)
        put_fields(out, [(0, fp16_bytes(d)), (2, levels)])


@register
class Q8_1Codec(_Q8Codec):
    """Activation format for Q4_1/Q5_1 dot products: Q8_0 plus ``s = d * sum(q)``.

    ggml has no ``to_float`` for it (dequantize_row_q8_1 is commented out); pyggml's
    ``d * q`` dequantizer is an extension, useful for checking dot products.
    """

    qtype = GGMLType.Q8_1
    vec_dot_type = GGMLType.Q8_1
    block_dtype = BLOCK_Q8_1
    qs_off = 4

    def _quantize_blocks(self, x: np.ndarray, imatrix: np.ndarray | None, out: np.ndarray) -> None:
        d, s, levels = self._levels(x)
        put_fields(out, [(0, fp16_bytes(d)), (2, fp16_bytes(s)), (4, levels)])


__all__ = [
    "BLOCK_Q4_0",
    "BLOCK_Q4_1",
    "BLOCK_Q5_0",
    "BLOCK_Q5_1",
    "BLOCK_Q8_0",
    "BLOCK_Q8_1",
    "Q4_0Codec",
    "Q4_1Codec",
    "Q5_0Codec",
    "Q5_1Codec",
    "Q8_0Codec",
    "Q8_1Codec",
    "quantize_q8_0_activations",
    "quantize_q8_1_activations",
]
