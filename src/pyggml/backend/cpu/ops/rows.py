"""Row kernels: GET_ROWS (and GET_ROWS_BACK), SET_ROWS, and DUP/CPY/CONT.

GET_ROWS converts only the gathered rows (a quantized table is dequantized row by row);
SET_ROWS writes each row through the destination type's from_float, as ggml fills a quantized
KV cache; DUP/CPY/CONT copy in logical order, converting type.

Builders: pyggml/ops/rows.py (the same family).
"""

from __future__ import annotations

import numpy as np

from .... import quants
from ....ops.enums import Op
from ....tensor import Tensor
from .._common import (
    F16,
    F32,
    FLOAT_TYPES,
    I32,
    I64,
    INT_TYPES,
    KernelInputError,
    load_f32,
    require_types,
    shape4,
    store,
    to_type,
    unsupported,
)
from ..kernel_table import kernel
from .mat import _check_rows_index, _weight_rows_f32


@kernel(Op.GET_ROWS)
def get_rows(node: Tensor, n_threads: int) -> None:
    """dst[:, i10, i11, i12] = to_float(src0[:, idx[i10, i11, i12], i11, i12]); only gathered rows convert."""
    a, b = node.src[0], node.src[1]
    if not (a.type in FLOAT_TYPES or a.type == I32 or a.type.is_quantized):
        raise unsupported(node)
    require_types(node, b, (I32,))
    idx = b.view4()[0]  # (ne12, ne11, ne10)
    ne03, ne02, ne01, _ = shape4(a)
    if idx.shape[0] != ne03 or idx.shape[1] != ne02:
        raise KernelInputError(f"GET_ROWS: index planes {idx.shape[:2]} do not match table planes {(ne03, ne02)}")
    _check_rows_index(idx, ne01, "GET_ROWS")
    i3 = np.arange(ne03)[:, None, None]
    i2 = np.arange(ne02)[None, :, None]
    rows = a.view4()[i3, i2, idx]  # (ne12, ne11, ne10, row)
    if a.type == I32:
        if node.type != I32:
            raise unsupported(node)
        node.view4()[...] = rows
        return
    if a.type.is_quantized:
        flat = quants.dequantize(np.ascontiguousarray(rows).reshape(-1, rows.shape[-1]), a.type)
        vals = flat.reshape(*rows.shape[:-1], a.ne[0])
    else:
        vals = _weight_rows_f32(rows, a.type)
    store(node, vals)


@kernel(Op.SET_ROWS)
def set_rows(node: Tensor, n_threads: int) -> None:
    """dst[idx[i, i02 % ne11, i03 % ne12]] = from_float(src[i]) for every row i of src (src0 F32/F16, idx I32/I64).

    node is a view of src[2] (the destination); each row goes through the destination type's CPU
    from_float, so quantized KV caches are filled the way ggml fills them.
    """
    src, idx_t = node.src[0], node.src[1]
    require_types(node, src, (F32, F16))
    require_types(node, idx_t, (I32, I64))
    if not (node.type in FLOAT_TYPES or node.type.is_quantized):
        raise unsupported(node)
    if src.is_empty():  # no rows to set (e.g. a zero-row view of the source): dst keeps its data
        return
    ne03, ne02, ne01, _ = shape4(src)
    idx = idx_t.view4()[0]  # (ne12, ne11, ne10)
    if idx.shape[2] != ne01 or ne02 % idx.shape[1] or ne03 % idx.shape[0]:
        raise KernelInputError(f"SET_ROWS: indices {idx_t.ne} do not fit source rows {src.ne}")
    full = np.tile(idx, (ne03 // idx.shape[0], ne02 // idx.shape[1], 1)).astype(np.int64)
    _check_rows_index(full, node.ne[1], "SET_ROWS")
    out = node.view4()
    if src.type == F16 and node.type == F16:
        vals = src.view4()
    else:
        vals = to_type(load_f32(src), node.type)
    i3 = np.arange(ne03)[:, None, None]
    i2 = np.arange(ne02)[None, :, None]
    out[i3, i2, full] = vals


def _copy(node: Tensor, src: Tensor) -> None:
    """ggml_compute_forward_dup: elements are copied in logical (row-major ne) order, converting type."""
    if src.nelements() != node.nelements():
        raise KernelInputError(f"{node.op.name}: {src.nelements()} elements into {node.nelements()}")
    dshape = shape4(node)
    sty, dty = src.type, node.type
    if sty == dty:
        # same type: a byte/bit copy in logical order (quantized: whole blocks)
        if sty.is_quantized and src.ne[0] != node.ne[0] and (src.ne[0] % sty.blck_size or node.ne[0] % sty.blck_size):
            raise unsupported(node, "quantized copy must keep whole blocks")
        raw = np.ascontiguousarray(src.view4()).reshape(-1)
        node.view4()[...] = raw.reshape(node.view4().shape)
        return
    known = FLOAT_TYPES | INT_TYPES
    if sty not in known and not sty.is_quantized:
        raise unsupported(node)
    if dty not in known and not dty.is_quantized:
        raise unsupported(node)
    if sty in INT_TYPES and dty in INT_TYPES:
        node.view4()[...] = np.ascontiguousarray(src.view4()).reshape(dshape)
        return
    vals = np.ascontiguousarray(load_f32(src)).reshape(dshape)
    if dty.is_quantized and node.ne[0] % dty.blck_size:
        raise unsupported(node, f"row of {node.ne[0]} is not whole {dty.type_name} blocks")
    store(node, vals)


@kernel(Op.DUP, Op.CONT)
def dup(node: Tensor, n_threads: int) -> None:
    """Copy src0 into dst (new layout or new shape, same or other type)."""
    _copy(node, node.src[0])


@kernel(Op.CPY)
def cpy(node: Tensor, n_threads: int) -> None:
    """Copy/convert src0 into src1; the node is a view of src1 (or src1 is the node itself: ggml_cast)."""
    _copy(node, node.src[0])


@kernel(Op.GET_ROWS_BACK)
def get_rows_back(node: Tensor, n_threads: int) -> None:
    """Scatter-add: dst = 0; dst[ids[i]] += src0[i] (src0 F32/F16 rows, src1 I32 ids)."""
    g, ids_t = node.src[0], node.src[1]
    require_types(node, g, (F32, F16))
    require_types(node, ids_t, (I32,))
    ids = ids_t.view4().reshape(-1).astype(np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= node.ne[1]):
        raise KernelInputError(f"GET_ROWS_BACK: row index out of range [0, {node.ne[1]})")
    rows = load_f32(g)[0, 0]
    out = np.zeros((node.ne[1], node.ne[0]), dtype=np.float32)
    np.add.at(out, ids, rows[: ids.size])
    node.view4()[0, 0] = out

