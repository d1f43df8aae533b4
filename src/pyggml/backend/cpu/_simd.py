"""Short fixed-length integer dot products as numba intrinsics (portable LLVM vector IR).

Why: a quantized block is only 16 or 32 codes long. Written as a numba loop, LLVM either
unrolls it fully and leaves scalar code, or (with a run-time trip count) vectorizes it for 64
elements per iteration and runs a block through the slow 8-lane epilogue. Emitting the block
as one ``<32 x i8>`` load, the code unpacking, a widening multiply and ``llvm.vector.reduce.add``
lets LLVM pick the target's best instructions (``vpmaddwd`` on AVX2/AVX-512) with no loop at
all. The IR is target-independent: other CPUs get whatever vector code LLVM has for them.

Every function takes (array, element offset) pairs; offsets are not bounds-checked, exactly
like numba's own indexing without ``boundscheck``. All return int32.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

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
    return isinstance(t, types.Array) and t.ndim == 1 and t.dtype in (types.uint8, types.int8)


@intrinsic
def dot_i8_32(typingctx, w, wo, a, ao):
    """sum_{i<32} int8 w[wo+i] * int8 a[ao+i] (Q8_0 x Q8_0)."""
    if not (_arr1(w) and _arr1(a)):
        return None
    sig = types.int32(w, wo, a, ao)

    def codegen(context, builder, sig, args):
        wv = _load(context, builder, sig.args[0], args[0], args[1], 32)
        av = _load(context, builder, sig.args[2], args[2], args[3], 32)
        return _dot(builder, wv, True, av)

    return sig, codegen


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


@intrinsic
def dot_q5_32(typingctx, w, wo, qh, a, ao):
    """Q5_0/Q5_1 codes: nibble | bit i of the u32 qh << 4, unsigned 0..31, times a[ao+i]."""
    if not (_arr1(w) and _arr1(a) and isinstance(qh, types.Integer)):
        return None
    sig = types.int32(w, wo, qh, a, ao)

    def codegen(context, builder, sig, args):
        q = _nibbles32(builder, _load(context, builder, sig.args[0], args[0], args[1], 16))
        h32 = builder.trunc(args[2], _I32) if args[2].type.width > 32 else builder.zext(args[2], _I32)
        bits = builder.lshr(_splat(builder, h32, 32), ir.Constant(_vec(32, _I32), list(range(32))))
        bits = builder.and_(bits, ir.Constant(_vec(32, _I32), [1] * 32))
        hb = builder.shl(builder.trunc(bits, _vec(32)), _consts(32, [4] * 32))
        av = _load(context, builder, sig.args[3], args[3], args[4], 32)
        return _dot(builder, builder.or_(q, hb), False, av)

    return sig, codegen


@intrinsic
def dot_nib_32(typingctx, w, wo, shift, a, ao):
    """sum_{i<32} ((w[wo+i] >> shift) & 15) * a[ao+i] (Q4_K: shift 0 or 4)."""
    if not (_arr1(w) and _arr1(a) and isinstance(shift, types.Integer)):
        return None
    sig = types.int32(w, wo, shift, a, ao)

    def codegen(context, builder, sig, args):
        q = _load(context, builder, sig.args[0], args[0], args[1], 32)
        s = _splat(builder, builder.trunc(args[2], _I8), 32)
        q = builder.and_(builder.lshr(q, s), _consts(32, [15] * 32))
        return _dot(builder, q, False, _load(context, builder, sig.args[3], args[3], args[4], 32))

    return sig, codegen


@intrinsic
def dot_q5k_32(typingctx, w, wo, shift, h, ho, hbit, a, ao):
    """sum_{i<32} (((w[wo+i] >> shift) & 15) | ((h[ho+i] >> hbit) & 1) << 4) * a[ao+i] (Q5_K)."""
    if not (_arr1(w) and _arr1(h) and _arr1(a)):
        return None
    sig = types.int32(w, wo, shift, h, ho, hbit, a, ao)

    def codegen(context, builder, sig, args):
        q = _load(context, builder, sig.args[0], args[0], args[1], 32)
        q = builder.and_(builder.lshr(q, _splat(builder, builder.trunc(args[2], _I8), 32)), _consts(32, [15] * 32))
        hv = _load(context, builder, sig.args[3], args[3], args[4], 32)
        hv = builder.and_(builder.lshr(hv, _splat(builder, builder.trunc(args[5], _I8), 32)), _consts(32, [1] * 32))
        q = builder.or_(q, builder.shl(hv, _consts(32, [4] * 32)))
        return _dot(builder, q, False, _load(context, builder, sig.args[6], args[6], args[7], 32))

    return sig, codegen


@intrinsic
def dot_q6_16(typingctx, w, wo, shift, h, ho, hshift, a, ao):
    """sum_{i<16} (((w[wo+i] >> shift) & 15) | ((h[ho+i] >> hshift) & 3) << 4) * a[ao+i] (Q6_K, unsigned)."""
    if not (_arr1(w) and _arr1(h) and _arr1(a)):
        return None
    sig = types.int32(w, wo, shift, h, ho, hshift, a, ao)

    def codegen(context, builder, sig, args):
        q = _load(context, builder, sig.args[0], args[0], args[1], 16)
        q = builder.and_(builder.lshr(q, _splat(builder, builder.trunc(args[2], _I8), 16)), _consts(16, [15] * 16))
        hv = _load(context, builder, sig.args[3], args[3], args[4], 16)
        hv = builder.and_(builder.lshr(hv, _splat(builder, builder.trunc(args[5], _I8), 16)), _consts(16, [3] * 16))
        q = builder.or_(q, builder.shl(hv, _consts(16, [4] * 16)))
        return _dot(builder, q, False, _load(context, builder, sig.args[6], args[6], args[7], 16))

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
    h32 = builder.load(hptr, align=1)
    bits = builder.lshr(_splat(builder, h32, 32), ir.Constant(_vec(32, _I32), list(range(32))))
    bits = builder.and_(bits, ir.Constant(_vec(32, _I32), [1] * 32))
    hb = builder.shl(builder.trunc(bits, _vec(32)), _consts(32, [4] * 32))
    q = builder.load(builder.bitcast(builder.gep(blk, [ir.Constant(_I64, 6)]), _vec(16).as_pointer()), align=1)
    return builder.sub(builder.or_(_nibbles32(builder, q), hb), _consts(32, [16] * 32))


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
            abase = _ptr_at(context, builder, sig.args[3], a_arr, ao_v)
            dbase = _ptr_at(context, builder, sig.args[5], da_arr, dao_v)
            tbase = _ptr_at(context, builder, sig.args[7], tab_arr, ir.Constant(_I64, 0))
            f8 = _vec(8, _F32)
            acc = cgutils.alloca_once_value(builder, ir.Constant(f8, [0.0] * 8))
            with cgutils.for_range(builder, nb_v) as loop:
                b = loop.index
                blk = builder.gep(wbase, [builder.mul(b, ir.Constant(_I64, block_bytes))])
                dbits = builder.load(builder.bitcast(blk, ir.IntType(16).as_pointer()), align=1)
                dw = builder.load(builder.gep(tbase, [builder.zext(dbits, _I64)]))
                d = builder.fmul(dw, builder.load(builder.gep(dbase, [b])))
                codes = decode(builder, blk)
                av = builder.load(builder.bitcast(builder.gep(abase, [builder.mul(b, ir.Constant(_I64, 32))]),
                                                  _vec(32).as_pointer()), align=1)
                prod = builder.mul(builder.sext(codes, _vec(32, _I32)), builder.sext(av, _vec(32, _I32)))
                lanes = _halves(builder, _pairs(builder, prod))  # <8 x i32>
                contrib = builder.fmul(builder.sitofp(lanes, f8), _splat(builder, d, 8))
                builder.store(builder.fadd(builder.load(acc), contrib), acc)
            v = builder.load(acc)
            v4 = _halves(builder, v)
            v2 = _halves(builder, v4)
            return builder.fadd(builder.extract_element(v2, ir.Constant(_I32, 0)),
                                builder.extract_element(v2, ir.Constant(_I32, 1)))

        return sig, codegen

    return intrinsic(typer)


rowdot_q8_0 = _rowdot32(_decode_q8_0, 34)
rowdot_q4_0 = _rowdot32(_decode_q4_0, 18)
rowdot_q5_0 = _rowdot32(_decode_q5_0, 22)
