"""Shared helpers for the CPU kernels: reading sources as float32, storing results, type checks.

Kernels see every tensor through ``Tensor.view4()`` (numpy order ``(ne3, ne2, ne1, ne0)`` with
ggml's byte strides), so permuted, transposed and viewed operands work the way they do in ggml:
the kernel reads the bytes the strides point at, never a packed copy it assumed.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ...errors import PyGGMLError, UnsupportedOpError
from ...tensor import Tensor
from ...tensor_data import bf16_to_f32, f32_to_bf16
from ...types import GGMLType

F32, F16, BF16 = GGMLType.F32, GGMLType.F16, GGMLType.BF16
I8, I16, I32, I64 = GGMLType.I8, GGMLType.I16, GGMLType.I32, GGMLType.I64
FLOAT_TYPES = frozenset({F32, F16, BF16})
INT_TYPES = frozenset({I8, I16, I32, I64})


class KernelInputError(PyGGMLError, ValueError):
    """A kernel met data it cannot compute on (an index out of range, a bad op parameter)."""


def types_of(node: Tensor) -> str:
    """``dst=f32 src0=f16 ...``: the type signature an error message names."""
    parts = [f"dst={node.type.type_name}"]
    for i, s in enumerate(node.src):
        if s is not None:
            parts.append(f"src{i}={s.type.type_name}")
    return " ".join(parts)


def unsupported(node: Tensor, why: str = "") -> UnsupportedOpError:
    """The error for a node whose op exists but whose types (or parameters) have no CPU kernel."""
    sub = f" ({why})" if why else ""
    return UnsupportedOpError(f"CPU backend cannot compute {node.op.name} for {types_of(node)}{sub}")


def require_types(node: Tensor, t: Tensor | None, allowed: Iterable[GGMLType]) -> None:
    """Raise UnsupportedOpError unless ``t`` has one of ``allowed`` types (ggml aborts instead)."""
    if t is not None and t.type not in allowed:
        raise unsupported(node)


def require_f32(node: Tensor, *ts: Tensor | None) -> None:
    """Raise UnsupportedOpError unless every given source is F32: the kernels that compute in float32 only."""
    for t in ts:
        require_types(node, t, (F32,))


def load_f32(t: Tensor) -> np.ndarray:
    """The tensor as float32 in numpy order (ne3, ne2, ne1, ne0); dequantized or widened as ggml's to_float.

    F32 data comes back as the strided view itself (no copy), so callers must not write to it.
    """
    v = t.view4()
    ty = t.type
    if ty == F32:
        return v
    if ty == F16:
        return v.astype(np.float32)
    if ty == BF16:
        return bf16_to_f32(v)
    if ty.is_quantized:
        from ... import quants

        lead = v.shape[:-1]
        flat = np.ascontiguousarray(v).reshape(-1, v.shape[-1])
        return quants.dequantize(flat, ty).reshape(*lead, t.ne[0])
    return v.astype(np.float32)


def to_type(x: np.ndarray, ty: GGMLType) -> np.ndarray:
    """float32 values -> the stored representation of ``ty`` with ggml's CPU rounding.

    F16 and BF16 round to nearest even; ints truncate like a C cast; quantized types go through
    the CPU ``from_float`` of that type (see actquant.from_float_rows).
    """
    if ty == F32:
        return x.astype(np.float32, copy=False)
    if ty == F16:
        with np.errstate(over="ignore"):  # overflow to inf is ggml's fp16 rounding too
            return x.astype(np.float16)
    if ty == BF16:
        return f32_to_bf16(x)
    if ty.is_quantized:
        from .quants.actquant import from_float_rows

        lead = x.shape[:-1]
        flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
        q = from_float_rows(flat, ty)
        return q.reshape(*lead, q.shape[-1])
    dt = ty.traits.np_dtype
    if np.issubdtype(dt, np.integer):
        return np.trunc(x).astype(dt)
    return x.astype(dt)


def store(t: Tensor, x: np.ndarray) -> None:
    """Write float32 values ``x`` (broadcastable to t's numpy shape) into t, converting to t's type."""
    v = t.view4()
    if t.type == F32:
        v[...] = x
        return
    x = np.broadcast_to(np.asarray(x, dtype=np.float32), (t.ne[3], t.ne[2], t.ne[1], t.ne[0]))
    v[...] = to_type(x, t.type)


def round_to(x: np.ndarray, ty: GGMLType) -> np.ndarray:
    """x as float32 after a round trip through ``ty`` (what ggml's conversion to ty loses)."""
    if ty == F16:
        return x.astype(np.float16).astype(np.float32)
    if ty == BF16:
        return bf16_to_f32(f32_to_bf16(x))
    return x


def tile_to(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Repeat ``x`` along each axis to ``shape`` (ggml_can_repeat broadcasting: ne % ne_b == 0).

    Plain numpy broadcasting covers the size-1 axes without a copy; other whole-multiple repeats tile.
    """
    if x.shape == shape:
        return x
    reps = []
    for have, want in zip(x.shape, shape, strict=True):
        if have == 0 or want % have:
            raise KernelInputError(f"cannot repeat shape {x.shape} to {shape}")
        reps.append(want // have)
    if all(r == 1 or h == 1 for r, h in zip(reps, x.shape, strict=True)):
        return np.broadcast_to(x, shape)
    return np.tile(x, reps)


def shape4(t: Tensor) -> tuple[int, int, int, int]:
    """t's numpy-order 4-d shape (ne3, ne2, ne1, ne0)."""
    ne = t.ne
    return (ne[3], ne[2], ne[1], ne[0])
