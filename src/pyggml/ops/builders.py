"""ggml's op constructors: they check shapes and types, record the node, and compute nothing.

Every function has ggml's name without the ``ggml_`` prefix and ggml's arguments in ggml's
order (``mul_mat(ctx, a, b)`` is ``ggml_mul_mat``). Result types and shapes, src slots,
op_params layouts and view/inplace semantics follow ggml.c; where ggml asserts, pyggml raises
ShapeError or TypeMismatchError with a message naming the problem.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from enum import IntEnum
from typing import Any

from ..context import Context
from ..errors import PyGGMLError, ShapeError, TypeMismatchError  # noqa: F401  (ShapeError: importable from here as before)
from ..tensor import GGML_MAX_DIMS, GGML_MAX_SRC, Tensor, are_same_shape, can_repeat
from ..types import GGMLType
from ._build import BF16, F16, F32, I32, I64, _dup_or_view, _ne, _new, _node, _require
from .builders_extra import *  # noqa: F403  (ggml's less common forward ops, kept out of this file's length)
from .builders_extra import __all__ as _extra_all
from .builders_recurrent import *  # noqa: F403
from .builders_recurrent import __all__ as _recurrent_all
from .builders_train import *  # noqa: F403
from .builders_train import __all__ as _train_all
from .enums import GluOp, Op, UnaryOp

GGML_PREC_DEFAULT = 0
GGML_PREC_F32 = 10
GGML_N_TASKS_MAX = -1
GGML_ROPE_TYPE_NEOX = 2
GGML_ROPE_TYPE_MROPE = 8
GGML_ROPE_TYPE_VISION = 24
GGML_ROPE_TYPE_IMROPE = 40
GGML_MROPE_SECTIONS = 4


class SortOrder(IntEnum):
    ASC = 0
    DESC = 1


class OpPool(IntEnum):
    MAX = 0
    AVG = 1


class TriType(IntEnum):
    UPPER_DIAG = 0
    UPPER = 1
    LOWER_DIAG = 2
    LOWER = 3


class ScaleMode(IntEnum):
    NEAREST = 0
    BILINEAR = 1
    BICUBIC = 2


GGML_SCALE_FLAG_ALIGN_CORNERS = 1 << 8
GGML_SCALE_FLAG_ANTIALIAS = 1 << 9


# ---------------------------------------------------------------------- helpers
def _format(t: Tensor, fmt: str, *args: str) -> None:
    """ggml_format_name with snprintf's truncation (derived names may exceed 63 bytes)."""
    t.name = (fmt % args).encode()[:63].decode(errors="ignore")


def _is_padded_1d(t: Tensor) -> bool:
    return t.nb[0] == t.type.type_size and t.nb[2] == t.nb[1] * t.ne[1] and t.nb[3] == t.nb[2] * t.ne[2]


def _check_repeat(op: str, b: Tensor, a: Tensor) -> None:
    _require(can_repeat(b, a), op, f"b {_ne(b)} cannot be broadcast to a {_ne(a)}")


# ---------------------------------------------------------------------- DUP / binary element-wise
def dup(ctx: Context, a: Tensor) -> Tensor:
    return _node(ctx.dup_tensor(a), Op.DUP, a)


def dup_inplace(ctx: Context, a: Tensor) -> Tensor:
    return _node(ctx.view_tensor(a), Op.DUP, a)


def _binary(ctx: Context, a: Tensor, b: Tensor, op: Op, inplace: bool) -> Tensor:
    _check_repeat(op.name, b, a)
    return _node(_dup_or_view(ctx, a, inplace), op, a, b)


