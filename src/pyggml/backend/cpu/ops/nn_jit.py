"""Compiled RMS_NORM, NORM, L2_NORM, GROUP_NORM, SOFT_MAX and ROPE (F32), with the numerics of ops/nn.py
(NORM and GROUP_NORM in ggml-cpu's exact summation order, which ops/nn.py only approaches).

RMS_NORM sums the float32 squares in double and narrows the mean once; SOFT_MAX takes ggml's
vector expf (mathf.py), sums the exponentials in double (prompt rows as ggml-cpu on AVX2 does:
vectors of 8 summed in float first) and multiplies by the float32 reciprocal; ROPE builds its angles by the
cumulative float32 product theta_{i+1} = theta_i * theta_scale, per position row, as ggml does.
Parameters ggml derives in float32 (theta_scale, YaRN corrections, ALiBi slopes) are computed by
the selectors with the same numpy code the Python kernels use, so both paths get the same values.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from ....ops.enums import Op
from ....quants.jitcache import variant
from ....tensor import Tensor
from ....types import GGMLType
from ..jit import Choice, JitKernel, background, compile_in_background, jit_kernel, ready_or_wanted, selector
from ..jit.mathf import LANES, libm_expf, v_expf
from ..jit.record import (
    AUX,
    T_DST,
    T_SRC0,
    T_SRC1,
    T_SRC2,
    aux_f32,
    params_f32,
    params_i32,
    rec,
    row_at,
    row_index,
    span,
)
from ..native import f32p, fmaf, i32p, u16p
from ..threads import C_ERR
from . import rows_jit as rows
from .elementwise_jit import all_f32, k_add, k_mul, rows_contiguous
from .mat_f_jit import DOUBLE_MAX_COLS
from .nn import GGML_ROPE_TYPE_NEOX, alibi_slopes, rope_yarn_corr_dims
from .rows_jit import put_row, set_rows_at

F32, F16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.I32
_opts = {"inline": "always", "cache": True, "error_model": "numpy"}
#: float32 index of the first selector float in the AUX words (record.AUX + 8 words in)
_F0 = 16


@numba.njit(**_opts)
def _rms_finish(s, ne0, eps):  # pragma: no cover - compiled
    """1 / sqrt(mean + eps) from a row's double sum of squares, the mean narrowed to float32 once."""
    mean = np.float32(s / ne0)
    return np.float32(1.0) / np.float32(math.sqrt(mean + eps))


@numba.njit(**_opts)
def _rms_scale(x, ne0, eps):  # pragma: no cover - compiled
    """1 / sqrt(mean(x^2) + eps) of a row: the float32 squares summed in double, in order."""
    s = 0.0
    for i in range(ne0):
        v = x[i]
        s += np.float64(v * v)
    return _rms_finish(s, ne0, eps)


@jit_kernel
def k_rms_norm(node, ith, nth, ctrl):  # pragma: no cover - compiled
    r = rec(node)
    eps = params_f32(node)[0]
    d, ne0, ne1, ne2 = r[T_DST], r[T_DST + 1], r[T_DST + 2], r[T_DST + 3]
    nb1, nb2, nb3 = r[T_DST + 6], r[T_DST + 7], r[T_DST + 8]
    a, na1, na2, na3 = r[T_SRC0], r[T_SRC0 + 6], r[T_SRC0 + 7], r[T_SRC0 + 8]
    ir0, ir1 = span(ne1 * ne2 * r[T_DST + 4], ith, nth)
    for ir in range(ir0, ir1):
        i1, i2, i3 = row_index(ir, ne1, ne2)
        x = numba.carray(f32p(a + i1 * na1 + i2 * na2 + i3 * na3), ne0)
        y = numba.carray(f32p(d + i1 * nb1 + i2 * nb2 + i3 * nb3), ne0)
        scale = _rms_scale(x, ne0, eps)
        for i in range(ne0):
            y[i] = x[i] * scale


@selector(Op.RMS_NORM)
def _sel_rms_norm(node: Tensor) -> Choice | None:
    a = node.src[0]
    if not all_f32(node, a) or a.ne != node.ne or not rows_contiguous(node, a):
        return None
    return Choice(k_rms_norm)


