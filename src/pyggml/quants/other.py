"""The newer small formats: ternary TQ1_0/TQ2_0, the fp4 formats MXFP4/NVFP4, and Q1_0/Q2_0.

None of them uses an importance matrix: ggml's ``quantize_tq1_0``, ``quantize_mxfp4`` etc.
ignore it, and ``quantize_q1_0``/``quantize_q2_0`` run the reference row quantizer either way.

Rounding follows ggml exactly: the ternary types use ``lroundf`` (half away from zero), Q2_0
uses ``roundf``, the fp4 types pick the first nearest code (ties go to the lower index), and
the MXFP4 exponent comes from ``floorf(log2f(amax))``.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from ..types import QK_K, GGMLType
from ._blocks import as_blocks, assemble, fp16_bytes, load_table, pack_bits, pack_nibbles, read_fp16
from .codec import Codec, register
from .fp import E8M0_HALF, UE4M3, fp32_to_ue4m3_nb, lroundf_nb, roundf_nb, trunc_to_i32_nb
from .ksearch import absmax_macro

F32 = np.float32


#: kvalues_mxfp4 / kvalues_fp4 (data/kvalues_fp4.txt): the E2M1 code book, doubled to integers
KVALUES_FP4 = load_table("kvalues_fp4.txt").astype(np.int8)
_KV_F32 = KVALUES_FP4.astype(np.float32)

QK_MXFP4 = 32
QK_NVFP4 = 64
QK_NVFP4_SUB = 16
QK1_0 = 128
QK2_0 = 64

BLOCK_TQ1_0 = np.dtype([("qs", "u1", (48,)), ("qh", "u1", (4,)), ("d", "<f2")])
BLOCK_TQ2_0 = np.dtype([("qs", "u1", (64,)), ("d", "<f2")])
BLOCK_MXFP4 = np.dtype([("e", "u1"), ("qs", "u1", (16,))])
BLOCK_NVFP4 = np.dtype([("d", "u1", (4,)), ("qs", "u1", (32,))])
BLOCK_Q1_0 = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])
BLOCK_Q2_0 = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])


# ---------------------------------------------------------------------------------------------
# ternary
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True, error_model="numpy")
def _trit(v: np.float32, inv: np.float32) -> int:
    """``lroundf(v*id) + 1`` kept to its low byte (only that survives the uint8 arithmetic)."""
    return (lroundf_nb(F32(v * inv)) + 1) & 0xFF


@nb.njit(cache=True, error_model="numpy")
def _pack_trits(x: np.ndarray, inv: np.float32, start: int, stride: int, count: int) -> int:
    """Base-3 digits x[start + n*stride], n < count, most significant first, then scaled so the
    byte's top bits hold them: q*256/243 rounded up (with uint8 wrap-around, as in ggml)."""
    q = 0
    for n in range(count):
        q = (q * 3 + _trit(x[start + n * stride], inv)) & 0xFF
    if count == 4:
        q = (q * 3) & 0xFF
    return ((q * 256 + 242) // 243) & 0xFF


@nb.njit(cache=True, parallel=True, error_model="numpy")
def _tq1_0_kernel(x: np.ndarray, d_out: np.ndarray, qs: np.ndarray, qh: np.ndarray) -> None:
    n_rows, n = x.shape
    for r in nb.prange(n_rows):
        for ib in range(n // QK_K):
            xb = x[r, ib * QK_K : (ib + 1) * QK_K]
            d = absmax_macro(xb)
            inv = F32(1.0) / d if d != 0 else F32(0.0)
            d_out[r, ib] = d
            for m in range(32):  # elements 0..159: five trits per byte, stride 32
                qs[r, ib, m] = _pack_trits(xb, inv, m, 32, 5)
            for m in range(16):  # elements 160..239: five trits per byte, stride 16
                qs[r, ib, 32 + m] = _pack_trits(xb, inv, 160 + m, 16, 5)
            for j in range(4):  # elements 240..255: four trits per byte, stride 4
                qh[r, ib, j] = _pack_trits(xb, inv, 240 + j, 4, 4)


@nb.njit(cache=True, parallel=True, error_model="numpy")
def _tq2_0_kernel(x: np.ndarray, d_out: np.ndarray, qs: np.ndarray) -> None:
    n_rows, n = x.shape
    for r in nb.prange(n_rows):
        for ib in range(n // QK_K):
            xb = x[r, ib * QK_K : (ib + 1) * QK_K]
            d = absmax_macro(xb)
            inv = F32(1.0) / d if d != 0 else F32(0.0)
            d_out[r, ib] = d
            for half in range(2):
                for m in range(32):
                    q = 0
                    for k in range(4):
                        q += (_trit(xb[half * 128 + k * 32 + m], inv) & 3) << (2 * k)
                    qs[r, ib, half * 32 + m] = q & 0xFF


def _tq1_0_order() -> tuple[np.ndarray, np.ndarray]:
    """For each output element of a TQ1_0 block: which of the 52 trit bytes, and which trit."""
    byte = np.empty(QK_K, dtype=np.int64)
    digit = np.empty(QK_K, dtype=np.int64)
    for n in range(5):
        byte[n * 32 : n * 32 + 32] = np.arange(32)
        digit[n * 32 : n * 32 + 32] = n
        byte[160 + n * 16 : 176 + n * 16] = 32 + np.arange(16)
        digit[160 + n * 16 : 176 + n * 16] = n
    for n in range(4):
        byte[240 + n * 4 : 244 + n * 4] = 48 + np.arange(4)
        digit[240 + n * 4 : 244 + n * 4] = n
    return byte, digit


def _trit_table() -> np.ndarray:
    """(256, 5) float32: trit n of a byte, minus one: ((u8)(byte * 3^n) * 3) >> 8, then - 1."""
    b = np.arange(256, dtype=np.uint16)[:, None]
    pow3 = np.array([1, 3, 9, 27, 81], dtype=np.uint16)[None, :]
    shifted = (b * pow3) & np.uint16(0xFF)  # the product is a uint8 in C
    return (((shifted * np.uint16(3)) >> np.uint16(8)).astype(np.int16) - np.int16(1)).astype(np.float32)


_TQ1_BYTE, _TQ1_DIGIT = _tq1_0_order()
_TQ1_TRITS = _trit_table()


@nb.njit(cache=True, error_model="numpy")
def _deq_tq1_0(
    blocks: np.ndarray, d: np.ndarray, byte: np.ndarray, digit: np.ndarray, trits: np.ndarray, out: np.ndarray
) -> None:
    n_rows, n_blocks, _ = blocks.shape
    for r in nb.prange(n_rows):
        for b in range(n_blocks):
            db = d[r, b]
            for k in range(QK_K):
                out[r, b * QK_K + k] = trits[blocks[r, b, byte[k]], digit[k]] * db


@nb.njit(cache=True, error_model="numpy")
def _deq_tq2_0(blocks: np.ndarray, d: np.ndarray, out: np.ndarray) -> None:
    """Element half*128 + k*32 + m is bits 2k..2k+1 of byte half*32 + m; value (code - 1)*d."""
    n_rows, n_blocks, _ = blocks.shape
    for r in nb.prange(n_rows):
        for b in range(n_blocks):
            db = d[r, b]
            base = b * QK_K
            for half in range(2):
                for m in range(32):
                    byte = np.int64(blocks[r, b, half * 32 + m])
                    for k in range(4):
                        out[r, base + half * 128 + k * 32 + m] = F32(((byte >> (2 * k)) & 3) - 1) * db


@register
class TQ1_0Codec(Codec):
    """1.6875 bpw ternary: five trits per byte, stored as a fixed-point fraction of 243."""

    qtype = GGMLType.TQ1_0
    vec_dot_type = GGMLType.Q8_K
    block_dtype = BLOCK_TQ1_0

    def quantize_rows(self, x: np.ndarray, imatrix: np.ndarray | None) -> np.ndarray:
        n_rows, n = x.shape
        nbk = n // QK_K
        d = np.empty((n_rows, nbk), np.float32)
        qs = np.empty((n_rows, nbk, 48), np.uint8)
        qh = np.empty((n_rows, nbk, 4), np.uint8)
        _tq1_0_kernel(x, d, qs, qh)
        return assemble(n_rows, nbk, 54, [(0, qs), (48, qh), (52, fp16_bytes(d))])

    def dequantize_rows(self, q: np.ndarray) -> np.ndarray:
        blocks = as_blocks(q, 54)
        out = np.empty((q.shape[0], blocks.shape[1] * QK_K), np.float32)
        _deq_tq1_0(blocks, read_fp16(blocks, 52), _TQ1_BYTE, _TQ1_DIGIT, _TQ1_TRITS, out)
        return out


@register
class TQ2_0Codec(Codec):
    """2.0625 bpw ternary: four 2-bit codes (q+1) per byte."""

    qtype = GGMLType.TQ2_0
    vec_dot_type = GGMLType.Q8_K
    block_dtype = BLOCK_TQ2_0

    def quantize_rows(self, x: np.ndarray, imatrix: np.ndarray | None) -> np.ndarray:
        n_rows, n = x.shape
        nbk = n // QK_K
        d = np.empty((n_rows, nbk), np.float32)
        qs = np.empty((n_rows, nbk, 64), np.uint8)
        _tq2_0_kernel(x, d, qs)
        return assemble(n_rows, nbk, 66, [(0, qs), (64, fp16_bytes(d))])

    def dequantize_rows(self, q: np.ndarray) -> np.ndarray:
        blocks = as_blocks(q, 66)
        out = np.empty((q.shape[0], blocks.shape[1] * QK_K), np.float32)
        _deq_tq2_0(blocks, read_fp16(blocks, 64), out)
        return out


# ---------------------------------------------------------------------------------------------
# fp4
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True, error_model="numpy")
def _best_fp4(v: np.float32, scale: np.float32, kv: np.ndarray) -> int:
    """best_index_mxfp4: the first code minimising |kv*scale - v| (NaN input -> code 0)."""
    best = 0
    best_err = abs(F32(kv[0] * scale) - v)
    for i in range(1, 16):
        err = abs(F32(kv[i] * scale) - v)
        if err < best_err:
            best = i
            best_err = err
    return best


@nb.njit(cache=True, error_model="numpy")
def _mxfp4_exponent(amax: np.float32) -> int:
    """``(uint8_t)(floorf(log2f(amax)) - 2 + 127)``, 0 when amax is 0.

    log2f is taken as the correctly rounded float32 of the exact log2; the cast keeps the low
    byte of x86's truncating conversion (inf -> INT_MIN -> 0, like ggml on x86).
    """
    if not amax > 0:
        return 0
    lg = F32(math.log2(np.float64(amax))) if not math.isinf(amax) else F32(np.inf)
    e = F32(F32(F32(np.floor(lg)) - F32(2.0)) + F32(127.0))
    return trunc_to_i32_nb(e) & 0xFF


@nb.njit(cache=True, parallel=True, error_model="numpy")
def _mxfp4_kernel(x: np.ndarray, kv: np.ndarray, half: np.ndarray, e_out: np.ndarray, levels: np.ndarray) -> None:
    n_rows, n = x.shape
    for r in nb.prange(n_rows):
        for ib in range(n // QK_MXFP4):
            base = ib * QK_MXFP4
            amax = F32(0.0)
            for j in range(QK_MXFP4):
                a = abs(x[r, base + j])
                if amax < a:
                    amax = a
            e = _mxfp4_exponent(amax)
            e_out[r, ib] = e
            d = half[e]
            for j in range(QK_MXFP4):
                levels[r, base + j] = _best_fp4(x[r, base + j], d, kv)


@nb.njit(cache=True, parallel=True, error_model="numpy")
def _nvfp4_kernel(x: np.ndarray, kv: np.ndarray, ue4m3: np.ndarray, ue_out: np.ndarray, levels: np.ndarray) -> None:
    n_rows, n = x.shape
    n_sub = n // QK_NVFP4_SUB
    for r in nb.prange(n_rows):
        for s in range(n_sub):
            base = s * QK_NVFP4_SUB
            amax = F32(0.0)
            for j in range(QK_NVFP4_SUB):
                a = abs(x[r, base + j])
                if amax < a:
                    amax = a
            ue = fp32_to_ue4m3_nb(F32(amax / F32(6.0)))
            ue_out[r, s] = ue
            d = ue4m3[ue]
            for j in range(QK_NVFP4_SUB):
                levels[r, base + j] = _best_fp4(x[r, base + j], d, kv)


@nb.njit(cache=True, error_model="numpy")
def _deq_fp4(qs: np.ndarray, scale: np.ndarray, kv: np.ndarray, out: np.ndarray) -> None:
    """qs (rows, blocks, groups, h): code j of a group is the low nibble of byte j (j < h) or the
    high nibble of byte j-h; value kv[code] * scale[group] (one group for MXFP4, four for NVFP4)."""
    n_rows, n_blocks, n_groups, h = qs.shape
    for r in nb.prange(n_rows):
        for b in range(n_blocks):
            for g in range(n_groups):
                sg = scale[r, b, g]
                base = (b * n_groups + g) * 2 * h
                for j in range(h):
                    byte = qs[r, b, g, j]
                    out[r, base + j] = kv[byte & 15] * sg
                    out[r, base + h + j] = kv[byte >> 4] * sg


@register
class MXFP4Codec(Codec):
    """OCP microscaling fp4: 32 E2M1 values sharing one power-of-two (E8M0) exponent."""

    qtype = GGMLType.MXFP4
    vec_dot_type = GGMLType.Q8_0
    block_dtype = BLOCK_MXFP4

    def quantize_rows(self, x: np.ndarray, imatrix: np.ndarray | None) -> np.ndarray:
        n_rows, n = x.shape
        nbk = n // QK_MXFP4
        e = np.empty((n_rows, nbk), np.uint8)
        levels = np.empty((n_rows, n), np.uint8)
        _mxfp4_kernel(x, _KV_F32, E8M0_HALF, e, levels)
        qs = pack_nibbles(levels.reshape(n_rows, nbk, QK_MXFP4))
        return assemble(n_rows, nbk, 17, [(0, e[..., None]), (1, qs)])

    def dequantize_rows(self, q: np.ndarray) -> np.ndarray:
        blocks = as_blocks(q, 17)
        n_rows, n_blocks, _ = blocks.shape
        out = np.empty((n_rows, n_blocks * QK_MXFP4), np.float32)
        scale = E8M0_HALF[blocks[..., :1]]
        _deq_fp4(blocks[..., 1:].reshape(n_rows, n_blocks, 1, 16), scale, _KV_F32, out)
        return out


@register
class NVFP4Codec(Codec):
    """NVIDIA fp4: 64 E2M1 values in four groups of 16, each with a UE4M3 scale."""

    qtype = GGMLType.NVFP4
    vec_dot_type = GGMLType.Q8_0
    block_dtype = BLOCK_NVFP4

    def quantize_rows(self, x: np.ndarray, imatrix: np.ndarray | None) -> np.ndarray:
        n_rows, n = x.shape
        nbk = n // QK_NVFP4
        ue = np.empty((n_rows, n // QK_NVFP4_SUB), np.uint8)
        levels = np.empty((n_rows, n), np.uint8)
        _nvfp4_kernel(x, _KV_F32, UE4M3, ue, levels)
        qs = pack_nibbles(levels.reshape(n_rows, nbk, 4, QK_NVFP4_SUB)).reshape(n_rows, nbk, 32)
        return assemble(n_rows, nbk, 36, [(0, ue.reshape(n_rows, nbk, 4)), (4, qs)])

    def dequantize_rows(self, q: np.ndarray) -> np.ndarray:
        blocks = as_blocks(q, 36)
        n_rows, n_blocks, _ = blocks.shape
        out = np.empty((n_rows, n_blocks * QK_NVFP4), np.float32)
        scale = UE4M3[blocks[..., :4]]
        _deq_fp4(blocks[..., 4:].reshape(n_rows, n_blocks, 4, 8), scale, _KV_F32, out)
        return out


# ---------------------------------------------------------------------------------------------
# Q1_0 / Q2_0
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True, parallel=True, error_model="numpy")
def _q1_0_kernel(x: np.ndarray, d_out: np.ndarray, bits: np.ndarray) -> None:
    """d = mean |x| (summed left to right in float32); bit = x >= 0."""
    n_rows, n = x.shape
    for r in nb.prange(n_rows):
        for ib in range(n // QK1_0):
            base = ib * QK1_0
            total = F32(0.0)
            for j in range(QK1_0):
                total = F32(total + abs(x[r, base + j]))
            d_out[r, ib] = F32(total / F32(QK1_0))
            for j in range(QK1_0):
                bits[r, base + j] = 1 if x[r, base + j] >= 0 else 0


@nb.njit(cache=True, parallel=True, error_model="numpy")
def _q2_0_kernel(x: np.ndarray, d_out: np.ndarray, codes: np.ndarray) -> None:
    """d = amax; code = clamp((int)roundf(x/d) + 1, 0, 3), so codes mean -1, 0, +1, +2 times d."""
    n_rows, n = x.shape
    for r in nb.prange(n_rows):
        for ib in range(n // QK2_0):
            base = ib * QK2_0
            amax = F32(0.0)
            for j in range(QK2_0):
                a = abs(x[r, base + j])
                if a > amax:
                    amax = a
            inv = F32(1.0) / amax if amax > 0 else F32(0.0)
            d_out[r, ib] = amax
            for j in range(QK2_0):
                c = trunc_to_i32_nb(roundf_nb(F32(x[r, base + j] * inv))) + 1
                codes[r, base + j] = min(3, max(0, c))


@nb.njit(cache=True, error_model="numpy")
def _deq_q1_0(blocks: np.ndarray, d: np.ndarray, out: np.ndarray) -> None:
    """Bit j (LSB first) set -> +d, clear -> -d."""
    n_rows, n_blocks, _ = blocks.shape
    for r in nb.prange(n_rows):
        for b in range(n_blocks):
            db = d[r, b]
            for j in range(QK1_0):
                bit = (blocks[r, b, 2 + j // 8] >> (j % 8)) & 1
                out[r, b * QK1_0 + j] = db if bit else -db


@nb.njit(cache=True, error_model="numpy")
def _deq_q2_0(blocks: np.ndarray, d: np.ndarray, out: np.ndarray) -> None:
    """Element j is bits 2*(j%4) of byte j/4; value (code - 1)*d."""
    n_rows, n_blocks, _ = blocks.shape
    for r in nb.prange(n_rows):
        for b in range(n_blocks):
            db = d[r, b]
            for j in range(QK2_0):
                code = (np.int64(blocks[r, b, 2 + j // 4]) >> (2 * (j % 4))) & 3
                out[r, b * QK2_0 + j] = F32(code - 1) * db


@register
class Q1_0Codec(Codec):
    """1.125 bpw: the sign of each weight, times the block's mean magnitude."""

    qtype = GGMLType.Q1_0
    vec_dot_type = GGMLType.Q8_0
    block_dtype = BLOCK_Q1_0

    def quantize_rows(self, x: np.ndarray, imatrix: np.ndarray | None) -> np.ndarray:
        n_rows, n = x.shape
        nbk = n // QK1_0
        d = np.empty((n_rows, nbk), np.float32)
        bits = np.empty((n_rows, n), np.uint8)
        _q1_0_kernel(x, d, bits)
        qs = pack_bits(bits.reshape(n_rows, nbk, QK1_0))
        return assemble(n_rows, nbk, 18, [(0, fp16_bytes(d)), (2, qs)])

    def dequantize_rows(self, q: np.ndarray) -> np.ndarray:
        blocks = as_blocks(q, 18)
        out = np.empty((q.shape[0], blocks.shape[1] * QK1_0), np.float32)
        _deq_q1_0(blocks, read_fp16(blocks, 0), out)
        return out


@register
class Q2_0Codec(Codec):
    """2.25 bpw: codes -1, 0, +1, +2 times the block's absolute maximum."""

    qtype = GGMLType.Q2_0
    vec_dot_type = GGMLType.Q8_0
    block_dtype = BLOCK_Q2_0

    def quantize_rows(self, x: np.ndarray, imatrix: np.ndarray | None) -> np.ndarray:
        n_rows, n = x.shape
        nbk = n // QK2_0
        d = np.empty((n_rows, nbk), np.float32)
        codes = np.empty((n_rows, n), np.uint8)
        _q2_0_kernel(x, d, codes)
        c = codes.reshape(n_rows, nbk, 16, 4)
        qs = c[..., 0] | (c[..., 1] << 2) | (c[..., 2] << 4) | (c[..., 3] << 6)
        return assemble(n_rows, nbk, 18, [(0, fp16_bytes(d)), (2, qs)])

    def dequantize_rows(self, q: np.ndarray) -> np.ndarray:
        blocks = as_blocks(q, 18)
        out = np.empty((q.shape[0], blocks.shape[1] * QK2_0), np.float32)
        _deq_q2_0(blocks, read_fp16(blocks, 0), out)
        return out


__all__ = [
    "BLOCK_MXFP4",
    "BLOCK_NVFP4",
    "BLOCK_Q1_0",
    "BLOCK_Q2_0",
    "BLOCK_TQ1_0",
    "BLOCK_TQ2_0",
    "KVALUES_FP4",
    "MXFP4Codec",
    "NVFP4Codec",
    "Q1_0Codec",
    "Q2_0Codec",
    "TQ1_0Codec",
    "TQ2_0Codec",
]
