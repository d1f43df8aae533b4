"""Compiled GET_ROWS, SET_ROWS and DUP/CPY/CONT for the float types and the common weight types.

GET_ROWS takes each type's kernel from traits.py (quants/to_float.py's driver); SET_ROWS rounds F32 rows to
F16 as ggml's from_float does (RNE). An index out of range sets the control block's error word; the plan
then lets the numpy kernel raise its error.
"""

from __future__ import annotations

import numba
import numpy as np

from ....ops.enums import Op
from ....tensor import Tensor
from ....types import GGMLType
from ..jit import Choice, jit_kernel, selector
from ..jit.record import AUX, T_DST, T_SRC0, T_SRC1, rec, row_at, row_index, span
from ..native import atomic_store, f32p, i32p, i64p, u16p, u32p
from ..quants.to_float import ERR_INDEX
from ..simd import _F16C, F16_TO_F32, f16_bits, f16_store8
from ..threads import C_ERR
from ..traits import traits
from .elementwise_jit import rows_contiguous

F32, F16, I32, I64 = GGMLType.F32, GGMLType.F16, GGMLType.I32, GGMLType.I64
_opts = {"inline": "always", "cache": True, "error_model": "numpy"}

# row converters: (source row address, destination row, row bytes, fp16 table)


_TAB = int(F16_TO_F32.ctypes.data)


@selector(Op.GET_ROWS)
def _sel_get_rows(node: Tensor) -> Choice | None:
    a, b = node.src[0], node.src[1]
    kern = traits(a.type).get_rows
    if kern is None or node.type != F32 or b.type != I32 or not rows_contiguous(node, a):
        return None
    if node.ne != [a.ne[0], b.ne[0], b.ne[1], b.ne[2]] or b.ne[1] != a.ne[2] or b.ne[2] != a.ne[3]:
        return None
    return Choice(kern, ints=(_TAB, a.row_size()))


# ------------------------------------------------------------------------------------ set_rows
@numba.njit(**_opts)
def _set_rows(node, ith, nth, ctrl, to_f16, idx64):  # pragma: no cover - compiled
    r = rec(node)
    ir0, ir1 = span(r[T_SRC0 + 2] * r[T_SRC0 + 3] * r[T_SRC0 + 4], ith, nth)
    for ir in range(ir0, ir1):
        src, dst = set_rows_at(node, ctrl, ir, idx64)
        if dst == 0:
            return
        put_row(src, dst, r[T_SRC0 + 1], to_f16)


@numba.njit(**_opts)
def set_rows_at(node, ctrl, ir, idx64):  # pragma: no cover - compiled
    """SET_ROWS source row ir (flat over ne01, ne02, ne03): its address and its destination row's, the index
    broadcast over the index planes; (0, 0) after flagging an index out of range in the control block."""
    r = rec(node)
    i01, i02, i03 = row_index(ir, r[T_SRC0 + 2], r[T_SRC0 + 3])
    b, ne11, ne12 = r[T_SRC1], r[T_SRC1 + 2], r[T_SRC1 + 3]
    ip = b + i01 * r[T_SRC1 + 5] + (i02 % ne11) * r[T_SRC1 + 6] + (i03 % ne12) * r[T_SRC1 + 7]
    idx = i64p(ip)[0] if idx64 else np.int64(i32p(ip)[0])
    if idx < 0 or idx >= r[T_DST + 2]:
        atomic_store(ctrl + 8 * C_ERR, ERR_INDEX)
        return 0, 0
    return row_at(r, T_SRC0, i01, i02, i03), row_at(r, T_DST, idx, i02, i03)


@numba.njit(**_opts)
def put_row(src, dst, ne00, to_f16):  # pragma: no cover - compiled
    """One F32 row into a SET_ROWS destination row, rounded to fp16 (RNE, as ggml's from_float) or copied."""
    if to_f16:
        n8 = ne00 - ne00 % 8 if _F16C else 0
        for i in range(0, n8, 8):
            f16_store8(src + 4 * i, dst + 2 * i)
        xb = numba.carray(u32p(src), ne00)
        y16 = numba.carray(u16p(dst), ne00)
        for i in range(n8, ne00):
            y16[i] = f16_bits(xb[i])
    else:
        x = numba.carray(f32p(src), ne00)
        y = numba.carray(f32p(dst), ne00)
        for i in range(ne00):
            y[i] = x[i]


