"""Activation kernels: UNARY (every UnaryOp), GLU (every GluOp) and SILU_BACK.

Values are computed in float32 with one rounding per operation, as ggml-cpu does; F16/BF16
operands are widened first and the result rounded back to the destination type.

Builders: pyggml/ops/unary.py (the same family).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ....ops.enums import GluOp, Op, UnaryOp
from ....tensor import Tensor
from .._common import F16, F32, FLOAT_TYPES, load_f32, require_f32, require_types, shape4, store, unsupported
from ..kernel_table import kernel
from . import activations as act


@kernel(Op.UNARY)
def unary(node: Tensor, n_threads: int) -> None:
    """The UNARY family; op_params i32[0] selects the sub-op (XIELU reads f32[1..4])."""
    a = node.src[0]
    require_types(node, a, FLOAT_TYPES)
    require_types(node, node, FLOAT_TYPES)
    try:
        sub = UnaryOp(node.get_op_params_i32(0))
    except ValueError:
        raise unsupported(node, f"unknown unary op {node.get_op_params_i32(0)}") from None
    x = load_f32(a)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if sub == UnaryOp.XIELU:
            p = [node.get_op_params_f32(i) for i in range(1, 5)]
            y = act.xielu(x, *p)
        else:
            y = act.UNARY_FUNCS[sub](x)
    store(node, y)


def _swiglu_oai(x: np.ndarray, g: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """gpt-oss SwiGLU: x clamped above by limit, g clamped to ±limit, x*sigmoid(alpha x)*(g+1)."""
    al, lim = np.float32(alpha), np.float32(limit)
    x = np.minimum(x, lim)
    g = np.clip(g, -lim, lim)
    with np.errstate(over="ignore"):
        out = x / (np.float32(1.0) + np.exp(al * -x))
    return out * (g + np.float32(1.0))


def _swiglu_clamp(x: np.ndarray, g: np.ndarray, limit: float) -> np.ndarray:
    """ggml_swiglu_clamp: silu(min(x, limit)) * clamp(g, -limit, limit)."""
    lim = np.float32(limit)
    x = np.minimum(x, lim)
    with np.errstate(over="ignore"):
        out = x / (np.float32(1.0) + np.exp(-x))
    return out * np.clip(g, -lim, lim)


_GLU: dict[GluOp, Callable[[np.ndarray], np.ndarray]] = {
    GluOp.REGLU: act.relu,
    GluOp.GEGLU: act.gelu,
    GluOp.SWIGLU: act.silu,
    GluOp.GEGLU_ERF: act.gelu_erf,
    GluOp.GEGLU_QUICK: act.gelu_quick,
}


@kernel(Op.GLU)
def glu(node: Tensor, n_threads: int) -> None:
    """act(x) * g. One operand: rows split in halves, gate in the second half unless ``swapped``;
    two operands (``*_split``): x = src0, g = src1."""
    a, b = node.src[0], node.src[1]
    require_types(node, a, FLOAT_TYPES)
    require_types(node, b, (a.type,))
    raw = node.get_op_params_i32(0)
    try:
        sub = GluOp(raw)
    except ValueError:
        raise unsupported(node, f"unknown glu op {raw}") from None
    xa = load_f32(a)
    if b is None:
        nc = a.ne[0] // 2
        swapped = node.get_op_params_i32(1) != 0
        x, g = (xa[..., nc : 2 * nc], xa[..., :nc]) if swapped else (xa[..., :nc], xa[..., nc : 2 * nc])
    else:
        x, g = xa, load_f32(b)
    if x.shape != shape4(node):
        raise unsupported(node, f"GLU result shape {shape4(node)} does not match its operands")
    if sub == GluOp.SWIGLU_OAI:
        y = _swiglu_oai(x, g, node.get_op_params_f32(2), node.get_op_params_f32(3))
    elif sub == GluOp.SWIGLU_CLAMP:
        require_types(node, a, (F32, F16))
        y = _swiglu_clamp(x, g, node.get_op_params_f32(3))
    else:
        y = _GLU[sub](x) * g
    store(node, y)


@kernel(Op.SILU_BACK)
def silu_back(node: Tensor, n_threads: int) -> None:
    """dx = dy * s * (1 + x (1 - s)), s = sigmoid(x); src0 = dy, src1 = x."""
    dy, x = node.src[0], node.src[1]
    require_f32(node, dy, x)
    xv = x.view4()
    with np.errstate(over="ignore"):
        s = np.float32(1.0) / (np.float32(1.0) + np.exp(-xv))
    node.view4()[...] = dy.view4() * (s * (np.float32(1.0) + xv * (np.float32(1.0) - s)))

