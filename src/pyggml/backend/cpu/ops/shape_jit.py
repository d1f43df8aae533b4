"""Compiled data movement: CONCAT and REPEAT.

Both copy stored values bit for bit (as integers of the element's width, so a NaN's payload or a
bf16's bits come through unchanged), as ggml-cpu's concat_f32/concat_f16/concat_i8/concat_any and
repeat_f32/repeat_f16 do and as the numpy kernels in ops/shape.py do. The recurrent architectures
(RWKV's token shift, Mamba's conv state) run a few of these per layer and decode step; as numpy
nodes each cost a Python round-trip and split the plan's compiled runs.

Sources may have any strides (Mamba-2 concatenates a transposed view); the destination's rows must
be contiguous, which every freshly built CONCAT/REPEAT result is.
"""

from __future__ import annotations

import numba

from ....ops.enums import Op
from ....tensor import Tensor
from ....types import GGMLType
from ..jit import Choice, jit_kernel, selector
from ..jit.record import AUX, T_DST, T_SRC0, T_SRC1, params_i32, rec, row_index, span
from ..native import i64p, u8p, u16p, u32p

_opts = {"inline": "always", "cache": True, "error_model": "numpy"}

#: element widths the kernels copy as one integer; other types (quantized blocks) stay on numpy
_WIDTHS = (1, 2, 4, 8)
#: ggml-cpu's REPEAT types (repeat_f16 for the 2-byte ones, repeat_f32 for the 4-byte ones)
_REPEAT_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I16, GGMLType.I32)


@numba.njit(**_opts)
def _copy_elems(dp, sp, n, snb, w):  # pragma: no cover - compiled
    """n elements of w bytes from sp (stride snb bytes) to the contiguous dp."""
    if w == 4:
        if snb == 4:
            dv, sv = numba.carray(u32p(dp), n), numba.carray(u32p(sp), n)
            for i in range(n):
                dv[i] = sv[i]
        else:
            for i in range(n):
                u32p(dp + 4 * i)[0] = u32p(sp + i * snb)[0]
    elif w == 2:
        if snb == 2:
            dh, sh = numba.carray(u16p(dp), n), numba.carray(u16p(sp), n)
            for i in range(n):
                dh[i] = sh[i]
        else:
            for i in range(n):
                u16p(dp + 2 * i)[0] = u16p(sp + i * snb)[0]
    elif w == 8:
        for i in range(n):
            i64p(dp + 8 * i)[0] = i64p(sp + i * snb)[0]
    else:
        for i in range(n):
            u8p(dp + i)[0] = u8p(sp + i * snb)[0]


@numba.njit(**_opts)
def next_row(i1, i2, i3, ne1, ne2):  # pragma: no cover - compiled
    """The row after (i1, i2, i3) by carrying: row_index's divisions cost more than copying a short row."""
    i1 += 1
    if i1 == ne1:
        i1, i2 = 0, i2 + 1
        if i2 == ne2:
            i2, i3 = 0, i3 + 1
    return i1, i2, i3


@numba.njit(**_opts)
def _concat(node, ith, nth, w):  # pragma: no cover - compiled
    """dst = src0 followed by src1 along op_params i32[0] = dim, elements of w bytes."""
    r = rec(node)
    dim = params_i32(node)[0]
    d, ne0, ne1, ne2 = r[T_DST], r[T_DST + 1], r[T_DST + 2], r[T_DST + 3]
    nb1, nb2, nb3 = r[T_DST + 6], r[T_DST + 7], r[T_DST + 8]
    a, na0, na1, na2, na3 = r[T_SRC0], r[T_SRC0 + 5], r[T_SRC0 + 6], r[T_SRC0 + 7], r[T_SRC0 + 8]
    ne00 = r[T_SRC0 + 1]
    b, nb10, nb11, nb12, nb13 = r[T_SRC1], r[T_SRC1 + 5], r[T_SRC1 + 6], r[T_SRC1 + 7], r[T_SRC1 + 8]
    o = r[T_SRC0 + 1 + dim]  # src0's extent along dim: where src1 starts
    ir0, ir1 = span(ne1 * ne2 * r[T_DST + 4], ith, nth)
    i1, i2, i3 = row_index(ir0, ne1, ne2)
    for _ in range(ir0, ir1):
        if i1 == 0 or _ == ir0:  # the plane's offsets once per plane: a row then costs one multiply per tensor
            d23 = d + i2 * nb2 + i3 * nb3
            a23 = a + i2 * na2 + i3 * na3
            b23 = b + i2 * nb12 + i3 * nb13
        dp = d23 + i1 * nb1
        if dim == 0:
            _copy_elems(dp, a23 + i1 * na1, ne00, na0, w)
            _copy_elems(dp + ne00 * w, b23 + i1 * nb11, ne0 - ne00, nb10, w)
        elif (i1 if dim == 1 else (i2 if dim == 2 else i3)) < o:
            _copy_elems(dp, a23 + i1 * na1, ne0, na0, w)
        elif dim == 1:
            _copy_elems(dp, b23 + (i1 - o) * nb11, ne0, nb10, w)
        else:
            j2 = i2 - o if dim == 2 else i2
            j3 = i3 - o if dim == 3 else i3
            _copy_elems(dp, b + i1 * nb11 + j2 * nb12 + j3 * nb13, ne0, nb10, w)
        i1, i2, i3 = next_row(i1, i2, i3, ne1, ne2)


