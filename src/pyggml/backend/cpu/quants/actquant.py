"""The CPU backend's own ``from_float``: how ggml-cpu quantizes activations and rows at run time.

ggml quantizes the activations of every quantized matmul to the weight's ``vec_dot_type``
(Q8_0, Q8_1 or Q8_K) before the integer dot product. On x86 the Q8_0/Q8_1 quantizer is not the
reference one: it uses ``id = 127/amax`` and round-half-even (``rint``), where the reference uses
``1/d`` and round-half-away. Matching llama.cpp's logits needs the x86 form, so it lives here,
next to the kernels, rather than in pyggml.quants (which is ggml's reference, bit for bit).

``fake_quant`` returns the dequantized activations: ggml's integer dot equals, up to float
order, the float dot of dequantized weights with these values, which lets MUL_MAT use BLAS.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from ....quants.fp import bf16_bits_to_fp32, fp32_to_bf16_bits
from ....types import GGMLType
from ..native import f32_from_bits

Q8_0, Q8_1, Q8_K = GGMLType.Q8_0, GGMLType.Q8_1, GGMLType.Q8_K
_QK8 = 32
_QKK = 256


def _q8_0_parts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (n, k) float32 -> (d as float32 before fp16 rounding, d16 float16, q int8) per 32-block (x86)."""
    n, k = x.shape
    blocks = x.reshape(n, k // _QK8, _QK8)
    amax = np.abs(blocks).max(axis=-1)
    d = amax / np.float32(127.0)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
    q = np.rint(blocks * inv[..., None]).astype(np.int8)
    return d.astype(np.float32), d.astype(np.float16), q


def _q8_k_parts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x (n, k) float32 -> (d float32, q int8) per 256-block, as quantize_row_q8_K_ref."""
    n, k = x.shape
    blocks = x.reshape(n, k // _QKK, _QKK)
    first = np.abs(blocks).argmax(axis=-1)  # the first element of largest magnitude wins
    mx = np.take_along_axis(blocks, first[..., None], axis=-1)[..., 0]
    zero = mx == 0
    with np.errstate(divide="ignore"):
        iscale = np.where(zero, np.float32(0.0), np.float32(-127.0) / np.where(zero, np.float32(1.0), mx))
        iscale = iscale.astype(np.float32)
        d = np.where(zero, np.float32(0.0), np.float32(1.0) / np.where(zero, np.float32(1.0), iscale))
    q = np.minimum(127, np.rint(iscale[..., None] * blocks)).astype(np.int8)
    return d.astype(np.float32), q


def fake_quant(x: np.ndarray, vec_dot_type: GGMLType) -> np.ndarray:
    """The activations ggml's dot product really sees: x quantized to vec_dot_type, dequantized.

    x: float32 (n, k). Types other than Q8_0/Q8_1/Q8_K (F32, F16, BF16) are returned rounded to
    that type, which is what ggml's conversion of src1 does.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    if vec_dot_type in (Q8_0, Q8_1):
        _, d16, q = _q8_0_parts(x)
        return (d16.astype(np.float32)[..., None] * q).reshape(x.shape)
    if vec_dot_type == Q8_K:
        d, q = _q8_k_parts(x)
        return (d[..., None] * q).reshape(x.shape)
    if vec_dot_type == GGMLType.F16:
        return round_to_f16(x)
    if vec_dot_type == GGMLType.BF16:
        return bf16_bits_to_fp32(fp32_to_bf16_bits(x))
    return x


def from_float_rows(x: np.ndarray, ty: GGMLType) -> np.ndarray:
    """Quantize float32 rows (n, k) to ``ty``'s bytes (n, row_bytes) the way ggml-cpu's from_float does.

    Q8_0/Q8_1 use the x86 quantizer, IQ4_NL quantize_row_iq4_nl_ref; every other type's CPU
    from_float is what ggml_quantize_chunk does without an imatrix.
    """
    n, k = x.shape
    if ty in (Q8_0, Q8_1):
        d32, d16, q = _q8_0_parts(x)
        nb = k // _QK8
        if ty == Q8_0:
            out = np.empty((n, nb, 34), dtype=np.uint8)
            out[..., 0:2] = d16.view(np.uint8).reshape(n, nb, 2)
            out[..., 2:] = q.view(np.uint8)
        else:
            s16 = (d32 * q.astype(np.int32).sum(axis=-1).astype(np.float32)).astype(np.float16)
            out = np.empty((n, nb, 36), dtype=np.uint8)
            out[..., 0:2] = d16.view(np.uint8).reshape(n, nb, 2)
            out[..., 2:4] = s16.view(np.uint8).reshape(n, nb, 2)
            out[..., 4:] = q.view(np.uint8)
        return out.reshape(n, -1)
    if ty == Q8_K:
        d, q = _q8_k_parts(x)
        nb = k // _QKK
        bsums = q.reshape(n, nb, 16, 16).astype(np.int16).sum(axis=-1, dtype=np.int16)
        out = np.empty((n, nb, 292), dtype=np.uint8)
        out[..., 0:4] = d.view(np.uint8).reshape(n, nb, 4)
        out[..., 4:260] = q.view(np.uint8)
        out[..., 260:] = bsums.view(np.uint8).reshape(n, nb, 32)
        return out.reshape(n, -1)
    from .... import quants

    if ty == GGMLType.IQ4_NL:  # quantize_row_iq4_nl: the reference, without ggml_quantize_chunk's scale search
        from ....quants.iq4 import quantize_iq4_nl_ref

        return quantize_iq4_nl_ref(x)
    return quants.quantize(x, ty)


@nb.njit(cache=True, nogil=True, inline="always")
def f16_bits(u: np.uint32) -> np.uint32:
    """The fp16 bits nearest (ties to even) to the float32 with bits ``u``, as numpy's and ggml's
    conversions give them: overflow to inf, NaN kept quiet with its top payload bits."""
    sign = (u >> np.uint32(16)) & np.uint32(0x8000)
    a = u & np.uint32(0x7FFFFFFF)
    if a > np.uint32(0x7F800000):  # NaN
        return sign | np.uint32(0x7E00) | ((a >> np.uint32(13)) & np.uint32(0x3FF))
    if a >= np.uint32(0x477FF000):  # rounds past 65504
        return sign | np.uint32(0x7C00)
    if a >= np.uint32(0x38800000):  # normal fp16: keep 10 mantissa bits
        r = a + np.uint32(0xFFF) + ((a >> np.uint32(13)) & np.uint32(1))
        return sign | ((r - np.uint32(0x38000000)) >> np.uint32(13))
    if a <= np.uint32(0x33000000):  # below half the smallest subnormal (a tie goes to even zero)
        return sign
    e = a >> np.uint32(23)  # subnormal: a multiple of 2^-24, ties to even
    m = (a & np.uint32(0x007FFFFF)) | np.uint32(0x00800000)
    shift = np.uint32(126) - e
    q = m >> shift
    rem = m & ((np.uint32(1) << shift) - np.uint32(1))
    half = np.uint32(1) << (shift - np.uint32(1))
    if rem > half or (rem == half and (q & np.uint32(1))):
        q += np.uint32(1)
    return sign | q


@nb.njit(cache=True, nogil=True, inline="always")
def f16_value(h: np.uint32) -> np.float32:
    """The float32 value of the fp16 bits ``h`` (GGML_FP16_TO_FP32, exact), without a table."""
    sign = np.float32(-1.0) if h & np.uint32(0x8000) else np.float32(1.0)
    e = (h >> np.uint32(10)) & np.uint32(0x1F)
    m = h & np.uint32(0x3FF)
    if e == 0:  # zero and subnormals: m * 2^-24
        return sign * np.float32(m) * np.float32(5.9604644775390625e-08)
    if e == 31:
        return sign * np.float32(np.inf) if m == 0 else np.float32(np.nan)
    return f32_from_bits((h & np.uint32(0x8000)) << np.uint32(16) | (e + np.uint32(112)) << np.uint32(23)
                         | m << np.uint32(13))


#: every fp16 bit pattern's float32 value (NaN payloads kept, as numpy widens them)
F16_TO_F32 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


@nb.njit(cache=True, nogil=True)
def _round_to_f16(src: np.ndarray, table: np.ndarray, dst: np.ndarray) -> None:
    for i in range(src.size):
        dst[i] = table[f16_bits(src[i])]


def round_to_f16(x: np.ndarray) -> np.ndarray:
    """x rounded to fp16 precision (as ggml rounds src1 for an F16 weight), returned as float32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty_like(x)
    _round_to_f16(x.reshape(-1).view(np.uint32), F16_TO_F32, out.reshape(-1))
    return out