@jit_kernel
def k_rms_norm_mul(node, ith, nth, ctrl):  # pragma: no cover - compiled
    """[A residual ADD ->] RMS_NORM -> MUL by a broadcast weight, in one pass per row; every node's output is
    written with the bits of its own kernel (the sum rounded to float32 and its squares summed in double, in
    order, as _rms_scale does; the normalized value rounded, then the product). The record is the MUL's, its
    parts the ADD's (when its op word says so) and the RMS_NORM's. One kernel for both chains: a first run
    compiles it once."""
    r = rec(node)
    add = rec(r[AUX])[0] == _OP_ADD
    norm = r[AUX + 1] if add else r[AUX]
    rn, ra = rec(norm), rec(r[AUX])
    eps = params_f32(norm)[0]
    ne0, ne1, ne2, ne10 = rn[T_DST + 1], rn[T_DST + 2], rn[T_DST + 3], r[T_SRC1 + 1]
    ir0, ir1 = span(ne1 * ne2 * rn[T_DST + 4], ith, nth)
    for ir in range(ir0, ir1):
        i1, i2, i3 = row_index(ir, ne1, ne2)
        x = numba.carray(f32p(row_at(rn, T_SRC0, i1, i2, i3)), ne0)
        if add:
            a = numba.carray(f32p(row_at(ra, T_SRC0, i1, i2, i3)), ne0)
            b = numba.carray(f32p(row_at(ra, T_SRC1, i1, i2, i3)), ne0)
            s = 0.0
            for i in range(ne0):
                v = a[i] + b[i]
                x[i] = v
                s += np.float64(v * v)
            scale = _rms_finish(s, ne0, eps)
        else:
            scale = _rms_scale(x, ne0, eps)
        yn = numba.carray(f32p(row_at(rn, T_DST, i1, i2, i3)), ne0)
        wv = numba.carray(f32p(row_at(r, T_SRC1, i1 % r[T_SRC1 + 2], i2 % r[T_SRC1 + 3], i3 % r[T_SRC1 + 4])), ne10)
        y = numba.carray(f32p(row_at(r, T_DST, i1, i2, i3)), ne0)
        if ne10 == ne0 and yn.ctypes.data == y.ctypes.data:  # the MUL in place over the norm: one store (the
            for i in range(ne0):                              # MUL's), so LLVM can vectorize the loop
                y[i] = (x[i] * scale) * wv[i]
        elif ne10 == ne0:  # a weight row per row (no modulo per element: an integer division each)
            for i in range(ne0):
                v = x[i] * scale
                yn[i] = v
                y[i] = v * wv[i]
        else:
            for i in range(ne0):
                v = x[i] * scale
                yn[i] = v
                y[i] = v * wv[i % ne10]


_OP_ADD = int(Op.ADD)


@numba.njit(**_opts)
def _norm_row(x, y, ne0, eps):  # pragma: no cover - compiled
    """k_norm's steps on one row: y = (x - mean) * (1 / sqrtf(var + eps))."""
    nv = ne0 - ne0 % 8
    s = 0.0
    for i in range(ne0):
        s += np.float64(x[i])
    mean = np.float32(s) / np.float32(ne0)
    total = 0.0
    for i0 in range(0, nv, 8):
        for j in range(8):
            y[i0 + j] = x[i0 + j] - mean
        q0, q1, q2, q3 = y[i0] * y[i0], y[i0 + 1] * y[i0 + 1], y[i0 + 2] * y[i0 + 2], y[i0 + 3] * y[i0 + 3]
        q4, q5, q6, q7 = (y[i0 + 4] * y[i0 + 4], y[i0 + 5] * y[i0 + 5], y[i0 + 6] * y[i0 + 6],
                          y[i0 + 7] * y[i0 + 7])
        total += np.float64(((q4 + q0) + (q6 + q2)) + ((q5 + q1) + (q7 + q3)))
    for i in range(nv, ne0):
        v = x[i] - mean
        y[i] = v
        total += np.float64(v * v)
    scale = np.float32(1.0) / np.float32(math.sqrt(np.float32(total / ne0) + eps))
    for i in range(ne0):
        y[i] = y[i] * scale


