"""The CPU kernel registry: ``Op`` -> kernel, filled by ``@kernel(Op.X)`` in the kernels_* modules.

Kept apart from compute.py so kernel modules can register without importing the executor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ...ops.enums import Op
from ...tensor import Tensor

#: A kernel computes one node: ``fn(node, n_threads)``; it reads node.src and writes node.
Kernel = Callable[[Tensor, int], None]

KERNELS: dict[Op, Kernel] = {}

#: How many leading src slots an op needs filled (ggml's constructors always fill them);
#: checked before any kernel runs so a hand-built node missing an operand gets a clear error.
REQUIRED_SRCS: dict[Op, int] = {
    Op.ARANGE: 0, Op.CUSTOM: 0,
    Op.ADD: 2, Op.SUB: 2, Op.MUL: 2, Op.DIV: 2, Op.ADD1: 2, Op.ACC: 2, Op.SET: 2, Op.CPY: 2,
    Op.MUL_MAT: 2, Op.OUT_PROD: 2, Op.GET_ROWS: 2, Op.GET_ROWS_BACK: 2, Op.CONCAT: 2, Op.COUNT_EQUAL: 2,
    Op.IM2COL: 2, Op.IM2COL_3D: 2, Op.IM2COL_BACK: 2, Op.CONV_3D: 2,
    Op.CONV_2D: 2, Op.CONV_2D_DW: 2, Op.CONV_TRANSPOSE_1D: 2, Op.CONV_TRANSPOSE_2D: 2,
    Op.ROPE: 2, Op.ROPE_BACK: 2, Op.SILU_BACK: 2, Op.RMS_NORM_BACK: 2, Op.SOFT_MAX_BACK: 2,
    Op.CROSS_ENTROPY_LOSS: 2, Op.SSM_CONV: 2, Op.SOLVE_TRI: 2, Op.MAP_CUSTOM2: 2, Op.POOL_2D_BACK: 2,
    Op.SET_ROWS: 3, Op.ADD_REL_POS: 3, Op.MUL_MAT_ID: 3, Op.ADD_ID: 3, Op.FLASH_ATTN_EXT: 3,
    Op.CROSS_ENTROPY_LOSS_BACK: 3, Op.OPT_STEP_SGD: 3, Op.MAP_CUSTOM3: 3,
    Op.DSV4_HC_PRE: 2, Op.DSV4_HC_COMB: 3, Op.DSV4_HC_POST: 3, Op.LIGHTNING_INDEXER: 4,
    Op.GATED_LINEAR_ATTN: 5, Op.OPT_STEP_ADAMW: 5,
    Op.GATED_DELTA_NET: 6, Op.RWKV_WKV6: 6, Op.SSM_SCAN: 7, Op.RWKV_WKV7: 7,
}


def required_srcs(op: Op) -> int:
    """Leading src slots ``op`` needs (1 unless listed in REQUIRED_SRCS)."""
    return REQUIRED_SRCS.get(op, 1)


_Fn = TypeVar("_Fn", bound=Callable[..., object])


def op_registrar(table: dict[Op, _Fn], what: str, ops: tuple[Op, ...]) -> Callable[[_Fn], _Fn]:
    """A decorator that enters ``fn`` in ``table`` under each op of ``ops``; a second entry for an op is a
    RuntimeError naming ``what`` (two kernels for one op would leave which one runs to import order).
    Both op tables of the CPU backend fill this way: KERNELS here and jit/'s SELECTORS."""

    def register(fn: _Fn) -> _Fn:
        for op in ops:
            if op in table:
                raise RuntimeError(f"two {what} registered for {op.name}")
            table[op] = fn
        return fn

    return register


def kernel(*ops: Op) -> Callable[[Kernel], Kernel]:
    """Register ``fn`` as the CPU kernel of each op in ``ops`` (one kernel per op)."""
    return op_registrar(KERNELS, "CPU kernels", ops)
