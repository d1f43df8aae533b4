"""The compiled GET_ROWS driver and its row converters (ggml's to_float per type): only the gathered rows
are converted, with the reference dequantizers the numpy path's BLAS tiles use (dots.py's _dq_*). An index
out of range sets the control block's error word; the plan then lets the numpy kernel raise its error.
traits.py makes each type's kernel of them."""

from __future__ import annotations

import numba
import numpy as np

from ....quants.jitcache import variant
from ..jit.record import AUX, T_DST, T_SRC0, T_SRC1, rec, row_index, span
from ..native import atomic_store, f32p, i8p, i32p, u8p, u16p
from ..threads import C_ERR

_opts = {"inline": "always", "cache": True, "error_model": "numpy"}


#: error codes a kernel leaves in the control block
ERR_INDEX = 1


@numba.njit(**_opts)
def _row_f32(src, y, rb, tab):  # pragma: no cover - compiled
    x = numba.carray(f32p(src), y.size)
    for i in range(y.size):
        y[i] = x[i]


@numba.njit(**_opts)
def _row_f16(src, y, rb, tab):  # pragma: no cover - compiled
    h = numba.carray(u16p(src), y.size)
    for i in range(y.size):
        y[i] = tab[h[i]]


def _dequantizing(dq):
    """A row converter running the dequantizer ``dq`` (quants/dots.py's _dq_*) on one row."""

    @numba.njit(**_opts)
    @variant(dq.__name__)
    def row(src, y, rb, tab):  # pragma: no cover - compiled
        dq(numba.carray(u8p(src), rb), numba.carray(i8p(src), rb), 0, 0, 1, tab, y.reshape((1, y.size)))

    return row


@numba.njit(**_opts)
def _get_rows(node, ith, nth, ctrl, convert):  # pragma: no cover - compiled
    r = rec(node)
    tab = numba.carray(f32p(r[AUX]), 65536)
    d, ne0 = r[T_DST], r[T_DST + 1]
    nb1, nb2, nb3 = r[T_DST + 6], r[T_DST + 7], r[T_DST + 8]
    a, ne01 = r[T_SRC0], r[T_SRC0 + 2]
    na1, na2, na3 = r[T_SRC0 + 6], r[T_SRC0 + 7], r[T_SRC0 + 8]
    b, ne10, ne11 = r[T_SRC1], r[T_SRC1 + 1], r[T_SRC1 + 2]
    nb10, nb11, nb12 = r[T_SRC1 + 5], r[T_SRC1 + 6], r[T_SRC1 + 7]
    row_bytes = r[AUX + 1]
    ir0, ir1 = span(ne10 * ne11 * r[T_SRC1 + 3], ith, nth)
    for ir in range(ir0, ir1):
        i10, i11, i12 = row_index(ir, ne10, ne11)
        idx = np.int64(i32p(b + i10 * nb10 + i11 * nb11 + i12 * nb12)[0])
        if idx < 0 or idx >= ne01:
            atomic_store(ctrl + 8 * C_ERR, ERR_INDEX)
            return
        convert(a + idx * na1 + i11 * na2 + i12 * na3,
                numba.carray(f32p(d + i10 * nb1 + i11 * nb2 + i12 * nb3), ne0), row_bytes, tab)