@jit_kernel
def k_norm(node, ith, nth, ctrl):  # pragma: no cover - compiled
    """LayerNorm without affine (ggml_compute_forward_norm_f32 on AVX2): the mean from the row's double sum
    narrowed to float, divided in float; the variance as ggml_vec_cvar_f32 adds it, each 8 centred squares
    summed in float as its horizontal add does ((0+4)+(2+6)) + ((1+5)+(3+7)), then in double, the rest in
    double; the mean of squares narrowed to float; y = (x - mean) * (1 / sqrtf(var + eps))."""
    r = rec(node)
    eps = params_f32(node)[0]
    ne0, ne1, ne2 = r[T_DST + 1], r[T_DST + 2], r[T_DST + 3]
    ir0, ir1 = span(ne1 * ne2 * r[T_DST + 4], ith, nth)
    for ir in range(ir0, ir1):
        i1, i2, i3 = row_index(ir, ne1, ne2)
        _norm_row(numba.carray(f32p(row_at(r, T_SRC0, i1, i2, i3)), ne0),
                  numba.carray(f32p(row_at(r, T_DST, i1, i2, i3)), ne0), ne0, eps)


@jit_kernel
def k_norm_mul_add(node, ith, nth, ctrl):  # pragma: no cover - compiled
    """NORM, the MUL of its output by a weight row and the ADD of a bias row (LayerNorm's affine), row by row:
    each node's output written with its own kernel's bits. The record is the last node's: AUX word 0 is the
    NORM's, word 1 the MUL's when the node is the ADD (0 when the node is the MUL)."""
    r = rec(node)
    rn = rec(r[AUX])
    rm = rec(r[AUX + 1]) if r[AUX + 1] != 0 else r
    eps = params_f32(r[AUX])[0]
    ne0, ne1, ne2 = rn[T_DST + 1], rn[T_DST + 2], rn[T_DST + 3]
    w = numba.carray(f32p(rm[T_SRC1]), ne0)
    b = numba.carray(f32p(r[T_SRC1]), ne0)
    ir0, ir1 = span(ne1 * ne2 * rn[T_DST + 4], ith, nth)
    for ir in range(ir0, ir1):
        i1, i2, i3 = row_index(ir, ne1, ne2)
        y = numba.carray(f32p(row_at(rn, T_DST, i1, i2, i3)), ne0)
        _norm_row(numba.carray(f32p(row_at(rn, T_SRC0, i1, i2, i3)), ne0), y, ne0, eps)
        ym = numba.carray(f32p(row_at(rm, T_DST, i1, i2, i3)), ne0)
        for i in range(ne0):
            ym[i] = y[i] * w[i]
        if r[AUX + 1] != 0:
            yo = numba.carray(f32p(row_at(r, T_DST, i1, i2, i3)), ne0)
            for i in range(ne0):
                yo[i] = ym[i] + b[i]


def _a_row_of(t: Tensor | None, node: Tensor) -> bool:
    """Whether ``t`` is one contiguous F32 row as long as ``node``'s rows (a norm's weight or bias)."""
    return (t is not None and t.type == GGMLType.F32 and t.ne[0] == node.ne[0] and t.ne[1] == t.ne[2] == t.ne[3] == 1
            and t.nb[0] == 4)


def fuse_norm_affine(prev: Tensor, prev_choice: Choice, node: Tensor, choice: Choice,
                     readers: object = None) -> Choice | None:
    """NORM and the MUL of its output by a weight row, then the ADD of a bias row (BERT's LayerNorms: 75 records
    of an encoder's 12 layers become 25); or None. Taken once k_norm_mul_add is compiled: a first run has it
    compile in the background and keeps the nodes apart (background compiles off: the plan compiles it)."""
    if node.src[0] is not prev or node.ne != prev.ne or not _a_row_of(node.src[1], node) or node.src[1] is prev:
        return None
    if choice.kernel is k_mul and prev_choice.kernel is k_norm:
        fused = Choice(k_norm_mul_add, ints=(0,), parts=((prev, prev_choice),))
    elif choice.kernel is k_add and prev_choice.kernel is k_norm_mul_add and len(prev_choice.parts) == 1:
        fused = Choice(k_norm_mul_add, parts=(prev_choice.parts[0], (prev, Choice(k_mul))))
    else:
        return None
    if not k_norm_mul_add.load_cached() and background():
        compile_in_background(k_norm_mul_add)
        return None
    return fused


def _row_norm_choice(node: Tensor, kernel: JitKernel) -> Choice | None:
    """NORM and L2_NORM: F32 rows in and out of one shape, contiguous rows, a non-negative eps."""
    a = node.src[0]
    if not all_f32(node, a) or a.ne != node.ne or not rows_contiguous(node, a) or node.get_op_params_f32(0) < 0:
        return None
    return Choice(kernel)


