"""The activation quantizers of the quantized matmul (ggml-cpu's from_float on x86), compiled."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..native import f32_bits
from ..simd import _F32, _I8, _I32, _vec, f16_bits, f16_value

# --------------------------------------------------------------------------------------------
# activation quantizers (ggml-cpu's from_float on x86), in numba so a decode step costs microseconds


@njit(cache=True, inline="always")
def _round_fp16(v):  # pragma: no cover - compiled
    """float32 v rounded to the nearest fp16 value (ties to even), as float32: ggml stores Q8_0's d as
    fp16 and the dot uses the rounded value. The bits come from simd.f16_bits, the one fp32 -> fp16
    rounding of the CPU backend."""
    return f16_value(f16_bits(np.uint32(f32_bits(v))))


@njit(cache=True, inline="always")
def _amax32(x, j, b):  # pragma: no cover - compiled
    """max |x| over the 32 values of block b of row j (a Q8_0/Q8_1 block's scale source)."""
    amax = np.float32(0.0)
    for i in range(32):
        amax = max(amax, abs(x[j, 32 * b + i]))
    return amax


@intrinsic
def _q8_0_block(typingctx, src, dst):
    """The x86 quantize_row_q8_0's steps on the block of 32 floats at src, 8 lanes at a time as its AVX code
    takes them: amax by vmaxps over |x|, ``id = 127/amax`` (0 for an all-zero block), ``rint(x * id)``
    (round-half-even) stored as 32 int8 at dst; returns amax. The element loop it replaces (the same float
    steps) ran at about 1.5 ns a value, 5% of a BERT-base embedding batch's CPU time. Generic IR: any CPU
    compiles it (x86 to vmaxps, vroundps, vcvttps2dq)."""
    sig = types.float32(types.int64, types.int64)

    def codegen(context, builder, sig, args):
        f8, i32x8 = _vec(8, _F32), _vec(8, _I32)
        xp = builder.inttoptr(args[0], f8.as_pointer())
        xs = [builder.load(builder.gep(xp, [ir.Constant(_I32, i)]), align=4) for i in range(4)]
        mask = ir.Constant(i32x8, [0x7FFFFFFF] * 8)
        ab = [builder.bitcast(builder.and_(builder.bitcast(x, i32x8), mask), f8) for x in xs]

        def vmax(a, b):  # maxps's a > b ? a : b, in generic IR (LLVM selects maxps; any CPU compiles it)
            return builder.select(builder.fcmp_ordered(">", a, b), a, b)

        def halves(v, keep):
            return builder.shuffle_vector(v, v, ir.Constant(_vec(len(keep), _I32), keep))

        m = vmax(vmax(ab[0], ab[1]), vmax(ab[2], ab[3]))
        m4 = vmax(halves(m, [4, 5, 6, 7]), halves(m, [0, 1, 2, 3]))
        m4 = vmax(m4, halves(m4, [2, 3, 2, 3]))
        m4 = vmax(m4, halves(m4, [1, 1, 3, 3]))
        amax = builder.extract_element(m4, ir.Constant(_I32, 0))
        zero = ir.Constant(_F32, 0.0)
        inv = builder.select(builder.fcmp_ordered("!=", amax, zero),
                             builder.fdiv(ir.Constant(_F32, 127.0), amax), zero)
        vinv = builder.insert_element(ir.Constant(f8, ir.Undefined), inv, ir.Constant(_I32, 0))
        vinv = builder.shuffle_vector(vinv, vinv, ir.Constant(i32x8, [0] * 8))
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f8, [f8]), "llvm.rint.v8f32")
        qp = builder.inttoptr(args[1], _vec(8, _I8).as_pointer())
        for i in range(4):
            q = builder.fptosi(builder.call(fn, [builder.fmul(xs[i], vinv)]), i32x8)
            builder.store(builder.trunc(q, _vec(8, _I8)), builder.gep(qp, [ir.Constant(_I32, i)]), align=1)
        return amax

    return sig, codegen


