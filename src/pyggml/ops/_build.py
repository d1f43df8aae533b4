"""Helpers every op constructor shares (ops/builders.py and the builders_* modules beside it).

They live apart from builders.py so the builder modules can import them without importing each
other: builders.py re-exports the builders_* functions, and a cycle through it would leave one
of the two half-initialised depending on which was imported first.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..context import Context
from ..errors import PyGGMLError, ShapeError
from ..tensor import Tensor
from ..types import GGMLType
from .enums import Op

F32, F16, BF16, I32, I64 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32, GGMLType.I64


def _require(cond: bool, op: str, msg: str, exc: type[PyGGMLError] = ShapeError) -> None:
    """ggml's GGML_ASSERT in a builder, as a pyggml exception naming the op and the problem."""
    if not cond:
        raise exc(f"{op}: {msg}")


def _ne(t: Tensor) -> str:
    return "[" + ", ".join(str(n) for n in t.ne) + "]"


def _node(result: Tensor, op: Op, *srcs: Tensor | None, params: Sequence[int | float] | bytes | None = None) -> Tensor:
    """Record ``op`` on ``result``: its src slots in order and its op_params (ints i32, floats f32)."""
    result.op = op
    for i, s in enumerate(srcs):
        result.src[i] = s
    if params is not None:
        result.set_op_params(params if isinstance(params, bytes) else list(params))
    return result


def _dup_or_view(ctx: Context, a: Tensor, inplace: bool) -> Tensor:
    return ctx.view_tensor(a) if inplace else ctx.dup_tensor(a)


def _new(ctx: Context, type: GGMLType, ne: Sequence[int]) -> Tensor:
    return ctx.new_tensor_impl(type, list(ne))