@selector(Op.NORM)
def _sel_norm(node: Tensor) -> Choice | None:
    return _row_norm_choice(node, k_norm)


@jit_kernel
def k_l2_norm(node, ith, nth, ctrl):  # pragma: no cover - compiled
    """y = x / max(sqrt(sum x^2), eps) per row: the float squares summed in double, in order, the sum narrowed
    to float for sqrtf (ggml_compute_forward_l2_norm_f32)."""
    r = rec(node)
    eps = params_f32(node)[0]
    ne0, ne1, ne2 = r[T_DST + 1], r[T_DST + 2], r[T_DST + 3]
    ir0, ir1 = span(ne1 * ne2 * r[T_DST + 4], ith, nth)
    for ir in range(ir0, ir1):
        i1, i2, i3 = row_index(ir, ne1, ne2)
        x = numba.carray(f32p(row_at(r, T_SRC0, i1, i2, i3)), ne0)
        y = numba.carray(f32p(row_at(r, T_DST, i1, i2, i3)), ne0)
        s = 0.0
        for i in range(ne0):
            v = x[i]
            s += np.float64(v * v)
        scale = np.float32(1.0) / max(np.float32(math.sqrt(np.float32(s))), eps)
        for i in range(ne0):
            y[i] = x[i] * scale


@selector(Op.L2_NORM)
def _sel_l2_norm(node: Tensor) -> Choice | None:
    return _row_norm_choice(node, k_l2_norm)


@numba.njit(**_opts)
def _group_sum(r, c0, c1, i3, mean, center):  # pragma: no cover - compiled
    """The double sum over the group's rows (channels c0..c1 of batch i3): of x (center False), or of
    (x - mean)^2 with x - mean written to the output (center True); each row summed on its own first."""
    ne0, ne1 = r[T_DST + 1], r[T_DST + 2]
    total = 0.0
    for i2 in range(c0, c1):
        for i1 in range(ne1):
            x = numba.carray(f32p(row_at(r, T_SRC0, i1, i2, i3)), ne0)
            y = numba.carray(f32p(row_at(r, T_DST, i1, i2, i3)), ne0)
            s = 0.0
            for i in range(ne0):
                if center:
                    v = x[i] - mean
                    y[i] = v
                    s += np.float64(v * v)
                else:
                    s += np.float64(x[i])
            total += s
    return total


@jit_kernel
def k_group_norm(node, ith, nth, ctrl):  # pragma: no cover - compiled
    """GROUP_NORM (ggml_compute_forward_group_norm_f32): channels (dim 2) in groups of ceil(ne2 / n_groups),
    each normalized over ne0 * ne1 * its channels per batch; mean and variance from double sums of per-row
    double sums, narrowed to float. Thread ith takes groups ith, ith + nth, ..."""
    r = rec(node)
    n_groups = params_i32(node)[0]
    eps = params_f32(node)[1]
    ne0, ne1, ne2, ne3 = r[T_DST + 1], r[T_DST + 2], r[T_DST + 3], r[T_DST + 4]
    per = (ne2 + n_groups - 1) // n_groups
    for g in range(ith, n_groups, nth):
        c0 = g * per
        c1 = min(c0 + per, ne2)
        if c1 <= c0:
            continue
        cnt = ne0 * ne1 * (c1 - c0)
        for i3 in range(ne3):
            mean = np.float32(_group_sum(r, c0, c1, i3, np.float32(0.0), False) / cnt)
            variance = np.float32(_group_sum(r, c0, c1, i3, mean, True) / cnt)
            scale = np.float32(1.0) / np.float32(math.sqrt(variance + eps))
            for i2 in range(c0, c1):
                for i1 in range(ne1):
                    y = numba.carray(f32p(row_at(r, T_DST, i1, i2, i3)), ne0)
                    for i in range(ne0):
                        y[i] = y[i] * scale


@selector(Op.GROUP_NORM)
def _sel_group_norm(node: Tensor) -> Choice | None:
    a = node.src[0]
    if not all_f32(node, a) or a.ne != node.ne or not rows_contiguous(node, a) or node.get_op_params_i32(0) <= 0:
        return None
    return Choice(k_group_norm)