@intrinsic
def _quad_sums(typingctx, src, dst):
    """-128 times the sum of each 4 of the 32 int8 at src, 8 int32 stored at dst."""
    sig = types.void(types.int64, types.int64)

    def codegen(context, builder, sig, args):
        i32x8 = _vec(8, _I32)
        q = builder.sext(builder.load(builder.inttoptr(args[0], _vec(32, _I8).as_pointer()), align=1), _vec(32, _I32))
        quad = [builder.shuffle_vector(q, q, ir.Constant(i32x8, list(range(i, 32, 4)))) for i in range(4)]
        s = builder.add(builder.add(quad[0], quad[1]), builder.add(quad[2], quad[3]))
        builder.store(builder.mul(s, ir.Constant(i32x8, [-128] * 8)), builder.inttoptr(args[1], i32x8.as_pointer()),
                      align=4)
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True)
def _quantize_q8_0(x, qa, da, asum):  # pragma: no cover - compiled
    """x (n, K) f32 -> qa int8 (n, K), da f32 (n, K/32) = fp16-rounded d, asum int32 (n, K/32) = sum of q.

    The x86 quantize_row_q8_0: ``id = 127/amax`` (not 1/d) and round-half-even. ``asum`` lets
    offset weight codes (Q4_0's ``q - 8``) subtract their offset once per block.
    """
    n, k = x.shape
    for j in range(n):
        for b in range(k // 32):
            if x.strides[1] == 4 and qa.strides[1] == 1:
                q_at = qa.ctypes.data + j * qa.strides[0] + 32 * b
                amax = _q8_0_block(x.ctypes.data + j * x.strides[0] + 128 * b, q_at)
                s = 0
                for i in range(32):
                    s += np.int32(qa[j, 32 * b + i])
            else:
                amax = _amax32(x, j, b)
                inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
                s = 0
                for i in range(32):
                    q = np.int32(np.rint(x[j, 32 * b + i] * inv))
                    qa[j, 32 * b + i] = q
                    s += q
            da[j, b] = _round_fp16(amax / np.float32(127.0))
            asum[j, b] = s


@njit(cache=True)
def _quantize_q8_0_lanes(x, qa, da, lanes):  # pragma: no cover - compiled
    """_quantize_q8_0's qa and da, and lanes int32 (n, K/4) = -128 * the sum of each 4 codes: the lanes a
    vpdpbusd over offset weight codes (w + 128, quants/repacked.py) starts from to end at sum(w * a), made
    once per activation row instead of once per weight group that reads it."""
    n, k = x.shape
    for j in range(n):
        for b in range(k // 32):
            if x.strides[1] == 4 and qa.strides[1] == 1 and lanes.strides[1] == 4:
                q_at = qa.ctypes.data + j * qa.strides[0] + 32 * b
                amax = _q8_0_block(x.ctypes.data + j * x.strides[0] + 128 * b, q_at)
                _quad_sums(q_at, lanes.ctypes.data + j * lanes.strides[0] + 32 * b)
            else:
                amax = _amax32(x, j, b)
                inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
                for i in range(32):
                    qa[j, 32 * b + i] = np.int32(np.rint(x[j, 32 * b + i] * inv))
                for t in range(8 * b, 8 * b + 8):
                    lanes[j, t] = -128 * (np.int32(qa[j, 4 * t]) + np.int32(qa[j, 4 * t + 1])
                                          + np.int32(qa[j, 4 * t + 2]) + np.int32(qa[j, 4 * t + 3]))
            da[j, b] = _round_fp16(amax / np.float32(127.0))


@njit(cache=True)
def _q8_1_sums(x, da, asum, sa):  # pragma: no cover - compiled
    """Q8_1's extra field s = fp16(d_f32 * sum q), from the Q8_0 parts (d before fp16 rounding)."""
    n, k = x.shape
    for j in range(n):
        for b in range(k // 32):
            d = _amax32(x, j, b) / np.float32(127.0)
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

