"""Every ggml quantization type, bit for bit with ggml.

Public API::

    quantize(x, qtype, imatrix=None) -> uint8 (n_rows, row_bytes)   # == ggml_quantize_chunk
    dequantize(q, qtype) -> float32 (n_rows, n_per_row)              # == type_traits.to_float
    requires_imatrix(qtype) -> bool                                  # == ggml_quantize_requires_imatrix
    validate_row_data(qtype, data) -> bool                           # == ggml_validate_row_data
"""

from __future__ import annotations

import numpy as np

from ..notice import slow_notice
from ..types import GGMLType, as_type
from .jitcache import drop_stale_caches

drop_stale_caches()  # before any codec or kernel loads a cached compile (see jitcache.py)

from . import fp, fp4, iq2, iq3, iq4, kquants, legacy, lowbit, ternary  # noqa: E402  (importing registers the codecs)
from .codec import CODECS, Codec, QuantError, QuantRowError, get_codec, n_per_row_of  # noqa: E402
from .validate import validate_row_data  # noqa: E402


def requires_imatrix(qtype: GGMLType | int | str) -> bool:
    """True for the types ggml refuses to quantize without an importance matrix."""
    return get_codec(as_type(qtype)).requires_imatrix


_quantized_once: set[GGMLType] = set()


def quantize(x: np.ndarray, qtype: GGMLType | int | str, imatrix: np.ndarray | None = None) -> np.ndarray:
    """Quantize float32 rows ``x`` (n_rows, n_per_row) to ``qtype``, as ``ggml_quantize_chunk``."""
    ty = as_type(qtype)
    codec = get_codec(ty)
    x = np.asarray(x)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2:
        raise QuantError(f"quantize expects a 2-d (n_rows, n_per_row) array, got shape {x.shape}")
    if x.dtype != np.float32:
        raise QuantError(f"quantize expects float32 input, got {x.dtype}")
    n_per_row = x.shape[1]
    if n_per_row % ty.blck_size:
        raise QuantError(
            f"n_per_row={n_per_row} is not a multiple of the {ty.type_name} block size {ty.blck_size}"
        )
    if not codec.can_quantize:
        raise QuantError(f"ggml has no quantizer for type {ty.type_name}")
    if imatrix is not None:
        imatrix = np.ascontiguousarray(imatrix, dtype=np.float32).reshape(-1)
        if imatrix.shape[0] != n_per_row:
            raise QuantError(f"imatrix has {imatrix.shape[0]} values, expected n_per_row={n_per_row}")
    elif codec.requires_imatrix:
        raise QuantError(f"type {ty.type_name} requires an importance matrix (imatrix)")
    if ty in _quantized_once:
        out = codec.quantize_rows(np.ascontiguousarray(x), imatrix)
    else:  # the first call compiles the type's numba search kernels (tens of seconds for the IQ types)
        # said only when slow: a cold kernel cache or a large input (the notice cannot tell which)
        with slow_notice(f"pyggml: quantizing to {ty.type_name} (a first use compiles its quantizer, cached "
                         "afterwards)..."):
            out = codec.quantize_rows(np.ascontiguousarray(x), imatrix)
        _quantized_once.add(ty)
    assert out.dtype == np.uint8 and out.shape == (x.shape[0], ty.row_size(n_per_row))
    return out


def dequantize(q: np.ndarray, qtype: GGMLType | int | str) -> np.ndarray:
    """Dequantize uint8 rows ``q`` (n_rows, row_bytes) of ``qtype`` to float32, as ggml's ``to_float``."""
    ty = as_type(qtype)
    codec = get_codec(ty)
    q = np.asarray(q)
    if q.ndim == 1:
        q = q[None, :]
    if q.ndim != 2 or q.dtype != np.uint8:
        raise QuantError(f"dequantize expects a 2-d uint8 array, got {q.dtype} of shape {q.shape}")
    n_per_row_of(ty, q.shape[1])
    return codec.dequantize_rows(np.ascontiguousarray(q))


__all__ = [
    "CODECS",
    "Codec",
    "QuantError",
    "QuantRowError",
    "dequantize",
    "get_codec",
    "quantize",
    "requires_imatrix",
    "validate_row_data",
]
