"""The CPU's SIMD helpers, in one place (ggml-cpu's simd-mappings.h and the fp16 parts of ggml-impl.h): what
this CPU has (AVX2, AVX-512, VNNI, F16C, as numba compiles for it), fp16 conversions with ggml's rounding,
and the LLVM IR building blocks the compiled kernels share (vector types, fma, horizontal sums, fp16 lanes).
"""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from .native import f32_from_bits

# ------------------------------------------------------------------------------------ LLVM IR types

_I8 = ir.IntType(8)


_I32 = ir.IntType(32)


def _vec(n: int, t: ir.Type = _I8) -> ir.VectorType:
    return ir.VectorType(t, n)


def _splat(builder: ir.IRBuilder, value: ir.Value, n: int) -> ir.Value:
    """A scalar broadcast to n lanes."""
    v = builder.insert_element(ir.Constant(_vec(n, value.type), ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, ir.Constant(_vec(n, value.type), ir.Undefined),
                                  ir.Constant(_vec(n, _I32), [0] * n))


_F32 = ir.FloatType()


# -------------------------------------------------------------------------------- this CPU's features

_I64 = ir.IntType(64)


def _halves(builder: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """<2n x T> -> <n x T>: low half + high half."""
    n = v.type.count // 2
    undef = ir.Constant(v.type, ir.Undefined)
    lo = builder.shuffle_vector(v, undef, ir.Constant(_vec(n, _I32), list(range(n))))
    hi = builder.shuffle_vector(v, undef, ir.Constant(_vec(n, _I32), list(range(n, 2 * n))))
    return builder.fadd(lo, hi) if isinstance(v.type.element, ir.FloatType) else builder.add(lo, hi)


def _host_has(feature: str) -> bool:
    """Whether numba compiles for this host CPU and the CPU has ``feature`` (x86 names)."""
    from llvmlite import binding
    from numba.core import config

    if config.CPU_NAME not in (None, "host") or config.CPU_FEATURES:
        return False  # a portable build (NUMBA_CPU_NAME=generic ...): no target-specific intrinsics
    try:
        return bool(binding.get_host_cpu_features().get(feature, False))
    except RuntimeError:
        return False


#: x86 AVX2: the block dots use pmaddubsw/pmaddwd as ggml's AVX2 kernels (u8 x s8 -> i16 pair sums,
#: then i16 x i16 -> i32), about half the instructions of widening both operands to i16
_AVX2 = _host_has("avx2")


#: AVX-512BW: 64-byte pmaddubsw/pmaddwd (the K-quant mat-vec does two sub-blocks per instruction)
_AVX512 = _AVX2 and _host_has("avx512bw")


#: AVX-512 VNNI (with VL) or AVX-VNNI: vpdpbusd adds the 4 products of u8 x s8 byte quads into each i32
#: lane, never saturating (the Q8_0-family prompt tiles, quants/gemm.py)
_VNNI = _AVX2 and (_host_has("avxvnni") or (_host_has("avx512vnni") and _host_has("avx512vl")))


#: AVX-512 VNNI: vpdpbusd on 64-byte registers (the two-tile K-quant GEMM kernels, quants/gemm.py)
_VNNI512 = _AVX512 and _host_has("avx512vnni")


#: F16C: fp16 scales widened with vcvtph2ps instead of a table lookup
_F16C = _host_has("f16c")


_I16 = ir.IntType(16)


def _fp16_at(builder: ir.IRBuilder, ptr: ir.Value, tbase: ir.Value) -> ir.Value:
    """The little-endian fp16 at byte pointer ``ptr`` as float32 (exact either way)."""
    bits = builder.load(builder.bitcast(ptr, _I16.as_pointer()), align=1)
    if _F16C:
        # LLVM loads a lone i16 with vpinsrw, which merges into a register it picks freely: a false
        # dependency on that register's last writer (in the row dots, the previous block's fma, so the
        # block loop ran at a chain's latency). An opaque zero (vpxor, loop-invariant) is the merge base.
        zero = builder.asm(ir.FunctionType(_vec(8, _I16), []), "vpxor $0, $0, $0", "=x", [], False)
        v = builder.insert_element(zero, bits, ir.Constant(_I32, 0))
        f = builder.fpext(builder.bitcast(v, _vec(8, ir.HalfType())), _vec(8, ir.FloatType()))
        return builder.extract_element(f, ir.Constant(_I32, 0))
    return builder.load(builder.gep(tbase, [builder.zext(bits, ir.IntType(64))]))


def _fp16_lanes(builder: ir.IRBuilder, ptrs: list[ir.Value], tbase: ir.Value) -> ir.Value:
    """The fp16 values at byte pointers ``ptrs`` (4 or 8) as one <n x float>: with F16C one conversion
    (vcvtph2ps) of the gathered bits, else a table load each."""
    n = len(ptrs)
    if not _F16C:
        return _insert_lanes(builder, [_fp16_at(builder, p, tbase) for p in ptrs])
    bits = [builder.load(builder.bitcast(p, _I16.as_pointer()), align=1) for p in ptrs]
    v = builder.asm(ir.FunctionType(_vec(8, _I16), []), "vpxor $0, $0, $0", "=x", [], False)  # see _fp16_at
    for i, b in enumerate(bits):
        v = builder.insert_element(v, b, ir.Constant(_I32, i))
    if n < 8:
        v = builder.shuffle_vector(v, v, ir.Constant(_vec(n, _I32), list(range(n))))
    return builder.fpext(builder.bitcast(v, _vec(n, ir.HalfType())), _vec(n, ir.FloatType()))


def _insert_lanes(builder: ir.IRBuilder, values: list[ir.Value]) -> ir.Value:
    """Scalars of one type -> a vector holding them in order."""
    v = ir.Constant(_vec(len(values), values[0].type), ir.Undefined)
    for i, x in enumerate(values):
        v = builder.insert_element(v, x, ir.Constant(_I32, i))
    return v


def _f16_8(builder: ir.IRBuilder, src: ir.Value) -> ir.Value:
    """<8 x half> of the 8 floats at address src (vcvtps2ph with F16C: nearest, ties to even, NaN kept quiet
    with its top payload bits, as simd.f16_bits)."""
    f8 = _vec(8, ir.FloatType())
    return builder.fptrunc(builder.load(builder.inttoptr(src, f8.as_pointer()), align=4), _vec(8, ir.HalfType()))


@intrinsic
def f16_round8(typingctx, src, dst):
    """The 8 floats at src rounded to fp16 and back, stored as f32 at dst (use where _F16C)."""
    sig = types.void(types.int64, types.int64)

    def codegen(context, builder, sig, args):
        f8 = _vec(8, ir.FloatType())
        builder.store(builder.fpext(_f16_8(builder, args[0]), f8), builder.inttoptr(args[1], f8.as_pointer()),
                      align=4)
        return context.get_dummy_value()

    return sig, codegen


def f16_mad_cells(width: int, n_vec: int):
    """mad_cells(v, nbv1, cells, msvs, n, acc): for j < n in order, cell c = cells[j] (int64), ms = msvs[2j],
    vs = msvs[2j + 1] (float32): where ms != 1, acc = fp16(acc * ms) (ggml_vec_scale_f16 on a new maximum),
    then acc = fp16(fma(V[c], vs, acc)) (ggml_vec_mad_f16), over the width * n_vec floats at acc (kept
    widened) and the fp16 row of cell c at v + c * nbv1. The accumulator stays in registers over the cells,
    where a step per cell went through memory and waited on the previous cell's store (a one-chunk row over
    2048 cells of 128 values, one thread: 32 -> 21 ns a cell with the 16-lane steps, bench/flash_attn.py's
    kernel loop). Each value's steps are the per-cell ones, so the bits are too (an ms of exactly 1 scales by
    1: no change to an fp16 value)."""

    def typer(typingctx, v, nbv1, cells, msvs, n, acc):
        sig = types.void(types.int64, types.int64, types.int64, types.int64, types.int64, types.int64)

        def codegen(context, builder, sig, args):
            v_a, nbv1_a, cells_a, msvs_a, n_a, acc_a = args
            fw, hw = _vec(width, ir.FloatType()), _vec(width, ir.HalfType())
            i64, f32 = ir.IntType(64), ir.FloatType()
            accp = builder.inttoptr(acc_a, fw.as_pointer())
            regs = [cgutils.alloca_once_value(builder, builder.load(builder.gep(accp, [ir.Constant(i64, k)]),
                                                                    align=4)) for k in range(n_vec)]
            cellp = builder.inttoptr(cells_a, i64.as_pointer())
            msvsp = builder.inttoptr(msvs_a, f32.as_pointer())

            def round16(x):
                return builder.fpext(builder.fptrunc(x, hw), fw)

            with cgutils.for_range(builder, n_a) as loop:
                j = loop.index
                cell = builder.load(builder.gep(cellp, [j]))
                ms = builder.load(builder.gep(msvsp, [builder.mul(j, ir.Constant(i64, 2))]))
                vs = builder.load(builder.gep(msvsp, [builder.add(builder.mul(j, ir.Constant(i64, 2)),
                                                                  ir.Constant(i64, 1))]))
                with builder.if_then(builder.fcmp_unordered("!=", ms, ir.Constant(f32, 1.0))):
                    msv = _splat(builder, ms, width)
                    for r in regs:
                        builder.store(round16(builder.fmul(builder.load(r), msv)), r)
                row = builder.inttoptr(builder.add(v_a, builder.mul(cell, nbv1_a)), hw.as_pointer())
                vsv = _splat(builder, vs, width)
                for k, r in enumerate(regs):
                    vv = builder.fpext(builder.load(builder.gep(row, [ir.Constant(i64, k)]), align=2), fw)
                    builder.store(round16(_fma(builder, vv, vsv, builder.load(r))), r)
            for k, r in enumerate(regs):
                builder.store(builder.load(r), builder.gep(accp, [ir.Constant(i64, k)]), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(typer)


@intrinsic
def f16_widen8(typingctx, src, dst):
    """The 8 fp16 values at src stored as f32 at dst (vcvtph2ps; use where _F16C)."""
    sig = types.void(types.int64, types.int64)

    def codegen(context, builder, sig, args):
        f8, h8 = _vec(8, ir.FloatType()), _vec(8, ir.HalfType())
        v = builder.load(builder.inttoptr(args[0], h8.as_pointer()), align=2)
        builder.store(builder.fpext(v, f8), builder.inttoptr(args[1], f8.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def f16_store8(typingctx, src, dst):
    """The 8 floats at src stored as fp16 at dst (use where _F16C)."""
    sig = types.void(types.int64, types.int64)

    def codegen(context, builder, sig, args):
        h8 = _vec(8, ir.HalfType())
        builder.store(_f16_8(builder, args[0]), builder.inttoptr(args[1], h8.as_pointer()), align=2)
        return context.get_dummy_value()

    return sig, codegen


def _x86(builder: ir.IRBuilder, name: str, ret: ir.Type, *args: ir.Value) -> ir.Value:
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, list(args))


def _fma(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
    """a*b + c over float32 (a scalar or a vector) with one rounding (llvm.fma: vfmadd on FMA CPUs)."""
    name = f"llvm.fma.v{a.type.count}f32" if isinstance(a.type, ir.VectorType) else "llvm.fma.f32"
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(a.type, [a.type] * 3), name)
    return builder.call(fn, [a, b, c])


def _hsum8(builder: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """The float sum of <8 x float> lanes as ggml's hsum_float_8 and tinyBLAS's hsum take it: the two
    halves added, then (0+2) + (1+3) of the four lanes left."""
    v2 = _halves(builder, _halves(builder, v))
    return builder.fadd(builder.extract_element(v2, ir.Constant(_I32, 0)),
                        builder.extract_element(v2, ir.Constant(_I32, 1)))


# --------------------------------------------------------------------------------- fp16 <-> float32

@nb.njit(cache=True, nogil=True, inline="always")
def bf16_bits(u: np.uint32) -> np.uint32:
    """The bf16 bits of the float32 with bits ``u``, as ggml_compute_fp32_to_bf16 (quants.fp.fp32_to_bf16_bits):
    round to nearest even on the integer bits, a NaN made quiet."""
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return (u >> np.uint32(16)) | np.uint32(64)
    return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFFFFFF)) >> np.uint32(16)


@nb.njit(cache=True, nogil=True, inline="always")
def f16_bits(u: np.uint32) -> np.uint32:
    """The fp16 bits nearest (ties to even) to the float32 with bits ``u``, as numpy's and ggml's
    conversions give them: overflow to inf, NaN kept quiet with its top payload bits."""
    sign = (u >> np.uint32(16)) & np.uint32(0x8000)
    a = u & np.uint32(0x7FFFFFFF)
    if a > np.uint32(0x7F800000):  # NaN
        return sign | np.uint32(0x7E00) | ((a >> np.uint32(13)) & np.uint32(0x3FF))
    if a >= np.uint32(0x477FF000):  # rounds past 65504
        return sign | np.uint32(0x7C00)
    if a >= np.uint32(0x38800000):  # normal fp16: keep 10 mantissa bits
        r = a + np.uint32(0xFFF) + ((a >> np.uint32(13)) & np.uint32(1))
        return sign | ((r - np.uint32(0x38000000)) >> np.uint32(13))
    if a <= np.uint32(0x33000000):  # below half the smallest subnormal (a tie goes to even zero)
        return sign
    e = a >> np.uint32(23)  # subnormal: a multiple of 2^-24, ties to even
    m = (a & np.uint32(0x007FFFFF)) | np.uint32(0x00800000)
    shift = np.uint32(126) - e
    q = m >> shift
    rem = m & ((np.uint32(1) << shift) - np.uint32(1))
    half = np.uint32(1) << (shift - np.uint32(1))
    if rem > half or (rem == half and (q & np.uint32(1))):
        q += np.uint32(1)
    return sign | q


@nb.njit(cache=True, nogil=True, inline="always")
def f16_value(h: np.uint32) -> np.float32:
    """The float32 value of the fp16 bits ``h`` (GGML_FP16_TO_FP32, exact), without a table."""
    sign = np.float32(-1.0) if h & np.uint32(0x8000) else np.float32(1.0)
    e = (h >> np.uint32(10)) & np.uint32(0x1F)
    m = h & np.uint32(0x3FF)
    if e == 0:  # zero and subnormals: m * 2^-24
        return sign * np.float32(m) * np.float32(5.9604644775390625e-08)
    if e == 31:
        return sign * np.float32(np.inf) if m == 0 else np.float32(np.nan)
    return f32_from_bits((h & np.uint32(0x8000)) << np.uint32(16) | (e + np.uint32(112)) << np.uint32(23)
                         | m << np.uint32(13))


#: every fp16 bit pattern's float32 value (NaN payloads kept, as numpy widens them)
F16_TO_F32 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


def round_to_f16(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """x rounded to fp16 precision (as ggml rounds src1 for an F16 weight: F16C's round to nearest even, which
    numpy's float16 conversion is too), returned as float32, into ``out`` when given. Only the Python kernels
    call it, so it is numpy's: nothing to compile before a first run's first token."""
    with np.errstate(over="ignore", invalid="ignore"):
        h = np.asarray(x, dtype=np.float32).astype(np.float16)
    if out is None:
        return h.astype(np.float32)
    out[...] = h
    return out

#: the fp16 -> f32 table's address, for records
TAB_ADDR = int(F16_TO_F32.ctypes.data)