@jit_kernel
def k_set_rows_f16_i64(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _set_rows(node, ith, nth, ctrl, True, True)


@jit_kernel
def k_set_rows_f16_i32(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _set_rows(node, ith, nth, ctrl, True, False)


@jit_kernel
def k_set_rows_f32_i64(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _set_rows(node, ith, nth, ctrl, False, True)


@jit_kernel
def k_set_rows_f32_i32(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _set_rows(node, ith, nth, ctrl, False, False)


_SET_ROWS = {(F16, I64): k_set_rows_f16_i64, (F16, I32): k_set_rows_f16_i32,
             (F32, I64): k_set_rows_f32_i64, (F32, I32): k_set_rows_f32_i32}


@selector(Op.SET_ROWS)
def _sel_set_rows(node: Tensor) -> Choice | None:
    src, idx = node.src[0], node.src[1]
    kern = _SET_ROWS.get((node.type, idx.type))
    if kern is None or src.type != F32 or not rows_contiguous(node, src) or src.ne[0] != node.ne[0]:
        return None
    if idx.ne[0] != src.ne[1] or src.ne[2] % idx.ne[1] or src.ne[3] % idx.ne[2]:
        return None
    if node.ne[2] != src.ne[2] or node.ne[3] != src.ne[3]:
        return None
    return Choice(kern)


# ------------------------------------------------------------------------------- dup/cpy/cont
@numba.njit(**_opts)
def _copy(node, ith, nth, s16, d16):  # pragma: no cover - compiled
    """Elements in src's logical order into a contiguous dst (row i of src -> dst[i*ne00 ...])."""
    r = rec(node)
    tab = numba.carray(f32p(r[AUX]), 65536)
    d = r[T_DST]
    a, ne00, ne01, ne02 = r[T_SRC0], r[T_SRC0 + 1], r[T_SRC0 + 2], r[T_SRC0 + 3]
    na0, na1, na2, na3 = r[T_SRC0 + 5], r[T_SRC0 + 6], r[T_SRC0 + 7], r[T_SRC0 + 8]
    dsz = 2 if d16 else 4
    ir0, ir1 = span(ne01 * ne02 * r[T_SRC0 + 4], ith, nth)
    for ir in range(ir0, ir1):
        i01, i02, i03 = row_index(ir, ne01, ne02)
        sp = a + i01 * na1 + i02 * na2 + i03 * na3
        dp = d + ir * ne00 * dsz
        for i in range(ne00):
            if s16:
                v = tab[u16p(sp + i * na0)[0]]
            else:
                v = f32p(sp + i * na0)[0]
            if d16:
                u16p(dp + 2 * i)[0] = f16_bits(u32p(sp + i * na0)[0]) if not s16 else u16p(sp + i * na0)[0]
            else:
                f32p(dp + 4 * i)[0] = v


@jit_kernel
def k_copy_f32_f32(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _copy(node, ith, nth, False, False)


@jit_kernel
def k_copy_f32_f16(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _copy(node, ith, nth, False, True)


@jit_kernel
def k_copy_f16_f32(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _copy(node, ith, nth, True, False)


@jit_kernel
def k_copy_f16_f16(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _copy(node, ith, nth, True, True)


_COPY = {(F32, F32): k_copy_f32_f32, (F32, F16): k_copy_f32_f16, (F16, F32): k_copy_f16_f32,
         (F16, F16): k_copy_f16_f16}


@selector(Op.DUP, Op.CONT, Op.CPY)
def _sel_copy(node: Tensor) -> Choice | None:
    src = node.src[0]
    kern = _COPY.get((src.type, node.type))
    if kern is None or not node.is_contiguous() or src.nelements() != node.nelements():
        return None
    return Choice(kern, ints=(_TAB,))


__all__ = ["ERR_INDEX"]
