"""Compiled MUL_MAT of F16/F32 weights (attention's KQ and KQV against the F16 cache), and ggml's
chunk rule the quantized products share.

src1 rows are rounded to fp16 first when the weight is F16 (ggml's vec_dot_type F16). Decode-size
products (up to DOUBLE_MAX_COLS src1 columns) sum each output in double, so a sequence gets the same
bits whichever cells its tokens took and whatever shares its batch. Prompts compute as llama.cpp does
on x86 with AVX2: llamafile's tinyBLAS register tiles (one 8-lane fma accumulator per output) where it
takes the product, one ggml_vec_dot_f16/_f32 per output (four accumulators) elsewhere. Neither
depends on the thread count, the other columns or masked cells past the live ones, so a prompt's
attention does not change with the batch's shape.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ....quants.jitcache import variant
from ....tensor import Tensor
from ....types import GGMLType
from ..jit import Choice, jit_kernel, lean_unless_ready
from ..jit.record import AUX, T_DST, T_SRC0, T_SRC1, n_chunks, rec, row_index, span
from ..native import atomic_add, atomic_store, f32p, i64p, u16p, u32p
from ..simd import _AVX512, _F16C, TAB_ADDR, _fma, _hsum8, bf16_bits, f16_bits, f16_round8
from ..threads import C_CHUNK, C_WDATA, available_cores, barrier

F32, F16, BF16 = GGMLType.F32, GGMLType.F16, GGMLType.BF16
_opts = {"inline": "always", "cache": True, "error_model": "numpy"}
_F32T = ir.FloatType()
_I64 = ir.IntType(64)
_LANES = 16


#: the float weight kinds: fp16, bf16 (their bits, as i16: LLVM's bfloat needs no AVX512-BF16 this way), f32
_F16K, _BF16K, _F32K = "f16", "bf16", "f32"


def _elem_type(kind: str) -> ir.Type:
    return {_F16K: ir.HalfType(), _BF16K: ir.IntType(16), _F32K: _F32T}[kind]


def _widen(builder: ir.IRBuilder, v: ir.Value, kind: str) -> ir.Value:
    """Stored weights (a scalar or a vector) as float32, exactly: fp16 fpext, bf16 its bits shifted up 16."""
    if kind == _F16K:
        return builder.fpext(v, ir.VectorType(_F32T, v.type.count) if isinstance(v.type, ir.VectorType) else _F32T)
    if kind == _BF16K:
        vec = isinstance(v.type, ir.VectorType)
        i32 = ir.VectorType(ir.IntType(32), v.type.count) if vec else ir.IntType(32)
        bits = builder.shl(builder.zext(v, i32), ir.Constant(i32, [16] * v.type.count) if vec else ir.Constant(i32, 16))
        return builder.bitcast(bits, ir.VectorType(_F32T, v.type.count) if vec else _F32T)
    return v


def _load_lanes(builder: ir.IRBuilder, base: ir.Value, i: ir.Value, kind: str, n: int = 8) -> ir.Value:
    """n (8 or 16) weights from element i of ``base`` (fp16, bf16 or f32) as <n x float>."""
    v = builder.load(builder.bitcast(builder.gep(base, [i]), ir.VectorType(_elem_type(kind), n).as_pointer()),
                     align=4 if kind == _F32K else 2)
    return _widen(builder, v, kind)


def _dot_intrinsic(kind: str):
    """dot(w_addr, x_addr, n) -> float32: sum w[i]*x[i], w fp16, bf16 or f32 (kind), x f32, for decode-size
    products (at most DOUBLE_MAX_COLS src1 columns).

    Products and sums are in double (16 lanes, a fixed pairwise tree), rounded to float once. Why
    double: these are attention's products, where most terms are masked zeros and which cells hold
    the live ones depends on where a sequence's tokens landed in the cache. Float lanes would sum
    the same numbers in an order set by those cell indices, so the same sequence would get other
    last bits next to other sequences; a double sum of a few float products is exact, so it does not.
    """

    def typer(typingctx, w, x, n):
        sig = types.float32(types.int64, types.int64, types.int64)

        def codegen(context, builder, sig, args):
            wty = _elem_type(kind)
            f64 = ir.DoubleType()
            vw = ir.VectorType(wty, _LANES)
            vf = ir.VectorType(_F32T, _LANES)
            vd = ir.VectorType(f64, _LANES)
            wbase = builder.inttoptr(args[0], wty.as_pointer())
            xbase = builder.inttoptr(args[1], _F32T.as_pointer())
            n = args[2]
            nv = builder.sdiv(n, ir.Constant(_I64, _LANES))
            acc = cgutils.alloca_once_value(builder, ir.Constant(vd, [0.0] * _LANES))
            with cgutils.for_range(builder, nv) as loop:
                i = builder.mul(loop.index, ir.Constant(_I64, _LANES))
                wv = builder.load(builder.bitcast(builder.gep(wbase, [i]), vw.as_pointer()),
                                  align=4 if kind == _F32K else 2)
                xv = builder.load(builder.bitcast(builder.gep(xbase, [i]), vf.as_pointer()), align=4)
                prod = builder.fmul(builder.fpext(_widen(builder, wv, kind), vd), builder.fpext(xv, vd))
                builder.store(builder.fadd(builder.load(acc), prod), acc)
            tail = cgutils.alloca_once_value(builder, ir.Constant(f64, 0.0))
            start = builder.mul(nv, ir.Constant(_I64, _LANES))
            with cgutils.for_range_slice(builder, start, n, ir.Constant(_I64, 1), inc=True) as (i, _):
                wi = builder.fpext(_widen(builder, builder.load(builder.gep(wbase, [i])), kind), f64)
                xi = builder.fpext(builder.load(builder.gep(xbase, [i])), f64)
                builder.store(builder.fadd(builder.load(tail), builder.fmul(wi, xi)), tail)
            v = builder.load(acc)
            width = _LANES
            while width > 1:  # fixed pairwise tree: lanes [0, w/2) + [w/2, w)
                width //= 2
                lo = builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                            ir.Constant(ir.VectorType(ir.IntType(32), width), list(range(width))))
                hi = builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                            ir.Constant(ir.VectorType(ir.IntType(32), width),
                                                        list(range(width, 2 * width))))
                v = builder.fadd(lo, hi)
            s = builder.fadd(builder.extract_element(v, ir.Constant(ir.IntType(32), 0)), builder.load(tail))
            return builder.fptrunc(s, _F32T)

        return sig, codegen

    return intrinsic(typer)


dot_f16_f32, dot_bf16_f32, dot_f32_f32 = (_dot_intrinsic(k) for k in (_F16K, _BF16K, _F32K))


def _vec_dot_intrinsic(kind: str):
    """vec_dot(w_addr, x_addr, n) -> float32: ggml_vec_dot_f16 / _f32 on AVX2, the product ggml takes
    for one src1 column (and where llamafile's tinyBLAS declines); bf16 weights the same way (ggml's
    vec_dot_bf16 sums the same exact products, in another order).

    Four <8 x float> accumulators over steps of 32 (fma), reduced as GGML_F32x8_REDUCE (x0+x2, x1+x3,
    then x0+x1, the two 128-bit halves added, two horizontal adds); leftovers added in double for
    fp16 weights (ggml_float) and in float for f32 weights, as vec.cpp does. With AVX-512 the four are
    two 16-lane registers, [x0|x1] and [x2|x3], each lane taking the same fmas: half the conversions and
    fmas issued (attention's scores; F16 weights' products)."""

    def typer(typingctx, w, x, n):
        sig = types.float32(types.int64, types.int64, types.int64)

        def codegen(context, builder, sig, args):
            half = kind != _F32K  # leftovers in double, as ggml_vec_dot_f16/bf16 (ggml_float)
            wty = _elem_type(kind)
            wbase = builder.inttoptr(args[0], wty.as_pointer())
            xbase = builder.inttoptr(args[1], _F32T.as_pointer())
            n = args[2]
            nsteps = builder.sdiv(n, ir.Constant(_I64, 32))
            i32 = ir.IntType(32)

            def pick(v, idx):
                return builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                              ir.Constant(ir.VectorType(i32, len(idx)), idx))

            width = 16 if _AVX512 else 8  # lanes a register: the accumulators x0..x3 two or one to a register
            fw = ir.VectorType(_F32T, width)
            accs = [cgutils.alloca_once_value(builder, ir.Constant(fw, [0.0] * width)) for _ in range(32 // width)]
            with cgutils.for_range(builder, nsteps) as loop:
                i = builder.mul(loop.index, ir.Constant(_I64, 32))
                for j, acc in enumerate(accs):
                    o = builder.add(i, ir.Constant(_I64, width * j))
                    xv = builder.load(builder.bitcast(builder.gep(xbase, [o]), fw.as_pointer()), align=4)
                    wv = _load_lanes(builder, wbase, o, kind, width)
                    builder.store(_fma(builder, wv, xv, builder.load(acc)), acc)
            if width == 16:  # [x0|x1] + [x2|x3], then its halves: (x0 + x2) + (x1 + x3)
                x02_13 = builder.fadd(builder.load(accs[0]), builder.load(accs[1]))
                x0 = builder.fadd(pick(x02_13, list(range(8))), pick(x02_13, list(range(8, 16))))
            else:
                x0, x1, x2, x3 = (builder.load(a) for a in accs)
                x0 = builder.fadd(builder.fadd(x0, x2), builder.fadd(x1, x3))

            t0 = builder.fadd(pick(x0, [0, 1, 2, 3]), pick(x0, [4, 5, 6, 7]))
            t1 = builder.fadd(pick(t0, [0, 2]), pick(t0, [1, 3]))  # hadd: (t0+t1, t2+t3)
            red = builder.fadd(builder.extract_element(t1, ir.Constant(i32, 0)),
                               builder.extract_element(t1, ir.Constant(i32, 1)))
            start = builder.mul(nsteps, ir.Constant(_I64, 32))
            f64 = ir.DoubleType()
            tail = cgutils.alloca_once_value(builder, builder.fpext(red, f64) if half else red)
            with cgutils.for_range_slice(builder, start, n, ir.Constant(_I64, 1), inc=True) as (i, _):
                wi = _widen(builder, builder.load(builder.gep(wbase, [i])), kind)
                xi = builder.load(builder.gep(xbase, [i]))
                if half:  # (ggml_float)(x*y): the float product, widened
                    builder.store(builder.fadd(builder.load(tail), builder.fpext(builder.fmul(wi, xi), f64)), tail)
                else:  # sumf += x*y, contracted to an fma by the compiler
                    builder.store(_fma(builder, wi, xi, builder.load(tail)), tail)
            res = builder.load(tail)
            return builder.fptrunc(res, _F32T) if half else res

        return sig, codegen

    return intrinsic(typer)


vec_dot_f16, vec_dot_bf16, vec_dot_f32 = (_vec_dot_intrinsic(k) for k in (_F16K, _BF16K, _F32K))

#: src1 columns (per plane) up to which attention's F16/F32 products sum in double: decode steps, where the cells a
#: sequence's tokens landed in vary with the batch (see _dot_intrinsic). A product of one plane by one plane (a
#: model's weight by its activations: no cells, and each output on its own) takes ggml's vec_dot instead (four fma
#: chains: Gemma 3 270M F16 decode ran at 0.59x llama.cpp on the double sums' one chain). The rule reads shapes
#: only, so an RPC server, which does not know which buffers hold weights, computes what the client would.
DOUBLE_MAX_COLS = 16
#: weight bytes a tile group keeps in L1 while all src1 columns pass it (half a 32 KB L1; the group is
#: copied once into a thread's scratch in the tiles' layout, as f32: twice that for fp16 weights)
_L1_WEIGHT_BYTES = 8 * 1024
#: the register tile: 4 weight rows by TILE_N src1 columns, one accumulator each (tinyBLAS takes 4 x 3 on
#: 16-register x86; the tile's shape does not change any output's bits: 4 x 2 where 4 x 3 would spill the
#: 16 ymm registers, 4 x 5 with AVX-512's 32)
TILE_M, TILE_N = 4, (5 if _AVX512 else 2)


def _fma16(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
    """a*b + c over <16 x float>: one 64-byte vfmadd with AVX-512 (the intrinsic keeps LLVM from splitting
    it in two for CPUs it tunes for 256-bit vectors), else llvm.fma (two 32-byte ones)."""
    if _AVX512:
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(a.type, [a.type] * 3 + [ir.IntType(32)]), "llvm.x86.avx512.vfmadd.ps.512")
        return builder.call(fn, [a, b, c, ir.Constant(ir.IntType(32), 4)])  # 4: the current rounding mode
    return _fma(builder, a, b, c)


def _tile_intrinsic(rn: int):
    """tile(w_addr, x_addr, x_stride, k, d_addr, d_stride_row, d_stride_col): the TILE_M x rn outputs of
    llamafile's tinyBLAS<8, __m256> (F32, or F16 weights and src1 widened from fp16 exactly): one 8-lane
    accumulator per output, fma over k in steps of 8, hsum at the end. The weights are a tile of
    _group_rows's layout: per step of 8 values, rows (0, 1) then (2, 3) side by side in 16 floats, so
    one 64-byte fma advances two outputs (half the instructions of two 32-byte ones: f16 512x256 by 512
    rows, one thread, 78 -> 100 GFLOP/s on this project's Xeon); each output's lanes take the same fmas
    in the same order. Strides in bytes."""
    pairs = TILE_M // 2

    def typer(typingctx, w, x, xs, k, d, dr, dc):
        sig = types.void(*([types.int64] * 7))

        def codegen(context, builder, sig, args):
            w_a, x_a, xs_v, k_v, d_a, dr_v, dc_v = args
            f8, f16 = ir.VectorType(_F32T, 8), ir.VectorType(_F32T, 16)
            i32 = ir.IntType(32)
            wp = builder.inttoptr(w_a, _F32T.as_pointer())
            xrow = [builder.inttoptr(builder.add(x_a, builder.mul(xs_v, ir.Constant(_I64, j))), _F32T.as_pointer())
                    for j in range(rn)]
            accs = [[cgutils.alloca_once_value(builder, ir.Constant(f16, [0.0] * 16)) for _ in range(pairs)]
                    for _ in range(rn)]
            twice = ir.Constant(ir.VectorType(i32, 16), list(range(8)) * 2)
            nsteps = builder.sdiv(k_v, ir.Constant(_I64, 8))
            with cgutils.for_range(builder, nsteps) as loop:
                o = builder.mul(loop.index, ir.Constant(_I64, 8))
                wv = [builder.load(builder.bitcast(builder.gep(wp, [builder.add(builder.mul(o, ir.Constant(_I64, 4)),
                                                                                  ir.Constant(_I64, 16 * p))]),
                                                   f16.as_pointer()), align=4) for p in range(pairs)]
                for j in range(rn):
                    x8 = builder.load(builder.bitcast(builder.gep(xrow[j], [o]), f8.as_pointer()), align=4)
                    xv = builder.shuffle_vector(x8, ir.Constant(f8, ir.Undefined), twice)
                    for p in range(pairs):
                        builder.store(_fma16(builder, wv[p], xv, builder.load(accs[j][p])), accs[j][p])
            lo, hi = (ir.Constant(ir.VectorType(i32, 8), list(range(h, h + 8))) for h in (0, 8))
            for j in range(rn):
                for p in range(pairs):
                    acc = builder.load(accs[j][p])
                    for h, sel in enumerate((lo, hi)):
                        i = 2 * p + h
                        off = builder.add(builder.add(d_a, builder.mul(dr_v, ir.Constant(_I64, i))),
                                          builder.mul(dc_v, ir.Constant(_I64, j)))
                        res = _hsum8(builder, builder.shuffle_vector(acc, ir.Constant(f16, ir.Undefined), sel))
                        builder.store(res, builder.inttoptr(off, _F32T.as_pointer()))
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(typer)


_tile_full, _tile_1 = _tile_intrinsic(TILE_N), _tile_intrinsic(1)


def _group_rows_kernel(kind: str):
    """group(w, ws, rows, k, tab, out): rows weight rows of k (ws bytes apart; fp16, bf16 or f32, a multiple of
    TILE_M) as f32 at out in the tiles' layout (see _tile_intrinsic): tile t, step s, pair p, row h of the
    pair at out[((t*k/8 + s)*2 + p)*16 + 8*h ..]. Widening fp16 and bf16 is exact."""

    half, bf16 = kind == _F16K, kind == _BF16K

    @numba.njit(**_opts)
    @variant(kind)
    def group(w, ws, rows, k, tab, out):  # pragma: no cover - compiled
        dst = numba.carray(f32p(out), rows * k)
        dst_bits = numba.carray(u32p(out), rows * k)
        for r in range(rows):
            t, i = r // TILE_M, r % TILE_M
            base = t * TILE_M * k + (i // 2) * 16 + (i % 2) * 8
            if half:
                src16 = numba.carray(u16p(w + r * ws), k)
                for e in range(k):
                    dst[base + (e // 8) * 32 + e % 8] = tab[src16[e]]
            elif bf16:
                b16 = numba.carray(u16p(w + r * ws), k)
                for e in range(k):
                    dst_bits[base + (e // 8) * 32 + e % 8] = np.uint32(b16[e]) << np.uint32(16)
            else:
                src32 = numba.carray(f32p(w + r * ws), k)
                for e in range(k):
                    dst[base + (e // 8) * 32 + e % 8] = src32[e]

    return group


#: per weight kind: (its tile-group copy, its double-sum dot, its vec_dot)
_KIND_FUNCS = {k: (_group_rows_kernel(k), dot, vdot) for k, dot, vdot in (
    (_F16K, dot_f16_f32, vec_dot_f16), (_BF16K, dot_bf16_f32, vec_dot_bf16), (_F32K, dot_f32_f32, vec_dot_f32))}


# ------------------------------------------------------------------------------ F16 / F32
def _matmul_f_kernel(kind: str, tiles: bool):
    """dst[i01, i11, i12, i13] = dot(src0 row (i01, i12/r2, i13/r3), src1 row (i11, i12, i13)), fp16, bf16 or f32
    weights (kind); src1 rounded to fp16 / bf16 first for the 16-bit kinds (their vec_dot_type), into the work
    buffer as f32.

    Planes of up to DOUBLE_MAX_COLS src1 columns (decode): one double-precision dot per output. More
    (prompts): as ggml-cpu with llamafile computes them on AVX2, in tinyBLAS's tiles where it takes the
    product (AUX+1 set: k % 8 == 0, ne01 % 4 == 0, and fp16 weights or a contiguous src1; compiled only
    with ``tiles``), else one ggml_vec_dot per output. ``kind`` and ``tiles`` are closure constants, so
    numba drops the branches a kernel cannot take before typing them (it does not for literal arguments).
    """
    half, bf16 = kind == _F16K, kind == _BF16K
    rounded = half or bf16  # src1 converted into the work buffer
    # the kind's functions, closure constants as kind is
    group_rows, double_dot, vec_dot = _KIND_FUNCS[kind]

    @numba.njit(**_opts)
    @variant(kind, tiles)
    def matmul_f(node, ith, nth, ctrl):  # pragma: no cover - compiled
        r = rec(node)
        tab = numba.carray(f32p(r[AUX]), 65536)
        d, nd0, nd1, nd2, nd3 = r[T_DST], r[T_DST + 5], r[T_DST + 6], r[T_DST + 7], r[T_DST + 8]
        w, k, ne01, ne02, ne03 = r[T_SRC0], r[T_SRC0 + 1], r[T_SRC0 + 2], r[T_SRC0 + 3], r[T_SRC0 + 4]
        nw1, nw2, nw3 = r[T_SRC0 + 6], r[T_SRC0 + 7], r[T_SRC0 + 8]
        x, ne11, ne12, ne13 = r[T_SRC1], r[T_SRC1 + 2], r[T_SRC1 + 3], r[T_SRC1 + 4]
        nx1, nx2, nx3 = r[T_SRC1 + 6], r[T_SRC1 + 7], r[T_SRC1 + 8]
        r2, r3 = ne12 // ne02, ne13 // ne03
        n = ne11 * ne12 * ne13
        xq = i64p(ctrl + 8 * C_WDATA)[0]
        if rounded:  # ggml converts src1 to fp16 / bf16 first (vec_dot_type F16 / BF16)
            j0, j1 = span(n, ith, nth)
            k8 = k - k % 8 if _F16C and half else 0
            for j in range(j0, j1):
                i1, i2, i3 = row_index(j, ne11, ne12)
                sa, da = x + i1 * nx1 + i2 * nx2 + i3 * nx3, xq + 4 * k * j
                for i in range(0, k8, 8):
                    f16_round8(sa + 4 * i, da + 4 * i)
                src = numba.carray(u32p(sa), k)
                if half:
                    dst = numba.carray(f32p(da), k)
                    for i in range(k8, k):
                        dst[i] = tab[f16_bits(src[i])]
                else:
                    dst_bits = numba.carray(u32p(da), k)
                    for i in range(k):
                        dst_bits[i] = bf16_bits(src[i]) << np.uint32(16)
            if ith == 0:
                atomic_store(ctrl + 8 * C_CHUNK, nth)
            barrier(ctrl, nth)
        elif ith == 0:
            atomic_store(ctrl + 8 * C_CHUNK, nth)
            barrier(ctrl, nth)
        else:
            barrier(ctrl, nth)
        few = ne11 <= DOUBLE_MAX_COLS
        exact = few and r[AUX + 4] == 0  # a one-plane product needs no double sums (see DOUBLE_MAX_COLS)
        tiled = r[AUX + 1] != 0 and not few
        n_tiles = ne01 // TILE_M
        nrc = min(n_chunks(ne01, nth), n_tiles) if tiled else n_chunks(ne01, nth)
        nchunk = nrc * ne12 * ne13
        xs = 4 * k if rounded else nx1
        c = ith
        while c < nchunk:
            plane = c // nrc
            rc = c - plane * nrc
            i12 = plane % ne12
            i13 = plane // ne12
            wp = w + (i12 // r2) * nw2 + (i13 // r3) * nw3
            xp0 = xq + 4 * k * ne11 * (i12 + ne12 * i13) if rounded else x + i12 * nx2 + i13 * nx3
            dp0 = d + i12 * nd2 + i13 * nd3
            if tiles and tiled:
                t0, t1 = n_tiles * rc // nrc, n_tiles * (rc + 1) // nrc
                tg = r[AUX + 2]  # tiles per group: its weight rows stay in L1 while every column passes them
                gw = xq + r[AUX + 3] + ith * 4 * k * TILE_M * tg  # the thread's group of rows, in tile layout
                for g0 in range(t0, t1, tg):
                    g1 = min(g0 + tg, t1)
                    group_rows(wp + g0 * TILE_M * nw1, nw1, (g1 - g0) * TILE_M, k, tab, gw)
                    j = 0
                    while j < ne11:
                        full = ne11 - j >= TILE_N
                        for t in range(g0, g1):
                            args_w, args_d = gw + (t - g0) * TILE_M * 4 * k, dp0 + t * TILE_M * nd0 + j * nd1
                            if full:
                                _tile_full(args_w, xp0 + j * xs, xs, k, args_d, nd0, nd1)
                            else:
                                _tile_1(args_w, xp0 + j * xs, xs, k, args_d, nd0, nd1)
                        j += TILE_N if full else 1
            else:
                r0, r1 = ne01 * rc // nrc, ne01 * (rc + 1) // nrc
                for i11 in range(ne11):
                    xp = xp0 + i11 * xs
                    dp = dp0 + i11 * nd1
                    for i01 in range(r0, r1):
                        if exact:
                            v = double_dot(wp + i01 * nw1, xp, k)
                        else:
                            v = vec_dot(wp + i01 * nw1, xp, k)
                        f32p(dp + i01 * nd0)[0] = v
            c = atomic_add(ctrl + 8 * C_CHUNK, 1)

    return matmul_f


_mm_f16, _gemm_f16, _mm_bf16, _gemm_bf16, _mm_f32, _gemm_f32 = (_matmul_f_kernel(kind, t)
                                                                  for kind in (_F16K, _BF16K, _F32K)
                                                                  for t in (False, True))


@jit_kernel
def k_mm_f16(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mm_f16(node, ith, nth, ctrl)


@jit_kernel
def k_gemm_f16(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _gemm_f16(node, ith, nth, ctrl)


@jit_kernel
def k_mm_bf16(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mm_bf16(node, ith, nth, ctrl)


@jit_kernel
def k_gemm_bf16(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _gemm_bf16(node, ith, nth, ctrl)


@jit_kernel
def k_mm_f32(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mm_f32(node, ith, nth, ctrl)


@jit_kernel
def k_gemm_f32(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _gemm_f32(node, ith, nth, ctrl)


def float_choice(node: Tensor, a: Tensor, b: Tensor) -> Choice | None:
    if node.type != F32 or b.nb[0] != 4 or a.nb[0] != a.type.type_size:
        return None
    if b.ne[2] % a.ne[2] or b.ne[3] % a.ne[3] or node.ne != [a.ne[1], b.ne[1], b.ne[2], b.ne[3]]:
        return None
    # llamafile_sgemm's conditions (sgemm.cpp tinyBLAS::matmul, ggml-cpu.c's two calls): k % 8, m % 4, and
    # for f32 weights a contiguous src1 (fp16 weights meet an fp16 copy of src1, contiguous by making)
    rounded = a.type in (F16, BF16)  # src1 meets a rounded copy, contiguous by making
    tiled = int(a.ne[0] % 8 == 0 and a.ne[1] % TILE_M == 0 and (rounded or b.is_contiguous()))
    k, esize = a.ne[0], a.type.type_size
    group = max(1, _L1_WEIGHT_BYTES // (TILE_M * k * esize))  # tiles per L1 group
    use_tiles = tiled and b.ne[1] > DOUBLE_MAX_COLS  # the tiles run: compile the kernel that has them
    # work buffer: fp16 weights meet src1 widened from fp16 first; then each thread's group of weight rows
    # as f32 in the tiles' layout
    src1_bytes = 4 * k * b.ne[1] * b.ne[2] * b.ne[3] if rounded else 0
    wsize = src1_bytes + (available_cores() * 4 * k * TILE_M * group if use_tiles else 0)
    mm, gemm = {F16: (k_mm_f16, k_gemm_f16), BF16: (k_mm_bf16, k_gemm_bf16), F32: (k_mm_f32, k_gemm_f32)}[a.type]
    kern = gemm if use_tiles else lean_unless_ready(mm, gemm)
    # one plane each (a model's weight by its activations) or several (attention's heads; see DOUBLE_MAX_COLS)
    plain = int(a.ne[2] * a.ne[3] == 1 and b.ne[2] * b.ne[3] == 1)
    return Choice(kern, ints=(TAB_ADDR, tiled, group, src1_bytes, plain), wsize=wsize)


