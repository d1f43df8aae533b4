"""Conversions between a tensor's stored type and float32 / numpy arrays.

The rounding rules are ggml's: F32->F16 rounds to nearest even (numpy's astype does the
same), F32->BF16 rounds to nearest even with NaN made quiet (ggml_compute_fp32_to_bf16),
quantized types go through pyggml.quants row by row (ggml's from_float / to_float).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import ShapeError, TypeMismatchError
from .quants.fp import bf16_bits_to_fp32 as bf16_to_f32  # one place for ggml's bf16 rounding
from .quants.fp import fp32_to_bf16_bits as f32_to_bf16
from .types import GGMLType

if TYPE_CHECKING:
    from .tensor import Tensor


def _by_rows(convert: Callable[[np.ndarray, GGMLType], np.ndarray], a: np.ndarray, type: GGMLType) -> np.ndarray:
    """Apply a codec's whole-row ``convert`` (2-d in, 2-d out) to an array of any rank: the last axis
    is the row, the leading axes are kept and only the row's length changes (values <-> bytes)."""
    out = convert(np.ascontiguousarray(a).reshape(-1, a.shape[-1]), type)
    return out.reshape(*a.shape[:-1], out.shape[-1])


def rows_to_f32(raw: np.ndarray, type: GGMLType) -> np.ndarray:
    """Convert a numpy array of stored elements (last axis = row) of ``type`` to float32.

    For quantized types the last axis holds row bytes and becomes n_per_row floats.
    """
    if type == GGMLType.F32:
        return raw.astype(np.float32, copy=False)
    if type == GGMLType.BF16:
        return bf16_to_f32(raw)
    if type.is_quantized:
        from . import quants  # deferred: the quantizers load numba; import pyggml stays light

        return _by_rows(quants.dequantize, raw, type)
    return raw.astype(np.float32)


def f32_to_rows(x: np.ndarray, type: GGMLType) -> np.ndarray:
    """Convert float32 values (last axis = row) to the stored representation of ``type``."""
    x = np.asarray(x, dtype=np.float32)
    if type == GGMLType.F32:
        return x
    if type == GGMLType.F16:
        return x.astype(np.float16)
    if type == GGMLType.BF16:
        return f32_to_bf16(x)
    if type.is_quantized:
        from . import quants  # deferred: the quantizers load numba; import pyggml stays light

        return _by_rows(quants.quantize, x, type)
    dt = type.traits.np_dtype
    if np.issubdtype(dt, np.integer):
        # ggml converts float to int by C truncation
        return np.trunc(x).astype(dt)
    return x.astype(dt)


def to_f32_4d(t: Tensor) -> np.ndarray:
    """The tensor's data as float32 in numpy order (ne3, ne2, ne1, ne0)."""
    return rows_to_f32(t.view4(), t.type)


def _squeeze_lead(shape: tuple[int, ...]) -> tuple[int, ...]:
    i = 0
    while i < len(shape) - 1 and shape[i] == 1:
        i += 1
    return tuple(shape[i:])


def from_numpy_into(t: Tensor, array: Any) -> None:
    """Tensor.set: write array into t after shape and type checks."""
    arr = np.asarray(array)
    ty = t.type
    is_int_type = ty in (GGMLType.I8, GGMLType.I16, GGMLType.I32, GGMLType.I64)
    if arr.dtype.kind not in ("iub" if is_int_type else "fiub"):
        raise TypeMismatchError(f"cannot store {arr.dtype} data in {ty.type_name} tensor {t.name!r}")
    target = (t.ne[3], t.ne[2], t.ne[1], t.ne[0])
    if _squeeze_lead(arr.shape) != _squeeze_lead(t.shape) and not (arr.ndim == 1 and arr.size == t.nelements()):
        raise ShapeError(f"array of shape {arr.shape} does not fit tensor {t.name!r} of numpy shape {t.shape}")
    arr = arr.reshape(target)
    view = t.view4()
    if is_int_type:
        info = np.iinfo(view.dtype)
        if arr.size and (arr.min() < info.min or arr.max() > info.max):
            raise TypeMismatchError(f"values out of range for {ty.type_name} tensor {t.name!r}")
        view[...] = arr
    elif ty in (GGMLType.F32, GGMLType.F64) or (ty == GGMLType.F16 and arr.dtype == np.float16):
        view[...] = arr
    else:  # F16 from wider floats rounds via float32 as ggml does; BF16 and quantized types convert
        view[...] = f32_to_rows(arr.astype(np.float32), ty)


def fill(t: Tensor, value: float) -> None:
    """ggml_set_f32 / ggml_set_i32 on every element."""
    view = t.view4()
    if t.type.is_quantized or t.type == GGMLType.BF16:
        rows = np.full((t.ne[3], t.ne[2], t.ne[1], t.ne[0]), value, dtype=np.float32)
        view[...] = f32_to_rows(rows, t.type)
    else:
        view[...] = value
