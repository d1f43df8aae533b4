"""Op constructors of user callbacks: MAP_CUSTOM1/2/3 and CUSTOM (Python callables kept in
``node.extra``).

CPU kernels: backend/cpu/ops/custom.py. The conventions every builder keeps: ops/builders.py.
"""

from __future__ import annotations

__all__ = [
    "GGML_N_TASKS_MAX",
    "custom_4d",
    "custom_inplace",
    "map_custom1",
    "map_custom1_inplace",
    "map_custom2",
    "map_custom2_inplace",
    "map_custom3",
    "map_custom3_inplace",
]

from collections.abc import Callable, Sequence
from typing import Any

from ..context import Context
from ..errors import TypeMismatchError
from ..tensor import GGML_MAX_SRC, Tensor
from ..types import GGMLType
from ._build import _dup_or_view, _new, _node, _require
from .enums import Op

GGML_N_TASKS_MAX = -1


# ---------------------------------------------------------------------- custom ops (Python callables)
CustomFn = Callable[..., Any]


def _custom_params(fun: CustomFn, n_tasks: int, userdata: Any) -> tuple[CustomFn, int, Any]:
    if not callable(fun):
        raise TypeMismatchError("custom op: fun must be callable")
    return (fun, int(n_tasks), userdata)


def _map_custom(ctx: Context, srcs: list[Tensor], op: Op, fun: CustomFn, n_tasks: int, userdata: Any,
                inplace: bool) -> Tensor:
    result = _dup_or_view(ctx, srcs[0], inplace)
    _node(result, op, *srcs)
    result.extra = _custom_params(fun, n_tasks, userdata)
    return result


def map_custom1(ctx: Context, a: Tensor, fun: CustomFn, n_tasks: int = GGML_N_TASKS_MAX,
                userdata: Any = None) -> Tensor:
    """fun(dst, a, ith, nth, userdata) is called once per task to fill dst (a new tensor like a)."""
    return _map_custom(ctx, [a], Op.MAP_CUSTOM1, fun, n_tasks, userdata, False)


def map_custom1_inplace(ctx: Context, a: Tensor, fun: CustomFn, n_tasks: int = GGML_N_TASKS_MAX,
                        userdata: Any = None) -> Tensor:
    return _map_custom(ctx, [a], Op.MAP_CUSTOM1, fun, n_tasks, userdata, True)


def map_custom2(ctx: Context, a: Tensor, b: Tensor, fun: CustomFn, n_tasks: int = GGML_N_TASKS_MAX,
                userdata: Any = None) -> Tensor:
    """fun(dst, a, b, ith, nth, userdata)."""
    return _map_custom(ctx, [a, b], Op.MAP_CUSTOM2, fun, n_tasks, userdata, False)


def map_custom2_inplace(ctx: Context, a: Tensor, b: Tensor, fun: CustomFn, n_tasks: int = GGML_N_TASKS_MAX,
                        userdata: Any = None) -> Tensor:
    return _map_custom(ctx, [a, b], Op.MAP_CUSTOM2, fun, n_tasks, userdata, True)


def map_custom3(ctx: Context, a: Tensor, b: Tensor, c: Tensor, fun: CustomFn, n_tasks: int = GGML_N_TASKS_MAX,
                userdata: Any = None) -> Tensor:
    """fun(dst, a, b, c, ith, nth, userdata)."""
    return _map_custom(ctx, [a, b, c], Op.MAP_CUSTOM3, fun, n_tasks, userdata, False)


def map_custom3_inplace(ctx: Context, a: Tensor, b: Tensor, c: Tensor, fun: CustomFn,
                        n_tasks: int = GGML_N_TASKS_MAX, userdata: Any = None) -> Tensor:
    return _map_custom(ctx, [a, b, c], Op.MAP_CUSTOM3, fun, n_tasks, userdata, True)


def custom_4d(ctx: Context, type: GGMLType, ne0: int, ne1: int, ne2: int, ne3: int, args: Sequence[Tensor],
              fun: CustomFn, n_tasks: int = GGML_N_TASKS_MAX, userdata: Any = None) -> Tensor:
    """A new tensor computed by fun(dst, ith, nth, userdata); dst.src holds args."""
    _require(len(args) <= GGML_MAX_SRC, "CUSTOM", f"at most {GGML_MAX_SRC} arguments")
    result = _node(_new(ctx, type, [ne0, ne1, ne2, ne3]), Op.CUSTOM, *args)
    result.extra = _custom_params(fun, n_tasks, userdata)
    return result


def custom_inplace(ctx: Context, a: Tensor, args: Sequence[Tensor], fun: CustomFn,
                   n_tasks: int = GGML_N_TASKS_MAX, userdata: Any = None) -> Tensor:
    """fun(dst, ith, nth, userdata) writes into a view of a; dst.src = [a, *args]."""
    _require(len(args) < GGML_MAX_SRC, "CUSTOM", f"at most {GGML_MAX_SRC - 1} arguments")
    result = _node(ctx.view_tensor(a), Op.CUSTOM, a, *args)
    result.extra = _custom_params(fun, n_tasks, userdata)
    return result
