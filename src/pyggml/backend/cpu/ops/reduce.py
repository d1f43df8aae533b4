"""Reductions and orderings along rows: SUM, SUM_ROWS, MEAN, CUMSUM, ARGMAX, COUNT_EQUAL, ARGSORT, TOP_K.

Sums follow ggml_vec_sum_f32, which accumulates in double (``ggml_float``) and narrows once.

Builders: pyggml/ops/reduce.py (the same family).
"""

from __future__ import annotations

import numpy as np

from ....ops.enums import Op
from ....tensor import Tensor
from .._common import FLOAT_TYPES, I32, KernelInputError, load_f32, require_f32, require_types, store
from ..kernel_table import kernel

GGML_SORT_ORDER_ASC = 0
GGML_SORT_ORDER_DESC = 1


@kernel(Op.SUM)
def sum_all(node: Tensor, n_threads: int) -> None:
    """Sum of every element into a 1-element tensor of the source type (double accumulation)."""
    a = node.src[0]
    require_types(node, a, FLOAT_TYPES)
    total = load_f32(a).sum(dtype=np.float64)
    store(node, np.float32(total))


@kernel(Op.SUM_ROWS)
def sum_rows(node: Tensor, n_threads: int) -> None:
    """dst[i1,i2,i3] = sum over i0 (F32 only, as ggml)."""
    a = node.src[0]
    require_f32(node, a)
    store(node, a.view4().sum(axis=-1, dtype=np.float64, keepdims=True).astype(np.float32))


@kernel(Op.MEAN)
def mean(node: Tensor, n_threads: int) -> None:
    """Row sums (double, narrowed to float) divided by ne0 in float."""
    a = node.src[0]
    require_f32(node, a)
    s = a.view4().sum(axis=-1, dtype=np.float64, keepdims=True).astype(np.float32)
    store(node, s / np.float32(a.ne[0]))


@kernel(Op.CUMSUM)
def cumsum(node: Tensor, n_threads: int) -> None:
    """Running float32 sum along each row."""
    a = node.src[0]
    require_f32(node, a)
    store(node, np.cumsum(a.view4(), axis=-1, dtype=np.float32))


@kernel(Op.ARGMAX)
def argmax(node: Tensor, n_threads: int) -> None:
    """Index of the row maximum; among equal maxima ggml returns the LAST one."""
    a = node.src[0]
    require_f32(node, a)
    x = a.view4()[0, 0]  # ggml_argmax takes a matrix
    n = x.shape[-1]
    idx = (n - 1) - np.argmax(x[:, ::-1], axis=-1)
    node.view4()[0, 0, 0, :] = idx.astype(np.int32)


@kernel(Op.COUNT_EQUAL)
def count_equal(node: Tensor, n_threads: int) -> None:
    """Number of positions where two I32 tensors agree, as one I64."""
    a, b = node.src[0], node.src[1]
    require_types(node, a, (I32,))
    require_types(node, b, (I32,))
    if a.ne != b.ne:
        raise KernelInputError(f"COUNT_EQUAL operands differ in shape: {a.ne} vs {b.ne}")
    node.view4()[...] = np.count_nonzero(a.view4() == b.view4())


def _order_desc(x: np.ndarray) -> np.ndarray:
    """Row-wise indices that sort x descending (ties: lower index first; ggml leaves ties unspecified)."""
    return np.argsort(-x, axis=-1, kind="stable")


@kernel(Op.ARGSORT)
def argsort(node: Tensor, n_threads: int) -> None:
    """I32 indices that sort each row; op_params i32[0] = order (0 ASC, 1 DESC)."""
    a = node.src[0]
    require_f32(node, a)
    order = node.get_op_params_i32(0)
    x = a.view4()
    if order == GGML_SORT_ORDER_ASC:
        idx = np.argsort(x, axis=-1, kind="stable")
    elif order == GGML_SORT_ORDER_DESC:
        idx = _order_desc(x)
    else:
        raise KernelInputError(f"ARGSORT: invalid sort order {order}")
    node.view4()[...] = idx.astype(np.int32)


@kernel(Op.TOP_K)
def top_k(node: Tensor, n_threads: int) -> None:
    """The indices of the k = dst.ne0 largest values of each row.

    ggml promises no order; its CPU kernel sorts descending and then swaps the first two
    entries "to emphasize that the order is not important". We do exactly that.
    """
    a = node.src[0]
    require_f32(node, a)
    k = node.ne[0]
    idx = _order_desc(a.view4())[..., :k].astype(np.int32)
    if k > 1:
        idx[..., [0, 1]] = idx[..., [1, 0]]
    node.view4()[...] = idx

