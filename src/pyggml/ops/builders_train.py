"""Op constructors of training graphs: backward ops (SILU_BACK, RMS_NORM_BACK, SOFT_MAX_BACK,
POOL_2D_BACK), the cross-entropy loss and its gradient, and the optimizer steps.

ggml's backward pass (ggml_build_backward_expand) emits these nodes; pyggml has no autodiff yet,
but it has their CPU kernels, so the constructors are here for graphs built by hand and for the
op table. ROPE_BACK's constructors (rope_ext_back, rope_multi_back) live beside rope in
builders.py because they are rope nodes with another op. Re-exported by ops/builders.py.
"""

from __future__ import annotations

from ..context import Context
from ..errors import TypeMismatchError
from ..tensor import Tensor, TensorFlag, are_same_shape
from ._build import F32, _dup_or_view, _ne, _new, _node, _require
from .enums import Op


def silu_back(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_silu_back: the SiLU gradient, a = upstream gradient dy, b = the forward input x."""
    return _node(ctx.dup_tensor(a), Op.SILU_BACK, a, b)


def rms_norm_back(ctx: Context, a: Tensor, b: Tensor, eps: float) -> Tensor:
    """ggml_rms_norm_back: the RMS_NORM gradient, a = dz, b = x; op_params f32[0] = eps."""
    return _node(ctx.dup_tensor(a), Op.RMS_NORM_BACK, a, b, params=[float(eps)])


def _soft_max_ext_back(ctx: Context, a: Tensor, b: Tensor, scale: float, max_bias: float, inplace: bool) -> Tensor:
    return _node(_dup_or_view(ctx, a, inplace), Op.SOFT_MAX_BACK, a, b, params=[float(scale), float(max_bias)])


def soft_max_ext_back(ctx: Context, a: Tensor, b: Tensor, scale: float, max_bias: float) -> Tensor:
    """ggml_soft_max_ext_back: the softmax gradient, a = dy, b = the softmax output; f32 {scale, max_bias}."""
    return _soft_max_ext_back(ctx, a, b, scale, max_bias, False)


def soft_max_ext_back_inplace(ctx: Context, a: Tensor, b: Tensor, scale: float, max_bias: float) -> Tensor:
    return _soft_max_ext_back(ctx, a, b, scale, max_bias, True)


def pool_2d_back(ctx: Context, a: Tensor, af: Tensor, op: int, k0: int, k1: int, s0: int, s1: int,
                 p0: float, p1: float) -> Tensor:
    """ggml_pool_2d_back: the POOL_2D gradient a spread over an F32 tensor shaped like the forward input af.

    op_params i32 {op, k0, k1, s0, s1, p0, p1}, the paddings truncated to int as ggml's int32 array does.
    """
    return _node(_new(ctx, F32, af.ne), Op.POOL_2D_BACK, a, af, params=[int(op), k0, k1, s0, s1, int(p0), int(p1)])


def cross_entropy_loss(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """ggml_cross_entropy_loss: mean over rows of -sum(b * log_softmax(a)), a 1-element tensor of a's type."""
    _require(are_same_shape(a, b), "CROSS_ENTROPY_LOSS", f"logits {_ne(a)} and labels {_ne(b)} differ in shape")
    return _node(_new(ctx, a.type, [1]), Op.CROSS_ENTROPY_LOSS, a, b)


def cross_entropy_loss_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """ggml_cross_entropy_loss_back: d logits, a = the scalar loss gradient, b = logits, c = labels."""
    op = "CROSS_ENTROPY_LOSS_BACK"
    _require(a.is_scalar(), op, f"the loss gradient must be a scalar, got {_ne(a)}")
    _require(are_same_shape(b, c), op, f"logits {_ne(b)} and labels {_ne(c)} differ in shape")
    return _node(ctx.dup_tensor(b), Op.CROSS_ENTROPY_LOSS_BACK, a, b, c)


def _require_param(op: str, a: Tensor) -> None:
    _require(bool(a.flags & TensorFlag.PARAM), op, f"{a.name or 'a'} must be a parameter (set_param)")


def opt_step_adamw(ctx: Context, a: Tensor, grad: Tensor, m: Tensor, v: Tensor, adamw_params: Tensor) -> Tensor:
    """ggml_opt_step_adamw: one AdamW step on parameter a in place (a view of a; m and v updated too).

    adamw_params F32 [7]: alpha, beta1, beta2, eps, wd, beta1h, beta2h.
    """
    op = "OPT_STEP_ADAMW"
    _require_param(op, a)
    for name, t in (("grad", grad), ("m", m), ("v", v)):
        _require(are_same_shape(a, t), op, f"{name} {_ne(t)} differs in shape from a {_ne(a)}")
    _require(adamw_params.type == F32, op, "adamw_params must be F32", TypeMismatchError)
    _require(adamw_params.nelements() == 7, op, f"adamw_params must hold 7 values, got {adamw_params.nelements()}")
    return _node(ctx.view_tensor(a), Op.OPT_STEP_ADAMW, a, grad, m, v, adamw_params)


def opt_step_sgd(ctx: Context, a: Tensor, grad: Tensor, params: Tensor) -> Tensor:
    """ggml_opt_step_sgd: a = a*(1 - alpha*wd) - alpha*grad in place; params F32 [2] = alpha, wd."""
    op = "OPT_STEP_SGD"
    _require_param(op, a)
    _require(are_same_shape(a, grad), op, f"grad {_ne(grad)} differs in shape from a {_ne(a)}")
    _require(params.type == F32, op, "params must be F32", TypeMismatchError)
    _require(params.nelements() == 2, op, f"params must hold 2 values, got {params.nelements()}")
    return _node(ctx.view_tensor(a), Op.OPT_STEP_SGD, a, grad, params)


__all__ = [n for n, v in list(globals().items())
           if not n.startswith("_") and callable(v) and getattr(v, "__module__", None) == __name__]