def fuse_norm(prev: Tensor, prev_choice: Choice, node: Tensor, choice: Choice,
              readers: object = None) -> Choice | None:
    """The norm chains: RMS_NORM then the MUL of its output by a weight (ggml-cpu's rms_norm + mul fusion),
    with or without the residual ADD whose sum the RMS_NORM reads; or None. ADD + RMS_NORM waits for the MUL."""
    if choice.kernel is k_mul and node.src[0] is prev:
        w = node.src[1]
        if node.ne != prev.ne or not rows_contiguous(node, w) or w is prev:
            return None
        if prev_choice.kernel is k_rms_norm:
            return Choice(k_rms_norm_mul, parts=((prev, prev_choice),))
        if prev_choice.kernel is k_rms_norm_mul and prev_choice.pending:
            return Choice(k_rms_norm_mul, parts=prev_choice.pending)
        return None
    if choice.kernel is k_rms_norm and prev_choice.kernel is k_add and node.src[0] is prev:
        a, b = prev.src[0], prev.src[1]
        if a.ne == b.ne == prev.ne and rows_contiguous(prev, a, b):
            return Choice(k_rms_norm_mul, pending=((prev, prev_choice), (node, choice)))
    return None


# ------------------------------------------------------------------------------------ softmax
#: lanes of the row maximum: element i goes to lane i % _LANES (a vector register's worth)
_LANES = 16


@numba.njit(**_opts)
def _row_max(w, lanes):  # pragma: no cover - compiled
    n = w.size
    lanes[:] = -np.inf
    for i0 in range(0, n - n % _LANES, _LANES):
        for j in range(_LANES):
            lanes[j] = max(lanes[j], w[i0 + j])
    m = lanes[0]
    for j in range(1, _LANES):
        m = max(m, lanes[j])
    for i in range(n - n % _LANES, n):
        m = max(m, w[i])
    return m


@numba.njit(**_opts)
def _row_sum(w, acc):  # pragma: no cover - compiled
    """The row's sum in double lanes (element i in lane i % _LANES), lanes added in a fixed tree, for rows of
    decode-size products (at most matmul_f.DOUBLE_MAX_COLS rows a plane).

    Double, like ggml's softmax sum, and for a second reason: in a masked row only a few terms are
    live and which lanes they fall in depends on the cells a sequence's tokens sit in; summed in
    double those few float terms add exactly in any grouping, so a sequence's probabilities do not
    depend on its neighbours in the cache.
    """
    n = w.size
    acc[:] = 0.0
    for i0 in range(0, n - n % _LANES, _LANES):
        for j in range(_LANES):
            acc[j] += np.float64(w[i0 + j])
    for i in range(n - n % _LANES, n):
        acc[0] += np.float64(w[i])
    width = _LANES
    while width > 1:
        width //= 2
        for j in range(width):
            acc[j] += acc[j + width]
    return acc[0]


@numba.njit(**_opts)
def _row_sum_ggml(w):  # pragma: no cover - compiled
    """ggml_vec_soft_max_f32's sum on AVX2, for prompt rows: each vector of LANES values summed in float
    (halves, then (0+2)+(1+3)), added in double, then the leftover values in double."""
    n = w.size
    nv = n - n % LANES
    s = 0.0
    for i0 in range(0, nv, LANES):
        q0 = w[i0 + 4] + w[i0]
        q1 = w[i0 + 5] + w[i0 + 1]
        q2 = w[i0 + 6] + w[i0 + 2]
        q3 = w[i0 + 7] + w[i0 + 3]
        s += np.float64((q0 + q2) + (q1 + q3))
    for i in range(nv, n):
        s += np.float64(w[i])
    return s


@numba.njit(**_opts)
def _mask_f32(w, mp, slope, tab):  # pragma: no cover - compiled
    mf = numba.carray(f32p(mp), w.size)
    for i in range(w.size):
        w[i] = w[i] + slope * mf[i]


@numba.njit(**_opts)
def _mask_f16(w, mp, slope, tab):  # pragma: no cover - compiled
    mh = numba.carray(u16p(mp), w.size)
    for i in range(w.size):
        w[i] = w[i] + slope * tab[mh[i]]


