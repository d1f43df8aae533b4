"""The CPU backend's kernel registry and graph executor (ggml_graph_compute for the CPU).

One kernel per ``Op``, registered with ``@kernel(Op.X)`` by the ops/ modules. A kernel is
``fn(node, n_threads) -> None``: it reads ``node.src`` and writes ``node`` through numpy views of
real memory. ggml runs every thread through every node with ``(ith, nth)``; here numpy and BLAS
do the parallel work, so a kernel runs once per node. ``n_threads`` sets the BLAS threads of
mat-mat products (mat-vec products run on one, see blas.py) and the ``nth`` custom ops see.
"""

from __future__ import annotations

from collections.abc import Callable

from ...context import Context
from ...errors import UnsupportedOpError
from ...graph import Graph
from ...ops.enums import EMPTY_OPS
from ...tensor import Tensor
from . import blas, jit, repack_buffer
from ._common import KernelInputError, types_of
from .kernel_table import KERNELS, Kernel, kernel, required_srcs
from .ops import fusion, mat  # importing ops registers every kernel and selector
from .plan import Fuse, GraphPlan, Independent, plan_for


def supports_op(node: Tensor) -> bool:
    """Whether an op has a CPU kernel at all (type support is checked when the kernel runs); an op reading
    a CPU_REPACK tensor only when the repacked kernels compute it (ggml's extra buffer type supports_op)."""
    for s in node.src:
        if s is not None and repack_buffer.in_repack_buffer(s):
            return repack_buffer.supports_op(node)
    return node.op in EMPTY_OPS or node.op in KERNELS


def _resolve(node: Tensor) -> Kernel:
    """The kernel of a non-empty node, after checking it has one and has its operands."""
    fn = KERNELS.get(node.op)
    if fn is None:
        raise UnsupportedOpError(f"CPU backend has no kernel for op {node.op.name} ({types_of(node)})")
    need = required_srcs(node.op)
    missing = [i for i in range(need) if node.src[i] is None]
    if missing:
        raise KernelInputError(f"{node.op.name} node {node.name!r} is missing src{missing[0]} (needs {need} operands)")
    repack_buffer.check_op(node)
    return fn


def _fusions() -> Fuse | None:
    """ops/fusion.py's rules, or None under PYGGML_FUSION=0 (to compare)."""
    return None if jit.fusion_mode() == "0" else fusion.fuse


def _independent() -> Independent | None:
    """ops/fusion.py's kernels that may run without barriers around them, or None under PYGGML_FUSION=0 (a
    barrier after every record, to compare)."""
    return None if jit.fusion_mode() == "0" else fusion.barrier_free


def new_plan(graph: Graph) -> GraphPlan:
    """A fresh plan of ``graph`` with this backend's kernels and fusions (what graph_compute keeps on the graph)."""
    return GraphPlan(graph, _resolve, _fusions(), _independent(), mat.warm_aside)


def compute_forward(node: Tensor, n_threads: int = 1) -> None:
    """Compute one node (ggml_compute_forward). Empty ops (views, leafs) compute nothing."""
    if node.op in EMPTY_OPS:
        return
    _resolve(node)(node, n_threads)


def graph_compute(graph: Graph, n_threads: int = 1, abort_callback: Callable[[], bool] | None = None) -> int:
    """Run every node of ``graph`` in order whose flags have COMPUTE and whose op is not empty.

    The graph's plan (plan.py) resolves every node's kernel before any runs, so an unsupported op
    is reported before the graph has half-computed; a reused graph keeps its plan. As in ggml,
    ``abort_callback`` is asked after each computed node; when it returns True the remaining
    nodes are skipped. Returns ggml's status: GGML_STATUS_SUCCESS (0) or GGML_STATUS_ABORTED (1).
    """
    if n_threads < 1:
        raise KernelInputError(f"n_threads must be >= 1, got {n_threads}")
    plan = plan_for(graph, _resolve, _fusions(), _independent(), mat.warm_aside)
    blas_threads = blas.get_threads()  # MUL_MAT adjusts BLAS threads per product; give them back after
    try:
        return plan.compute(n_threads, abort_callback)
    finally:
        blas.set_threads(blas_threads)


def graph_compute_with_ctx(ctx: Context, graph: Graph, n_threads: int = 1) -> int:
    """ggml_graph_compute_with_ctx: compute a graph whose tensors live in ``ctx``'s own memory.

    ggml takes the work buffer from ctx; the numpy kernels need none, so ctx is only checked.
    """
    if ctx.get_no_alloc():
        raise KernelInputError("graph_compute_with_ctx needs a context that allocates tensor data (no_alloc=False)")
    return graph_compute(graph, n_threads)



__all__ = [
    "KERNELS",
    "compute_forward",
    "graph_compute",
    "graph_compute_with_ctx",
    "kernel",
    "supports_op",
]
