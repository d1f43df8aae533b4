"""Compiled SSM_CONV and SSM_SCAN (F32), with ggml-cpu's loops and float order (ops.cpp,
ggml_compute_forward_ssm_conv_f32 / ggml_compute_forward_ssm_scan_f32 on AVX2).

SSM_CONV: each thread takes a share of the channels, a channel's tokens one after the other; every
output is a float sum, in order, of the window times the conv weights (not ggml's double-summing
vec_dot). SSM_SCAN: each thread takes a share of the heads and rolls their states token by token (a
head's tokens one after the other, so its state stays in cache), the first token reading the state
its sequence starts from (``ids``) and the later ones the state just written to the output. The
softplus of dt and the decays use the C library's expf/logf. Mamba-2 (a scalar decay per head) runs
ggml's vector loop where d_state allows (an LLVM intrinsic, two state rows a call): four
accumulators of 8 lanes over steps of 32, reduced as GGML_F32x8_REDUCE, then the leftover state
dims in float; Mamba-1 is ggml's scalar loop. As GCC builds ggml (``-ffp-contract=fast``),
``s0*dA + B*x_dt`` is one fma over the second product and ``sum += state*C`` an fma.

SSM_SCAN has seven sources; the record holds the first three (s, x, dt), the selector puts the
addresses of A, B, C and ids and the token and sequence strides of B and C in the AUX words, and
the group count as a float.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ....ops.enums import EMPTY_OPS, Op
from ....tensor import Tensor, TensorFlag
from ....types import GGMLType
from ..jit import Choice, Readers, jit_kernel, selector
from ..jit.mathf import LANES, libm_expf
from ..jit.record import AUX, T_DST, T_SRC0, T_SRC1, T_SRC2, aux_f32, params_i32, rec, row_at, span
from ..native import f32p, fmaf, i32p
from ..simd import _fma, _host_has, _splat
from . import elementwise_jit as elementwise
from . import rows_jit as rows
from .rows_jit import set_rows_at

F32, I32 = GGMLType.F32, GGMLType.I32
_opts = {"inline": "always", "cache": True, "error_model": "numpy"}
#: float32 index of the first selector float in the AUX words (record.AUX + 8 words in)
_F0 = 16
#: ggml's GGML_F32_STEP on AVX2: 4 vectors of 8 lanes
_STEP = 32
#: SSM_SCAN (Mamba-2): state rows updated together, sharing the loads of B and C and overlapping their sums'
#: reductions (one thread, 128 tokens of a 64 x 128 x 32-head layer: 4.4 ms a row at a time, 3.7 two, 5.5 four)
SCAN_ROWS = 2


@numba.njit(**_opts)
def _conv(r, ir0, ir1):  # pragma: no cover - compiled
    """SSM_CONV (record words ``r``) of channels [ir0, ir1)."""
    sx, nb01, nb02 = r[T_SRC0], r[T_SRC0 + 6], r[T_SRC0 + 7]
    w, nc, nb11 = r[T_SRC1], r[T_SRC1 + 1], r[T_SRC1 + 6]
    d, n_t, n_s = r[T_DST], r[T_DST + 2], r[T_DST + 3]
    nb1, nb2 = r[T_DST + 6], r[T_DST + 7]
    # channel by channel, the tokens inside: a channel's window row is read once, in order, where ggml's
    # token-outer loop touches every channel's row (a cache line each) for every token; the outputs of a
    # channel go to n_t rows that the next channel's fill in turn (same values: each output is the same sum)
    for i3 in range(n_s):
        for i1 in range(ir0, ir1):
            row = numba.carray(f32p(sx + i1 * nb01 + i3 * nb02), n_t + nc - 1)
            c = numba.carray(f32p(w + i1 * nb11), nc)
            o = d + i3 * nb2 + i1 * 4
            for i2 in range(n_t):
                sumf = np.float32(0.0)
                for i0 in range(nc):
                    sumf += row[i2 + i0] * c[i0]
                f32p(o + i2 * nb1)[0] = sumf


@jit_kernel
def k_ssm_conv(node, ith, nth, ctrl):  # pragma: no cover - compiled
    r = rec(node)
    ir0, ir1 = span(r[T_DST + 1], ith, nth)
    _conv(r, ir0, ir1)


@jit_kernel
def k_ssm_conv_bias(node, ith, nth, ctrl):  # pragma: no cover - compiled
    """SSM_CONV, the ADD of its bias and (when the record is a UNARY's) the SiLU of that (a Mamba layer's
    conv, fuse_ssm_conv_bias): each thread adds the bias to, and takes the SiLU of, the outputs of its own
    channels, a row segment per token, right after their conv, so no barrier between; each node's output
    gets the bits of its own kernel (the float sum, the float add, elementwise_jit's SiLU: ggml_v_expf on a
    row's whole vectors of LANES, libm expf on the rest). Parts: the SSM_CONV's record, then the ADD's."""
    r = rec(node)
    silu = r[0] == _OP_UNARY
    rc = rec(r[AUX])
    ra = rec(r[AUX + 1]) if silu else r
    nr, n_t, n_s = rc[T_DST + 1], rc[T_DST + 2], rc[T_DST + 3]
    ir0, ir1 = span(nr, ith, nth)
    _conv(rc, ir0, ir1)
    n = ir1 - ir0
    m = min(n, max(0, nr - nr % LANES - ir0))  # this segment's elements in the row's whole vectors
    bias = numba.carray(f32p(ra[T_SRC1] + ir0 * 4), n)
    for i3 in range(n_s):
        for i2 in range(n_t):
            xc = row_at(rc, T_DST, i2, i3, 0) + ir0 * 4
            xa = row_at(ra, T_DST, i2, i3, 0) + ir0 * 4
            conv = numba.carray(f32p(xc), n)
            add = numba.carray(f32p(xa), n)
            if xa == xc:  # in place: one array, so that LLVM vectorizes (elementwise_jit._binary)
                for i in range(n):
                    conv[i] = conv[i] + bias[i]
            else:
                for i in range(n):
                    add[i] = conv[i] + bias[i]
            if not silu:
                continue
            xu = row_at(r, T_DST, i2, i3, 0) + ir0 * 4
            if xu == xa:
                elementwise.silu_seg(add, add, m, n)
            else:
                elementwise.silu_seg(add, numba.carray(f32p(xu), n), m, n)


_OP_UNARY = int(Op.UNARY)


@selector(Op.SSM_CONV)
def _sel_ssm_conv(node: Tensor) -> Choice | None:
    sx, c = node.src[0], node.src[1]
    if not (sx.type == c.type == node.type == F32) or not node.is_contiguous():
        return None
    if sx.nb[0] != 4 or c.nb[0] != 4 or sx.nb[1] != sx.ne[0] * 4:
        return None
    return Choice(k_ssm_conv)


@numba.njit(**_opts)
def _softplus(x):  # pragma: no cover - compiled
    """ggml_compute_softplus_f32: x above 20, else logf(1 + expf(x))."""
    if x > np.float32(20.0):
        return x
    return np.float32(math.log(np.float32(1.0) + libm_expf(x)))


_F32T = ir.FloatType()
_I32T = ir.IntType(32)
_I64T = ir.IntType(64)


def _state_rows(rows: int, stream: bool = False):
    """state_rows(s0, s, b, c, da, x, dt_sp, nc, y): ``rows`` consecutive rows of a Mamba-2 state (nc floats
    each; addresses): row r gets s[i] = s0[i]*dA + B[i]*x_dt with x_dt = x[r]*dt_sp, and y[r] = sum(s*C) in
    ggml's AVX2 order: four <8 x float> fma accumulators over steps of 32, GGML_F32x8_REDUCE (x0+x2, x1+x3,
    then x0+x1, the two halves, two horizontal adds), then the leftover dims in float. Rows are independent
    (their own accumulators); several a call share each load of B and C and overlap their reductions.

    ``stream``: the vector stores of s are non-temporal (s must be 32-byte aligned, nc a multiple of 8): a
    decode writes each new state once, into a row nothing reads before the next token, and a Mamba-2's
    states (a megabyte a layer, twice: the rows read and the rows written) do not stay in the caches between
    tokens anyway, so an ordinary store first reads every line it writes from memory, a third of the scan's
    traffic. The caller fences (_sfence) before anything reads them."""

    def typer(typingctx, s0, s, b, c, da, x, dt_sp, nc, y):
        sig = types.void(types.int64, types.int64, types.int64, types.int64, types.float32, types.int64,
                         types.float32, types.int64, types.int64)

        def codegen(context, builder, sig, args):
            f8 = ir.VectorType(_F32T, 8)
            fptr = _F32T.as_pointer()
            p_s0, p_s, p_b, p_c = (builder.inttoptr(a, fptr) for a in args[:4])
            da, p_x, dt_sp, n, p_y = args[4], builder.inttoptr(args[5], fptr), args[6], args[7], \
                builder.inttoptr(args[8], fptr)
            x_dt = [builder.fmul(builder.load(builder.gep(p_x, [ir.Constant(_I64T, r)])), dt_sp) for r in range(rows)]
            vda, vxdt = _splat(builder, da, 8), [_splat(builder, v, 8) for v in x_dt]
            row_off = [builder.mul(n, ir.Constant(_I64T, r)) for r in range(rows)]

            def at(base, i, vec=True):
                ptr = builder.gep(base, [i])
                return builder.bitcast(ptr, f8.as_pointer()) if vec else ptr

            nontemporal = builder.module.add_metadata([ir.Constant(_I32T, 1)])

            nsteps = builder.sdiv(n, ir.Constant(_I64T, _STEP))
            accs = [[cgutils.alloca_once_value(builder, ir.Constant(f8, [0.0] * 8)) for _ in range(4)]
                    for _ in range(rows)]
            with cgutils.for_range(builder, nsteps) as loop:
                i0 = builder.mul(loop.index, ir.Constant(_I64T, _STEP))
                for j in range(4):
                    o = builder.add(i0, ir.Constant(_I64T, 8 * j))
                    bv, cv = builder.load(at(p_b, o), align=4), builder.load(at(p_c, o), align=4)
                    for r in range(rows):
                        ro = builder.add(o, row_off[r])
                        v = _fma(builder, builder.load(at(p_s0, ro), align=4), vda, builder.fmul(bv, vxdt[r]))
                        acc = accs[r][j]
                        builder.store(_fma(builder, v, cv, builder.load(acc)), acc)
                        st = builder.store(v, at(p_s, ro), align=32 if stream else 4)
                        if stream:
                            st.set_metadata("nontemporal", nontemporal)

            def pick(v, idx):
                return builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                              ir.Constant(ir.VectorType(_I32T, len(idx)), idx))

            totals = []
            for r in range(rows):
                x0, x1, x2, x3 = (builder.load(a) for a in accs[r])
                x0 = builder.fadd(builder.fadd(x0, x2), builder.fadd(x1, x3))
                t0 = builder.fadd(pick(x0, [0, 1, 2, 3]), pick(x0, [4, 5, 6, 7]))
                t1 = builder.fadd(pick(t0, [0, 2]), pick(t0, [1, 3]))
                red = builder.fadd(builder.extract_element(t1, ir.Constant(_I32T, 0)),
                                   builder.extract_element(t1, ir.Constant(_I32T, 1)))
                totals.append(cgutils.alloca_once_value(builder, red))
            start = builder.mul(nsteps, ir.Constant(_I64T, _STEP))
            with cgutils.for_range_slice(builder, start, n, ir.Constant(_I64T, 1), inc=True) as (i, _):
                for r in range(rows):
                    ri = builder.add(i, row_off[r])
                    v = _fma(builder, builder.load(at(p_s0, ri, False)), da,
                             builder.fmul(builder.load(at(p_b, i, False)), x_dt[r]))
                    builder.store(_fma(builder, v, builder.load(at(p_c, i, False)), builder.load(totals[r])),
                                  totals[r])
                    builder.store(v, at(p_s, ri, False))
            for r in range(rows):
                builder.store(builder.load(totals[r]), builder.gep(p_y, [ir.Constant(_I64T, r)]))
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(typer)


