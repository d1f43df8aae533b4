"""Op constructors of training graphs: the cross-entropy loss and its gradient, and the optimizer
steps (OPT_STEP_ADAMW, OPT_STEP_SGD). The backward ops sit with their forward op's family
(SILU_BACK in unary.py, RMS_NORM_BACK and SOFT_MAX_BACK in nn.py, POOL_2D_BACK in conv.py).

CPU kernels: backend/cpu/ops/train.py. The conventions every builder keeps: ops/builders.py.
"""

from __future__ import annotations

__all__ = [
    "cross_entropy_loss",
    "cross_entropy_loss_back",
    "opt_step_adamw",
    "opt_step_sgd",
]

from ..context import Context
from ..errors import TypeMismatchError
from ..tensor import Tensor, TensorFlag, are_same_shape
from ._build import F32, _ne, _new, _node, _require
from .enums import Op


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
