"""Compiled row reductions and the small ops of the mixture-of-experts router: SUM_ROWS, CLAMP, ARGSORT, and
ADD_ID (the chosen experts' biases).

Each is a handful of values per token, but in a numpy kernel each would end the compiled run it sits in
(a Python step between runs, three per MoE layer); compiled, the router stays inside the plan's run. The
numerics are the numpy kernels' (ops/reduce.py, ops/elementwise.py): SUM_ROWS in double, summed in
order as ggml's ggml_vec_sum_f32 does, then rounded; ARGSORT stable (ties: lower index first).
"""

from __future__ import annotations

import numba
import numpy as np

from ....ops.enums import Op
from ....tensor import Tensor
from ....types import GGMLType
from ..jit import Choice, jit_kernel, selector
from ..jit.record import T_DST, T_SRC0, T_SRC1, T_SRC2, params_f32, params_i32, rec, row_index, span
from ..native import f32p, i32p
from .elementwise_jit import all_f32, rows_contiguous

_opts = {"inline": "always", "cache": True, "error_model": "numpy"}


@numba.njit(**_opts)
def _rows(node, ith, nth):  # pragma: no cover - compiled
    """This thread's rows of the source: (record, first row, end row, ne1, ne2)."""
    r = rec(node)
    ne1, ne2 = r[T_SRC0 + 2], r[T_SRC0 + 3]
    ir0, ir1 = span(ne1 * ne2 * r[T_SRC0 + 4], ith, nth)
    return r, ir0, ir1, ne1, ne2


@numba.njit(**_opts)
def _at(r, slot, ir, ne1, ne2):  # pragma: no cover - compiled
    i1, i2, i3 = row_index(ir, ne1, ne2)
    return r[slot] + i1 * r[slot + 6] + i2 * r[slot + 7] + i3 * r[slot + 8]


@jit_kernel
def k_sum_rows(node, ith, nth, ctrl):  # pragma: no cover - compiled
    r, ir0, ir1, ne1, ne2 = _rows(node, ith, nth)
    ne0 = r[T_SRC0 + 1]
    for ir in range(ir0, ir1):
        x = numba.carray(f32p(_at(r, T_SRC0, ir, ne1, ne2)), ne0)
        s = 0.0
        for i in range(ne0):
            s += np.float64(x[i])
        numba.carray(f32p(_at(r, T_DST, ir, ne1, ne2)), 1)[0] = np.float32(s)


@jit_kernel
def k_clamp(node, ith, nth, ctrl):  # pragma: no cover - compiled
    r, ir0, ir1, ne1, ne2 = _rows(node, ith, nth)
    lo, hi = params_f32(node)[0], params_f32(node)[1]
    ne0 = r[T_SRC0 + 1]
    for ir in range(ir0, ir1):
        x = numba.carray(f32p(_at(r, T_SRC0, ir, ne1, ne2)), ne0)
        y = numba.carray(f32p(_at(r, T_DST, ir, ne1, ne2)), ne0)
        for i in range(ne0):
            y[i] = max(min(x[i], hi), lo)


@jit_kernel
def k_argsort(node, ith, nth, ctrl):  # pragma: no cover - compiled
    r, ir0, ir1, ne1, ne2 = _rows(node, ith, nth)
    desc = params_i32(node)[0] == 1
    ne0 = r[T_SRC0 + 1]
    for ir in range(ir0, ir1):
        x = numba.carray(f32p(_at(r, T_SRC0, ir, ne1, ne2)), ne0)
        idx = np.argsort(-x if desc else x, kind="mergesort")
        y = numba.carray(i32p(_at(r, T_DST, ir, ne1, ne2)), ne0)
        for i in range(ne0):
            y[i] = idx[i]


def _rowwise(node: Tensor, dst_ne0: int) -> bool:
    a = node.src[0]
    return (a is not None and a.type == GGMLType.F32 and rows_contiguous(node, a) and node.ne[0] == dst_ne0
            and list(node.ne[1:]) == list(a.ne[1:]))


@selector(Op.SUM_ROWS)
def _sel_sum_rows(node: Tensor) -> Choice | None:
    return Choice(k_sum_rows) if all_f32(node) and _rowwise(node, 1) else None


@selector(Op.CLAMP)
def _sel_clamp(node: Tensor) -> Choice | None:
    return Choice(k_clamp) if all_f32(node) and _rowwise(node, node.src[0].ne[0]) else None


@selector(Op.ARGSORT)
def _sel_argsort(node: Tensor) -> Choice | None:
    if node.type != GGMLType.I32 or node.get_op_params_i32(0) not in (0, 1):
        return None  # a bad order goes to the numpy kernel, which names it
    return Choice(k_argsort) if _rowwise(node, node.src[0].ne[0]) else None


@jit_kernel
def k_add_id(node, ith, nth, ctrl):  # pragma: no cover - compiled
    """dst[:, i1, i2] = a[:, i1, i2] + b[:, ids[i1, i2]]: the chosen experts' biases (gpt-oss)."""
    r = rec(node)
    ne0, ne1, ne2 = r[T_DST + 1], r[T_DST + 2], r[T_DST + 3]
    ir0, ir1 = span(ne1 * ne2, ith, nth)
    for ir in range(ir0, ir1):
        i1, i2 = ir % ne1, ir // ne1
        e = numba.carray(i32p(r[T_SRC2] + i1 * r[T_SRC2 + 5] + i2 * r[T_SRC2 + 6]), 1)[0]
        a = numba.carray(f32p(r[T_SRC0] + i1 * r[T_SRC0 + 6] + i2 * r[T_SRC0 + 7]), ne0)
        b = numba.carray(f32p(r[T_SRC1] + e * r[T_SRC1 + 6]), ne0)
        y = numba.carray(f32p(r[T_DST] + i1 * r[T_DST + 6] + i2 * r[T_DST + 7]), ne0)
        for i in range(ne0):
            y[i] = a[i] + b[i]


@selector(Op.ADD_ID)
def _sel_add_id(node: Tensor) -> Choice | None:
    a, b, ids = node.src[0], node.src[1], node.src[2]
    if not all_f32(node, a, b) or ids.type != GGMLType.I32 or not rows_contiguous(node, a, b, ids):
        return None
    if node.ne[3] != 1 or a.ne != node.ne or b.ne[0] != a.ne[0] or list(ids.ne[:2]) != list(a.ne[1:3]):
        return None
    return Choice(k_add_id)