#: Mamba-2 state rows per call (SCAN_ROWS), and the odd last one; the same with non-temporal stores
_state_rows_n, _state_rows_1 = _state_rows(SCAN_ROWS), _state_rows(1)
_stream_rows_n, _stream_rows_1 = _state_rows(SCAN_ROWS, True), _state_rows(1, True)
_SSE = _host_has("sse")


@intrinsic
def _sfence(typingctx):
    """sfence: the non-temporal stores before it are visible before any store after it (the barrier's)."""
    sig = types.void()

    def codegen(context, builder, sig, args):
        if _SSE:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse.sfence")
            builder.call(fn, [])
        else:  # another CPU, or a portable build: a full fence (an mfence on x86) orders them as well
            builder.fence("seq_cst")
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(**_opts)
def _scan(node, ith, nth, ctrl, store):  # pragma: no cover - compiled
    """SSM_SCAN of the record at ``node``; with ``store`` (a SET_ROWS record writing the scan's new states into
    the rows of a state tensor, see fuse_ssm_scan_set_rows) the states go to those rows instead of the scan's
    output. Straight there when no sequence's destination row is a row another sequence reads its state
    from; otherwise into the output first, and each thread then copies its heads' states over (they are
    the only ones it read)."""
    r = rec(node)
    aux = r[AUX:]
    a_p, b_p, c_p, ids_p = aux[0], aux[1], aux[2], aux[3]
    bnb2, bnb3, cnb2, cnb3 = aux[4], aux[5], aux[6], aux[7]
    ng = np.int64(aux_f32(node)[_F0])
    a_ne0 = np.int64(aux_f32(node)[_F0 + 1])
    k_slots = max(np.int64(1), np.int64(params_i32(node)[0]))
    s_src, nc, nr, snb3 = r[T_SRC0], r[T_SRC0 + 1], r[T_SRC0 + 2], r[T_SRC0 + 8]
    x_p, nh, nt, ns = r[T_SRC1], r[T_SRC1 + 2], r[T_SRC1 + 3], r[T_SRC1 + 4]
    xnb2, xnb3 = r[T_SRC1 + 7], r[T_SRC1 + 8]
    dt_p, dtnb1, dtnb2 = r[T_SRC2], r[T_SRC2 + 6], r[T_SRC2 + 7]
    d = r[T_DST]
    s_off = nr * nh * nt * ns * 4
    ids = numba.carray(i32p(ids_p), ns)
    a = numba.carray(f32p(a_p), a_ne0 * nh)
    ih0, ih1 = span(nh, ith, nth)
    hpg = nh // ng
    row = nr * nc  # one head's state, in floats
    direct = store != 0
    if direct:
        for i3 in range(ns):
            _, to = set_rows_at(store, ctrl, i3, True)
            if to == 0:  # an index out of range (flagged in the control block)
                return
            for j3 in range(ns):
                if j3 != i3 and abs(to - (s_src + ids[j3] * snb3)) < snb3:
                    direct = False
    # head by head, the tokens inside: a head's state (row floats) stays in cache from token to token, where
    # ggml's token-outer loop streams every head's state through memory once per token (same values: each
    # state element sees the same operations in the same order)
    fence = False
    for i3 in range(ns):
        s_seq = d + i3 * snb3 + s_off
        if direct:
            _, s_seq = set_rows_at(store, ctrl, i3, True)
        # a decode's states straight into another row: non-temporal stores (see _state_rows)
        stream = direct and nt == 1 and nc % 8 == 0 and s_seq % 32 == 0 and s_seq != s_src + ids[i3] * snb3
        fence = fence or stream
        for h in range(ih0, ih1):
            g = h // hpg
            s0_base = s_src + ids[i3] * snb3
            s_base = s_seq
            for i2 in range(nt):
                x_at, y_at = x_p + i2 * xnb2 + i3 * xnb3, d + i2 * nh * nr * 4 + i3 * nt * nh * nr * 4
                dt = numba.carray(f32p(dt_p + i2 * dtnb1 + i3 * dtnb2), nh)
                b_row = b_p + i2 * bnb2 + i3 * bnb3
                c_row = c_p + i2 * cnb2 + i3 * cnb3
                dt_sp = _softplus(dt[h])
                if a_ne0 == 1:  # Mamba-2: one decay per head
                    da = libm_expf(dt_sp * a[h])
                    i1 = 0
                    while i1 < nr:
                        ii = i1 + h * nr
                        at = ii * nc * 4
                        if i1 + SCAN_ROWS <= nr:
                            if stream:
                                _stream_rows_n(s0_base + at, s_base + at, b_row + g * nc * 4, c_row + g * nc * 4,
                                               da, x_at + ii * 4, dt_sp, nc, y_at + ii * 4)
                            else:
                                _state_rows_n(s0_base + at, s_base + at, b_row + g * nc * 4, c_row + g * nc * 4,
                                              da, x_at + ii * 4, dt_sp, nc, y_at + ii * 4)
                            i1 += SCAN_ROWS
                        elif stream:
                            _stream_rows_1(s0_base + at, s_base + at, b_row + g * nc * 4, c_row + g * nc * 4, da,
                                           x_at + ii * 4, dt_sp, nc, y_at + ii * 4)
                            i1 += 1
                        else:
                            _state_rows_1(s0_base + at, s_base + at, b_row + g * nc * 4, c_row + g * nc * 4, da,
                                          x_at + ii * 4, dt_sp, nc, y_at + ii * 4)
                            i1 += 1
                else:  # Mamba-1: one decay per state dim, the scalar loop
                    b = numba.carray(f32p(b_row + g * nc * 4), nc)
                    c = numba.carray(f32p(c_row + g * nc * 4), nc)
                    x = numba.carray(f32p(x_at), nr * nh)
                    y = numba.carray(f32p(y_at), nr * nh)
                    for i1 in range(nr):
                        ii = i1 + h * nr
                        x_dt = x[ii] * dt_sp
                        s0 = numba.carray(f32p(s0_base + ii * nc * 4), nc)
                        st = numba.carray(f32p(s_base + ii * nc * 4), nc)
                        sumf = np.float32(0.0)
                        for i0 in range(nc):
                            v = fmaf(s0[i0], libm_expf(dt_sp * a[i0 + h * nc]), b[i0] * x_dt)
                            sumf = fmaf(v, c[i0], sumf)
                            st[i0] = v
                        y[ii] = sumf
                slot = nt - 1 - i2
                if k_slots > 1 and 0 < slot < k_slots:  # a rollback snapshot: this head's state after token i2
                    snap = d + s_off + (slot * ns + i3) * snb3
                    src = numba.carray(f32p(s_base + h * row * 4), row)
                    dst = numba.carray(f32p(snap + h * row * 4), row)
                    for j in range(row):
                        dst[j] = src[j]
                s0_base = s_base  # later tokens read the state just written
    if fence:
        _sfence()
    if store != 0 and not direct:
        for i3 in range(ns):
            _, to = set_rows_at(store, ctrl, i3, True)
            src = numba.carray(f32p(d + i3 * snb3 + s_off + ih0 * row * 4), (ih1 - ih0) * row)
            dst = numba.carray(f32p(to + ih0 * row * 4), (ih1 - ih0) * row)
            for j in range((ih1 - ih0) * row):
                dst[j] = src[j]


