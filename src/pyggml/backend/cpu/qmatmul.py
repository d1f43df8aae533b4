"""Fast MUL_MAT with a quantized weight: fused integer mat-vec for decode, tiled BLAS for prompts.

Why two paths. A decode step multiplies each weight by one (or a few) activation rows: it is
memory-bound, so the weight must be read once, in its quantized form, and never expanded to
float32 (that writes and re-reads 4 bytes per weight). A prompt multiplies by hundreds of rows:
it is compute-bound, and the fastest multiply numpy has is BLAS sgemm, so the weight is
dequantized a tile of rows at a time (the tile stays in cache) and each tile goes through BLAS.

Numerics follow ggml (ggml-cpu-kernels.md §1-2): the activations are first quantized to the
weight's ``vec_dot_type`` with the x86 quantizers (Q8_0/Q8_1: ``id = 127/amax``, ``rint``, fp16
d; Q8_K: ``-127/max``, f32 d), the per-block integer dot products are exact int32 and the block
scales are applied in float32. The BLAS path multiplies the dequantized weight with these same
quantized activations dequantized ("fake quant"), which equals ggml's integer dot up to float
summation order.

Why the kernels look the way they do (measured, see bench/bench_matvec.py):

* The block dot products are LLVM vector IR emitted by the intrinsics below. Plain
  numba loops over a 16- or 32-code block came out 2-3x slower: numba types ``int32 * int32`` as
  int64, a constant trip count is unrolled to scalar code, and a run-time one is vectorized for
  64 codes per iteration so a block runs in the 8-lane epilogue.
* Q8_0/Q4_0/Q5_0 (most of a Q4_K_M model's decode bytes) use whole-row intrinsics that keep 8
  float lanes across the row like ggml's AVX2 kernels, instead of a horizontal sum per block.
* Rows are addressed through one flat byte array and a row stride, so strided row views (rows
  of a larger buffer) need no copy.
* The activations are quantized once per call, not once per weight row chunk.
* Threads are the CPU backend's persistent workers running ``nogil`` kernels on rows claimed
  first come, first served (:func:`parallel_ranges`), not numba's OpenMP prange: on a busy
  machine an OpenMP region waits for every worker to be scheduled, which cost milliseconds per call.

Entry point: :func:`mul_mat_q`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

from ... import quants
from ...quants.fp import bf16_bits_to_fp32, fp32_to_bf16_bits
from ...types import GGMLType
from . import threads
from .actquant import F16_TO_F32

#: fp16 bit pattern -> float32 (exact, as GGML_FP16_TO_FP32)
_F16 = F16_TO_F32

Q8_0_FAMILY = (GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.IQ4_NL)
Q8_1_FAMILY = (GGMLType.Q4_1, GGMLType.Q5_1)
Q8_K_FAMILY = (GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K)
#: weight types with a fused integer mat-vec kernel
FUSED = frozenset(Q8_0_FAMILY + Q8_1_FAMILY + Q8_K_FAMILY)

#: src1 rows up to which the fused kernels beat the integer GEMM (jit/gemm.py) or dequantize + BLAS,
#: per type: the crossings measured with ``bench/gemm.py --mv`` runs on 2 threads, Qwen2.5
#: shapes (GOPS fused/GEMM: Q5_0 4864x896 76.9/66.8 at 32 columns, 74.4/83.5 at 48; Q4_0 74.0/68.4
#: at 48, 74.8/93.8 at 64; Q4_K 8960x1536 92.2/85.8 at 64, 75.0/110.8 at 96; Q6_K 1536x8960
#: 82.4/82.1 at 96; Q8_0 4864x896 fused/BLAS 87.8/76.6 at 96; Q5_K fused/BLAS 73.2/54.6 at 128).
#: The fused kernels decode each weight block once for ROWDOT_COLS activation rows.
#: IQ4_NL/Q4_1/Q5_1 have plainer kernels (a decode per column), hence the lower limit.
#: Q8_0/Q4_0/Q5_0 take the fused kernels at every column count: llama.cpp computes their prompts with
#: the same per-output dot as their decode on x86 (llamafile's tinyBLAS_Q0_AVX: 8 float lanes, fma per
#: block), so a product's bits never depend on the batch's shape, and neither do perplexity or imatrix.
ALL_COLS = 1 << 62
MATVEC_MAX_COLS = {
    GGMLType.Q8_0: ALL_COLS, GGMLType.Q4_0: ALL_COLS, GGMLType.Q5_0: ALL_COLS, GGMLType.IQ4_NL: 8, GGMLType.Q4_1: 8,
    GGMLType.Q5_1: 8, GGMLType.Q4_K: 64, GGMLType.Q5_K: 128, GGMLType.Q6_K: 96,
}
#: fused products reading fewer weight bytes than this (times columns) run on one thread: waking a
#: helper thread costs 20-50 us, and Gemma's 0.4-1.1 MB layer weights (0.05-0.13 ms) measured 20-40%
#: slower on 2 threads; the 178 MB output head is the one that gains (9.6 -> 5.8 ms)
PARALLEL_MIN_BYTES = 4 << 20
#: products smaller than this many flops run BLAS on one thread, for the same reason
BLAS_PARALLEL_MIN_FLOPS = 64_000_000
#: bytes of float32 weight per dequantized tile: about half an L2, so the tile stays cached
#: while BLAS streams the activations past it
_TILE_BYTES = 512 * 1024


# --------------------------------------------------------------------------------------------
# Short fixed-length integer dot products as numba intrinsics (portable LLVM vector IR).
#
# A quantized block is only 16 or 32 codes long. Written as a numba loop, LLVM either unrolls it
# fully and leaves scalar code, or (with a run-time trip count) vectorizes it for 64 codes per
# iteration and runs a block through the slow 8-lane epilogue. Emitting the block as one
# <32 x i8> load, the code unpacking, a widening multiply and llvm.vector.reduce.add lets LLVM
# pick the target's best instructions (vpmaddwd on AVX2/AVX-512) with no loop at all. The IR is
# target-independent: other CPUs get whatever vector code LLVM has for them. Offsets are not
# bounds-checked, exactly like numba's own indexing. They live in this file, not a module of
# their own, because numba's cache only notices edits to the file of the cached function.

_I8 = ir.IntType(8)
_I32 = ir.IntType(32)


def _vec(n: int, t: ir.Type = _I8) -> ir.VectorType:
    return ir.VectorType(t, n)


def _splat(builder: ir.IRBuilder, value: ir.Value, n: int) -> ir.Value:
    """A scalar broadcast to n lanes."""
    v = builder.insert_element(ir.Constant(_vec(n, value.type), ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, ir.Constant(_vec(n, value.type), ir.Undefined),
                                  ir.Constant(_vec(n, _I32), [0] * n))


def _load(context, builder, arrty, arr, off, n: int) -> ir.Value:
    """n bytes of a 1-d (u)int8 array starting at element ``off``, as <n x i8>."""
    ary = context.make_array(arrty)(context, builder, arr)
    ptr = builder.gep(ary.data, [off])
    return builder.load(builder.bitcast(ptr, _vec(n).as_pointer()), align=1)


def _dot(builder: ir.IRBuilder, w: ir.Value, w_signed: bool, a: ir.Value) -> ir.Value:
    """sum(w * a) over the lanes, w and a <n x i8> (a signed), widened to i32."""
    n = w.type.count
    wide = _vec(n, _I32)
    wv = builder.sext(w, wide) if w_signed else builder.zext(w, wide)
    prod = builder.mul(wv, builder.sext(a, wide))
    fnty = ir.FunctionType(_I32, [wide])
    fn = cgutils.get_or_insert_function(builder.module, fnty, f"llvm.vector.reduce.add.v{n}i32")
    return builder.call(fn, [prod])


def _consts(n: int, values: list[int]) -> ir.Constant:
    return ir.Constant(_vec(n), values)


def _arr1(t) -> bool:
    """A contiguous 1-d byte array: the intrinsics address it by pointer arithmetic."""
    return isinstance(t, types.Array) and t.ndim == 1 and t.layout == "C" and t.dtype in (types.uint8, types.int8)


def _nibbles32(builder: ir.IRBuilder, q: ir.Value) -> ir.Value:
    """16 packed bytes -> 32 codes: low nibbles first, then high nibbles (the Q4_0 order)."""
    lo = builder.and_(q, _consts(16, [15] * 16))
    hi = builder.lshr(q, _consts(16, [4] * 16))
    return builder.shuffle_vector(lo, hi, ir.Constant(_vec(32, _I32), list(range(32))))


@intrinsic
def dot_q4_32(typingctx, w, wo, a, ao):
    """sum_{i<16} (w[wo+i] & 15) * a[ao+i] + (w[wo+i] >> 4) * a[ao+16+i], codes unsigned (Q4_0/Q4_1)."""
    if not (_arr1(w) and _arr1(a)):
        return None
    sig = types.int32(w, wo, a, ao)

    def codegen(context, builder, sig, args):
        q = _nibbles32(builder, _load(context, builder, sig.args[0], args[0], args[1], 16))
        av = _load(context, builder, sig.args[2], args[2], args[3], 32)
        return _dot(builder, q, False, av)

    return sig, codegen


def _high_bits32(builder: ir.IRBuilder, h32: ir.Value) -> ir.Value:
    """Bit i of the i32 h32 as 16 or 0 in byte lane i (<32 x i8>): the Q5 fifth bit, in place.

    Byte i/8 of h32 is copied to lane i, masked with 1 << (i % 8) and compared with zero: one
    byte shuffle and one test, where shifting 32 i32 lanes by 0..31 took several wide ops.
    """
    by = builder.bitcast(h32, _vec(4))
    spread = builder.shuffle_vector(by, ir.Constant(_vec(4), ir.Undefined),
                                    ir.Constant(_vec(32, _I32), [i // 8 for i in range(32)]))
    hit = builder.icmp_unsigned("!=", builder.and_(spread, _consts(32, [1 << (i % 8) for i in range(32)])),
                                _consts(32, [0] * 32))
    return builder.select(hit, _consts(32, [16] * 32), _consts(32, [0] * 32))


@intrinsic
def dot_q5_32(typingctx, w, wo, qh, a, ao):
    """Q5_0/Q5_1 codes: nibble | bit i of the u32 qh << 4, unsigned 0..31, times a[ao+i]."""
    if not (_arr1(w) and _arr1(a) and isinstance(qh, types.Integer)):
        return None
    sig = types.int32(w, wo, qh, a, ao)

    def codegen(context, builder, sig, args):
        q = _nibbles32(builder, _load(context, builder, sig.args[0], args[0], args[1], 16))
        h32 = builder.trunc(args[2], _I32) if args[2].type.width > 32 else builder.zext(args[2], _I32)
        hb = _high_bits32(builder, h32)
        av = _load(context, builder, sig.args[3], args[3], args[4], 32)
        return _dot(builder, builder.or_(q, hb), False, av)

    return sig, codegen


# --------------------------------------------------------------------------------------------
# whole-row dot products for the 32-element block types. A per-block horizontal sum costs more
# than the block's multiply; ggml's AVX2 kernels instead keep 8 int32 lanes per block, convert
# them to float and accumulate ``lanes * (d_w*d_a)`` in 8 float lanes across the row, summing
# the lanes once at the end. These intrinsics do the same, in portable vector IR.

_F32 = ir.FloatType()
_I64 = ir.IntType(64)


def _pairs(builder: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """<2n x i32> -> <n x i32> by adding adjacent lanes (with a widening multiply before it,
    this is the pattern LLVM turns into pmaddwd)."""
    n = v.type.count // 2
    undef = ir.Constant(v.type, ir.Undefined)
    even = builder.shuffle_vector(v, undef, ir.Constant(_vec(n, _I32), list(range(0, 2 * n, 2))))
    odd = builder.shuffle_vector(v, undef, ir.Constant(_vec(n, _I32), list(range(1, 2 * n, 2))))
    return builder.add(even, odd)


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
#: F16C: fp16 scales widened with vcvtph2ps instead of a table lookup
_F16C = _host_has("f16c")
_I16 = ir.IntType(16)


def _fp16_at(builder: ir.IRBuilder, ptr: ir.Value, tbase: ir.Value) -> ir.Value:
    """The little-endian fp16 at byte pointer ``ptr`` as float32 (exact either way)."""
    bits = builder.load(builder.bitcast(ptr, _I16.as_pointer()), align=1)
    if _F16C:
        return builder.fpext(builder.bitcast(bits, ir.HalfType()), ir.FloatType())
    return builder.load(builder.gep(tbase, [builder.zext(bits, ir.IntType(64))]))


def _x86(builder: ir.IRBuilder, name: str, ret: ir.Type, *args: ir.Value) -> ir.Value:
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, list(args))


def _maddubs(builder: ir.IRBuilder, u: ir.Value, s: ir.Value) -> ir.Value:
    """<32 x i8> unsigned x <32 x i8> signed -> <16 x i16> sums of adjacent products (no saturation
    for the codes used here: |pair| <= 2*63*127)."""
    return _x86(builder, "llvm.x86.avx2.pmadd.ub.sw", _vec(16, _I16), u, s)


def _maddwd(builder: ir.IRBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
    """<16 x i16> x <16 x i16> -> <8 x i32> sums of adjacent products."""
    return _x86(builder, "llvm.x86.avx2.pmadd.wd", _vec(8, _I32), a, b)


def _i16_lanes(builder: ir.IRBuilder, values: list[ir.Value]) -> ir.Value:
    """<16 x i16> with lane i = values[i * len(values) // 16] (i32 scalars truncated)."""
    v = ir.Constant(_vec(16, _I16), ir.Undefined)
    for i in range(16):
        v = builder.insert_element(v, builder.trunc(values[i * len(values) // 16], _I16), ir.Constant(_I32, i))
    return v


def _signed_lanes8(builder: ir.IRBuilder, codes: ir.Value, a: ir.Value) -> ir.Value:
    """<32 x i8> signed codes x <32 x i8> signed a -> <8 x i32> lane sums of 4 products each.

    AVX2: ggml's sign trick, maddubs(|codes|, sign(a, codes)) then pmaddwd with ones (lane i sums
    products 4i..4i+3); elsewhere widen both to i32 (lane i sums products 2i, 2i+1, 2i+16, 2i+17).
    """
    if _AVX2:
        ax = _x86(builder, "llvm.x86.avx2.psign.b", _vec(32), codes, codes)
        sy = _x86(builder, "llvm.x86.avx2.psign.b", _vec(32), a, codes)
        ones = ir.Constant(_vec(16, _I16), [1] * 16)
        return _maddwd(builder, _maddubs(builder, ax, sy), ones)
    prod = builder.mul(builder.sext(codes, _vec(32, _I32)), builder.sext(a, _vec(32, _I32)))
    return _halves(builder, _pairs(builder, prod))


def _ptr_at(context, builder, arrty, arr, off):
    ary = context.make_array(arrty)(context, builder, arr)
    return builder.gep(ary.data, [off])


def _decode_q8_0(builder, blk):
    return builder.load(builder.bitcast(builder.gep(blk, [ir.Constant(_I64, 2)]), _vec(32).as_pointer()), align=1)


def _decode_q4_0(builder, blk):
    q = builder.load(builder.bitcast(builder.gep(blk, [ir.Constant(_I64, 2)]), _vec(16).as_pointer()), align=1)
    return builder.sub(_nibbles32(builder, q), _consts(32, [8] * 32))


def _decode_q5_0(builder, blk):
    hptr = builder.bitcast(builder.gep(blk, [ir.Constant(_I64, 2)]), _I32.as_pointer())
    hb = _high_bits32(builder, builder.load(hptr, align=1))
    q = builder.load(builder.bitcast(builder.gep(blk, [ir.Constant(_I64, 6)]), _vec(16).as_pointer()), align=1)
    return builder.sub(builder.or_(_nibbles32(builder, q), hb), _consts(32, [16] * 32))


def _fma8(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
    """a*b + c over <8 x float> with one rounding (llvm.fma: vfmadd on FMA CPUs)."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(a.type, [a.type] * 3), "llvm.fma.v8f32")
    return builder.call(fn, [a, b, c])


def _rowdot_blocks(builder, decode, block_bytes, wbase, nb, cols, tbase):
    """The codegen of the row dots: per block, codes decoded once and dotted with each column's
    (activation base, scale base) in ``cols``; returns each column's float32 sum."""
    f8 = _vec(8, _F32)
    accs = [cgutils.alloca_once_value(builder, ir.Constant(f8, [0.0] * 8)) for _ in cols]
    with cgutils.for_range(builder, nb) as loop:
        b = loop.index
        blk = builder.gep(wbase, [builder.mul(b, ir.Constant(_I64, block_bytes))])
        dw = _fp16_at(builder, blk, tbase)
        codes = decode(builder, blk)
        for acc, (abase, dbase) in zip(accs, cols, strict=True):
            d = builder.fmul(dw, builder.load(builder.gep(dbase, [b])))
            av = builder.load(builder.bitcast(builder.gep(abase, [builder.mul(b, ir.Constant(_I64, 32))]),
                                              _vec(32).as_pointer()), align=1)
            lanes = _signed_lanes8(builder, codes, av)  # <8 x i32>
            # acc = fma(d, lanes, acc): ggml's AVX2 vec_dot (_mm256_fmadd_ps) and llamafile's
            # tinyBLAS_Q0_AVX, which llama.cpp runs for these types' prompts on x86 (sgemm.cpp)
            builder.store(_fma8(builder, _splat(builder, d, 8), builder.sitofp(lanes, f8), builder.load(acc)), acc)
    sums = []
    for acc in accs:
        v2 = _halves(builder, _halves(builder, builder.load(acc)))
        sums.append(builder.fadd(builder.extract_element(v2, ir.Constant(_I32, 0)),
                                 builder.extract_element(v2, ir.Constant(_I32, 1))))
    return sums


def _rowdot32(decode, block_bytes: int):
    """Build an intrinsic rowdot(w, wo, nb, a, ao, da, dao, tab) -> float32:
    sum_b float(sum_i code_i * a_i) * (d_w[b] * da[b]) over nb blocks of ``block_bytes`` bytes,
    codes from ``decode`` (signed <32 x i8>), d_w the fp16 at each block's start (via tab)."""

    def typer(typingctx, w, wo, nb, a, ao, da, dao, tab):
        if not (_arr1(w) and _arr1(a)):
            return None
        sig = types.float32(w, wo, nb, a, ao, da, dao, tab)

        def codegen(context, builder, sig, args):
            w_arr, wo_v, nb_v, a_arr, ao_v, da_arr, dao_v, tab_arr = args
            wbase = _ptr_at(context, builder, sig.args[0], w_arr, wo_v)
            col = (_ptr_at(context, builder, sig.args[3], a_arr, ao_v),
                   _ptr_at(context, builder, sig.args[5], da_arr, dao_v))
            tbase = _ptr_at(context, builder, sig.args[7], tab_arr, ir.Constant(_I64, 0))
            return _rowdot_blocks(builder, decode, block_bytes, wbase, nb_v, [col], tbase)[0]

        return sig, codegen

    return intrinsic(typer)


#: activation bytes per column block of the row-dot kernels (half of a Zen 3 / Ice Lake L2)
_COL_BLOCK_BYTES = 256 * 1024
#: columns per call of the multi-column row dots: one decode of the weight codes serves them all
ROWDOT_COLS = 4


def _rowdot32_cols(decode, block_bytes: int):
    """rowdot for ROWDOT_COLS activation rows at once: rowdot4(w, wo, nb, a, ao, da, dao, tab) ->
    a tuple of float32, column c's activations at a[ao + c*32*nb], its scales at da[dao + c*nb]. Each
    sum is computed exactly as rowdot's (same lanes, same order), the codes decoded once per block."""

    def typer(typingctx, w, wo, nb, a, ao, da, dao, tab):
        if not (_arr1(w) and _arr1(a)):
            return None
        sig = types.UniTuple(types.float32, ROWDOT_COLS)(w, wo, nb, a, ao, da, dao, tab)

        def codegen(context, builder, sig, args):
            w_arr, wo_v, nb_v, a_arr, ao_v, da_arr, dao_v, tab_arr = args
            wbase = _ptr_at(context, builder, sig.args[0], w_arr, wo_v)
            a0 = _ptr_at(context, builder, sig.args[3], a_arr, ao_v)
            d0 = _ptr_at(context, builder, sig.args[5], da_arr, dao_v)
            k = builder.mul(nb_v, ir.Constant(_I64, 32))
            cols = [(builder.gep(a0, [builder.mul(k, ir.Constant(_I64, c))]),
                     builder.gep(d0, [builder.mul(nb_v, ir.Constant(_I64, c))])) for c in range(ROWDOT_COLS)]
            tbase = _ptr_at(context, builder, sig.args[7], tab_arr, ir.Constant(_I64, 0))
            sums = _rowdot_blocks(builder, decode, block_bytes, wbase, nb_v, cols, tbase)
            return context.make_tuple(builder, sig.return_type, sums)

        return sig, codegen

    return intrinsic(typer)


rowdot_q8_0 = _rowdot32(_decode_q8_0, 34)
rowdot_q4_0 = _rowdot32(_decode_q4_0, 18)
rowdot_q5_0 = _rowdot32(_decode_q5_0, 22)
rowdot4_q8_0 = _rowdot32_cols(_decode_q8_0, 34)
rowdot4_q4_0 = _rowdot32_cols(_decode_q4_0, 18)
rowdot4_q5_0 = _rowdot32_cols(_decode_q5_0, 22)


# Superblock dots for the K-quants: the sub-block sums stay in 8 int32 lanes, are multiplied by
# their sub-block scale as vectors and reduced once per 256 codes instead of once per 32 or 16.


def _scaled_lanes8(builder: ir.IRBuilder, codes: ir.Value, a: ir.Value, scales: list[ir.Value]) -> ir.Value:
    """<32 x i8> unsigned codes x <32 x i8> signed a, each run of 32/len(scales) codes times its i32
    scale, as <8 x i32> lanes whose total is the exact scaled dot (the lane split differs by path)."""
    if _AVX2:
        return _maddwd(builder, _maddubs(builder, codes, a), _i16_lanes(builder, scales))
    n = codes.type.count
    prod = builder.mul(builder.zext(codes, _vec(n, _I32)), builder.sext(a, _vec(n, _I32)))
    per = n // len(scales)
    sc = ir.Constant(_vec(n, _I32), ir.Undefined)
    for i in range(n):
        sc = builder.insert_element(sc, scales[i // per], ir.Constant(_I32, i))
    v = _pairs(builder, builder.mul(prod, sc))
    while v.type.count > 8:
        v = _halves(builder, v)
    return v


def _reduce_i32(builder: ir.IRBuilder, v: ir.Value) -> ir.Value:
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I32, [v.type]),
                                        f"llvm.vector.reduce.add.v{v.type.count}i32")
    return builder.call(fn, [v])


def _load_at(builder: ir.IRBuilder, base: ir.Value, off: int, n: int) -> ir.Value:
    return builder.load(builder.bitcast(builder.gep(base, [ir.Constant(_I64, off)]), _vec(n).as_pointer()), align=1)


def _k4_scale_words(builder: ir.IRBuilder, base: ir.Value) -> tuple[ir.Value, ir.Value]:
    """The 12 scale bytes of a Q4_K/Q5_K superblock at base -> (<8 x i32> scales, <8 x i32> mins).

    get_scale_min_k4 done on three little-endian u32 words, four 6-bit values per word at once.
    """
    def word(i: int) -> ir.Value:
        return builder.load(builder.bitcast(builder.gep(base, [ir.Constant(_I64, 4 * i)]), _I32.as_pointer()), align=1)

    def c(v: int) -> ir.Constant:
        return ir.Constant(_I32, v)

    u0, u1, u2 = word(0), word(1), word(2)
    six, four, two = c(0x3F3F3F3F), c(0x0F0F0F0F), c(0x03030303)
    sc_hi = builder.or_(builder.and_(u2, four), builder.shl(builder.and_(builder.lshr(u0, c(6)), two), c(4)))
    mn_hi = builder.or_(builder.and_(builder.lshr(u2, c(4)), four),
                        builder.shl(builder.and_(builder.lshr(u1, c(6)), two), c(4)))

    def bytes8(lo: ir.Value, hi: ir.Value) -> ir.Value:
        v = builder.insert_element(ir.Constant(_vec(2, _I32), ir.Undefined), lo, c(0))
        v = builder.insert_element(v, hi, c(1))
        return builder.zext(builder.bitcast(v, _vec(8)), _vec(8, _I32))

    return bytes8(builder.and_(u0, six), sc_hi), bytes8(builder.and_(u1, six), mn_hi)


def _k4_body(five: bool):
    """Q4_K (five=False) / Q5_K superblock codegen: body(builder, wb, cols) -> per column (ab, bb)
    [sum_s sc_s * sum q*a, sum_s m_s * sum a], the second from the activation's 16-sums at bb
    (int32). Q5_K adds bit 2g+half of each qh byte as the codes' fifth bit."""
    qs_at = 48 if five else 16

    def body(builder, wb, cols):
        scales, mins = _k4_scale_words(builder, builder.gep(wb, [ir.Constant(_I64, 4)]))
        qh = _load_at(builder, wb, 16, 32) if five else None
        accs = [ir.Constant(_vec(8, _I32), [0] * 8)] * len(cols)
        for g in range(4):
            v = _load_at(builder, wb, qs_at + 32 * g, 32)
            for half in range(2):
                if half == 0:
                    codes = builder.and_(v, _consts(32, [15] * 32))
                else:
                    codes = builder.lshr(v, _consts(32, [4] * 32))
                if five:
                    bit = builder.and_(qh, _consts(32, [1 << (2 * g + half)] * 32))
                    hit = builder.icmp_unsigned("!=", bit, _consts(32, [0] * 32))
                    codes = builder.or_(codes, builder.select(hit, _consts(32, [16] * 32), _consts(32, [0] * 32)))
                scale = builder.extract_element(scales, ir.Constant(_I32, 2 * g + half))
                for c, (ab, _) in enumerate(cols):
                    a32 = _load_at(builder, ab, 64 * g + 32 * half, 32)
                    accs[c] = builder.add(accs[c], _scaled_lanes8(builder, codes, a32, [scale]))
        out = []
        for acc, (_, bb) in zip(accs, cols, strict=True):
            bsums = builder.load(builder.bitcast(bb, _vec(16, _I32).as_pointer()), align=4)
            out.append([_reduce_i32(builder, acc), _reduce_i32(builder, builder.mul(_pairs(builder, bsums), mins))])
        return out

    return body


def _q6_body(builder, wb, cols):
    """Q6_K superblock codegen: per column (ab, bb) [sum_{j<16} scale_j * sum over sub-block j of
    (q-32)*a]. The codes are used unsigned (0..63) and the -32 comes off once as 32*sum_j
    scale_j*bsum_j, from the activation's 16-sums at bb (int32), as ggml's AVX2 kernel does.
    Scales: int8 at byte 192."""
    accs = [ir.Constant(_vec(8, _I32), [0] * 8)] * len(cols)
    for hf in range(2):
        ql0 = _load_at(builder, wb, 64 * hf, 32)
        ql1 = _load_at(builder, wb, 64 * hf + 32, 32)
        qh = _load_at(builder, wb, 128 + 32 * hf, 32)
        for k, (ql, shift) in enumerate(((ql0, 0), (ql1, 0), (ql0, 4), (ql1, 4))):
            lo = builder.and_(builder.lshr(ql, _consts(32, [shift] * 32)), _consts(32, [15] * 32))
            hi = builder.and_(builder.lshr(qh, _consts(32, [2 * k] * 32)), _consts(32, [3] * 32))
            codes = builder.or_(lo, builder.shl(hi, _consts(32, [4] * 32)))
            # 32 codes = two sub-blocks of 16, scales 8hf+2k and 8hf+2k+1
            scales = [builder.sext(builder.load(builder.gep(wb, [ir.Constant(_I64, 192 + 8 * hf + 2 * k + g)])),
                                   _I32) for g in range(2)]
            for c, (ab, _) in enumerate(cols):
                a32 = _load_at(builder, ab, 128 * hf + 32 * k, 32)
                accs[c] = builder.add(accs[c], _scaled_lanes8(builder, codes, a32, scales))
    sc16 = builder.sext(_load_at(builder, wb, 192, 16), _vec(16, _I32))
    out = []
    for acc, (_, bb) in zip(accs, cols, strict=True):
        bsums = builder.load(builder.bitcast(bb, _vec(16, _I32).as_pointer()), align=4)
        off = _reduce_i32(builder, builder.mul(sc16, bsums))
        out.append([builder.sub(_reduce_i32(builder, acc), builder.mul(off, ir.Constant(_I32, 32)))])
    return out


def _sbdot(body, nret: int, ncols: int = 1):
    """A superblock intrinsic from a codegen body (_k4_body, _q6_body).

    ncols == 1: sbdot(w, o, a, ao, bs, bso) for the superblock at w[o], activations a[ao:ao+256]
    and their 16-sums bs[bso:bso+16]; returns the body's value (int32, or a tuple of nret).
    ncols > 1: sbdot(w, o, a, ao, bs, bso, ak, bk): the same for ncols activation rows, row c at
    ao + c*ak and bso + c*bk, the superblock decoded once; returns all their values in one tuple.
    """
    n_out = nret * ncols
    rty = types.int32 if n_out == 1 else types.UniTuple(types.int32, n_out)

    def codegen(context, builder, sig, args):
        wb = _ptr_at(context, builder, sig.args[0], args[0], args[1])
        ab = _ptr_at(context, builder, sig.args[2], args[2], args[3])
        bb = _ptr_at(context, builder, sig.args[4], args[4], args[5])
        cols = [(ab, bb)] + [(builder.gep(ab, [builder.mul(args[6], ir.Constant(_I64, c))]),
                              builder.gep(bb, [builder.mul(args[7], ir.Constant(_I64, c))])) for c in range(1, ncols)]
        vals = [v for col in body(builder, wb, cols) for v in col]
        return vals[0] if n_out == 1 else context.make_tuple(builder, rty, vals)

    def ok(w, a, bs) -> bool:
        return _arr1(w) and _arr1(a) and isinstance(bs, types.Array) and bs.layout == "C" and bs.dtype == types.int32

    if ncols == 1:
        def typer(typingctx, w, o, a, ao, bs, bso):
            return (rty(w, o, a, ao, bs, bso), codegen) if ok(w, a, bs) else None
    else:
        def typer(typingctx, w, o, a, ao, bs, bso, ak, bk):
            return (rty(w, o, a, ao, bs, bso, ak, bk), codegen) if ok(w, a, bs) else None

    return intrinsic(typer)


sbdot_q4_k = _sbdot(_k4_body(False), 2)
sbdot_q5_k = _sbdot(_k4_body(True), 2)
sbdot_q6_k = _sbdot(_q6_body, 1)
sbdot4_q4_k = _sbdot(_k4_body(False), 2, ROWDOT_COLS)
sbdot4_q5_k = _sbdot(_k4_body(True), 2, ROWDOT_COLS)
sbdot4_q6_k = _sbdot(_q6_body, 1, ROWDOT_COLS)


# --------------------------------------------------------------------------------------------
# activation quantizers (ggml-cpu's from_float on x86), in numba so a decode step costs microseconds


@njit(cache=True, inline="always")
def _round_fp16(v):  # pragma: no cover - compiled
    """float32 v >= 0 rounded to the nearest fp16 value (RNE), returned as float32.

    ggml stores Q8_0's d as fp16, and the dot uses the rounded value; numba has no float16
    arithmetic, so round to 11 significant bits (normal range) or to a multiple of 2^-24
    (subnormal range) directly; both steps are exact in float64 except the intended rint.
    """
    x = np.float64(v)
    if x < 6.103515625e-05:  # below the smallest normal fp16: fixed quantum 2^-24
        return np.float32(np.rint(x * 16777216.0) / 16777216.0)
    mant, ex = math.frexp(x)
    r = math.ldexp(np.rint(mant * 2048.0), ex - 11)
    if r > 65504.0:
        return np.float32(np.inf)
    return np.float32(r)


@njit(cache=True)
def _quantize_q8_0(x, qa, da, asum):  # pragma: no cover - compiled
    """x (n, K) f32 -> qa int8 (n, K), da f32 (n, K/32) = fp16-rounded d, asum int32 (n, K/32) = sum of q.

    The x86 quantize_row_q8_0: ``id = 127/amax`` (not 1/d) and round-half-even. ``asum`` lets
    offset weight codes (Q4_0's ``q - 8``) subtract their offset once per block.
    """
    n, k = x.shape
    for j in range(n):
        for b in range(k // 32):
            amax = np.float32(0.0)
            for i in range(32):
                amax = max(amax, abs(x[j, 32 * b + i]))
            d = amax / np.float32(127.0)
            inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
            s = 0
            for i in range(32):
                q = np.int32(np.rint(x[j, 32 * b + i] * inv))
                qa[j, 32 * b + i] = q
                s += q
            da[j, b] = _round_fp16(d)
            asum[j, b] = s


@njit(cache=True)
def _q8_1_sums(x, da, asum, sa):  # pragma: no cover - compiled
    """Q8_1's extra field s = fp16(d_f32 * sum q), from the Q8_0 parts (d before fp16 rounding)."""
    n, k = x.shape
    for j in range(n):
        for b in range(k // 32):
            amax = np.float32(0.0)
            for i in range(32):
                amax = max(amax, abs(x[j, 32 * b + i]))
            d = amax / np.float32(127.0)
            v = d * np.float32(asum[j, b])
            sa[j, b] = _round_fp16(v) if v >= 0 else -_round_fp16(-v)


@njit(cache=True)
def _quantize_q8_k(x, qa, da, bsum):  # pragma: no cover - compiled
    """x (n, K) f32 -> qa int8, da f32 (n, K/256), bsum int32 (n, K/16): quantize_row_q8_K_ref.

    The first element of largest magnitude sets ``iscale = -127/max`` (so d is negative when that
    element is positive), values are ``min(127, rint(iscale*x))``; an all-zero block has d = 0.
    """
    n, k = x.shape
    for j in range(n):
        for b in range(k // 256):
            o = 256 * b
            amax = np.float32(0.0)
            for i in range(256):
                amax = max(amax, abs(x[j, o + i]))
            mx = np.float32(0.0)
            for i in range(256):  # the first element of that magnitude decides the sign
                if abs(x[j, o + i]) == amax:
                    mx = x[j, o + i]
                    break
            if amax == 0:
                da[j, b] = 0.0
                for i in range(256):
                    qa[j, o + i] = 0
                for g in range(16):
                    bsum[j, 16 * b + g] = 0
                continue
            iscale = np.float32(-127.0) / mx
            for i in range(256):
                qa[j, o + i] = min(127, np.int32(np.rint(iscale * x[j, o + i])))
            da[j, b] = np.float32(1.0) / iscale
            for g in range(16):
                s = 0
                for i in range(16):
                    s += qa[j, o + 16 * g + i]
                bsum[j, 16 * b + g] = s


@njit(cache=True, nogil=True)
def _scale_blocks(qa, da, y):  # pragma: no cover - compiled
    """y = da[block] * qa (the dequantized activations), one pass instead of numpy's two."""
    n, k = qa.shape
    blk = k // da.shape[1]
    for j in range(n):
        for b in range(da.shape[1]):
            d = da[j, b]
            for i in range(blk):
                y[j, blk * b + i] = np.float32(qa[j, blk * b + i]) * d


# --------------------------------------------------------------------------------------------
# fused mat-vec kernels. Shared arguments:
#   wu/wi  the weight bytes as one flat uint8 / int8 array; row r starts at r*rs
#   m      number of weight rows;  qa/da  quantized activations (n, K) and their block scales
#   out    (n, m) float32;  nch  row chunks (one per thread), each a contiguous row range
# The block dot products are the intrinsics above. Q8_0/Q4_0/Q5_0 use whole-row intrinsics that
# keep 8 float lanes like ggml's AVX2 kernels; the others combine each block in float as ggml's
# generic vec_dot (quants.c) does. Either way results match llama.cpp up to float summation order.


@njit(cache=True, inline="always")
def _h(tab, wu, o):  # pragma: no cover - compiled
    """The fp16 stored little-endian at byte o, as float32."""
    return tab[np.int64(wu[o]) | (np.int64(wu[o + 1]) << 8)]


@njit(cache=True, inline="always")
def _u32(wu, o):  # pragma: no cover - compiled
    """The little-endian u32 at byte o (Q5_0/Q5_1 high bits)."""
    return np.int64(wu[o]) | (np.int64(wu[o + 1]) << 8) | (np.int64(wu[o + 2]) << 16) | (np.int64(wu[o + 3]) << 24)


@njit(cache=True, nogil=True)
def _mv_rowdot(kind, wu, wi, rs, m, qa, da, asum, tab, out, r0, r1):  # pragma: no cover - compiled
    """Q8_0 / Q4_0 / Q5_0 (kind 0/1/2): one whole-row vector dot per output (see rowdot_*)."""
    n, nb = qa.shape[0], qa.shape[1] // 32
    qf, df = qa.reshape(qa.size), da.reshape(da.size)
    n4 = n - n % ROWDOT_COLS
    # prompts: columns a block at a time, so the activations a row meets stay in L2 (k bytes a column)
    cb = max(ROWDOT_COLS, (_COL_BLOCK_BYTES // (32 * nb)) // ROWDOT_COLS * ROWDOT_COLS)
    for j0 in range(0, n4, cb):
        for r in range(r0, r1):
            for j in range(j0, min(j0 + cb, n4), ROWDOT_COLS):  # several columns per decode of the row
                if kind == 0:
                    s = rowdot4_q8_0(wi, r * rs, nb, qf, j * 32 * nb, df, j * nb, tab)
                elif kind == 1:
                    s = rowdot4_q4_0(wi, r * rs, nb, qf, j * 32 * nb, df, j * nb, tab)
                else:
                    s = rowdot4_q5_0(wi, r * rs, nb, qf, j * 32 * nb, df, j * nb, tab)
                for c in range(ROWDOT_COLS):
                    out[j + c, r] = s[c]
    for r in range(r0, r1):
        for j in range(n4, n):
            if kind == 0:
                out[j, r] = rowdot_q8_0(wi, r * rs, nb, qa[j], 0, da[j], 0, tab)
            elif kind == 1:
                out[j, r] = rowdot_q4_0(wi, r * rs, nb, qa[j], 0, da[j], 0, tab)
            else:
                out[j, r] = rowdot_q5_0(wi, r * rs, nb, qa[j], 0, da[j], 0, tab)


@njit(cache=True, nogil=True)
def _mv_iq4_nl(wu, wi, rs, m, qa, da, asum, tab, out, r0, r1):  # pragma: no cover - compiled
    """IQ4_NL's codes index a 16-entry table, which no portable vector op expresses: plain loop."""
    n, nb = qa.shape[0], qa.shape[1] // 32
    kv = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int32)
    acc = np.empty(n, np.float32)
    for r in range(r0, r1):
        acc[:] = 0
        for b in range(nb):
            o = r * rs + 18 * b
            dw = _h(tab, wu, o)
            for j in range(n):
                s = np.int32(0)
                for i in range(16):
                    v = np.int32(wu[o + 2 + i])
                    s = np.int32(s + kv[v & 15] * np.int32(qa[j, 32 * b + i])
                                 + kv[v >> 4] * np.int32(qa[j, 32 * b + 16 + i]))
                acc[j] += (dw * da[j, b]) * np.float32(s)
        for j in range(n):
            out[j, r] = acc[j]


@njit(cache=True, nogil=True)
def _mv_q4_1(wu, wi, rs, m, qa, da, sa, tab, out, r0, r1):  # pragma: no cover - compiled
    n, nb = qa.shape[0], qa.shape[1] // 32
    acc = np.empty(n, np.float32)
    for r in range(r0, r1):
        acc[:] = 0
        for b in range(nb):
            o = r * rs + 20 * b
            dw = _h(tab, wu, o)
            mw = _h(tab, wu, o + 2)
            for j in range(n):
                s = dot_q4_32(wu, o + 4, qa[j], 32 * b)
                acc[j] += (dw * da[j, b]) * np.float32(s) + mw * sa[j, b]
        for j in range(n):
            out[j, r] = acc[j]


@njit(cache=True, nogil=True)
def _mv_q5_1(wu, wi, rs, m, qa, da, sa, tab, out, r0, r1):  # pragma: no cover - compiled
    n, nb = qa.shape[0], qa.shape[1] // 32
    acc = np.empty(n, np.float32)
    for r in range(r0, r1):
        acc[:] = 0
        for b in range(nb):
            o = r * rs + 24 * b
            dw = _h(tab, wu, o)
            mw = _h(tab, wu, o + 2)
            qh = _u32(wu, o + 4)
            for j in range(n):
                s = dot_q5_32(wu, o + 8, qh, qa[j], 32 * b)
                acc[j] += (dw * da[j, b]) * np.float32(s) + mw * sa[j, b]
        for j in range(n):
            out[j, r] = acc[j]


@njit(cache=True, inline="always")
def _scale_min_k4(wu, o, sc, mn):  # pragma: no cover - compiled
    """get_scale_min_k4 for all 8 sub-blocks of the 12 scale bytes at o."""
    for k in range(4):
        sc[k] = np.int32(wu[o + k]) & 63
        mn[k] = np.int32(wu[o + k + 4]) & 63
    for k in range(4, 8):
        sc[k] = (np.int32(wu[o + k + 4]) & 15) | ((np.int32(wu[o + k - 4]) >> 6) << 4)
        mn[k] = (np.int32(wu[o + k + 4]) >> 4) | ((np.int32(wu[o + k]) >> 6) << 4)


@njit(cache=True, nogil=True)
def _mv_k(kind, wu, wi, rs, m, qa, da, bsum, tab, out, r0, r1):  # pragma: no cover - compiled
    """Q4_K / Q5_K / Q6_K (kind 0/1/2) rows against activation rows, ROWDOT_COLS rows per decode
    of each superblock; every output is summed in the same order either way. Q6_K's codes are
    used unsigned and its -32 offset comes off via the block sums (see _q6_body)."""
    n, nb, k = qa.shape[0], qa.shape[1] // 256, qa.shape[1]
    bk = bsum.shape[1]
    bpb = 144 if kind == 0 else (176 if kind == 1 else 210)
    qf, bf = qa.reshape(qa.size), bsum.reshape(bsum.size)
    acc0 = np.zeros(ROWDOT_COLS, np.float32)
    acc1 = np.zeros(ROWDOT_COLS, np.float32)
    for r in range(r0, r1):
        j = 0
        while j < n:
            cols = ROWDOT_COLS if j + ROWDOT_COLS <= n else 1
            acc0[:] = 0
            acc1[:] = 0
            for b in range(nb):
                o, ao, bo = r * rs + bpb * b, j * k + 256 * b, j * bk + 16 * b
                if kind == 2:
                    dw = _h(tab, wu, o + 208)
                    if cols == 1:
                        acc0[0] += (dw * da[j, b]) * np.float32(sbdot_q6_k(wi, o, qf, ao, bf, bo))
                    else:
                        t6 = sbdot4_q6_k(wi, o, qf, ao, bf, bo, k, bk)
                        for c in range(ROWDOT_COLS):
                            acc0[c] += (dw * da[j + c, b]) * np.float32(t6[c])
                    continue
                dw, mw = _h(tab, wu, o), _h(tab, wu, o + 2)
                if cols == 1:
                    t1 = sbdot_q4_k(wu, o, qf, ao, bf, bo) if kind == 0 else sbdot_q5_k(wu, o, qf, ao, bf, bo)
                    acc0[0] += (dw * da[j, b]) * np.float32(t1[0])
                    acc1[0] += (mw * da[j, b]) * np.float32(t1[1])
                else:
                    if kind == 0:
                        t = sbdot4_q4_k(wu, o, qf, ao, bf, bo, k, bk)
                    else:
                        t = sbdot4_q5_k(wu, o, qf, ao, bf, bo, k, bk)
                    for c in range(ROWDOT_COLS):
                        acc0[c] += (dw * da[j + c, b]) * np.float32(t[2 * c])
                        acc1[c] += (mw * da[j + c, b]) * np.float32(t[2 * c + 1])
            for c in range(cols):
                out[j + c, r] = acc0[c] - acc1[c]
            j += cols


@njit(cache=True, nogil=True)
def _mv_q4_k(wu, wi, rs, m, qa, da, bsum, tab, out, r0, r1):  # pragma: no cover - compiled
    _mv_k(0, wu, wi, rs, m, qa, da, bsum, tab, out, r0, r1)


@njit(cache=True, nogil=True)
def _mv_q5_k(wu, wi, rs, m, qa, da, bsum, tab, out, r0, r1):  # pragma: no cover - compiled
    _mv_k(1, wu, wi, rs, m, qa, da, bsum, tab, out, r0, r1)


@njit(cache=True, nogil=True)
def _mv_q6_k(wu, wi, rs, m, qa, da, bsum, tab, out, r0, r1):  # pragma: no cover - compiled
    _mv_k(2, wu, wi, rs, m, qa, da, bsum, tab, out, r0, r1)


# --------------------------------------------------------------------------------------------
# dequantizers to float32 for the BLAS tiles (ggml's reference to_float, one rounding per product).


@njit(cache=True, nogil=True)
def _dq_q8_0(wu, wi, rs, r0, r1, tab, y):  # pragma: no cover - compiled
    nb = y.shape[1] // 32
    for r in range(r0, r1):
        for b in range(nb):
            o = r * rs + 34 * b
            d = _h(tab, wu, o)
            for i in range(32):
                y[r - r0, 32 * b + i] = np.float32(wi[o + 2 + i]) * d


@njit(cache=True, nogil=True)
def _dq_q4_0(wu, wi, rs, r0, r1, tab, y):  # pragma: no cover - compiled
    nb = y.shape[1] // 32
    for r in range(r0, r1):
        for b in range(nb):
            o = r * rs + 18 * b
            d = _h(tab, wu, o)
            for i in range(16):
                v = np.int32(wu[o + 2 + i])
                y[r - r0, 32 * b + i] = np.float32((v & 15) - 8) * d
                y[r - r0, 32 * b + 16 + i] = np.float32((v >> 4) - 8) * d


@njit(cache=True, nogil=True)
def _dq_q5_0(wu, wi, rs, r0, r1, tab, y):  # pragma: no cover - compiled
    nb = y.shape[1] // 32
    for r in range(r0, r1):
        for b in range(nb):
            o = r * rs + 22 * b
            d = _h(tab, wu, o)
            qh = np.int64(wu[o + 2]) | (np.int64(wu[o + 3]) << 8) | (np.int64(wu[o + 4]) << 16) | (
                np.int64(wu[o + 5]) << 24)
            for i in range(16):
                v = np.int64(wu[o + 6 + i])
                y[r - r0, 32 * b + i] = np.float32(((v & 15) | (((qh >> i) & 1) << 4)) - 16) * d
                y[r - r0, 32 * b + 16 + i] = np.float32(((v >> 4) | (((qh >> (i + 16)) & 1) << 4)) - 16) * d


@njit(cache=True, nogil=True)
def _dq_q4_k(wu, wi, rs, r0, r1, tab, y):  # pragma: no cover - compiled
    nb = y.shape[1] // 256
    for r in range(r0, r1):
        sc = np.empty(8, np.int32)
        mn = np.empty(8, np.int32)
        for b in range(nb):
            o = r * rs + 144 * b
            d = _h(tab, wu, o)
            dmin = _h(tab, wu, o + 2)
            _scale_min_k4(wu, o + 4, sc, mn)
            for g in range(4):
                d1 = d * np.float32(sc[2 * g])
                m1 = dmin * np.float32(mn[2 * g])
                d2 = d * np.float32(sc[2 * g + 1])
                m2 = dmin * np.float32(mn[2 * g + 1])
                e = 256 * b + 64 * g
                for i in range(32):
                    v = np.int32(wu[o + 16 + 32 * g + i])
                    y[r - r0, e + i] = d1 * np.float32(v & 15) - m1
                    y[r - r0, e + 32 + i] = d2 * np.float32(v >> 4) - m2


@njit(cache=True, nogil=True)
def _dq_q6_k(wu, wi, rs, r0, r1, tab, y):  # pragma: no cover - compiled
    nb = y.shape[1] // 256
    for r in range(r0, r1):
        for b in range(nb):
            o = r * rs + 210 * b
            d = _h(tab, wu, o + 208)
            for hf in range(2):
                e = 256 * b + 128 * hf
                for i in range(32):
                    v0 = np.int32(wu[o + 64 * hf + i])
                    v1 = np.int32(wu[o + 64 * hf + 32 + i])
                    h = np.int32(wu[o + 128 + 32 * hf + i])
                    so = o + 192 + 8 * hf + i // 16
                    y[r - r0, e + i] = (d * np.float32(wi[so])) * np.float32(((v0 & 15) | ((h & 3) << 4)) - 32)
                    y[r - r0, e + 32 + i] = (d * np.float32(wi[so + 2])) * np.float32(
                        ((v1 & 15) | ((h & 12) << 2)) - 32)
                    y[r - r0, e + 64 + i] = (d * np.float32(wi[so + 4])) * np.float32(((v0 >> 4) | (h & 48)) - 32)
                    y[r - r0, e + 96 + i] = (d * np.float32(wi[so + 6])) * np.float32(
                        ((v1 >> 4) | ((h & 192) >> 2)) - 32)


@njit(cache=True, nogil=True)
def _widen_f16(src, tab, dst):  # pragma: no cover - compiled
    for r in range(src.shape[0]):
        for c in range(src.shape[1]):
            dst[r, c] = tab[src[r, c]]


def widen_f16(rows: np.ndarray, out: np.ndarray) -> np.ndarray:
    """fp16 rows (r, k), any strides (e.g. a view of the transposed V cache) -> out float32 (r, k).

    A table lookup per value (exact, NaN payloads as numpy keeps them): numpy's own
    float16 -> float32 cast runs at ~1.6 ns a value here, which made widening the K/V cache
    cost more than the attention products of a decode step.
    """
    _widen_f16(rows.view(np.uint16), _F16, out)
    return out


#: type -> (kernel, kind): kind selects the row-dot intrinsic of _mv_rowdot (-1: own kernel)
_MATVEC = {
    GGMLType.Q8_0: (_mv_rowdot, 0), GGMLType.Q4_0: (_mv_rowdot, 1), GGMLType.Q5_0: (_mv_rowdot, 2),
    GGMLType.IQ4_NL: (_mv_iq4_nl, -1), GGMLType.Q4_1: (_mv_q4_1, -1), GGMLType.Q5_1: (_mv_q5_1, -1),
    GGMLType.Q4_K: (_mv_q4_k, -1), GGMLType.Q5_K: (_mv_q5_k, -1), GGMLType.Q6_K: (_mv_q6_k, -1),
}
_DEQUANT = {
    GGMLType.Q8_0: _dq_q8_0, GGMLType.Q4_0: _dq_q4_0, GGMLType.Q5_0: _dq_q5_0,
    GGMLType.Q4_K: _dq_q4_k, GGMLType.Q6_K: _dq_q6_k,
}


# --------------------------------------------------------------------------------------------
# Python side


def _flat_rows(w: np.ndarray) -> tuple[np.ndarray, int]:
    """(flat uint8 view of the rows' memory, row stride in bytes), without copying when rows are
    unit-stride inside; the flat view runs from the first byte of row 0 to the last of row m-1.

    The view is always read-only: weights mmapped from a GGUF are, and numba compiles (and
    caches) a separate specialization per writeability, so one kind means one compile per kernel.
    """
    if w.dtype != np.uint8:
        w = w.view(np.uint8)
    m, rb = w.shape
    if w.strides[1] != 1 or w.strides[0] < rb or m == 0:
        w = np.ascontiguousarray(w)
    if w.flags.c_contiguous:
        flat, rs = w.reshape(-1).view(), rb
    else:
        rs = w.strides[0]
        flat = np.lib.stride_tricks.as_strided(w, shape=((m - 1) * rs + rb,), strides=(1,))
    flat.flags.writeable = False
    return flat, rs


def parallel_ranges(fn: Callable[[int, int], None], total: int, n_threads: int, n_chunks: int) -> None:
    """Run fn(i0, i1) over [0, total) cut into n_chunks ranges, on the caller and n_threads-1 workers.

    The workers are the CPU backend's persistent ones (threads.py): the same threads that run the
    compiled kernels, so a numpy node between two compiled runs never competes with a spinning
    worker for a core. Chunks are claimed first come, first served and the caller works too: it
    only ever waits for chunks a worker has actually started, so a late worker costs nothing and
    the worst case is the single-thread time. ``fn`` should spend its time in ``nogil`` numba
    kernels or BLAS, so the threads really run at once.
    """
    if n_threads <= 1 or n_chunks <= 1 or total <= 1:
        fn(0, total)
        return
    pool = threads.get_pool()
    if not pool.acquire():  # another thread holds the workers: this product runs alone
        fn(0, total)
        return
    try:
        nth = pool.ensure(min(n_threads, threads.available_cores()))
        n_chunks = min(n_chunks, total)
        bounds = [total * i // n_chunks for i in range(n_chunks + 1)]
        cond = threading.Condition()
        state = {"next": 0, "done": 0}
        errors: list[BaseException] = []

        def work() -> None:
            while True:
                with cond:
                    i = state["next"]
                    if i >= n_chunks:
                        return
                    state["next"] = i + 1
                try:
                    fn(bounds[i], bounds[i + 1])
                except BaseException as e:  # re-raised in the caller
                    errors.append(e)
                with cond:
                    state["done"] += 1
                    cond.notify_all()

        pool.run_python(work, min(nth, n_chunks))
        with cond:
            while state["done"] < n_chunks:
                cond.wait()
    finally:
        pool.release()
    if errors:
        raise errors[0]


def quantize_activations(x: np.ndarray, vec_dot_type: GGMLType) -> tuple[np.ndarray, ...]:
    """x (n, K) float32 -> (qa int8 (n, K), da f32 per block, extra int32/f32 per block) as ggml-cpu.

    extra is the per-32 sum of q for Q8_0 (asum), s = fp16(d*sum q) for Q8_1, bsums per 16 for Q8_K.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    n, k = x.shape
    qa = np.empty((n, k), np.int8)
    if vec_dot_type == GGMLType.Q8_K:
        da = np.empty((n, k // 256), np.float32)
        bs = np.empty((n, k // 16), np.int32)
        _quantize_q8_k(x, qa, da, bs)
        return qa, da, bs
    da = np.empty((n, k // 32), np.float32)
    asum = np.empty((n, k // 32), np.int32)
    _quantize_q8_0(x, qa, da, asum)
    if vec_dot_type == GGMLType.Q8_1:
        sa = np.empty((n, k // 32), np.float32)
        _q8_1_sums(x, da, asum, sa)
        return qa, da, sa
    return qa, da, asum


def fake_quant(x: np.ndarray, vec_dot_type: GGMLType) -> np.ndarray:
    """The activations ggml's integer dot really multiplies, as float32 (n, K): d * q per block."""
    if vec_dot_type not in (GGMLType.Q8_0, GGMLType.Q8_1, GGMLType.Q8_K):
        if vec_dot_type == GGMLType.F16:
            return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)
        if vec_dot_type == GGMLType.BF16:
            return bf16_bits_to_fp32(fp32_to_bf16_bits(np.ascontiguousarray(x, dtype=np.float32)))
        return np.ascontiguousarray(x, dtype=np.float32)
    qa, da, _ = quantize_activations(x, vec_dot_type)
    y = np.empty(qa.shape, np.float32)
    _scale_blocks(qa, da, y)
    return y


def vec_dot_type_of(qtype: GGMLType) -> GGMLType:
    """The type ggml converts src1 to before multiplying with a ``qtype`` weight."""
    if qtype in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):
        return qtype
    return quants.get_codec(qtype).vec_dot_type


def matvec_q(w_rows: np.ndarray, qtype: GGMLType, x: np.ndarray, out: np.ndarray, n_threads: int) -> None:
    """Fused integer path: out[j, r] = ggml vec_dot(w row r, Q8(x[j])) for a type in FUSED.

    Reads the weight once per call in its quantized form; cost grows with x's row count, so it
    is meant for few rows (decode). Rows are split into contiguous ranges shared by the threads
    (parallel_ranges); each output element is one sequential dot, so the result does not depend
    on n_threads.
    """
    wf, rs = _flat_rows(w_rows)
    wi = wf.view(np.int8)
    m = w_rows.shape[0]
    qa, da, extra = quantize_activations(x, vec_dot_type_of(qtype))
    kern, kind = _MATVEC[qtype]

    def rows(r0: int, r1: int) -> None:
        if kind >= 0:
            kern(kind, wf, wi, rs, m, qa, da, extra, _F16, out, r0, r1)
        else:
            kern(wf, wi, rs, m, qa, da, extra, _F16, out, r0, r1)

    work_bytes = m * w_rows.shape[1] * x.shape[0]
    nt = n_threads if work_bytes >= PARALLEL_MIN_BYTES else 1
    parallel_ranges(rows, m, nt, min(4 * nt, max(1, m // 64)))


def dequantize_rows(w_rows: np.ndarray, qtype: GGMLType, r0: int, r1: int, y: np.ndarray | None = None) -> np.ndarray:
    """Weight rows r0..r1 as float32 (ggml's to_float), into ``y`` (r1-r0, K) when given."""
    kern = _DEQUANT.get(qtype)
    if kern is not None:
        wf, rs = _flat_rows(w_rows)
        k = w_rows.shape[1] // qtype.type_size * qtype.blck_size
        if y is None:
            y = np.empty((r1 - r0, k), np.float32)
        kern(wf, wf.view(np.int8), rs, r0, r1, _F16, y)
        return y
    rows = w_rows[r0:r1]
    if qtype == GGMLType.F32:
        vals = rows.view(np.float32)
    elif qtype == GGMLType.F16:
        vals = rows.view(np.float16).astype(np.float32)
    elif qtype == GGMLType.BF16:
        vals = (rows.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        vals = quants.dequantize(np.ascontiguousarray(rows.view(np.uint8)), qtype)
    if y is None:
        return np.ascontiguousarray(vals, dtype=np.float32)
    y[...] = vals
    return y


#: largest per-thread scratch buffer kept between calls (bytes); bigger ones are allocated fresh
SCRATCH_MAX_BYTES = 32 << 20
_TLS = threading.local()


def scratch(slot: str, shape: tuple[int, ...], dtype: type = np.float32) -> np.ndarray:
    """A C-contiguous uninitialized array of ``shape``, reused by the next call with the same slot
    on this thread (so valid only until then): the caller must be done with it, or copy it, first.

    Why: a fresh np.empty of more than 128 KB comes from mmap, and every one of its pages then
    page-faults (and is zeroed) on the first write. A 512-token prompt allocated ~250 MB of such
    temporaries per decode (dequantized tiles, sgemm results, quantized activations): ~55k minor
    faults, measured 0.2-0.3 s of a 1.65 s pp512. Arrays over SCRATCH_MAX_BYTES are not kept.
    """
    dt = np.dtype(dtype)
    nbytes = math.prod(shape) * dt.itemsize
    if nbytes > SCRATCH_MAX_BYTES:
        return np.empty(shape, dt)
    bufs = _TLS.__dict__.setdefault("bufs", {})
    buf = bufs.get(slot)
    if buf is None or buf.size < nbytes:
        buf = bufs[slot] = np.empty(max(nbytes, 64), np.uint8)
    return buf[:nbytes].view(dt).reshape(shape)


#: activation rows from which _fake_quant_scratch splits the rows between threads (a 640-wide
#: row takes ~1 us to quantize and scale; waking a helper 20-50 us)
_FQ_PARALLEL_ROWS = 128


def _fake_quant_scratch(x: np.ndarray, vec_dot_type: GGMLType, n_threads: int = 1) -> np.ndarray:
    """fake_quant(x, vec_dot_type) into this thread's scratch (slot "xf"), for the Q8 types; rows
    are independent, so many rows are split between ``n_threads`` threads (same bytes)."""
    if vec_dot_type not in (GGMLType.Q8_0, GGMLType.Q8_1, GGMLType.Q8_K):
        return fake_quant(x, vec_dot_type)
    x = np.ascontiguousarray(x, dtype=np.float32)
    n, k = x.shape
    qa = scratch("qa", (n, k), np.int8)
    y = scratch("xf", (n, k))
    if vec_dot_type == GGMLType.Q8_K:
        da = scratch("da", (n, k // 256))
        extra = scratch("extra", (n, k // 16), np.int32)
        quantize = _quantize_q8_k
    else:  # Q8_1's s is not needed for d * q
        da = scratch("da", (n, k // 32))
        extra = scratch("extra", (n, k // 32), np.int32)
        quantize = _quantize_q8_0

    def rows(i0: int, i1: int) -> None:
        quantize(x[i0:i1], qa[i0:i1], da[i0:i1], extra[i0:i1])
        _scale_blocks(qa[i0:i1], da[i0:i1], y[i0:i1])

    nt = n_threads if n >= _FQ_PARALLEL_ROWS else 1
    parallel_ranges(rows, n, nt, nt)
    return y


def matmul_tiles(w_rows: np.ndarray, qtype: GGMLType, x: np.ndarray, out: np.ndarray, n_threads: int) -> None:
    """BLAS path: out = fake_quant(x) @ dequant(w)^T, the weight dequantized a row tile at a time.

    Works for every type with a dequantizer. The tile holds about _TILE_BYTES of float32 so it
    stays in L2 while sgemm streams x past it. Tiles are shared by ``n_threads`` threads
    (parallel_ranges), each dequantizing its tile into its own scratch buffer and running a
    one-thread sgemm that writes straight into out's columns (no temporary, no copy).
    """
    from . import blas

    m = w_rows.shape[0]
    xf = _fake_quant_scratch(x, vec_dot_type_of(qtype), n_threads)
    k = xf.shape[1]
    if qtype == GGMLType.F32 and w_rows.dtype == np.float32:
        w_rows = w_rows.view(np.uint8)
    blas.set_threads(1)  # the threads are ours (parallel_ranges), one sgemm per tile each
    nt = n_threads if 2 * m * k * xf.shape[0] >= BLAS_PARALLEL_MIN_FLOPS else 1
    tile = max(8, min(m, _TILE_BYTES // (4 * max(k, 1)) // 8 * 8))
    if nt > 1:  # at least two tiles per thread, so both threads have work on small weights
        tile = max(8, min(tile, (m + 2 * nt - 1) // (2 * nt) + 7) // 8 * 8)
    n_tiles = (m + tile - 1) // tile
    # numpy's matmul calls sgemm on an out= view only if its rows are unit-stride float32
    # (otherwise it silently takes its slow non-BLAS loop): then a temporary and a copy
    direct = out.strides[1] == 4 and out.strides[0] % 4 == 0 and out.strides[0] >= 4 * m

    def tiles(t0: int, t1: int) -> None:
        buf = scratch("tile", (tile, k))
        for t in range(t0, t1):
            r0, r1 = t * tile, min(m, (t + 1) * tile)
            wt = dequantize_rows(w_rows, qtype, r0, r1, buf[: r1 - r0])
            if direct:
                np.matmul(xf, wt.T, out=out[:, r0:r1])
            else:
                out[:, r0:r1] = xf @ wt.T

    parallel_ranges(tiles, n_tiles, nt, n_tiles)


def mul_mat_q(w_rows: np.ndarray, qtype: GGMLType, x: np.ndarray, out: np.ndarray | None = None,
              n_threads: int = 1) -> np.ndarray:
    """out (n, m) float32 = rows of x (n, K) dotted with the m weight rows of ``qtype``, as ggml.

    w_rows: uint8 (m, row_bytes), rows may be strided (a view into a bigger buffer) but each row
    must be contiguous bytes. Few x rows (<= MATVEC_MAX_COLS[qtype]) of a FUSED type take the fused
    integer kernels; everything else goes through dequantized row tiles and BLAS. ``out`` may be
    a strided float32 (n, m) view (e.g. the destination tensor's slice); it is returned.
    """
    qtype = GGMLType(qtype)
    x = np.ascontiguousarray(x, dtype=np.float32)
    n = x.shape[0]
    m, row_bytes = w_rows.shape[0], w_rows.shape[1] * w_rows.itemsize
    if x.ndim != 2 or w_rows.ndim != 2:
        raise ValueError(f"mul_mat_q: w_rows and x must be 2-d, got {w_rows.shape} and {x.shape}")
    if row_bytes % qtype.type_size:
        raise ValueError(f"mul_mat_q: rows of {row_bytes} bytes are not whole {qtype.type_name} blocks")
    k = row_bytes // qtype.type_size * qtype.blck_size
    if x.shape[1] != k:
        raise ValueError(f"mul_mat_q: {qtype.type_name} rows hold {k} values but x rows have {x.shape[1]}")
    if w_rows.dtype != np.uint8:
        w_rows = w_rows.view(np.uint8)
    if out is None:
        out = np.empty((n, m), np.float32)
    elif out.shape != (n, m) or out.dtype != np.float32:
        raise ValueError(f"mul_mat_q: out must be float32 {(n, m)}, got {out.dtype} {out.shape}")
    if n == 0 or m == 0:
        return out
    if n <= MATVEC_MAX_COLS.get(qtype, 0):
        target = out if out.flags.c_contiguous else np.empty((n, m), np.float32)
        matvec_q(w_rows, qtype, x, target, n_threads)
        if target is not out:
            out[...] = target
    else:
        matmul_tiles(w_rows, qtype, x, out, n_threads)
    return out
