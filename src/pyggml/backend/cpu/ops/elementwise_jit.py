"""Compiled elementwise kernels: ADD/SUB/MUL/DIV with ggml broadcasting, SCALE, GLU, UNARY and SQR (F32).

Same float32 operations, one rounding each, as the numpy kernels in ops/elementwise.py;
GELU goes through ggml's fp16 table (activations.py), SiLU is ``x / (1 + expf(-x))`` with ggml's expf (mathf.py).
EXP and SIGMOID take libm's expf on every element, as ggml's unary-ops.cpp does (it has no vector path for them);
numpy's np.exp may differ from it in the last bit.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir as llir
from numba import types
from numba.extending import intrinsic

from ....ops.enums import GluOp, Op, UnaryOp
from ....tensor import Tensor
from ....types import GGMLType
from ..jit import Choice, jit_kernel, selector
from ..jit.mathf import LANES, libm_expf, v_expf
from ..jit.record import AUX, T_DST, T_SRC0, T_SRC1, aux_f32, params_f32, rec, row_index, span
from ..native import f32p, u32p
from ..simd import _AVX2, _F16C, _F32, _I8, _I32, _f16_8, _vec, _x86, f16_bits
from .activations import _GELU_TABLE_F32

F32 = GGMLType.F32
_opts = {"inline": "always", "cache": True, "error_model": "numpy"}


@numba.njit(**_opts)
def _add(a, b):  # pragma: no cover - compiled
    return a + b


@numba.njit(**_opts)
def _sub(a, b):  # pragma: no cover - compiled
    return a - b


@numba.njit(**_opts)
def _mul(a, b):  # pragma: no cover - compiled
    return a * b


@numba.njit(**_opts)
def _div(a, b):  # pragma: no cover - compiled
    return a / b


@numba.njit(**_opts)
def _binary(node, ith, nth, op):  # pragma: no cover - compiled
    """dst = op(a, b) row by row, b broadcast. A node the allocator put in place over a or b (dst at the same
    address) computes through that one array: LLVM vectorizes a loop only where it can tell its stores from
    its loads, and over two arrays at the same address it runs its scalar fallback (an in-place ADD of
    2304 x 128 floats took twice as long)."""
    r = rec(node)
    d, ne0, ne1, ne2 = r[T_DST], r[T_DST + 1], r[T_DST + 2], r[T_DST + 3]
    nb0, nb1, nb2, nb3 = r[T_DST + 5], r[T_DST + 6], r[T_DST + 7], r[T_DST + 8]
    a, na0, na1, na2, na3 = r[T_SRC0], r[T_SRC0 + 5], r[T_SRC0 + 6], r[T_SRC0 + 7], r[T_SRC0 + 8]
    b, ne10, ne11, ne12, ne13 = r[T_SRC1], r[T_SRC1 + 1], r[T_SRC1 + 2], r[T_SRC1 + 3], r[T_SRC1 + 4]
    nb10, nb11, nb12, nb13 = r[T_SRC1 + 5], r[T_SRC1 + 6], r[T_SRC1 + 7], r[T_SRC1 + 8]
    ir0, ir1 = span(ne1 * ne2 * r[T_DST + 4], ith, nth)
    for ir in range(ir0, ir1):
        i1, i2, i3 = row_index(ir, ne1, ne2)
        dp = d + i1 * nb1 + i2 * nb2 + i3 * nb3
        ap = a + i1 * na1 + i2 * na2 + i3 * na3
        bp = b + (i1 % ne11) * nb11 + (i2 % ne12) * nb12 + (i3 % ne13) * nb13
        if nb0 == 4 and na0 == 4 and nb10 == 4:
            dv = numba.carray(f32p(dp), ne0)
            av = numba.carray(f32p(ap), ne0)
            bv = numba.carray(f32p(bp), ne10)
            if ne10 == ne0 and dp == ap:
                for i in range(ne0):
                    av[i] = op(av[i], bv[i])
            elif ne10 == ne0 and dp == bp:
                for i in range(ne0):
                    bv[i] = op(av[i], bv[i])
            elif ne10 == ne0:
                for i in range(ne0):
                    dv[i] = op(av[i], bv[i])
            elif ne10 == 1 and dp == ap:
                s = bv[0]
                for i in range(ne0):
                    av[i] = op(av[i], s)
            elif ne10 == 1:
                s = bv[0]
                for i in range(ne0):
                    dv[i] = op(av[i], s)
            else:
                for i in range(ne0):
                    dv[i] = op(av[i], bv[i % ne10])
        else:
            for i in range(ne0):
                x = f32p(ap + i * na0)[0]
                y = f32p(bp + (i % ne10) * nb10)[0]
                f32p(dp + i * nb0)[0] = op(x, y)


@jit_kernel
def k_add(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _binary(node, ith, nth, _add)


@jit_kernel
def k_sub(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _binary(node, ith, nth, _sub)


@jit_kernel
def k_mul(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _binary(node, ith, nth, _mul)


@jit_kernel
def k_div(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _binary(node, ith, nth, _div)


_BINARY = {Op.ADD: k_add, Op.SUB: k_sub, Op.MUL: k_mul, Op.DIV: k_div}


def all_f32(*ts: Tensor | None) -> bool:
    return all(t is None or t.type == F32 for t in ts)


@selector(Op.ADD, Op.SUB, Op.MUL, Op.DIV)
def _sel_binary(node: Tensor) -> Choice | None:
    a, b = node.src[0], node.src[1]
    if not all_f32(node, a, b) or a.ne != node.ne:
        return None
    if any(n % m for n, m in zip(node.ne, b.ne, strict=True)):
        return None  # the Python kernel reports the bad broadcast
    return Choice(_BINARY[node.op])


@jit_kernel
def k_scale(node, ith, nth, ctrl):  # pragma: no cover - compiled
    r = rec(node)
    p = params_f32(node)
    s, c = p[0], p[1]
    d, ne0, ne1, ne2 = r[T_DST], r[T_DST + 1], r[T_DST + 2], r[T_DST + 3]
    nb1, nb2, nb3 = r[T_DST + 6], r[T_DST + 7], r[T_DST + 8]
    a, na1, na2, na3 = r[T_SRC0], r[T_SRC0 + 6], r[T_SRC0 + 7], r[T_SRC0 + 8]
    ir0, ir1 = span(ne1 * ne2 * r[T_DST + 4], ith, nth)
    for ir in range(ir0, ir1):
        i1, i2, i3 = row_index(ir, ne1, ne2)
        dv = numba.carray(f32p(d + i1 * nb1 + i2 * nb2 + i3 * nb3), ne0)
        av = numba.carray(f32p(a + i1 * na1 + i2 * na2 + i3 * na3), ne0)
        if c == 0 and dv.ctypes.data == av.ctypes.data:  # in place: one array (see _binary)
            for i in range(ne0):
                av[i] = av[i] * s
        elif c == 0:
            for i in range(ne0):
                dv[i] = av[i] * s
        else:
            for i in range(ne0):
                dv[i] = av[i] * s + c


def rows_contiguous(*ts: Tensor | None) -> bool:
    return all(t is None or t.nb[0] == t.type.type_size for t in ts)


@selector(Op.SCALE)
def _sel_scale(node: Tensor) -> Choice | None:
    a = node.src[0]
    if not all_f32(node, a) or a.ne != node.ne or not rows_contiguous(node, a):
        return None
    return Choice(k_scale)


# ------------------------------------------------------------------------------ activations
# One row function per activation, passed to _activation_rows as a function: numba then types and
# compiles only that activation into each kernel (a constant "kind" switch compiled all of them).


@intrinsic
def _gelu8(typingctx, src, dst, table):
    """_gelu_row's steps on the 8 floats at src into dst: the fp16 bits by vcvtps2ph (simd._f16_8, the bits of
    simd.f16_bits), the table read by one vpgatherdd, the clamps as selects. Element by element, the software
    rounding and the lookup took about 8 cycles a value: a BERT-base FFN's GELU (3072 x 800) was 4% of an
    embedding batch's CPU time."""
    sig = types.void(types.int64, types.int64, types.int64)

    def codegen(context, builder, sig, args):
        f8 = _vec(8, _F32)
        x = builder.load(builder.inttoptr(args[0], f8.as_pointer()), align=4)
        idx = builder.zext(builder.bitcast(_f16_8(builder, args[0]), _vec(8, llir.IntType(16))), _vec(8, _I32))
        if _AVX2:
            allv = builder.bitcast(llir.Constant(_vec(8, _I32), [-1] * 8), f8)
            g = _x86(builder, "llvm.x86.avx2.gather.d.ps.256", f8, llir.Constant(f8, [0.0] * 8),
                     builder.inttoptr(args[2], _I8.as_pointer()), idx, allv, llir.Constant(_I8, 4))
        else:  # (never run: _gelu_row takes this path on AVX2 only; generic IR, so any CPU compiles it)
            tab = builder.inttoptr(args[2], _F32.as_pointer())
            g = llir.Constant(f8, [0.0] * 8)
            for i in range(8):
                at = builder.extract_element(idx, llir.Constant(_I32, i))
                g = builder.insert_element(g, builder.load(builder.gep(tab, [at])), llir.Constant(_I32, i))
        zero = llir.Constant(f8, [0.0] * 8)
        g = builder.select(builder.fcmp_ordered("<=", x, llir.Constant(f8, [-10.0] * 8)), zero, g)
        g = builder.select(builder.fcmp_ordered(">=", x, llir.Constant(f8, [10.0] * 8)), x, g)
        builder.store(g, builder.inttoptr(args[1], f8.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(**_opts)
def _gelu_row(xv, xb, table, dv):  # pragma: no cover - compiled
    """ggml_vec_gelu_f32 with GGML_GELU_FP16: the fp16 table, 0 below -10, x above 10 (8 at a time where
    this CPU has AVX2 and F16C: _gelu8)."""
    n8 = xv.size - xv.size % 8 if _AVX2 and _F16C else 0
    for i in range(0, n8, 8):
        _gelu8(xv.ctypes.data + 4 * i, dv.ctypes.data + 4 * i, table.ctypes.data)
    for i in range(n8, xv.size):
        v = xv[i]
        g = table[f16_bits(xb[i])]
        if v <= np.float32(-10.0):
            g = np.float32(0.0)
        elif v >= np.float32(10.0):
            g = v
        dv[i] = g


@numba.njit(**_opts)
def silu_seg(x, y, m, n):  # pragma: no cover - compiled
    """y = SiLU(x) over n floats: ggml_v_expf on the first m (whole vectors), libm expf on the rest."""
    for i in range(m):
        v = x[i]
        y[i] = v / (np.float32(1.0) + v_expf(-v))
    for i in range(m, n):
        v = x[i]
        y[i] = v / (np.float32(1.0) + libm_expf(-v))


@numba.njit(**_opts)
def _silu_row(xv, xb, table, dv):  # pragma: no cover - compiled
    """ggml_vec_silu_f32 on AVX2: x / (1 + exp(-x)), ggml_v_expf over whole vectors, libm for the rest."""
    n = xv.size
    silu_seg(xv, dv, n - n % LANES, n)


@numba.njit(**_opts)
def _tanh_row(xv, xb, table, dv):  # pragma: no cover - compiled
    for i in range(xv.size):
        dv[i] = np.float32(math.tanh(xv[i]))


@numba.njit(**_opts)
def _relu_row(xv, xb, table, dv):  # pragma: no cover - compiled
    for i in range(xv.size):
        v = xv[i]
        dv[i] = v if v > np.float32(0.0) else np.float32(0.0)


@numba.njit(**_opts)
def _exp_row(xv, xb, table, dv):  # pragma: no cover - compiled
    """ggml's op_exp (unary-ops.cpp): libm expf on every element, no vector path."""
    for i in range(xv.size):
        dv[i] = libm_expf(xv[i])


@numba.njit(**_opts)
def _sigmoid_row(xv, xb, table, dv):  # pragma: no cover - compiled
    """ggml's op_sigmoid: 1 / (1 + expf(-x)) with libm expf on every element."""
    for i in range(xv.size):
        dv[i] = np.float32(1.0) / (np.float32(1.0) + libm_expf(-xv[i]))


@numba.njit(**_opts)
def _neg_row(xv, xb, table, dv):  # pragma: no cover - compiled
    for i in range(xv.size):
        dv[i] = -xv[i]


@numba.njit(**_opts)
def _abs_row(xv, xb, table, dv):  # pragma: no cover - compiled
    for i in range(xv.size):
        dv[i] = abs(xv[i])


@numba.njit(**_opts)
def _sqr_row(xv, xb, table, dv):  # pragma: no cover - compiled
    """ggml_vec_sqr_f32 (SQR, an op of its own): x * x."""
    for i in range(xv.size):
        v = xv[i]
        dv[i] = v * v


@numba.njit(**_opts)
def _activation_rows(node, ith, nth, act_row, gated):  # pragma: no cover - compiled
    """dst = act(x) (UNARY) or act(x) * g (GLU: g from src1, or the other half of each src0 row)."""
    r = rec(node)
    table = numba.carray(f32p(r[AUX]), 65536)
    d, ne0, ne1, ne2 = r[T_DST], r[T_DST + 1], r[T_DST + 2], r[T_DST + 3]
    nb1, nb2, nb3 = r[T_DST + 6], r[T_DST + 7], r[T_DST + 8]
    a, na1, na2, na3 = r[T_SRC0], r[T_SRC0 + 6], r[T_SRC0 + 7], r[T_SRC0 + 8]
    b, nb11, nb12, nb13 = r[T_SRC1], r[T_SRC1 + 6], r[T_SRC1 + 7], r[T_SRC1 + 8]
    swapped = r[AUX + 1]
    ir0, ir1 = span(ne1 * ne2 * r[T_DST + 4], ith, nth)
    for ir in range(ir0, ir1):
        i1, i2, i3 = row_index(ir, ne1, ne2)
        dv = numba.carray(f32p(d + i1 * nb1 + i2 * nb2 + i3 * nb3), ne0)
        ap = a + i1 * na1 + i2 * na2 + i3 * na3
        if not gated:
            xv = numba.carray(f32p(ap), ne0)
            # in place (a SiLU over its ADD): one array, or the loop is not vectorized (see _binary); 5x slower
            if ap == dv.ctypes.data:
                act_row(xv, numba.carray(u32p(ap), ne0), table, xv)
            else:
                act_row(xv, numba.carray(u32p(ap), ne0), table, dv)
            continue
        if b != 0:
            xp, gp = ap, b + i1 * nb11 + i2 * nb12 + i3 * nb13
        elif swapped:
            xp, gp = ap + 4 * ne0, ap
        else:
            xp, gp = ap, ap + 4 * ne0
        gated_row(act_row, xp, gp, dv, table)


@numba.njit(**_opts)
def gated_row(act_row, xp, gp, dv, table):  # pragma: no cover - compiled
    """dv = act(x) * g over dv.size floats, x and g at addresses xp and gp (a GLU row, or a span of one)."""
    n = dv.size
    act_row(numba.carray(f32p(xp), n), numba.carray(u32p(xp), n), table, dv)
    gv = numba.carray(f32p(gp), n)
    for i in range(n):
        dv[i] = dv[i] * gv[i]


@jit_kernel
def k_reglu(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _activation_rows(node, ith, nth, _relu_row, True)


@jit_kernel
def k_geglu(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _activation_rows(node, ith, nth, _gelu_row, True)


@jit_kernel
def k_swiglu(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _activation_rows(node, ith, nth, _silu_row, True)


@jit_kernel
def k_relu(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _activation_rows(node, ith, nth, _relu_row, False)


@jit_kernel
def k_gelu(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _activation_rows(node, ith, nth, _gelu_row, False)


@jit_kernel
def k_silu(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _activation_rows(node, ith, nth, _silu_row, False)


@jit_kernel
def k_tanh(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _activation_rows(node, ith, nth, _tanh_row, False)


@jit_kernel
def k_exp(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _activation_rows(node, ith, nth, _exp_row, False)


@jit_kernel
def k_sigmoid(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _activation_rows(node, ith, nth, _sigmoid_row, False)


@jit_kernel
def k_neg(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _activation_rows(node, ith, nth, _neg_row, False)


@jit_kernel
def k_abs(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _activation_rows(node, ith, nth, _abs_row, False)


@jit_kernel
def k_sqr(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _activation_rows(node, ith, nth, _sqr_row, False)


_GLU = {GluOp.REGLU: k_reglu, GluOp.GEGLU: k_geglu, GluOp.SWIGLU: k_swiglu}
_UNARY = {UnaryOp.RELU: k_relu, UnaryOp.GELU: k_gelu, UnaryOp.SILU: k_silu, UnaryOp.TANH: k_tanh,
          UnaryOp.EXP: k_exp, UnaryOp.SIGMOID: k_sigmoid, UnaryOp.NEG: k_neg, UnaryOp.ABS: k_abs}
_TABLE_ADDR = int(_GELU_TABLE_F32.ctypes.data)


@selector(Op.GLU)
def _sel_glu(node: Tensor) -> Choice | None:
    a, b = node.src[0], node.src[1]
    k = _GLU.get(node.get_op_params_i32(0))
    if k is None or not all_f32(node, a, b) or not rows_contiguous(node, a, b):
        return None
    want = list(a.ne) if b is not None else [a.ne[0] // 2, *a.ne[1:]]
    if node.ne != want or (b is not None and b.ne != a.ne):
        return None
    if b is not None and b.data == node.data:
        return None  # the kernel writes act(x) before multiplying by g: g must not be the destination
    return Choice(k, ints=(_TABLE_ADDR, node.get_op_params_i32(1)))


@selector(Op.UNARY)
def _sel_unary(node: Tensor) -> Choice | None:
    a = node.src[0]
    k = _UNARY.get(node.get_op_params_i32(0))
    if k is None or not all_f32(node, a) or a.ne != node.ne or not rows_contiguous(node, a):
        return None
    return Choice(k, ints=(_TABLE_ADDR, 0))


@selector(Op.SQR)
def _sel_sqr(node: Tensor) -> Choice | None:
    a = node.src[0]
    if not all_f32(node, a) or a.ne != node.ne or not rows_contiguous(node, a):
        return None
    return Choice(k_sqr, ints=(_TABLE_ADDR, 0))


__all__ = ["all_f32", "aux_f32", "rows_contiguous"]
