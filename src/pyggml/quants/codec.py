"""The codec contract every ggml quantization type implements, and the registry of codecs.

One class per ggml type (DESIGN.md: "a quant type once"). A codec works on whole rows:
``quantize`` maps float32 ``(n_rows, n_per_row)`` to uint8 ``(n_rows, row_bytes)`` exactly as
``ggml_quantize_chunk`` does, and ``dequantize`` maps them back exactly as ggml's ``to_float``.
"""

from __future__ import annotations

import numpy as np

from ..errors import PyGGMLError
from ..types import GGMLType, row_size


class QuantError(PyGGMLError, ValueError):
    """Bad input to a quantizer or dequantizer (shape, type, missing imatrix...)."""


class Codec:
    """Base class: subclasses set ``qtype`` and implement the two row functions."""

    qtype: GGMLType
    #: type the activations are converted to before a dot product (ggml's ``vec_dot_type``)
    vec_dot_type: GGMLType = GGMLType.F32
    #: numpy structured dtype of one block (its itemsize is checked against ggml's type_size)
    block_dtype: np.dtype | None = None
    #: ggml_quantize_requires_imatrix
    requires_imatrix: bool = False
    #: whether this type can be quantized (ggml_quantize_chunk has no q8_K case; pyggml offers
    #: quantize_row_q8_K_ref for it, the activation format of the K-quant dot products)
    can_quantize: bool = True

    def quantize_rows(self, x: np.ndarray, imatrix: np.ndarray | None) -> np.ndarray:
        """x: float32 (n_rows, n_per_row), C-contiguous; returns uint8 (n_rows, row_bytes)."""
        raise NotImplementedError

    def dequantize_rows(self, q: np.ndarray) -> np.ndarray:
        """q: uint8 (n_rows, row_bytes), C-contiguous; returns float32 (n_rows, n_per_row)."""
        raise NotImplementedError


CODECS: dict[GGMLType, Codec] = {}


def register(cls: type[Codec]) -> type[Codec]:
    """Class decorator: instantiate and register a codec, checking its block layout size."""
    codec = cls()
    if codec.block_dtype is not None and codec.block_dtype.itemsize != codec.qtype.type_size:
        raise AssertionError(
            f"{codec.qtype.type_name}: block dtype is {codec.block_dtype.itemsize} bytes, "
            f"ggml's is {codec.qtype.type_size}"
        )
    CODECS[codec.qtype] = codec
    return cls


def get_codec(qtype: GGMLType | int) -> Codec:
    try:
        ty = GGMLType(int(qtype))
    except ValueError:
        raise QuantError(f"unknown ggml type id {qtype}") from None
    codec = CODECS.get(ty)
    if codec is None:
        raise QuantError(f"no codec for type {ty.type_name}")
    return codec


def n_per_row_of(qtype: GGMLType, row_bytes: int) -> int:
    """Elements in a row of ``row_bytes`` bytes of type ``qtype``."""
    if row_bytes % qtype.type_size:
        raise QuantError(f"{row_bytes} bytes is not a whole number of {qtype.type_name} blocks")
    return row_bytes // qtype.type_size * qtype.blck_size


__all__ = ["CODECS", "Codec", "QuantError", "get_codec", "n_per_row_of", "register", "row_size"]
