"""Op constructors that copy or gather rows: DUP, CPY (and cast), CONT, GET_ROWS, GET_ROWS_BACK, SET_ROWS.

CPU kernels: backend/cpu/ops/rows.py. The conventions every builder keeps: ops/builders.py.
"""

from __future__ import annotations

__all__ = [
    "cast",
    "cont",
    "cont_1d",
    "cont_2d",
    "cont_3d",
    "cont_4d",
    "cpy",
    "dup",
    "dup_inplace",
    "get_rows",
    "get_rows_back",
    "set_rows",
]

from ..context import Context
from ..errors import TypeMismatchError
from ..tensor import Tensor
from ..types import GGMLType
from ._build import F16, F32, I32, I64, _format, _ne, _new, _node, _require
from .enums import Op


# ---------------------------------------------------------------------- DUP / binary element-wise
def dup(ctx: Context, a: Tensor) -> Tensor:
    return _node(ctx.dup_tensor(a), Op.DUP, a)


def dup_inplace(ctx: Context, a: Tensor) -> Tensor:
    return _node(ctx.view_tensor(a), Op.DUP, a)


def cpy(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Copy (converting type) a into b; the result is a view of b."""
    _require(a.nelements() == b.nelements(), "CPY", f"element counts differ: {_ne(a)} vs {_ne(b)}")
    result = ctx.view_tensor(b)
    if b.name:
        _format(result, "%s (copy of %s)", b.name, a.name)
    else:
        _format(result, "%s (copy)", a.name)
    return _node(result, Op.CPY, a, b)


def cast(ctx: Context, a: Tensor, type: GGMLType) -> Tensor:
    """A copy of a converted to ``type`` (a CPY node whose destination is itself)."""
    result = _new(ctx, type, a.ne)
    _format(result, "%s (copy)", a.name)
    return _node(result, Op.CPY, a, result)


def cont(ctx: Context, a: Tensor) -> Tensor:
    return cont_4d(ctx, a, *a.ne)


def cont_1d(ctx: Context, a: Tensor, ne0: int) -> Tensor:
    return cont_4d(ctx, a, ne0, 1, 1, 1)


def cont_2d(ctx: Context, a: Tensor, ne0: int, ne1: int) -> Tensor:
    return cont_4d(ctx, a, ne0, ne1, 1, 1)


def cont_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor:
    return cont_4d(ctx, a, ne0, ne1, ne2, 1)


def cont_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    """A contiguous copy of a, with a new shape of the same element count."""
    _require(a.nelements() == ne0 * ne1 * ne2 * ne3, "CONT", f"{_ne(a)} has {a.nelements()} elements, "
             f"not {ne0 * ne1 * ne2 * ne3}")
    result = _new(ctx, a.type, [ne0, ne1, ne2, ne3])
    _format(result, "%s (cont)", a.name)
    return _node(result, Op.CONT, a)


# ---------------------------------------------------------------------- rows
def get_rows(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Gather rows of a by the I32 indices in b: [a.ne0, b.ne0, b.ne1, b.ne2] (F32, or I32 for I32 a)."""
    _require(a.ne[2] == b.ne[1] and a.ne[3] == b.ne[2] and b.ne[3] == 1, "GET_ROWS",
             f"index tensor {_ne(b)} does not match table {_ne(a)}")
    _require(b.type == I32, "GET_ROWS", f"indices must be I32, got {b.type.type_name}", TypeMismatchError)
    ty = I32 if a.type == I32 else F32
    return _node(_new(ctx, ty, [a.ne[0], b.ne[0], b.ne[1], b.ne[2]]), Op.GET_ROWS, a, b)


def set_rows(ctx: Context, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """Write rows of b into a at the row indices in c (I64 or I32); the result is a view of a."""
    _require(a.ne[0] == b.ne[0] and a.ne[2] == b.ne[2] and a.ne[3] == b.ne[3], "SET_ROWS",
             f"rows {_ne(b)} do not fit destination {_ne(a)}")
    _require(b.ne[1] == c.ne[0] and b.ne[2] % c.ne[1] == 0 and b.ne[3] % c.ne[2] == 0 and c.ne[3] == 1,
             "SET_ROWS", f"index tensor {_ne(c)} does not match rows {_ne(b)}")
    _require(b.type in (F32, F16), "SET_ROWS", f"source rows must be F32 or F16, got {b.type.type_name}",
             TypeMismatchError)
    _require(c.type in (I64, I32), "SET_ROWS", f"indices must be I64 or I32, got {c.type.type_name}",
             TypeMismatchError)
    return _node(ctx.view_tensor(a), Op.SET_ROWS, b, c, a)


def get_rows_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """ggml_get_rows_back: scatter-add rows a at I32 ids b into an F32 tensor shaped like matrix c.

    c only gives the shape: as in ggml it is not recorded as a source.
    """
    op = "GET_ROWS_BACK"
    _require(a.is_matrix() and b.is_vector(), op, f"a must be a matrix and b a vector, got {_ne(a)}, {_ne(b)}")
    _require(b.type == I32, op, f"ids must be I32, got {b.type.type_name}", TypeMismatchError)
    _require(c.is_matrix() and a.ne[0] == c.ne[0], op, f"c {_ne(c)} must be a matrix with rows like a {_ne(a)}")
    return _node(_new(ctx, F32, [c.ne[0], c.ne[1]]), Op.GET_ROWS_BACK, a, b)