@numba.njit(**_opts)
def _repeat(node, ith, nth, w):  # pragma: no cover - compiled
    """Tile src0 over dst (each dst ne a whole multiple of src0's), elements of w bytes."""
    r = rec(node)
    d, ne0, ne1, ne2 = r[T_DST], r[T_DST + 1], r[T_DST + 2], r[T_DST + 3]
    nb1, nb2, nb3 = r[T_DST + 6], r[T_DST + 7], r[T_DST + 8]
    a, ne00, ne01, ne02, ne03 = r[T_SRC0], r[T_SRC0 + 1], r[T_SRC0 + 2], r[T_SRC0 + 3], r[T_SRC0 + 4]
    na0, na1, na2, na3 = r[T_SRC0 + 5], r[T_SRC0 + 6], r[T_SRC0 + 7], r[T_SRC0 + 8]
    ir0, ir1 = span(ne1 * ne2 * r[T_DST + 4], ith, nth)
    i1, i2, i3 = row_index(ir0, ne1, ne2)
    for _ in range(ir0, ir1):
        dp = d + i1 * nb1 + i2 * nb2 + i3 * nb3
        sp = a + (i1 % ne01) * na1 + (i2 % ne02) * na2 + (i3 % ne03) * na3
        for k in range(ne0 // ne00):
            _copy_elems(dp + k * ne00 * w, sp, ne00, na0, w)
        i1, i2, i3 = next_row(i1, i2, i3, ne1, ne2)


# One kernel per common width: the constant w, inlined, leaves one copy loop per kernel (a width read from
# the record kept every loop and its branches in the row loop: twice the time on Mamba-2's short rows).
@jit_kernel
def k_concat_4(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _concat(node, ith, nth, 4)


@jit_kernel
def k_concat_2(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _concat(node, ith, nth, 2)


@jit_kernel
def k_concat_any(node, ith, nth, ctrl):  # pragma: no cover - compiled
    """Widths 1 and 8 (I8, I64, F64), from AUX[0]."""
    _concat(node, ith, nth, rec(node)[AUX])


@jit_kernel
def k_repeat_4(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _repeat(node, ith, nth, 4)


@jit_kernel
def k_repeat_2(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _repeat(node, ith, nth, 2)


_CONCAT = {4: k_concat_4, 2: k_concat_2}
_REPEAT = {4: k_repeat_4, 2: k_repeat_2}


def _width(t: Tensor) -> int:
    """The element's bytes when the type has one value per element and a width the kernels copy, else 0."""
    ty = t.type
    return ty.type_size if ty.blck_size == 1 and ty.type_size in _WIDTHS else 0


@selector(Op.CONCAT)
def _sel_concat(node: Tensor) -> Choice | None:
    a, b = node.src[0], node.src[1]
    dim = node.get_op_params_i32(0)
    w = _width(node)
    if not w or a.type != node.type or b.type != node.type or not 0 <= dim < 4 or node.nb[0] != w:
        return None
    others_match = all(a.ne[i] == n and b.ne[i] == n for i, n in enumerate(node.ne) if i != dim)
    if not others_match or a.ne[dim] + b.ne[dim] != node.ne[dim]:
        return None  # the Python kernel reports the mismatch
    return Choice(_CONCAT.get(w, k_concat_any), ints=(w,))


@selector(Op.REPEAT)
def _sel_repeat(node: Tensor) -> Choice | None:
    a = node.src[0]
    if node.type not in _REPEAT_TYPES or a.type != node.type or node.nb[0] != node.type.type_size:
        return None
    if any(s == 0 or n % s for n, s in zip(node.ne, a.ne, strict=True)):
        return None  # the Python kernel reports the bad shape
    return Choice(_REPEAT[node.type.type_size])
