"""The plain float types as codecs: F32, F16 and BF16 (block size 1).

They sit in the codec registry beside the quantized types because ``ggml_quantize_chunk`` and
``to_float`` handle them too (F16 through ``ggml_fp32_to_fp16_row``, BF16 through
``ggml_fp32_to_bf16_row_ref``), and because the matmul path converts activations to F16/BF16
as their ``vec_dot_type``. An importance matrix means nothing for them and is ignored, as in ggml.
"""

from __future__ import annotations

import numpy as np

from ..types import GGMLType
from .codec import Codec, register
from .fp import bf16_bits_to_fp32, fp16_bits_to_fp32, fp32_to_bf16_bits, fp32_to_fp16_bits


@register
class F32Codec(Codec):
    """Identity: the bytes are the little-endian floats themselves."""

    qtype = GGMLType.F32
    vec_dot_type = GGMLType.F32
    block_dtype = np.dtype("<f4")

    def quantize_rows(self, x: np.ndarray, imatrix: np.ndarray | None) -> np.ndarray:
        return np.ascontiguousarray(x, dtype="<f4").view(np.uint8).copy()

    def dequantize_rows(self, q: np.ndarray) -> np.ndarray:
        return q.view("<f4").astype(np.float32)


@register
class F16Codec(Codec):
    qtype = GGMLType.F16
    vec_dot_type = GGMLType.F16
    block_dtype = np.dtype("<f2")

    def quantize_rows(self, x: np.ndarray, imatrix: np.ndarray | None) -> np.ndarray:
        return fp32_to_fp16_bits(x).astype("<u2").view(np.uint8)

    def dequantize_rows(self, q: np.ndarray) -> np.ndarray:
        return fp16_bits_to_fp32(q.view("<u2"))


@register
class BF16Codec(Codec):
    qtype = GGMLType.BF16
    vec_dot_type = GGMLType.BF16
    block_dtype = np.dtype("<u2")  # numpy has no bfloat16: the raw bits

    def quantize_rows(self, x: np.ndarray, imatrix: np.ndarray | None) -> np.ndarray:
        return fp32_to_bf16_bits(x).astype("<u2").view(np.uint8)

    def dequantize_rows(self, q: np.ndarray) -> np.ndarray:
        return bf16_bits_to_fp32(q.view("<u2"))
