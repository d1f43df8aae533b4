"""The node record a compiled kernel reads: ggml's tensor fields flattened into 64 int64 words.

The plan (plan.py) writes one record per node when it is built; the kernel gets the record's
address and reads the destination's and sources' data addresses, ``ne`` and ``nb`` from it, the
op_params as ggml stores them (16 int32 that may be read as float32), and up to 15 words the
op's selector computed in Python (table addresses, YaRN corrections, ...).
"""

from __future__ import annotations

import numba
import numpy as np

from ..native import f32p, i32p, i64p

NODE_WORDS = 64
#: tensor slots: data, ne[0..3], nb[0..3], type
T_DST = 1
T_SRC0 = 11
T_SRC1 = 21
T_SRC2 = 31
T_WORDS = 10
#: op_params: 16 int32 in 8 words
PARAMS = 41
#: selector-computed words
AUX = 49
AUX_WORDS = NODE_WORDS - AUX


@numba.njit(inline="always", cache=True)
def rec(node):  # pragma: no cover - compiled
    """The record at address ``node`` as int64[NODE_WORDS]."""
    return numba.carray(i64p(node), NODE_WORDS)


@numba.njit(inline="always", cache=True)
def params_i32(node):  # pragma: no cover - compiled
    return numba.carray(i32p(node + 8 * PARAMS), 16)


@numba.njit(inline="always", cache=True)
def params_f32(node):  # pragma: no cover - compiled
    return numba.carray(f32p(node + 8 * PARAMS), 16)


@numba.njit(inline="always", cache=True)
def aux_f32(node):  # pragma: no cover - compiled
    """The AUX words as float32[2 * AUX_WORDS] (selectors store float parameters there)."""
    return numba.carray(f32p(node + 8 * AUX), 2 * AUX_WORDS)


@numba.njit(inline="always", cache=True)
def row_at(r, slot, i1, i2, i3):  # pragma: no cover - compiled
    """The address of row (i1, i2, i3) of the tensor in record ``r``'s ``slot`` (T_DST, T_SRC0, ...)."""
    return r[slot] + i1 * r[slot + 6] + i2 * r[slot + 7] + i3 * r[slot + 8]


@numba.njit(inline="always", cache=True)
def span(n, ith, nth):  # pragma: no cover - compiled
    """Thread ith's contiguous share [i0, i1) of n items (ggml's dr = ceil(n/nth) split)."""
    dr = (n + nth - 1) // nth
    i0 = min(n, dr * ith)
    return i0, min(n, i0 + dr)


@numba.njit(inline="always", cache=True)
def row_index(ir, ne1, ne2):  # pragma: no cover - compiled
    """Row ``ir`` of a tensor with ne[1] = ne1, ne[2] = ne2 as (i1, i2, i3)."""
    i3 = ir // (ne1 * ne2)
    i2 = (ir - i3 * ne1 * ne2) // ne1
    return ir - i3 * ne1 * ne2 - i2 * ne1, i2, i3


#: rows of the weight per work chunk (ggml's chunk_size for a one-column product)
CHUNK_ROWS = 64


@numba.njit(inline="always", cache=True)
def n_chunks(rows, nth, chunk_rows=CHUNK_ROWS):  # pragma: no cover - compiled
    """ggml's rule: chunks of chunk_rows rows, or one per thread when that makes fewer than 4*nth."""
    n = (rows + chunk_rows - 1) // chunk_rows
    return nth if n < 4 * nth else n


@numba.njit(inline="always", cache=True)
def chunk_bounds(n_units, c, n_chunks, align):  # pragma: no cover - compiled
    """Chunk c's units [u0, u1) of n_units split n_chunks ways, its bounds multiples of ``align`` (or the end):
    an even split, rounded down."""
    u0 = n_units * c // n_chunks // align * align
    u1 = n_units if c + 1 == n_chunks else n_units * (c + 1) // n_chunks // align * align
    return u0, u1


def write_tensor(words: np.ndarray, base: int, t: object | None) -> None:
    """Fill a tensor slot of a record (all zero when the source is absent)."""
    if t is None:
        words[base : base + T_WORDS] = 0
        return
    words[base] = t.data
    words[base + 1 : base + 5] = t.ne
    words[base + 5 : base + 9] = t.nb
    words[base + 9] = int(t.type)
