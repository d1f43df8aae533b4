"""Elementwise kernels: binary arithmetic with ggml broadcasting (ADD, SUB, MUL, DIV, ADD1), unary
math (SQR, SQRT, LOG, SIN, COS), SCALE, CLAMP, LEAKY_RELU, FILL.

Values are computed in float32 with one rounding per operation, as ggml-cpu does; F16/BF16
operands are widened first and the result rounded back to the destination type.

Builders: pyggml/ops/elementwise.py (the same family).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ....ops.enums import Op
from ....tensor import Tensor
from .._common import BF16, F32, FLOAT_TYPES, load_f32, require_types, shape4, store, tile_to, unsupported
from ..kernel_table import kernel

_BINARY: dict[Op, Callable[..., np.ndarray]] = {
    Op.ADD: np.add,
    Op.SUB: np.subtract,
    Op.MUL: np.multiply,
    Op.DIV: np.divide,
}


def _check_binary(node: Tensor, a: Tensor, b: Tensor) -> None:
    if a.type.is_quantized:
        # ggml adds into quantized rows (dequantize, add, re-quantize) for ADD only
        if node.op != Op.ADD or node.type != a.type:
            raise unsupported(node)
    else:
        require_types(node, a, FLOAT_TYPES)
        require_types(node, node, FLOAT_TYPES)
    require_types(node, b, FLOAT_TYPES)


@kernel(Op.ADD, Op.SUB, Op.MUL, Op.DIV)
def binary(node: Tensor, n_threads: int) -> None:
    """dst = a op b, with b repeated to a's shape (ggml_can_repeat: each ne of b divides a's)."""
    a, b = node.src[0], node.src[1]
    _check_binary(node, a, b)
    fn = _BINARY[node.op]
    shape = shape4(a)
    y = tile_to(load_f32(b), shape)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if node.type == F32 and a.type == F32:
            fn(a.view4(), y, out=node.view4())
        else:
            store(node, fn(load_f32(a), y))


@kernel(Op.ADD1)
def add1(node: Tensor, n_threads: int) -> None:
    """dst = a + scalar b."""
    a, b = node.src[0], node.src[1]
    _check_binary(node, a, b)
    if b.nelements() != 1:
        raise unsupported(node, "ADD1 needs a scalar src1")
    v = load_f32(b).reshape(-1)[0]
    store(node, load_f32(a) + v)


def _unary_math(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[Tensor, int], None]:
    def run(node: Tensor, n_threads: int) -> None:
        a = node.src[0]
        require_types(node, a, FLOAT_TYPES)
        require_types(node, node, FLOAT_TYPES)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            store(node, fn(load_f32(a)))

    return run


kernel(Op.SQR)(_unary_math(lambda x: x * x))
kernel(Op.SQRT)(_unary_math(np.sqrt))
kernel(Op.LOG)(_unary_math(np.log))
kernel(Op.SIN)(_unary_math(np.sin))
kernel(Op.COS)(_unary_math(np.cos))


@kernel(Op.SCALE)
def scale(node: Tensor, n_threads: int) -> None:
    """dst = a*s (+ b when b != 0); op_params f32 {s, b}. ggml has it for F32 and BF16 (dst the type of a;
    BF16 computes in float32 and rounds once)."""
    a = node.src[0]
    require_types(node, a, (F32, BF16))
    require_types(node, node, (a.type,))
    s = np.float32(node.get_op_params_f32(0))
    b = np.float32(node.get_op_params_f32(1))
    if a.type == BF16:
        store(node, load_f32(a) * s + b)
        return
    x = a.view4()
    if b == 0:
        np.multiply(x, s, out=node.view4())
    else:
        store(node, x * s + b)


@kernel(Op.CLAMP)
def clamp(node: Tensor, n_threads: int) -> None:
    """dst = MAX(MIN(x, max), min); op_params f32 {min, max}."""
    a = node.src[0]
    require_types(node, a, (F32, *FLOAT_TYPES))
    lo = np.float32(node.get_op_params_f32(0))
    hi = np.float32(node.get_op_params_f32(1))
    store(node, np.maximum(np.minimum(load_f32(a), hi), lo))


@kernel(Op.LEAKY_RELU)
def leaky_relu(node: Tensor, n_threads: int) -> None:
    """dst = max(x, 0) + slope*min(x, 0); op_params f32[0] = negative_slope."""
    a = node.src[0]
    require_types(node, a, FLOAT_TYPES)
    ns = np.float32(node.get_op_params_f32(0))
    x = load_f32(a)
    store(node, np.where(x > 0, x, np.float32(0)) + ns * np.where(x < 0, x, np.float32(0)))


@kernel(Op.FILL)
def fill(node: Tensor, n_threads: int) -> None:
    """Every element of dst = c (op_params f32[0]); F32 and F16 as in ggml."""
    require_types(node, node, (F32, *FLOAT_TYPES))
    store(node, np.float32(node.get_op_params_f32(0)))

