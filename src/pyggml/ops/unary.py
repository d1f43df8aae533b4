"""Op constructors of activations: UNARY with its sub-ops (abs, gelu, silu, xielu...), GLU with its
sub-ops (swiglu, geglu, swiglu_oai, swiglu_clamp...), and SILU_BACK, the gradient of silu.

CPU kernels: backend/cpu/ops/unary.py. The conventions every builder keeps: ops/builders.py.
"""

from __future__ import annotations

__all__ = [
    "abs",
    "abs_inplace",
    "ceil",
    "ceil_inplace",
    "elu",
    "elu_inplace",
    "exp",
    "exp_inplace",
    "expm1",
    "expm1_inplace",
    "floor",
    "floor_inplace",
    "geglu",
    "geglu_erf",
    "geglu_erf_split",
    "geglu_erf_swapped",
    "geglu_quick",
    "geglu_quick_split",
    "geglu_quick_swapped",
    "geglu_split",
    "geglu_swapped",
    "gelu",
    "gelu_erf",
    "gelu_erf_inplace",
    "gelu_inplace",
    "gelu_quick",
    "gelu_quick_inplace",
    "glu",
    "glu_split",
    "hardsigmoid",
    "hardsigmoid_inplace",
    "hardswish",
    "hardswish_inplace",
    "neg",
    "neg_inplace",
    "reglu",
    "reglu_split",
    "reglu_swapped",
    "relu",
    "relu_inplace",
    "round",
    "round_inplace",
    "sgn",
    "sgn_inplace",
    "sigmoid",
    "sigmoid_inplace",
    "silu",
    "silu_back",
    "silu_inplace",
    "softplus",
    "softplus_inplace",
    "step",
    "step_inplace",
    "swiglu",
    "swiglu_clamp",
    "swiglu_oai",
    "swiglu_split",
    "swiglu_swapped",
    "tanh",
    "tanh_inplace",
    "trunc",
    "trunc_inplace",
    "unary",
    "unary_inplace",
    "xielu",
]

import math
from collections.abc import Callable

from ..context import Context
from ..errors import TypeMismatchError
from ..tensor import Tensor, are_same_shape
from ._build import Build1, _dup_or_view, _ne, _new, _node, _require, _twins
from .enums import GluOp, Op, UnaryOp


def _unary(ctx: Context, a: Tensor, op: UnaryOp, inplace: bool) -> Tensor:
    _require(a.is_contiguous_1(), "UNARY", "a must have contiguous rows")
    return _node(_dup_or_view(ctx, a, inplace), Op.UNARY, a, params=[int(op)])


def unary(ctx: Context, a: Tensor, op: UnaryOp) -> Tensor:
    return _unary(ctx, a, UnaryOp(op), False)


def unary_inplace(ctx: Context, a: Tensor, op: UnaryOp) -> Tensor:
    return _unary(ctx, a, UnaryOp(op), True)


def _unary_pair(op: UnaryOp) -> tuple[Build1, Build1]:
    return _twins(_unary, op, f": UNARY node with sub-op {op.name}")


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


def silu_back(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_silu_back: the SiLU gradient, a = upstream gradient dy, b = the forward input x."""
    return _node(ctx.dup_tensor(a), Op.SILU_BACK, a, b)
