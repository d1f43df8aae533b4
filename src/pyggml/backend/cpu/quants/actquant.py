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

import numpy as np

from ....quants.fp import bf16_bits_to_fp32, fp32_to_bf16_bits
from ....types import GGMLType
from ..simd import round_to_f16

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


