"""User callbacks: MAP_CUSTOM1/2/3 and CUSTOM.

ggml keeps ``{fun, n_tasks, userdata}`` in op_params as raw pointers; pyggml's builders keep the
Python objects in ``node.extra`` as the tuple ``(fun, n_tasks, userdata)``. ggml calls the function
once per thread with ``(ith, nth)``, where nth is n_threads when n_tasks is GGML_N_TASKS_MAX (-1)
and min(n_tasks, n_threads) otherwise; the calls here run one after another, in ith order.

Builders: pyggml/ops/custom.py (the same family).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ....ops.enums import Op
from ....tensor import Tensor
from .._common import KernelInputError
from ..kernel_table import kernel

GGML_N_TASKS_MAX = -1


def _unpack(node: Tensor) -> tuple[Callable[..., Any], int, Any]:
    extra = node.extra
    if not (isinstance(extra, tuple) and len(extra) == 3 and callable(extra[0])):
        raise KernelInputError(f"{node.op.name} node {node.name!r} carries no (fun, n_tasks, userdata) in extra")
    fun, n_tasks, userdata = extra
    return fun, int(n_tasks), userdata


def _n_tasks(n_tasks: int, n_threads: int) -> int:
    if n_tasks == GGML_N_TASKS_MAX or n_tasks <= 0:
        return n_threads
    return min(n_tasks, n_threads)


@kernel(Op.MAP_CUSTOM1, Op.MAP_CUSTOM2, Op.MAP_CUSTOM3)
def map_custom(node: Tensor, n_threads: int) -> None:
    """fun(dst, a[, b[, c]], ith, nth, userdata) for ith in range(nth)."""
    fun, n_tasks, userdata = _unpack(node)
    n_src = {Op.MAP_CUSTOM1: 1, Op.MAP_CUSTOM2: 2, Op.MAP_CUSTOM3: 3}[node.op]
    args = node.src[:n_src]
    nth = _n_tasks(n_tasks, n_threads)
    for ith in range(nth):
        fun(node, *args, ith, nth, userdata)


@kernel(Op.CUSTOM)
def custom(node: Tensor, n_threads: int) -> None:
    """fun(dst, ith, nth, userdata) for ith in range(nth); the arguments are dst.src."""
    fun, n_tasks, userdata = _unpack(node)
    nth = _n_tasks(n_tasks, n_threads)
    for ith in range(nth):
        fun(node, ith, nth, userdata)

