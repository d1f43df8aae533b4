"""The activation quantizers of the quantized matmul (ggml-cpu's from_float on x86), compiled."""

from __future__ import annotations

import numpy as np
from numba import njit

from ..native import f32_bits
from ..simd import f16_bits, f16_value

# --------------------------------------------------------------------------------------------
# activation quantizers (ggml-cpu's from_float on x86), in numba so a decode step costs microseconds


@njit(cache=True, inline="always")
def _round_fp16(v):  # pragma: no cover - compiled
    """float32 v rounded to the nearest fp16 value (ties to even), as float32: ggml stores Q8_0's d as
    fp16 and the dot uses the rounded value. The bits come from simd.f16_bits, the one fp32 -> fp16
    rounding of the CPU backend."""
    return f16_value(f16_bits(np.uint32(f32_bits(v))))


@njit(cache=True, inline="always")
def _amax32(x, j, b):  # pragma: no cover - compiled
    """max |x| over the 32 values of block b of row j (a Q8_0/Q8_1 block's scale source)."""
    amax = np.float32(0.0)
    for i in range(32):
        amax = max(amax, abs(x[j, 32 * b + i]))
    return amax


@njit(cache=True)
def _quantize_q8_0(x, qa, da, asum):  # pragma: no cover - compiled
    """x (n, K) f32 -> qa int8 (n, K), da f32 (n, K/32) = fp16-rounded d, asum int32 (n, K/32) = sum of q.

    The x86 quantize_row_q8_0: ``id = 127/amax`` (not 1/d) and round-half-even. ``asum`` lets
    offset weight codes (Q4_0's ``q - 8``) subtract their offset once per block.
    """
    n, k = x.shape
    for j in range(n):
        for b in range(k // 32):
            amax = _amax32(x, j, b)
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
            d = _amax32(x, j, b) / np.float32(127.0)
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
            amax = np.float32(0.0)
            for i in range(256):
                amax = max(amax, abs(x[j, o + i]))
            mx = np.float32(0.0)
            for i in range(256):  # the first element of that magnitude decides the sign
                if abs(x[j, o + i]) == amax:
                    mx = x[j, o + i]
                    break
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


@njit(cache=True, nogil=True)
def _scale_blocks(qa, da, y):  # pragma: no cover - compiled
    """y = da[block] * qa (the dequantized activations), one pass instead of numpy's two."""
    n, k = qa.shape
    blk = k // da.shape[1]
    for j in range(n):
        for b in range(da.shape[1]):
            d = da[j, b]
            for i in range(blk):
                y[j, blk * b + i] = np.float32(qa[j, blk * b + i]) * d