def add(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """a + b, b broadcast (ggml_can_repeat) to a's shape; the result has a's type."""
    return _binary(ctx, a, b, Op.ADD, False)


def add_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _binary(ctx, a, b, Op.ADD, True)


def add_cast(ctx: Context, a: Tensor, b: Tensor, type: GGMLType) -> Tensor:
    """ggml_add_cast: a + b stored as ``type`` (a quantized, F16 or BF16)."""
    _check_repeat("ADD", b, a)
    _require(a.type.is_quantized or a.type in (F16, BF16), "add_cast", "a must be quantized, F16 or BF16",
             TypeMismatchError)
    return _node(_new(ctx, type, a.ne), Op.ADD, a, b)


def sub(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _binary(ctx, a, b, Op.SUB, False)


def sub_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _binary(ctx, a, b, Op.SUB, True)


def mul(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _binary(ctx, a, b, Op.MUL, False)


def mul_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _binary(ctx, a, b, Op.MUL, True)


def div(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _binary(ctx, a, b, Op.DIV, False)


def div_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _binary(ctx, a, b, Op.DIV, True)


def _add1(ctx: Context, a: Tensor, b: Tensor, inplace: bool) -> Tensor:
    _require(b.is_scalar(), "ADD1", f"b must be a scalar, got {_ne(b)}")
    _require(_is_padded_1d(a), "ADD1", "a must be padded 1d (contiguous rows)")
    return _node(_dup_or_view(ctx, a, inplace), Op.ADD1, a, b)


def add1(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _add1(ctx, a, b, False)


def add1_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _add1(ctx, a, b, True)


def _acc(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int, inplace: bool) -> Tensor:
    _require(b.nelements() <= a.nelements(), "ACC", "b has more elements than a")
    _require(a.is_contiguous(), "ACC", "a must be contiguous")
    _require(a.type == F32 and b.type == F32, "ACC", "a and b must be F32", TypeMismatchError)
    return _node(_dup_or_view(ctx, a, inplace), Op.ACC, a, b, params=[nb1, nb2, nb3, offset, int(inplace)])


def acc(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    """dst = a; view(dst, nb1, nb2, nb3, offset) += b."""
    return _acc(ctx, a, b, nb1, nb2, nb3, offset, False)


def acc_inplace(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    return _acc(ctx, a, b, nb1, nb2, nb3, offset, True)


# ---------------------------------------------------------------------- simple element-wise math
def _elementwise(op: Op) -> tuple[Callable[[Context, Tensor], Tensor], Callable[[Context, Tensor], Tensor]]:
    def build(ctx: Context, a: Tensor) -> Tensor:
        return _node(ctx.dup_tensor(a), op, a)

    def build_inplace(ctx: Context, a: Tensor) -> Tensor:
        return _node(ctx.view_tensor(a), op, a)

    build.__doc__ = f"ggml_{op.name.lower()}"
    build_inplace.__doc__ = f"ggml_{op.name.lower()}_inplace"
    return build, build_inplace


sqr, sqr_inplace = _elementwise(Op.SQR)
sqrt, sqrt_inplace = _elementwise(Op.SQRT)
log, log_inplace = _elementwise(Op.LOG)
sin, sin_inplace = _elementwise(Op.SIN)
cos, cos_inplace = _elementwise(Op.COS)


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


# ---------------------------------------------------------------------- repeat / concat
def repeat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Tile a to b's shape."""
    _require(can_repeat(a, b), "REPEAT", f"a {_ne(a)} cannot be tiled to {_ne(b)}")
    return _node(_new(ctx, a.type, b.ne), Op.REPEAT, a)


def repeat_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    ne = [ne0, ne1, ne2, ne3]
    ok = (a.is_empty() or all(ne[i] % a.ne[i] == 0 for i in range(4))) if all(ne) else a.is_empty()
    _require(ok, "REPEAT", f"a {_ne(a)} cannot be tiled to {ne}")
    return _node(_new(ctx, a.type, ne), Op.REPEAT, a)


def repeat_back(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Sum the repetitions of a back into b's shape."""
    _require(can_repeat(b, a), "REPEAT_BACK", f"{_ne(b)} does not tile {_ne(a)}")
    return _node(_new(ctx, a.type, b.ne), Op.REPEAT_BACK, a)


def concat(ctx: Context, a: Tensor, b: Tensor, dim: int) -> Tensor:
    _require(0 <= dim < GGML_MAX_DIMS, "CONCAT", f"dim {dim} out of range")
    _require(a.type == b.type, "CONCAT", "a and b must have the same type", TypeMismatchError)
    ne = list(a.ne)
    for d in range(GGML_MAX_DIMS):
        if d == dim:
            ne[d] = a.ne[d] + b.ne[d]
        else:
            _require(a.ne[d] == b.ne[d], "CONCAT", f"dim {d} differs: {_ne(a)} vs {_ne(b)}")
    return _node(_new(ctx, a.type, ne), Op.CONCAT, a, b, params=[dim])


# ---------------------------------------------------------------------- normalisation
def _norm_like(ctx: Context, a: Tensor, op: Op, eps: float, inplace: bool) -> Tensor:
    return _node(_dup_or_view(ctx, a, inplace), op, a, params=[float(eps)])


def norm(ctx: Context, a: Tensor, eps: float) -> Tensor:
    return _norm_like(ctx, a, Op.NORM, eps, False)


def norm_inplace(ctx: Context, a: Tensor, eps: float) -> Tensor:
    return _norm_like(ctx, a, Op.NORM, eps, True)


def rms_norm(ctx: Context, a: Tensor, eps: float) -> Tensor:
    return _norm_like(ctx, a, Op.RMS_NORM, eps, False)


def rms_norm_inplace(ctx: Context, a: Tensor, eps: float) -> Tensor:
    return _norm_like(ctx, a, Op.RMS_NORM, eps, True)


def l2_norm(ctx: Context, a: Tensor, eps: float) -> Tensor:
    return _norm_like(ctx, a, Op.L2_NORM, eps, False)


def l2_norm_inplace(ctx: Context, a: Tensor, eps: float) -> Tensor:
    return _norm_like(ctx, a, Op.L2_NORM, eps, True)


def _group_norm(ctx: Context, a: Tensor, n_groups: int, eps: float, inplace: bool) -> Tensor:
    return _node(_dup_or_view(ctx, a, inplace), Op.GROUP_NORM, a, params=[int(n_groups), float(eps)])


def group_norm(ctx: Context, a: Tensor, n_groups: int, eps: float) -> Tensor:
    return _group_norm(ctx, a, n_groups, eps, False)


def group_norm_inplace(ctx: Context, a: Tensor, n_groups: int, eps: float) -> Tensor:
    return _group_norm(ctx, a, n_groups, eps, True)


# ---------------------------------------------------------------------- matrix products
def can_mul_mat(a: Tensor, b: Tensor) -> bool:
    return a.ne[0] == b.ne[0] and b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0


def mul_mat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Rows of a (weights, [K, M]) dotted with rows of b ([K, N]): F32 [M, N, b.ne2, b.ne3]."""
    _require(can_mul_mat(a, b), "MUL_MAT", f"cannot multiply a {_ne(a)} by b {_ne(b)} "
             "(need a.ne0 == b.ne0 and b.ne2, b.ne3 multiples of a.ne2, a.ne3)")
    _require(not a.is_transposed(), "MUL_MAT", "a must not be transposed")
    return _node(_new(ctx, F32, [a.ne[1], b.ne[1], b.ne[2], b.ne[3]]), Op.MUL_MAT, a, b)


def mul_mat_set_prec(a: Tensor, prec: int) -> None:
    _require(a.op == Op.MUL_MAT, "mul_mat_set_prec", "not a MUL_MAT node", PyGGMLError)
    a.op_params[0] = prec


def can_out_prod(a: Tensor, b: Tensor) -> bool:
    return a.ne[1] == b.ne[1] and b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0


def out_prod(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Outer products summed over rows: a [m, n], b [p, n] -> F32 [m, p]."""
    _require(can_out_prod(a, b), "OUT_PROD", f"cannot take the outer product of {_ne(a)} and {_ne(b)}")
    _require(not a.is_transposed(), "OUT_PROD", "a must not be transposed")
    return _node(_new(ctx, F32, [a.ne[0], b.ne[0], b.ne[2], b.ne[3]]), Op.OUT_PROD, a, b)


# ---------------------------------------------------------------------- scale / set / copies
def _scale(ctx: Context, a: Tensor, s: float, b: float, inplace: bool) -> Tensor:
    _require(_is_padded_1d(a), "SCALE", "a must be padded 1d (contiguous rows)")
    return _node(_dup_or_view(ctx, a, inplace), Op.SCALE, a, params=[float(s), float(b)])


def scale(ctx: Context, a: Tensor, s: float) -> Tensor:
    return _scale(ctx, a, s, 0.0, False)


def scale_inplace(ctx: Context, a: Tensor, s: float) -> Tensor:
    return _scale(ctx, a, s, 0.0, True)


def scale_bias(ctx: Context, a: Tensor, s: float, b: float) -> Tensor:
    return _scale(ctx, a, s, b, False)


def scale_bias_inplace(ctx: Context, a: Tensor, s: float, b: float) -> Tensor:
    return _scale(ctx, a, s, b, True)


def _set(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int, inplace: bool) -> Tensor:
    _require(a.nelements() >= b.nelements(), "SET", "b has more elements than a")
    return _node(_dup_or_view(ctx, a, inplace), Op.SET, a, b, params=[nb1, nb2, nb3, offset, int(inplace)])


def set(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    """dst = a with b written into view(dst, nb1, nb2, nb3, offset)."""
    return _set(ctx, a, b, nb1, nb2, nb3, offset, False)


def set_inplace(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    return _set(ctx, a, b, nb1, nb2, nb3, offset, True)


def set_1d(ctx: Context, a: Tensor, b: Tensor, offset: int) -> Tensor:
    return _set(ctx, a, b, a.nb[1], a.nb[2], a.nb[3], offset, False)


def set_1d_inplace(ctx: Context, a: Tensor, b: Tensor, offset: int) -> Tensor:
    return _set(ctx, a, b, a.nb[1], a.nb[2], a.nb[3], offset, True)


def set_2d(ctx: Context, a: Tensor, b: Tensor, nb1: int, offset: int) -> Tensor:
    return _set(ctx, a, b, nb1, a.nb[2], a.nb[3], offset, False)


def set_2d_inplace(ctx: Context, a: Tensor, b: Tensor, nb1: int, offset: int) -> Tensor:
    return _set(ctx, a, b, nb1, a.nb[2], a.nb[3], offset, True)


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


# ---------------------------------------------------------------------- views
def reshape(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """View of contiguous a with b's shape."""
    _require(a.is_contiguous(), "RESHAPE", "a must be contiguous")
    _require(a.nelements() == b.nelements(), "RESHAPE", f"element counts differ: {_ne(a)} vs {_ne(b)}")
    result = ctx.new_tensor_impl(a.type, b.ne, a, 0)
    _format(result, "%s (reshaped)", a.name)
    return _node(result, Op.RESHAPE, a)


def _reshape_nd(ctx: Context, a: Tensor, ne: list[int]) -> Tensor:
    _require(a.is_contiguous(), "RESHAPE", "a must be contiguous")
    _require(a.nelements() == math.prod(ne), "RESHAPE", f"{_ne(a)} has {a.nelements()} elements, not {math.prod(ne)}")
    result = ctx.new_tensor_impl(a.type, ne, a, 0)
    _format(result, "%s (reshaped)", a.name)
    return _node(result, Op.RESHAPE, a)


def reshape_1d(ctx: Context, a: Tensor, ne0: int) -> Tensor:
    return _reshape_nd(ctx, a, [ne0])


def reshape_2d(ctx: Context, a: Tensor, ne0: int, ne1: int) -> Tensor:
    return _reshape_nd(ctx, a, [ne0, ne1])


def reshape_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor:
    return _reshape_nd(ctx, a, [ne0, ne1, ne2])


def reshape_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    return _reshape_nd(ctx, a, [ne0, ne1, ne2, ne3])


def _view(ctx: Context, a: Tensor, ne: list[int], offset: int) -> Tensor:
    _require(offset >= 0, "VIEW", f"negative offset {offset}")
    result = ctx.new_tensor_impl(a.type, ne, a, offset)
    _format(result, "%s (view)", a.name)
    return _node(result, Op.VIEW, a, params=struct.pack("<Q", offset))


def view_1d(ctx: Context, a: Tensor, ne0: int, offset: int) -> Tensor:
    return _view(ctx, a, [ne0], offset)


def view_2d(ctx: Context, a: Tensor, ne0: int, ne1: int, nb1: int, offset: int) -> Tensor:
    r = _view(ctx, a, [ne0, ne1], offset)
    r.nb[1] = nb1
    r.nb[2] = r.nb[3] = nb1 * ne1
    return r


def view_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, nb1: int, nb2: int, offset: int) -> Tensor:
    r = _view(ctx, a, [ne0, ne1, ne2], offset)
    r.nb[1], r.nb[2] = nb1, nb2
    r.nb[3] = nb2 * ne2
    return r


def view_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int,
            nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    r = _view(ctx, a, [ne0, ne1, ne2, ne3], offset)
    r.nb[1], r.nb[2], r.nb[3] = nb1, nb2, nb3
    return r


def permute(ctx: Context, a: Tensor, axis0: int, axis1: int, axis2: int, axis3: int) -> Tensor:
    """Axis permutation view: source dim i moves to position axis_i."""
    axes = [axis0, axis1, axis2, axis3]
    _require(all(0 <= x < GGML_MAX_DIMS for x in axes) and len({*axes}) == 4, "PERMUTE",
             f"axes {axes} are not a permutation of 0..3")
    result = ctx.view_tensor(a)
    _format(result, "%s (permuted)", a.name)
    ne, nb = [0] * 4, [0] * 4
    for i, ax in enumerate(axes):
        ne[ax], nb[ax] = a.ne[i], a.nb[i]
    result.ne, result.nb = ne, nb
    return _node(result, Op.PERMUTE, a, params=axes)


def transpose(ctx: Context, a: Tensor) -> Tensor:
    result = ctx.view_tensor(a)
    _format(result, "%s (transposed)", a.name)
    result.ne[0], result.ne[1] = a.ne[1], a.ne[0]
    result.nb[0], result.nb[1] = a.nb[1], a.nb[0]
    return _node(result, Op.TRANSPOSE, a)


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


def diag(ctx: Context, a: Tensor) -> Tensor:
    _require(a.ne[1] == 1, "DIAG", f"a must be a row vector, got {_ne(a)}")
    return _node(_new(ctx, a.type, [a.ne[0], a.ne[0], a.ne[2], a.ne[3]]), Op.DIAG, a)


def _diag_mask(ctx: Context, a: Tensor, n_past: int, op: Op, inplace: bool) -> Tensor:
    return _node(_dup_or_view(ctx, a, inplace), op, a, params=[n_past])


def diag_mask_inf(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    return _diag_mask(ctx, a, n_past, Op.DIAG_MASK_INF, False)


def diag_mask_inf_inplace(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    return _diag_mask(ctx, a, n_past, Op.DIAG_MASK_INF, True)


def diag_mask_zero(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    return _diag_mask(ctx, a, n_past, Op.DIAG_MASK_ZERO, False)


def diag_mask_zero_inplace(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    return _diag_mask(ctx, a, n_past, Op.DIAG_MASK_ZERO, True)


# ---------------------------------------------------------------------- softmax
def _soft_max(ctx: Context, a: Tensor, mask: Tensor | None, scale: float, max_bias: float, inplace: bool) -> Tensor:
    _require(a.is_contiguous(), "SOFT_MAX", "a must be contiguous")
    if mask is not None:
        _require(mask.type in (F16, F32), "SOFT_MAX", "mask must be F16 or F32", TypeMismatchError)
        _require(mask.is_contiguous(), "SOFT_MAX", "mask must be contiguous")
        _require(mask.ne[0] == a.ne[0] and mask.ne[1] >= a.ne[1] and a.ne[2] % mask.ne[2] == 0
                 and a.ne[3] % mask.ne[3] == 0, "SOFT_MAX", f"mask {_ne(mask)} does not fit a {_ne(a)}")
    if max_bias > 0:
        _require(mask is not None, "SOFT_MAX", "max_bias > 0 (ALiBi) needs a mask")
    return _node(_dup_or_view(ctx, a, inplace), Op.SOFT_MAX, a, mask, params=[float(scale), float(max_bias)])


def soft_max(ctx: Context, a: Tensor) -> Tensor:
    return _soft_max(ctx, a, None, 1.0, 0.0, False)


def soft_max_inplace(ctx: Context, a: Tensor) -> Tensor:
    return _soft_max(ctx, a, None, 1.0, 0.0, True)


def soft_max_ext(ctx: Context, a: Tensor, mask: Tensor | None, scale: float, max_bias: float) -> Tensor:
    """softmax(a*scale + mask*slope) over rows; slope is ALiBi's when max_bias > 0, else 1."""
    return _soft_max(ctx, a, mask, scale, max_bias, False)


def soft_max_ext_inplace(ctx: Context, a: Tensor, mask: Tensor | None, scale: float, max_bias: float) -> Tensor:
    return _soft_max(ctx, a, mask, scale, max_bias, True)


def soft_max_add_sinks(a: Tensor, sinks: Tensor | None) -> None:
    """Attach per-head attention sinks (F32 [n_head]) to a SOFT_MAX node."""
    if sinks is None:
        a.src[2] = None
        return
    _require(a.op == Op.SOFT_MAX and a.src[2] is None, "soft_max_add_sinks", "not a SOFT_MAX node without sinks",
             PyGGMLError)
    src0 = a.src[0]
    assert src0 is not None
    _require(sinks.ne[0] == src0.ne[2], "soft_max_add_sinks", f"need {src0.ne[2]} sinks, got {sinks.ne[0]}")
    _require(sinks.type == F32, "soft_max_add_sinks", "sinks must be F32", TypeMismatchError)
    a.src[2] = sinks


# ---------------------------------------------------------------------- rope
def _rope(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, sections: Sequence[int] | None,
          mode: int, n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float,
          attn_factor: float, beta_fast: float, beta_slow: float, inplace: bool) -> Tensor:
    _require((mode & 1) == 0, "ROPE", "mode & 1 == 1 is no longer supported")
    _require(b.is_vector() and b.type == I32, "ROPE", "positions must be an I32 vector", TypeMismatchError)
    mrope = bool(mode & GGML_ROPE_TYPE_MROPE)
    want = a.ne[2] * 4 if mrope else a.ne[2]
    _require(b.ne[0] == want, "ROPE", f"need {want} positions for a {_ne(a)}, got {b.ne[0]}")
    if c is not None:
        _require(c.type == F32, "ROPE", "freq factors must be F32", TypeMismatchError)
        _require(c.ne[0] >= n_dims // 2, "ROPE", f"need at least {n_dims // 2} freq factors, got {c.ne[0]}")
    params: list[int | float] = [0, n_dims, mode, 0, n_ctx_orig, float(freq_base), float(freq_scale),
                                 float(ext_factor), float(attn_factor), float(beta_fast), float(beta_slow)]
    secs = list(sections) if (mrope and sections) else [0] * GGML_MROPE_SECTIONS
    params += [int(s) for s in secs]
    return _node(_dup_or_view(ctx, a, inplace), Op.ROPE, a, b, c, params=params)


def rope(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int) -> Tensor:
    return _rope(ctx, a, b, None, n_dims, None, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0, False)


def rope_inplace(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int) -> Tensor:
    return _rope(ctx, a, b, None, n_dims, None, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0, True)


def rope_ext(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, mode: int, n_ctx_orig: int,
             freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
             beta_fast: float, beta_slow: float) -> Tensor:
    """Rotary embedding of a [head_dim, n_head, n_tokens] at I32 positions b, with YaRN parameters."""
    return _rope(ctx, a, b, c, n_dims, None, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                 attn_factor, beta_fast, beta_slow, False)


def rope_ext_inplace(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, mode: int,
                     n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float,
                     attn_factor: float, beta_fast: float, beta_slow: float) -> Tensor:
    return _rope(ctx, a, b, c, n_dims, None, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                 attn_factor, beta_fast, beta_slow, True)


def rope_multi(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, sections: Sequence[int],
               mode: int, n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float,
               attn_factor: float, beta_fast: float, beta_slow: float) -> Tensor:
    return _rope(ctx, a, b, c, n_dims, sections, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                 attn_factor, beta_fast, beta_slow, False)


def rope_ext_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, mode: int, n_ctx_orig: int,
                  freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
                  beta_fast: float, beta_slow: float) -> Tensor:
    """ggml_rope_ext_back: rope_ext's node with op ROPE_BACK (the inverse rotation, rope's gradient)."""
    result = rope_ext(ctx, a, b, c, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor,
                      beta_fast, beta_slow)
    result.op = Op.ROPE_BACK
    return result


def rope_multi_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, sections: Sequence[int],
                    mode: int, n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float,
                    attn_factor: float, beta_fast: float, beta_slow: float) -> Tensor:
    """ggml_rope_multi_back: rope_multi's node with op ROPE_BACK."""
    result = rope_multi(ctx, a, b, c, n_dims, sections, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                        attn_factor, beta_fast, beta_slow)
    result.op = Op.ROPE_BACK
    return result


def rope_set_offset(a: Tensor, n_offs: int) -> Tensor:
    """ggml_rope_set_offset: rotate dims [n_offs, n_offs + n_dims) only (op_params i32[15]); returns a."""
    _require(a.op in (Op.ROPE, Op.ROPE_BACK), "rope_set_offset", "not a ROPE or ROPE_BACK node", PyGGMLError)
    _require(n_offs >= 0, "rope_set_offset", f"n_offs must be >= 0, got {n_offs}")
    _require(a.get_op_params_i32(2) != GGML_ROPE_TYPE_VISION, "rope_set_offset", "vision rope has no offset")
    a.set_op_params_i32(15, n_offs)
    return a


def rope_yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                        beta_slow: float) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims: the dimension range over which YaRN ramps (floor/ceil, clamped)."""

    def corr_dim(n_rot: float) -> float:
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(freq_base))

    start = math.floor(corr_dim(beta_fast))
    end = math.ceil(corr_dim(beta_slow))
    return float(max(0, start)), float(min(n_dims - 1, end))


# ---------------------------------------------------------------------- clamp / activations
def clamp(ctx: Context, a: Tensor, min: float, max: float) -> Tensor:
    """Clamp to [min, max]."""
    return _node(ctx.dup_tensor(a), Op.CLAMP, a, params=[float(min), float(max)])


def clamp_inplace(ctx: Context, a: Tensor, min: float, max: float) -> Tensor:
    return _node(ctx.view_tensor(a), Op.CLAMP, a, params=[float(min), float(max)])


def _leaky_relu(ctx: Context, a: Tensor, negative_slope: float, inplace: bool) -> Tensor:
    return _node(_dup_or_view(ctx, a, inplace), Op.LEAKY_RELU, a, params=[float(negative_slope)])


def leaky_relu(ctx: Context, a: Tensor, negative_slope: float, inplace: bool = False) -> Tensor:
    return _leaky_relu(ctx, a, negative_slope, inplace)


def _unary(ctx: Context, a: Tensor, op: UnaryOp, inplace: bool) -> Tensor:
    _require(a.is_contiguous_1(), "UNARY", "a must have contiguous rows")
    return _node(_dup_or_view(ctx, a, inplace), Op.UNARY, a, params=[int(op)])


def unary(ctx: Context, a: Tensor, op: UnaryOp) -> Tensor:
    return _unary(ctx, a, UnaryOp(op), False)


def unary_inplace(ctx: Context, a: Tensor, op: UnaryOp) -> Tensor:
    return _unary(ctx, a, UnaryOp(op), True)


def _unary_pair(op: UnaryOp) -> tuple[Callable[[Context, Tensor], Tensor], Callable[[Context, Tensor], Tensor]]:
    def build(ctx: Context, a: Tensor) -> Tensor:
        return _unary(ctx, a, op, False)

    def build_inplace(ctx: Context, a: Tensor) -> Tensor:
        return _unary(ctx, a, op, True)

    build.__doc__ = f"ggml_{op.name.lower()}: UNARY node with sub-op {op.name}"
    build_inplace.__doc__ = f"ggml_{op.name.lower()}_inplace"
    return build, build_inplace


abs, abs_inplace = _unary_pair(UnaryOp.ABS)
sgn, sgn_inplace = _unary_pair(UnaryOp.SGN)
neg, neg_inplace = _unary_pair(UnaryOp.NEG)
step, step_inplace = _unary_pair(UnaryOp.STEP)
tanh, tanh_inplace = _unary_pair(UnaryOp.TANH)
elu, elu_inplace = _unary_pair(UnaryOp.ELU)
relu, relu_inplace = _unary_pair(UnaryOp.RELU)
sigmoid, sigmoid_inplace = _unary_pair(UnaryOp.SIGMOID)
gelu, gelu_inplace = _unary_pair(UnaryOp.GELU)
gelu_quick, gelu_quick_inplace = _unary_pair(UnaryOp.GELU_QUICK)
silu, silu_inplace = _unary_pair(UnaryOp.SILU)
hardswish, hardswish_inplace = _unary_pair(UnaryOp.HARDSWISH)
hardsigmoid, hardsigmoid_inplace = _unary_pair(UnaryOp.HARDSIGMOID)
exp, exp_inplace = _unary_pair(UnaryOp.EXP)
expm1, expm1_inplace = _unary_pair(UnaryOp.EXPM1)
softplus, softplus_inplace = _unary_pair(UnaryOp.SOFTPLUS)
gelu_erf, gelu_erf_inplace = _unary_pair(UnaryOp.GELU_ERF)
floor, floor_inplace = _unary_pair(UnaryOp.FLOOR)
ceil, ceil_inplace = _unary_pair(UnaryOp.CEIL)
round, round_inplace = _unary_pair(UnaryOp.ROUND)
trunc, trunc_inplace = _unary_pair(UnaryOp.TRUNC)


def _softplus(x: float) -> float:
    return x if x > 20.0 else math.log1p(math.exp(x))


def xielu(ctx: Context, a: Tensor, alpha_n: float, alpha_p: float, beta: float, eps: float) -> Tensor:
    """xIELU activation; op_params as ggml: [XIELU, beta+softplus(alpha_n), softplus(alpha_p), beta, eps]."""
    result = _unary(ctx, a, UnaryOp.XIELU, False)
    result.set_op_params([int(UnaryOp.XIELU), float(beta + _softplus(alpha_n)), float(_softplus(alpha_p)),
                          float(beta), float(eps)])
    return result


# ---------------------------------------------------------------------- gated linear units
def _glu(ctx: Context, a: Tensor, b: Tensor | None, op: GluOp, swapped: bool) -> Tensor:
    _require(a.is_contiguous_1(), "GLU", "a must have contiguous rows")
    if b is not None:
        _require(b.is_contiguous_1(), "GLU", "b must have contiguous rows")
        _require(are_same_shape(a, b), "GLU", f"a {_ne(a)} and b {_ne(b)} differ in shape")
        _require(a.type == b.type, "GLU", "a and b must have the same type", TypeMismatchError)
        ne = a.ne
    else:
        _require(a.ne[0] % 2 == 0, "GLU", f"fused GLU needs an even row length, got {a.ne[0]}")
        ne = [a.ne[0] // 2, *a.ne[1:]]
    return _node(_new(ctx, a.type, ne), Op.GLU, a, b, params=[int(op), int(swapped)])


def glu(ctx: Context, a: Tensor, op: GluOp, swapped: bool) -> Tensor:
    """Fused GLU: rows split in halves, act(first) * second (or swapped)."""
    return _glu(ctx, a, None, GluOp(op), swapped)


def glu_split(ctx: Context, a: Tensor, b: Tensor, op: GluOp) -> Tensor:
    """Split GLU: act(a) * b."""
    return _glu(ctx, a, b, GluOp(op), False)


def _glu_family(op: GluOp) -> tuple[Callable[..., Tensor], Callable[..., Tensor], Callable[..., Tensor]]:
    def fused(ctx: Context, a: Tensor) -> Tensor:
        return _glu(ctx, a, None, op, False)

    def swapped(ctx: Context, a: Tensor) -> Tensor:
        return _glu(ctx, a, None, op, True)

    def split(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
        return _glu(ctx, a, b, op, False)

    return fused, swapped, split


reglu, reglu_swapped, reglu_split = _glu_family(GluOp.REGLU)
geglu, geglu_swapped, geglu_split = _glu_family(GluOp.GEGLU)
swiglu, swiglu_swapped, swiglu_split = _glu_family(GluOp.SWIGLU)
geglu_erf, geglu_erf_swapped, geglu_erf_split = _glu_family(GluOp.GEGLU_ERF)
geglu_quick, geglu_quick_swapped, geglu_quick_split = _glu_family(GluOp.GEGLU_QUICK)


def swiglu_oai(ctx: Context, a: Tensor, b: Tensor | None, alpha: float, limit: float) -> Tensor:
    """gpt-oss SwiGLU with clamping: op_params f32[2] = alpha, f32[3] = limit."""
    result = _glu(ctx, a, b, GluOp.SWIGLU_OAI, False)
    result.set_op_params_f32(2, alpha)
    result.set_op_params_f32(3, limit)
    return result


def swiglu_clamp(ctx: Context, a: Tensor, b: Tensor | None, limit: float) -> Tensor:
    """silu(min(x, limit)) * clamp(g, -limit, limit) (GluOp.SWIGLU_CLAMP); op_params f32[3] = limit."""
    result = _glu(ctx, a, b, GluOp.SWIGLU_CLAMP, False)
    result.set_op_params_f32(3, limit)
    return result


# ---------------------------------------------------------------------- convolution via im2col
def calc_conv_output_size(ins: int, ks: int, s: int, p: int, d: int) -> int:
    return (ins + 2 * p - d * (ks - 1) - 1) // s + 1


def im2col(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int,
           is_2D: bool, dst_type: GGMLType) -> Tensor:
    """Unfold input b into columns for kernel a, so a convolution becomes a MUL_MAT."""
    if is_2D:
        _require(a.ne[2] == b.ne[2], "IM2COL", f"channel count differs: kernel {_ne(a)}, input {_ne(b)}")
    else:
        _require(b.ne[1] == a.ne[1] and b.ne[3] == 1, "IM2COL",
                 f"channel count differs: kernel {_ne(a)}, input {_ne(b)}")
    oh = calc_conv_output_size(b.ne[1], a.ne[1], s1, p1, d1) if is_2D else 0
    ow = calc_conv_output_size(b.ne[0], a.ne[0], s0, p0, d0)
    _require((not is_2D or oh > 0) and ow > 0, "IM2COL", "input too small for the kernel")
    ne = [a.ne[2] * a.ne[1] * a.ne[0] if is_2D else a.ne[1] * a.ne[0], ow,
          oh if is_2D else b.ne[2], b.ne[3] if is_2D else 1]
    return _node(_new(ctx, dst_type, ne), Op.IM2COL, a, b, params=[s0, s1, p0, p1, d0, d1, int(is_2D)])


def conv_1d(ctx: Context, a: Tensor, b: Tensor, s0: int, p0: int, d0: int) -> Tensor:
    """1-D convolution of b [L, IC, N] by kernel a [K, IC, OC] -> [OL, OC, N], as IM2COL + MUL_MAT."""
    col = im2col(ctx, a, b, s0, 0, p0, 0, d0, 0, False, F16)
    r = mul_mat(ctx, reshape_2d(ctx, col, col.ne[0], col.ne[2] * col.ne[1]),
                reshape_2d(ctx, a, a.ne[0] * a.ne[1], a.ne[2]))
    return reshape_3d(ctx, r, col.ne[1], a.ne[2], col.ne[2])


def conv_2d(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int) -> Tensor:
    """2-D convolution of b [W, H, IC, N] by kernel a [KW, KH, IC, OC] -> [OW, OH, OC, N]."""
    col = im2col(ctx, a, b, s0, s1, p0, p1, d0, d1, True, a.type)
    r = mul_mat(ctx, reshape_2d(ctx, col, col.ne[0], col.ne[3] * col.ne[2] * col.ne[1]),
                reshape_2d(ctx, a, a.ne[0] * a.ne[1] * a.ne[2], a.ne[3]))
    r = reshape_4d(ctx, r, col.ne[1], col.ne[2], col.ne[3], a.ne[3])
    return cont(ctx, permute(ctx, r, 0, 1, 3, 2))


# ---------------------------------------------------------------------- pooling / resampling / padding
def calc_pool_output_size(ins: int, ks: int, s: int, p: float) -> int:
    return int((ins + 2 * p - ks) / s + 1)


def pool_1d(ctx: Context, a: Tensor, op: OpPool, k0: int, s0: int, p0: int) -> Tensor:
    ne = [calc_pool_output_size(a.ne[0], k0, s0, p0), a.ne[1], a.ne[2], a.ne[3]]
    _require(ne[0] > 0, "POOL_1D", "input too small for the kernel")
    return _node(_new(ctx, F32, ne), Op.POOL_1D, a, params=[int(op), k0, s0, p0])


def pool_2d(ctx: Context, a: Tensor, op: OpPool, k0: int, k1: int, s0: int, s1: int, p0: float, p1: float) -> Tensor:
    ne = [calc_pool_output_size(a.ne[0], k0, s0, p0), calc_pool_output_size(a.ne[1], k1, s1, p1), a.ne[2], a.ne[3]]
    _require(ne[0] > 0 and ne[1] > 0, "POOL_2D", "input too small for the kernel")
    return _node(_new(ctx, F32, ne), Op.POOL_2D, a, params=[int(op), k0, k1, s0, s1, int(p0), int(p1)])


def interpolate(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, mode: int) -> Tensor:
    """ggml_interpolate: resample a to [ne0, ne1, ne2, ne3] (mode: ScaleMode | flags)."""
    _require((mode & 0xFF) < len(ScaleMode), "UPSCALE", f"unknown scale mode {mode & 0xFF}")
    return _node(_new(ctx, a.type, [ne0, ne1, ne2, ne3]), Op.UPSCALE, a, params=[int(mode)])


def upscale(ctx: Context, a: Tensor, scale_factor: int, mode: int = ScaleMode.NEAREST) -> Tensor:
    return interpolate(ctx, a, a.ne[0] * scale_factor, a.ne[1] * scale_factor, a.ne[2], a.ne[3], mode)


def upscale_ext(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int,
                mode: int = ScaleMode.NEAREST) -> Tensor:
    return interpolate(ctx, a, ne0, ne1, ne2, ne3, mode)


def pad_ext(ctx: Context, a: Tensor, lp0: int, rp0: int, lp1: int, rp1: int, lp2: int, rp2: int,
            lp3: int, rp3: int, circular: bool = False) -> Tensor:
    pads = [lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3]
    _require(min(pads) >= 0, "PAD", f"negative padding {pads}")
    ne = [a.ne[0] + lp0 + rp0, a.ne[1] + lp1 + rp1, a.ne[2] + lp2 + rp2, a.ne[3] + lp3 + rp3]
    return _node(_new(ctx, a.type, ne), Op.PAD, a, params=[*pads, int(circular)])


def pad(ctx: Context, a: Tensor, p0: int, p1: int, p2: int, p3: int) -> Tensor:
    """Zero-pad each dim on the right."""
    return pad_ext(ctx, a, 0, p0, 0, p1, 0, p2, 0, p3)


def pad_circular(ctx: Context, a: Tensor, lp0: int, rp0: int, lp1: int, rp1: int, lp2: int, rp2: int,
                 lp3: int, rp3: int) -> Tensor:
    return pad_ext(ctx, a, lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3, circular=True)


# ---------------------------------------------------------------------- generators and sorting
def arange(ctx: Context, start: float, stop: float, step: float) -> Tensor:
    _require(stop > start, "ARANGE", f"stop {stop} must be greater than start {start}")
    _require(step > 0, "ARANGE", f"step {step} must be positive")
    steps = math.ceil((stop - start) / step)
    return _node(_new(ctx, F32, [steps]), Op.ARANGE, params=[float(start), float(stop), float(step)])


def timestep_embedding(ctx: Context, timesteps: Tensor, dim: int, max_period: int) -> Tensor:
    """Sinusoidal embedding of each timestep: F32 [dim, n]."""
    return _node(_new(ctx, F32, [dim, timesteps.ne[0]]), Op.TIMESTEP_EMBEDDING, timesteps, params=[dim, max_period])


def argsort(ctx: Context, a: Tensor, order: SortOrder) -> Tensor:
    _require(a.ne[0] <= 2**31 - 1, "ARGSORT", "rows too long")
    return _node(_new(ctx, I32, a.ne), Op.ARGSORT, a, params=[int(order)])


def top_k(ctx: Context, a: Tensor, k: int) -> Tensor:
    """Indices of the k largest elements of each row (I32 [k, ...], in no particular order)."""
    _require(0 < k <= a.ne[0], "TOP_K", f"k={k} must be in 1..{a.ne[0]}")
    return _node(_new(ctx, I32, [k, a.ne[1], a.ne[2], a.ne[3]]), Op.TOP_K, a)


def tri(ctx: Context, a: Tensor, type: TriType) -> Tensor:
    """Keep one triangle of each square matrix, zeroing the rest."""
    _require(a.type == F32, "TRI", "a must be F32", TypeMismatchError)
    _require(a.is_contiguous() and a.ne[0] == a.ne[1], "TRI", f"a must be contiguous and square, got {_ne(a)}")
    return _node(ctx.dup_tensor(a), Op.TRI, a, params=[int(type)])


def _fill(ctx: Context, a: Tensor, c: float, inplace: bool) -> Tensor:
    _require(a.type == F32, "FILL", "a must be F32", TypeMismatchError)
    _require(a.is_contiguous(), "FILL", "a must be contiguous")
    return _node(_dup_or_view(ctx, a, inplace), Op.FILL, a, params=[float(c)])


def fill(ctx: Context, a: Tensor, c: float) -> Tensor:
    return _fill(ctx, a, c, False)


def fill_inplace(ctx: Context, a: Tensor, c: float) -> Tensor:
    return _fill(ctx, a, c, True)


# ---------------------------------------------------------------------- attention
def flash_attn_ext(ctx: Context, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float,
                   max_bias: float, logit_softcap: float) -> Tensor:
    """softmax(scale*q.k [softcap] + mask*slope) . v, F32 [v.ne0, q.ne2, q.ne1, q.ne3] (heads before tokens)."""
    _require(can_mul_mat(k, q), "FLASH_ATTN_EXT", f"k {_ne(k)} does not match q {_ne(q)}")
    _require(q.ne[3] == k.ne[3] == v.ne[3], "FLASH_ATTN_EXT", "q, k and v differ in dim 3")
    if mask is not None:
        _require(mask.is_contiguous(), "FLASH_ATTN_EXT", "mask must be contiguous")
        _require(mask.ne[1] >= q.ne[1] and q.ne[2] % mask.ne[2] == 0 and q.ne[3] % mask.ne[3] == 0,
                 "FLASH_ATTN_EXT", f"mask {_ne(mask)} does not fit q {_ne(q)}")
    if max_bias > 0:
        _require(mask is not None, "FLASH_ATTN_EXT", "max_bias > 0 (ALiBi) needs a mask")
    result = _new(ctx, F32, [v.ne[0], q.ne[2], q.ne[1], q.ne[3]])
    return _node(result, Op.FLASH_ATTN_EXT, q, k, v, mask,
                 params=[float(scale), float(max_bias), float(logit_softcap)])


def flash_attn_ext_set_prec(a: Tensor, prec: int) -> None:
    _require(a.op == Op.FLASH_ATTN_EXT, "flash_attn_ext_set_prec", "not a FLASH_ATTN_EXT node", PyGGMLError)
    a.op_params[3] = prec


def flash_attn_ext_get_prec(a: Tensor) -> int:
    return int(a.op_params[3])


def flash_attn_ext_add_sinks(a: Tensor, sinks: Tensor | None) -> None:
    if sinks is None:
        a.src[4] = None
        return
    _require(a.op == Op.FLASH_ATTN_EXT and a.src[4] is None, "flash_attn_ext_add_sinks",
             "not a FLASH_ATTN_EXT node without sinks", PyGGMLError)
    q = a.src[0]
    assert q is not None
    _require(sinks.ne[0] == q.ne[2] and sinks.type == F32, "flash_attn_ext_add_sinks",
             f"need F32 [{q.ne[2]}] sinks, got {sinks.type.type_name} {_ne(sinks)}")
    a.src[4] = sinks


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


__all__ = [n for n, v in list(globals().items())
           if not n.startswith("_") and getattr(v, "__module__", None) == __name__ and n not in ("CustomFn",)]
__all__ += [*_extra_all, *_recurrent_all, *_train_all]
__all__ += [
    "GGML_N_TASKS_MAX",
    "GGML_PREC_DEFAULT",
    "GGML_PREC_F32",
    "GGML_ROPE_TYPE_IMROPE",
    "GGML_ROPE_TYPE_MROPE",
    "GGML_ROPE_TYPE_NEOX",
    "GGML_ROPE_TYPE_VISION",
    "GGML_SCALE_FLAG_ALIGN_CORNERS",
    "GGML_SCALE_FLAG_ANTIALIAS",
]
