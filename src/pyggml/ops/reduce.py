"""Op constructors of reductions and orderings along rows: SUM, SUM_ROWS, MEAN, CUMSUM, ARGMAX,
COUNT_EQUAL, ARGSORT, TOP_K.

CPU kernels: backend/cpu/ops/reduce.py. The conventions every builder keeps: ops/builders.py.
"""

from __future__ import annotations

__all__ = [
    "SortOrder",
    "argmax",
    "argsort",
    "count_equal",
    "cumsum",
    "mean",
    "sum",
    "sum_rows",
    "top_k",
]

from enum import IntEnum

from ..context import Context
from ..errors import TypeMismatchError
from ..tensor import Tensor, are_same_shape
from ._build import F32, I32, I64, _ne, _new, _node, _require
from .enums import Op


class SortOrder(IntEnum):
    ASC = 0
    DESC = 1


# ---------------------------------------------------------------------- reductions
def sum(ctx: Context, a: Tensor) -> Tensor:
    """Sum of all elements, as a 1-element tensor of a's type."""
    return _node(_new(ctx, a.type, [1]), Op.SUM, a)


def sum_rows(ctx: Context, a: Tensor) -> Tensor:
    return _node(_new(ctx, a.type, [1, a.ne[1], a.ne[2], a.ne[3]]), Op.SUM_ROWS, a)


def mean(ctx: Context, a: Tensor) -> Tensor:
    return _node(_new(ctx, F32, [1, a.ne[1], a.ne[2], a.ne[3]]), Op.MEAN, a)


def argmax(ctx: Context, a: Tensor) -> Tensor:
    """Index of the largest element of each row of a matrix (I32 [ne1])."""
    _require(a.is_matrix(), "ARGMAX", f"a must be a matrix, got {_ne(a)}")
    _require(a.ne[0] <= 2**31 - 1, "ARGMAX", "rows too long")
    return _node(_new(ctx, I32, [a.ne[1]]), Op.ARGMAX, a)


def count_equal(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    _require(are_same_shape(a, b), "COUNT_EQUAL", f"shapes differ: {_ne(a)} vs {_ne(b)}")
    return _node(_new(ctx, I64, [1]), Op.COUNT_EQUAL, a, b)


def cumsum(ctx: Context, a: Tensor) -> Tensor:
    _require(a.type == F32, "CUMSUM", "a must be F32", TypeMismatchError)
    return _node(ctx.dup_tensor(a), Op.CUMSUM, a)


def argsort(ctx: Context, a: Tensor, order: SortOrder) -> Tensor:
    _require(a.ne[0] <= 2**31 - 1, "ARGSORT", "rows too long")
    return _node(_new(ctx, I32, a.ne), Op.ARGSORT, a, params=[int(order)])


def top_k(ctx: Context, a: Tensor, k: int) -> Tensor:
    """Indices of the k largest elements of each row (I32 [k, ...], in no particular order)."""
    _require(0 < k <= a.ne[0], "TOP_K", f"k={k} must be in 1..{a.ne[0]}")
    return _node(_new(ctx, I32, [k, a.ne[1], a.ne[2], a.ne[3]]), Op.TOP_K, a)