@numba.njit(**_opts)
def _soft_max(node, ith, nth, add_mask):  # pragma: no cover - compiled
    r = rec(node)
    p = params_f32(node)
    scale = p[0]
    d, ne0, ne1, ne2 = r[T_DST], r[T_DST + 1], r[T_DST + 2], r[T_DST + 3]
    nb1, nb2, nb3 = r[T_DST + 6], r[T_DST + 7], r[T_DST + 8]
    a, na1, na2, na3 = r[T_SRC0], r[T_SRC0 + 6], r[T_SRC0 + 7], r[T_SRC0 + 8]
    m, nem2, nem3 = r[T_SRC1], r[T_SRC1 + 3], r[T_SRC1 + 4]
    nm1, nm2, nm3 = r[T_SRC1 + 6], r[T_SRC1 + 7], r[T_SRC1 + 8]
    slopes = numba.carray(f32p(r[AUX]), max(ne2, 1))
    tab = numba.carray(f32p(r[AUX + 1]), 65536)
    w = np.empty(ne0, np.float32)
    lanes = np.empty(_LANES, np.float32)
    dlanes = np.empty(_LANES, np.float64)
    ir0, ir1 = span(ne1 * ne2 * r[T_DST + 4], ith, nth)
    for ir in range(ir0, ir1):
        i1, i2, i3 = row_index(ir, ne1, ne2)
        x = numba.carray(f32p(a + i1 * na1 + i2 * na2 + i3 * na3), ne0)
        y = numba.carray(f32p(d + i1 * nb1 + i2 * nb2 + i3 * nb3), ne0)
        for i in range(ne0):
            w[i] = x[i] * scale
        if m != 0:
            mp = m + i1 * nm1 + (i2 % nem2) * nm2 + (i3 % nem3) * nm3
            add_mask(w, mp, slopes[i2], tab)
        mx = _row_max(w, lanes)
        nv = ne0 - ne0 % LANES
        for i in range(nv):  # ggml_vec_soft_max_f32: ggml's vector expf, libm for the last ne0 % LANES
            w[i] = v_expf(w[i] - mx)
        for i in range(nv, ne0):
            w[i] = libm_expf(w[i] - mx)
        total = _row_sum(w, dlanes) if ne1 <= DOUBLE_MAX_COLS else _row_sum_ggml(w)
        inv = np.float32(1.0 / total)
        for i in range(ne0):
            y[i] = w[i] * inv