@jit_kernel
def k_ssm_scan(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _scan(node, ith, nth, ctrl, 0)


@jit_kernel
def k_ssm_scan_set_rows(node, ith, nth, ctrl):  # pragma: no cover - compiled
    """The fused record is the SET_ROWS's; the SSM_SCAN's record is its part (AUX word 0)."""
    _scan(rec(node)[AUX], ith, nth, ctrl, node)


def _packed(t: Tensor) -> bool:
    return t.nb[0] == 4 and t.nb[1] == t.ne[0] * 4


@selector(Op.SSM_SCAN)
def _sel_ssm_scan(node: Tensor) -> Choice | None:
    s, x, dt, a, b, c, ids = node.src[:7]
    if not all(t.type == F32 for t in (node, s, x, dt, a, b, c)) or ids.type != I32:
        return None
    if not (s.is_contiguous() and a.is_contiguous() and ids.is_contiguous() and _packed(x) and _packed(b)
            and _packed(c) and dt.nb[0] == 4 and node.is_contiguous()):
        return None
    if x.nb[1] != x.ne[0] * 4 or s.nb[3] != s.ne[0] * s.ne[1] * s.ne[2] * 4:
        return None
    ints = (a.data, b.data, c.data, ids.data, b.nb[2], b.nb[3], c.nb[2], c.nb[3])
    return Choice(k_ssm_scan, ints=ints, floats=(float(b.ne[1]), float(a.ne[0])))


def _is_view_of(n: Tensor, t: Tensor) -> bool:
    return n.op in EMPTY_OPS and n.src[0] is t


def _views_of(t: Tensor, readers: Readers) -> list[Tensor]:
    """``t`` and every view of it (views of views too) in the graph."""
    out, todo = [], [t]
    while todo:
        v = todo.pop()
        out.append(v)
        todo.extend(n for n in readers(v) if _is_view_of(n, v))
    return out


def fuse_ssm_scan_set_rows(prev: Tensor, prev_choice: Choice, node: Tensor, choice: Choice,
                           readers: Readers) -> Choice | None:
    """An SSM_SCAN whose new states (all of them: its output after y) the next node, a SET_ROWS with I64
    indices, writes into a state tensor's rows (llm/graph.py's store of a Mamba layer's s states): the scan
    writes them into those rows itself, a pass over the states (a megabyte a layer) saved. The scan's own
    output then holds y only, so the fusion needs the SET_ROWS to be the only reader of the states there (no
    other node, no graph output); the rest of the output is written as the scan's kernel writes it."""
    if prev_choice.kernel is not k_ssm_scan or choice.kernel is not rows.k_set_rows_f32_i64:
        return None
    src, idx = node.src[0], node.src[1]
    x = prev.src[1]
    y_bytes = x.nelements() * 4
    n_seqs = x.ne[3]
    states = prev.src[0]
    if int(prev.op_params.view(np.int32)[0]) > 1 or prev.nbytes() != y_bytes + states.nb[3] * n_seqs:
        return None  # rollback snapshots after the states: not this layout
    if not (src.is_contiguous() and src.data == prev.data + y_bytes and src.ne[0] * 4 == states.nb[3]
            and src.ne[1] == n_seqs and src.ne[2] == src.ne[3] == 1 and idx.is_contiguous()):
        return None
    lo, hi = prev.data + y_bytes, prev.data + prev.nbytes()
    for v in _views_of(prev, readers):
        if v.flags & TensorFlag.OUTPUT:
            return None
        if v.data + v.nbytes() <= lo or v.data >= hi:
            continue  # y only
        if any(n is not node and not _is_view_of(n, v) for n in readers(v)):
            return None  # another node reads the states
    return Choice(k_ssm_scan_set_rows, parts=((prev, prev_choice),))


def _same_rows_f32(a: Tensor, b: Tensor) -> bool:
    """Same shape, F32, each row's floats packed (the fused kernel walks rows of both with one index)."""
    return a.type == b.type == F32 and list(a.ne) == list(b.ne) and a.nb[0] == b.nb[0] == 4


def fuse_ssm_conv_bias(prev: Tensor, prev_choice: Choice, node: Tensor, choice: Choice,
                       readers: Readers) -> Choice | None:
    """A Mamba layer's conv, the ADD of its bias and the SiLU of that (llama.cpp's graph; ggml's CUDA backend
    fuses the same three): SSM_CONV + ADD, then + UNARY SiLU, one record (k_ssm_conv_bias) where each thread
    adds the bias to, and takes the SiLU of, the outputs of its own channels: two barriers and two passes over
    the layer's conv outputs saved."""
    if prev_choice.kernel is k_ssm_conv and choice.kernel is elementwise.k_add:
        bias = node.src[1]
        if (node.src[0] is prev and _same_rows_f32(prev, node) and bias.type == F32
                and list(bias.ne) == [prev.ne[0], 1, 1, 1] and bias.nb[0] == 4):
            return Choice(k_ssm_conv_bias, parts=((prev, prev_choice),))
        return None
    if (prev_choice.kernel is k_ssm_conv_bias and len(prev_choice.parts) == 1 and choice.kernel is elementwise.k_silu
            and node.src[0] is prev and _same_rows_f32(prev, node)):
        return Choice(k_ssm_conv_bias, parts=(*prev_choice.parts, (prev, Choice(elementwise.k_add))))
    return None
