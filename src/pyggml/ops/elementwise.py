"""Op constructors of element-wise arithmetic: ADD, SUB, MUL, DIV (b broadcast to a), ADD1, SQR,
SQRT, LOG, SIN, COS, SCALE, CLAMP, LEAKY_RELU, FILL.

CPU kernels: backend/cpu/ops/elementwise.py. The conventions every builder keeps: ops/builders.py.
"""

from __future__ import annotations

__all__ = [
    "add",
    "add1",
    "add1_inplace",
    "add_cast",
    "add_inplace",
    "clamp",
    "clamp_inplace",
    "cos",
    "cos_inplace",
    "div",
    "div_inplace",
    "fill",
    "fill_inplace",
    "leaky_relu",
    "log",
    "log_inplace",
    "mul",
    "mul_inplace",
    "scale",
    "scale_bias",
    "scale_bias_inplace",
    "scale_inplace",
    "sin",
    "sin_inplace",
    "sqr",
    "sqr_inplace",
    "sqrt",
    "sqrt_inplace",
    "sub",
    "sub_inplace",
]

from ..context import Context
from ..errors import TypeMismatchError
from ..tensor import Tensor
from ..types import GGMLType
from ._build import BF16, F16, F32, _check_repeat, _dup_or_view, _is_padded_1d, _ne, _new, _node, _require, _twins
from .enums import Op


def _binary(ctx: Context, a: Tensor, op: Op, inplace: bool, b: Tensor) -> Tensor:
    _check_repeat(op.name, b, a)
    return _node(_dup_or_view(ctx, a, inplace), op, a, b)


add, add_inplace = _twins(_binary, Op.ADD, ": a + b, b broadcast (ggml_can_repeat) to a's shape; a's type.")
sub, sub_inplace = _twins(_binary, Op.SUB, ": a - b, b broadcast to a's shape.")
mul, mul_inplace = _twins(_binary, Op.MUL, ": a * b element-wise, b broadcast to a's shape.")
div, div_inplace = _twins(_binary, Op.DIV, ": a / b element-wise, b broadcast to a's shape.")


def add_cast(ctx: Context, a: Tensor, b: Tensor, type: GGMLType) -> Tensor:
    """ggml_add_cast: a + b stored as ``type`` (a quantized, F16 or BF16)."""
    _check_repeat("ADD", b, a)
    _require(a.type.is_quantized or a.type in (F16, BF16), "add_cast", "a must be quantized, F16 or BF16",
             TypeMismatchError)
    return _node(_new(ctx, type, a.ne), Op.ADD, a, b)


def _add1(ctx: Context, a: Tensor, b: Tensor, inplace: bool) -> Tensor:
    _require(b.is_scalar(), "ADD1", f"b must be a scalar, got {_ne(b)}")
    _require(_is_padded_1d(a), "ADD1", "a must be padded 1d (contiguous rows)")
    return _node(_dup_or_view(ctx, a, inplace), Op.ADD1, a, b)


def add1(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _add1(ctx, a, b, False)


def add1_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _add1(ctx, a, b, True)


# ---------------------------------------------------------------------- simple element-wise math
def _math(ctx: Context, a: Tensor, op: Op, inplace: bool) -> Tensor:
    return _node(_dup_or_view(ctx, a, inplace), op, a)


sqr, sqr_inplace = _twins(_math, Op.SQR)
sqrt, sqrt_inplace = _twins(_math, Op.SQRT)
log, log_inplace = _twins(_math, Op.LOG)
sin, sin_inplace = _twins(_math, Op.SIN)
cos, cos_inplace = _twins(_math, Op.COS)


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


def _fill(ctx: Context, a: Tensor, c: float, inplace: bool) -> Tensor:
    _require(a.type == F32, "FILL", "a must be F32", TypeMismatchError)
    _require(a.is_contiguous(), "FILL", "a must be contiguous")
    return _node(_dup_or_view(ctx, a, inplace), Op.FILL, a, params=[float(c)])


def fill(ctx: Context, a: Tensor, c: float) -> Tensor:
    return _fill(ctx, a, c, False)


def fill_inplace(ctx: Context, a: Tensor, c: float) -> Tensor:
    return _fill(ctx, a, c, True)