@jit_kernel
def k_soft_max(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _soft_max(node, ith, nth, _mask_f32)


@jit_kernel
def k_soft_max_mf16(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _soft_max(node, ith, nth, _mask_f16)


@selector(Op.SOFT_MAX)
def _sel_soft_max(node: Tensor) -> Choice | None:
    from ..simd import F16_TO_F32

    a, mask, sinks = node.src[0], node.src[1], node.src[2]
    if sinks is not None or not all_f32(node, a) or a.ne != node.ne or not rows_contiguous(node, a, mask):
        return None
    if mask is not None and (mask.type not in (F32, F16) or mask.ne[0] != a.ne[0] or mask.ne[1] < a.ne[1]
                             or a.ne[2] % mask.ne[2] or a.ne[3] % mask.ne[3]):
        return None
    slopes = alibi_slopes(a.ne[2], node.get_op_params_f32(1))
    kern = k_soft_max_mf16 if mask is not None and mask.type == F16 else k_soft_max
    return Choice(kern, ints=(slopes.ctypes.data, F16_TO_F32.ctypes.data), notes={"keep": slopes})


# --------------------------------------------------------------------------------------- rope
@numba.njit(**_opts)
def _rope_angles(node, i2, cos, sin, back):  # pragma: no cover - compiled
    """cos/sin (times mscale) of position row i2's angles: theta_{i+1} = theta_i * theta_scale in float32, as ggml
    builds its cache, with YaRN's ramp when ext_factor is set."""
    r = rec(node)
    f = aux_f32(node)
    theta_scale, freq_scale, ext_factor, mscale = f[_F0], f[_F0 + 1], f[_F0 + 2], f[_F0 + 3]
    corr_low, corr_span = f[_F0 + 4], f[_F0 + 5]
    ff_addr = r[T_SRC2]
    theta = np.float32(i32p(r[T_SRC1])[i2])
    for i in range(cos.size):
        ff = f32p(ff_addr)[i] if ff_addr != 0 else np.float32(1.0)
        extrap = theta / ff
        interp = freq_scale * extrap
        if ext_factor != 0:
            y = (np.float32(i) - corr_low) / corr_span
            ramp = (np.float32(1) - min(np.float32(1), max(np.float32(0), y))) * ext_factor
            th = interp * (np.float32(1) - ramp) + extrap * ramp
        else:
            th = interp
        cos[i] = np.float32(math.cos(th)) * mscale
        s = np.float32(math.sin(th)) * mscale
        sin[i] = -s if back else s
        theta = theta * theta_scale


@numba.njit(**_opts)
def _rope_row(node, i1, i2, i3, cos, sin, neox):  # pragma: no cover - compiled
    """Row (i1, i2, i3) of the ROPE: its first n_dims values past n_offs rotated in pairs, the others copied."""
    r = rec(node)
    pi = params_i32(node)
    n_dims, n_offs = pi[1], pi[15]
    ne0, half = r[T_DST + 1], cos.size
    x = numba.carray(f32p(row_at(r, T_SRC0, i1, i2, i3)), ne0)
    out = numba.carray(f32p(row_at(r, T_DST, i1, i2, i3)), ne0)
    for i in range(n_offs):
        out[i] = x[i]
    for i in range(n_offs + n_dims, ne0):
        out[i] = x[i]
    for i in range(half):
        if neox:
            j0, j1 = n_offs + i, n_offs + i + half
        else:
            j0, j1 = n_offs + 2 * i, n_offs + 2 * i + 1
        x0, x1 = x[j0], x[j1]
        # ggml's rotate_pairs as GCC builds it for x86 (-ffp-contract=fast, FMA): x0*cos - x1*sin becomes
        # fma(x0, cos, -(x1*sin)) and x0*sin + x1*cos fma(x0, sin, x1*cos) (llama.cpp 0c1e570's libggml-cpu)
        out[j0] = fmaf(x0, cos[i], -(x1 * sin[i]))
        out[j1] = fmaf(x0, sin[i], x1 * cos[i])


@numba.njit(**_opts)
def _rope(node, ith, nth, neox, back):  # pragma: no cover - compiled
    r = rec(node)
    half = params_i32(node)[1] // 2
    ne1, ne2 = r[T_DST + 2], r[T_DST + 3]
    cos = np.empty(half, np.float32)
    sin = np.empty(half, np.float32)
    cached = -1
    ir0, ir1 = span(ne1 * ne2 * r[T_DST + 4], ith, nth)
    for ir in range(ir0, ir1):
        i1, i2, i3 = row_index(ir, ne1, ne2)
        if i2 != cached:
            cached = i2
            _rope_angles(node, i2, cos, sin, back)
        _rope_row(node, i1, i2, i3, cos, sin, neox)


@jit_kernel
def k_rope_norm(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _rope(node, ith, nth, False, False)


@jit_kernel
def k_rope_neox(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _rope(node, ith, nth, True, False)


@jit_kernel
def k_rope_norm_back(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _rope(node, ith, nth, False, True)


@jit_kernel
def k_rope_neox_back(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _rope(node, ith, nth, True, True)


_ROPE = {(0, False): k_rope_norm, (GGML_ROPE_TYPE_NEOX, False): k_rope_neox,
         (0, True): k_rope_norm_back, (GGML_ROPE_TYPE_NEOX, True): k_rope_neox_back}


@selector(Op.ROPE, Op.ROPE_BACK)
def _sel_rope(node: Tensor) -> Choice | None:
    a, pos, ff = node.src[0], node.src[1], node.src[2]
    p = node.op_params
    n_dims, mode, n_ctx_orig, n_offs = int(p[1]), int(p[2]), int(p[4]), int(p[15])
    kern = _ROPE.get((mode, node.op == Op.ROPE_BACK))
    if kern is None or not all_f32(node, a, ff) or pos.type != I32 or a.ne != node.ne:
        return None
    if not rows_contiguous(node, a) or not pos.is_contiguous() or (ff is not None and not ff.is_contiguous()):
        return None
    ne0 = a.ne[0]
    if n_dims <= 0 or n_dims % 2 or n_offs < 0 or n_offs % 2 or n_offs + n_dims > ne0 or pos.ne[0] < a.ne[2]:
        return None  # the Python kernel names the problem
    if ff is not None and ff.ne[0] < n_dims // 2:
        return None
    freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow = (
        np.float32(v) for v in node.op_params_f32[5:11])
    theta_scale = np.float32(np.power(freq_base, np.float32(-2.0) / np.float32(n_dims)))
    mscale, low, span_ = attn_factor, np.float32(0), np.float32(1)
    if ext_factor != 0:  # as rope_cache in ops/nn.py
        lo, hi = rope_yarn_corr_dims(n_dims, n_ctx_orig, float(freq_base), float(beta_fast), float(beta_slow))
        low, span_ = np.float32(lo), np.float32(max(0.001, hi - lo))
        mscale = mscale * (np.float32(1.0) + np.float32(0.1) * np.log(np.float32(1.0) / freq_scale))
    return Choice(kern, floats=(theta_scale, freq_scale, ext_factor, np.float32(mscale), low, span_))


def _rope_set_rows(neox: bool, to_f16: bool):
    """ROPE, then SET_ROWS of its output (a contiguous view of it) into the KV cache: each thread ropes the rows
    of its cache rows' sources and writes them at once, while they are in L1. The record is the SET_ROWS's,
    the ROPE's its part (AUX word 0); both outputs get their own kernels' bits (the same row functions)."""

    @numba.njit(**_opts)
    @variant(neox, to_f16)
    def fused(node, ith, nth, ctrl):  # pragma: no cover - compiled
        r = rec(node)
        rope = r[AUX]
        rr = rec(rope)
        half = params_i32(rope)[1] // 2
        ne0, ne1, ne2 = rr[T_DST + 1], rr[T_DST + 2], rr[T_DST + 3]
        ne00 = r[T_SRC0 + 1]
        per = ne00 // ne0  # ROPE rows per cache row
        cos = np.empty(half, np.float32)
        sin = np.empty(half, np.float32)
        cached = -1
        ir0, ir1 = span(r[T_SRC0 + 2] * r[T_SRC0 + 3] * r[T_SRC0 + 4], ith, nth)
        for ir in range(ir0, ir1):
            src, dst = set_rows_at(node, ctrl, ir, True)
            if dst == 0:
                return
            for k in range(ir * per, (ir + 1) * per):
                i1, i2, i3 = row_index(k, ne1, ne2)
                if i2 != cached:
                    cached = i2
                    _rope_angles(rope, i2, cos, sin, False)
                _rope_row(rope, i1, i2, i3, cos, sin, neox)
            put_row(src, dst, ne00, to_f16)

    return fused


_rope_neox_f16, _rope_norm_f16, _rope_neox_f32, _rope_norm_f32 = (
    _rope_set_rows(neox, f16) for f16 in (True, False) for neox in (True, False))


@jit_kernel
def k_rope_neox_set_rows_f16(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _rope_neox_f16(node, ith, nth, ctrl)


@jit_kernel
def k_rope_norm_set_rows_f16(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _rope_norm_f16(node, ith, nth, ctrl)


@jit_kernel
def k_rope_neox_set_rows_f32(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _rope_neox_f32(node, ith, nth, ctrl)


@jit_kernel
def k_rope_norm_set_rows_f32(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _rope_norm_f32(node, ith, nth, ctrl)


#: (ROPE kernel, SET_ROWS kernel with I64 indices) -> the fused kernel
_ROPE_SET_ROWS = {(k_rope_neox, rows.k_set_rows_f16_i64): k_rope_neox_set_rows_f16,
                  (k_rope_norm, rows.k_set_rows_f16_i64): k_rope_norm_set_rows_f16,
                  (k_rope_neox, rows.k_set_rows_f32_i64): k_rope_neox_set_rows_f32,
                  (k_rope_norm, rows.k_set_rows_f32_i64): k_rope_norm_set_rows_f32}


def fuse_rope_set_rows(prev: Tensor, prev_choice: Choice, node: Tensor, choice: Choice,
                       readers: object = None) -> Choice | None:
    """A ROPE whose output SET_ROWS writes into the cache next (the K of every attention layer), or None; also
    while the fused kernel is not compiled yet (jit.ready_or_wanted)."""
    fused = _ROPE_SET_ROWS.get((prev_choice.kernel, choice.kernel))
    src = node.src[0]
    if fused is None or src.data != prev.data or src.nelements() != prev.nelements() or src.ne[0] % prev.ne[0]:
        return None
    if not (prev.is_contiguous() and src.is_contiguous()) or not ready_or_wanted(fused):
        return None
    return Choice(fused, parts=((prev, prev_choice),))


__all__ = ["C_ERR"]
