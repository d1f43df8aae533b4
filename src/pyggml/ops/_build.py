"""Helpers the op constructors share (the family modules ops/<family>.py).

They live apart from builders.py so the family modules can import them without importing each
other through it: builders.py re-exports every family, and a cycle through it would leave one
of the two half-initialised depending on which was imported first.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import TypeVar, TypeVarTuple

from ..context import Context
from ..errors import PyGGMLError, ShapeError
from ..tensor import Tensor, can_repeat
from ..types import GGMLType
from .enums import Op, UnaryOp

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


def _format(t: Tensor, fmt: str, *args: str) -> None:
    """ggml_format_name with snprintf's truncation (derived names may exceed 63 bytes)."""
    t.name = (fmt % args).encode()[:63].decode(errors="ignore")


def _is_padded_1d(t: Tensor) -> bool:
    return t.nb[0] == t.type.type_size and t.nb[2] == t.nb[1] * t.ne[1] and t.nb[3] == t.nb[2] * t.ne[2]


def _check_repeat(op: str, b: Tensor, a: Tensor) -> None:
    _require(can_repeat(b, a), op, f"b {_ne(b)} cannot be broadcast to a {_ne(a)}")


#: a one-tensor builder, ``ggml_X(ctx, a)``
Build1 = Callable[[Context, Tensor], Tensor]
_OpT = TypeVar("_OpT", Op, UnaryOp)
_Ts = TypeVarTuple("_Ts")
#: a builder ``ggml_X(ctx, a, *args)``
BuildN = Callable[[Context, Tensor, *_Ts], Tensor]


def _twins(impl: Callable[[Context, Tensor, _OpT, bool, *_Ts], Tensor], op: _OpT,
           doc: str = "") -> tuple[BuildN[*_Ts], BuildN[*_Ts]]:
    """ggml's twins ``ggml_X(ctx, a, ...)`` / ``ggml_X_inplace(ctx, a, ...)``, as ggml.c writes them: both
    call ``impl(ctx, a, op, inplace, ...)``, the first over a new tensor, the second over a view of ``a``.
    The two functions count as defined in ``impl``'s module (the op table's family check reads
    ``__module__``), are named after the op, and show ``impl``'s signature without ``op`` and ``inplace``."""
    name = op.name.lower()
    sig = inspect.signature(impl)
    sig = sig.replace(parameters=[p for p in sig.parameters.values() if p.name not in ("op", "inplace")])

    def build(ctx: Context, a: Tensor, *args: *_Ts) -> Tensor:
        return impl(ctx, a, op, False, *args)

    def build_inplace(ctx: Context, a: Tensor, *args: *_Ts) -> Tensor:
        return impl(ctx, a, op, True, *args)

    for fn, fn_name in ((build, name), (build_inplace, f"{name}_inplace")):
        fn.__module__ = impl.__module__
        fn.__name__ = fn.__qualname__ = fn_name
        fn.__doc__ = f"ggml_{fn_name}{doc if fn is build else ''}"
        fn.__signature__ = sig  # type: ignore[attr-defined]
    return build, build_inplace
