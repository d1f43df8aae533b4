"""The block dot products of the quantized matmul as numba intrinsics (LLVM vector IR): ggml's AVX2
lane structure where a kernel needs its bits, portable vector IR elsewhere."""

from __future__ import annotations

from typing import Any, NamedTuple

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from ....quants.iq4 import KVALUES_IQ4NL
from ..simd import (
    _AVX2,
    _AVX512,
    _F32,
    _I8,
    _I16,
    _I32,
    _I64,
    _VNNI,
    _fma,
    _fp16_at,
    _halves,
    _hsum8,
    _splat,
    _vec,
    _x86,
)

# --------------------------------------------------------------------------------------------
# Short fixed-length integer dot products as numba intrinsics (portable LLVM vector IR).
#
# A quantized block is only 16 or 32 codes long. Written as a numba loop, LLVM either unrolls it
# fully and leaves scalar code, or (with a run-time trip count) vectorizes it for 64 codes per
# iteration and runs a block through the slow 8-lane epilogue. Emitting the block as one
# <32 x i8> load, the code unpacking, a widening multiply and llvm.vector.reduce.add lets LLVM
# pick the target's best instructions (vpmaddwd on AVX2/AVX-512) with no loop at all. The IR is
# target-independent: other CPUs get whatever vector code LLVM has for them. Offsets are not
# bounds-checked, exactly like numba's own indexing. (numba's cache notices edits to the cached
# function's own file only; quants/jitcache.py drops every cache when any of these files changes.)


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
    """16 packed bytes -> 32 codes: low nibbles first, then high nibbles (the Q4_0 order). The bytes go to both
    128-bit halves and the upper half's i32 lanes shift right by 4, then one mask: a shift and an and on the
    whole register, where masking and shifting each half and joining them took one instruction more."""
    both = builder.bitcast(builder.shuffle_vector(q, q, ir.Constant(_vec(32, _I32), list(range(16)) * 2)),
                           _vec(8, _I32))
    both = builder.lshr(both, ir.Constant(_vec(8, _I32), [0] * 4 + [4] * 4))
    return builder.and_(builder.bitcast(both, _vec(32)), _consts(32, [15] * 32))


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
    byte shuffle and one test, where shifting 32 i32 lanes by 0..31 took several wide ops. AVX-512BW takes
    h32 as a mask register as it is (kmovd, then a masked move: two instructions where those took four).
    """
    if _AVX512:
        hit = builder.bitcast(h32, ir.VectorType(ir.IntType(1), 32))
        return builder.select(hit, _consts(32, [16] * 32), _consts(32, [0] * 32))
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


def _pairs(builder: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """<2n x i32> -> <n x i32> by adding adjacent lanes (with a widening multiply before it,
    this is the pattern LLVM turns into pmaddwd)."""
    n = v.type.count // 2
    undef = ir.Constant(v.type, ir.Undefined)
    even = builder.shuffle_vector(v, undef, ir.Constant(_vec(n, _I32), list(range(0, 2 * n, 2))))
    odd = builder.shuffle_vector(v, undef, ir.Constant(_vec(n, _I32), list(range(1, 2 * n, 2))))
    return builder.add(even, odd)


def _maddubs(builder: ir.IRBuilder, u: ir.Value, s: ir.Value) -> ir.Value:
    """<32|64 x i8> unsigned x signed -> <16|32 x i16> sums of adjacent products (pmaddubsw, AVX2 or
    AVX-512BW by width; no saturation for the codes used here: |pair| <= 2*63*127)."""
    name = "llvm.x86.avx512.pmaddubs.w.512" if u.type.count == 64 else "llvm.x86.avx2.pmadd.ub.sw"
    return _x86(builder, name, _vec(u.type.count // 2, _I16), u, s)


def _maddwd(builder: ir.IRBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
    """<16|32 x i16> x same -> <8|16 x i32> sums of adjacent products (pmaddwd, AVX2 or AVX-512BW)."""
    name = "llvm.x86.avx512.pmaddw.d.512" if a.type.count == 32 else "llvm.x86.avx2.pmadd.wd"
    return _x86(builder, name, _vec(a.type.count // 2, _I32), a, b)


def _dpbusd(builder: ir.IRBuilder, acc: ir.Value, u: ir.Value, s: ir.Value) -> ir.Value:
    """<8|16 x i32> acc + (lane i: the 4 products of bytes 4i..4i+3 of <32|64 x i8> unsigned u and signed s)."""
    n = acc.type.count
    i32s = _vec(n, _I32)
    return _x86(builder, f"llvm.x86.avx512.vpdpbusd.{32 * n}", i32s, acc, builder.bitcast(u, i32s),
                builder.bitcast(s, i32s))


def _i16_lanes(builder: ir.IRBuilder, values: list[ir.Value]) -> ir.Value:
    """<16 x i16> with lane i = values[i * len(values) // 16] (i32 scalars truncated)."""
    v = ir.Constant(_vec(16, _I16), ir.Undefined)
    for i in range(16):
        v = builder.insert_element(v, builder.trunc(values[i * len(values) // 16], _I16), ir.Constant(_I32, i))
    return v


def _signed_lanes8(builder: ir.IRBuilder, codes: ir.Value, a: ir.Value, scale: ir.Value | None = None) -> ir.Value:
    """<32 x i8> signed codes x <32 x i8> signed a -> <8 x i32> lane sums of 4 products each, times the i32
    ``scale`` when one is given (exact: |pair sum| <= 2*127*127, so it fits pmaddwd's i16 operand).

    AVX2: ggml's sign trick, maddubs(|codes|, sign(a, codes)) then pmaddwd with ones or the scale (lane i sums
    products 4i..4i+3); elsewhere widen both to i32 (lane i sums products 2i, 2i+1, 2i+16, 2i+17).
    """
    if _AVX2:
        ax = _x86(builder, "llvm.x86.avx2.psign.b", _vec(32), codes, codes)
        sy = _x86(builder, "llvm.x86.avx2.psign.b", _vec(32), a, codes)
        mult = ir.Constant(_vec(16, _I16), [1] * 16) if scale is None else _i16_lanes(builder, [scale])
        return _maddwd(builder, _maddubs(builder, ax, sy), mult)
    prod = builder.mul(builder.sext(codes, _vec(32, _I32)), builder.sext(a, _vec(32, _I32)))
    if scale is not None:
        prod = builder.mul(prod, _splat(builder, scale, 32))
    return _halves(builder, _pairs(builder, prod))


def _ptr_at(context, builder, arrty, arr, off):
    ary = context.make_array(arrty)(context, builder, arr)
    return builder.gep(ary.data, [off])


def _decode_q8_0(builder, blk, unsigned=False):
    codes = builder.load(builder.bitcast(builder.gep(blk, [ir.Constant(_I64, 2)]), _vec(32).as_pointer()), align=1)
    return builder.xor(codes, _consts(32, [0x80] * 32)) if unsigned else codes  # unsigned: code + 128


def _decode_q4_0(builder, blk, unsigned=False):
    q = builder.load(builder.bitcast(builder.gep(blk, [ir.Constant(_I64, 2)]), _vec(16).as_pointer()), align=1)
    codes = _nibbles32(builder, q)
    return codes if unsigned else builder.sub(codes, _consts(32, [8] * 32))


def lut16(values, unsigned: bool) -> ir.Constant:
    """<32 x i8>: a 4-bit type's 16 code values (value + 128 when unsigned) in both 128-bit halves (vpshufb)."""
    return ir.Constant(_vec(32, _I8), [(int(v) + (128 if unsigned else 0)) & 0xFF for v in values] * 2)


def _lookup16(builder: ir.IRBuilder, table: ir.Constant, idx: ir.Value) -> ir.Value:
    """<32 x i8> table[idx] for idx 0..15 (lut16's layout): vpshufb, or 16 selects without AVX2."""
    if _AVX2:
        return _x86(builder, "llvm.x86.avx2.pshuf.b", _vec(32), table, idx)
    out = ir.Constant(_vec(32), [0] * 32)
    for v, byte in enumerate(table.constant[:16]):
        hit = builder.icmp_unsigned("==", idx, _consts(32, [v] * 32))
        out = builder.select(hit, _consts(32, [byte] * 32), out)
    return out


_IQ4NL_LUT = {u: lut16(KVALUES_IQ4NL, u) for u in (False, True)}


def _decode_iq4_nl(builder, blk, unsigned=False):
    """IQ4_NL: Q4_0's block with its nibbles indexing the 16 non-linear values (ggml's kvalues_iq4nl)."""
    q = builder.load(builder.bitcast(builder.gep(blk, [ir.Constant(_I64, 2)]), _vec(16).as_pointer()), align=1)
    return _lookup16(builder, _IQ4NL_LUT[unsigned], _nibbles32(builder, q))


def _decode_q5_0(builder, blk, unsigned=False):
    hptr = builder.bitcast(builder.gep(blk, [ir.Constant(_I64, 2)]), _I32.as_pointer())
    hb = _high_bits32(builder, builder.load(hptr, align=1))
    q = builder.load(builder.bitcast(builder.gep(blk, [ir.Constant(_I64, 6)]), _vec(16).as_pointer()), align=1)
    codes = builder.or_(_nibbles32(builder, q), hb)
    return codes if unsigned else builder.sub(codes, _consts(32, [16] * 32))


#: decoders whose codes are stored unsigned, with the offset ggml subtracts: log2 of it (the row dots may take
#: the stored codes, vpdpbusd or pmaddubsw + pmaddwd, and subtract offset * the activation quad's sum: the same
#: int32 lanes as ggml's sign trick on the signed codes)
_UNSIGNED_SHIFT = {_decode_q4_0: 3, _decode_q5_0: 4}
#: with vpdpbusd Q8_0 and IQ4_NL too (codes + 128: pmaddubsw's i16 pair sums of those would saturate; vpdpbusd's
#: never do)
_UNSIGNED_SHIFT_VNNI = {**_UNSIGNED_SHIFT, _decode_q8_0: 7, _decode_iq4_nl: 7}


#: bytes ahead of its loads a kernel streaming repacked weights prefetches (quants/repacked.py): a decode reads
#: each row group once, and a group (a few KB) is too short for the hardware prefetcher to ramp up on before
#: the next one starts (Q4_0 8960 x 1536, 2 threads, bench/matvec_bandwidth.py --repack: 7.8 GB/s without,
#: 20.1 with 1024 bytes, 22.8 with 2048, 21.9 with 4096; 24.1 with every line prefetched, not only the first)
PREFETCH_BYTES = 2048


def _prefetch_ahead(builder: ir.IRBuilder, ptr: ir.Value, nbytes: int) -> None:
    """Prefetch (for reading, into all levels: prefetcht0) every line of the nbytes at ptr + PREFETCH_BYTES."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [_I8.as_pointer(), _I32, _I32,
                                                                                         _I32]), "llvm.prefetch.p0i8")
    for line in range(0, nbytes, 64):
        at = builder.gep(builder.bitcast(ptr, _I8.as_pointer()), [ir.Constant(_I64, PREFETCH_BYTES + line)])
        builder.call(fn, [at, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])


def _rowdot_blocks(builder, decode, block_bytes, wbases, nb, cols, tbase):
    """The codegen of the row dots: per block, each weight row's codes (rows at ``wbases``) decoded once
    and dotted with each column's (activation base, scale base) in ``cols``; returns sums[row][col] as
    float32. Every (row, column) keeps its own accumulator, so several rows at once are several
    independent fma chains (a decode's one column would otherwise wait on one chain's latency)."""
    f8 = _vec(8, _F32)
    # unsigned codes: with VNNI always; on AVX2 when several rows share each column's offset (a decode's four
    # rows: the offset's three instructions once, where the sign trick took two a row)
    shift = (_UNSIGNED_SHIFT_VNNI.get(decode) if _VNNI
             else _UNSIGNED_SHIFT.get(decode) if _AVX2 and len(wbases) > 1 else None)
    zero = ir.Constant(_vec(8, _I32), [0] * 8)
    ones = ir.Constant(_vec(16, _I16), [1] * 16)

    def quad_sums(u, a):  # <8 x i32>: lane i = sum of the 4 products of bytes 4i..4i+3 (u unsigned, a signed)
        return _dpbusd(builder, zero, u, a) if _VNNI else _maddwd(builder, _maddubs(builder, u, a), ones)

    accs = [[cgutils.alloca_once_value(builder, ir.Constant(f8, [0.0] * 8)) for _ in cols] for _ in wbases]
    with cgutils.for_range(builder, nb) as loop:
        b = loop.index
        avs = [builder.load(builder.bitcast(builder.gep(abase, [builder.mul(b, ir.Constant(_I64, 32))]),
                                            _vec(32).as_pointer()), align=1) for abase, _ in cols]
        if shift is not None:  # offset * each activation quad's sum, once per column for all the rows
            offs = [builder.shl(quad_sums(_consts(32, [1] * 32), av), ir.Constant(_vec(8, _I32), [shift] * 8))
                    for av in avs]
            if _VNNI:  # vpdpbusd starts from -offset and ends at the signed codes' sums: no zeroing, no subtraction
                offs = [builder.sub(zero, o) for o in offs]
        for wbase, row_accs in zip(wbases, accs, strict=True):
            blk = builder.gep(wbase, [builder.mul(b, ir.Constant(_I64, block_bytes))])
            dw = _fp16_at(builder, blk, tbase)
            codes = decode(builder, blk, shift is not None) if shift is not None else decode(builder, blk)
            for c, (acc, (_, dbase)) in enumerate(zip(row_accs, cols, strict=True)):
                d = builder.fmul(dw, builder.load(builder.gep(dbase, [b])))
                if shift is not None and _VNNI:
                    lanes = _dpbusd(builder, offs[c], codes, avs[c])
                elif shift is not None:
                    lanes = builder.sub(quad_sums(codes, avs[c]), offs[c])
                else:
                    lanes = _signed_lanes8(builder, codes, avs[c])  # <8 x i32>
                # acc = fma(d, lanes, acc): ggml's AVX2 vec_dot (_mm256_fmadd_ps) and llamafile's
                # tinyBLAS_Q0_AVX, which llama.cpp runs for these types' prompts on x86 (sgemm.cpp)
                builder.store(_fma(builder, _splat(builder, d, 8), builder.sitofp(lanes, f8), builder.load(acc)),
                              acc)
    return [[_hsum8(builder, builder.load(acc)) for acc in row_accs] for row_accs in accs]


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
            return _rowdot_blocks(builder, decode, block_bytes, [wbase], nb_v, [col], tbase)[0][0]

        return sig, codegen

    return intrinsic(typer)


#: activation bytes per column block of the row-dot kernels (half of a Zen 3 / Ice Lake L2)
_COL_BLOCK_BYTES = 256 * 1024
#: columns per call of the multi-column row dots: one decode of the weight codes serves them all
ROWDOT_COLS = 4


def _rowdot32_cols(decode, block_bytes: int, ncols: int = ROWDOT_COLS):
    """rowdot for ``ncols`` activation rows at once: rowdotN(w, wo, nb, a, ao, da, dao, tab) ->
    a tuple of float32, column c's activations at a[ao + c*32*nb], its scales at da[dao + c*nb]. Each
    sum is computed exactly as rowdot's (same lanes, same order), the codes decoded once per block."""

    def typer(typingctx, w, wo, nb, a, ao, da, dao, tab):
        if not (_arr1(w) and _arr1(a)):
            return None
        sig = types.UniTuple(types.float32, ncols)(w, wo, nb, a, ao, da, dao, tab)

        def codegen(context, builder, sig, args):
            w_arr, wo_v, nb_v, a_arr, ao_v, da_arr, dao_v, tab_arr = args
            wbase = _ptr_at(context, builder, sig.args[0], w_arr, wo_v)
            a0 = _ptr_at(context, builder, sig.args[3], a_arr, ao_v)
            d0 = _ptr_at(context, builder, sig.args[5], da_arr, dao_v)
            k = builder.mul(nb_v, ir.Constant(_I64, 32))
            cols = [(builder.gep(a0, [builder.mul(k, ir.Constant(_I64, c))]),
                     builder.gep(d0, [builder.mul(nb_v, ir.Constant(_I64, c))])) for c in range(ncols)]
            tbase = _ptr_at(context, builder, sig.args[7], tab_arr, ir.Constant(_I64, 0))
            sums = _rowdot_blocks(builder, decode, block_bytes, [wbase], nb_v, cols, tbase)[0]
            return context.make_tuple(builder, sig.return_type, sums)

        return sig, codegen

    return intrinsic(typer)


#: weight rows per call of the multi-row row dots (a decode's mat-vec): independent chains in flight
ROWDOT_ROWS = 4


def _rowdot32_rows(decode, block_bytes: int):
    """rowdot for ROWDOT_ROWS weight rows at once (row i at w[wo + i*rs]) and one activation row:
    rowsdot(w, wo, rs, nb, a, ao, da, dao, tab) -> a tuple of float32, each sum exactly rowdot's.

    Give rows far apart (rs many rows): each then streams on through its own range of rows, which
    the hardware prefetcher follows; adjacent rows would be four short runs, each ending in a jump
    (measured: a quarter of the bandwidth)."""

    def typer(typingctx, w, wo, rs, nb, a, ao, da, dao, tab):
        if not (_arr1(w) and _arr1(a)):
            return None
        sig = types.UniTuple(types.float32, ROWDOT_ROWS)(w, wo, rs, nb, a, ao, da, dao, tab)

        def codegen(context, builder, sig, args):
            w_arr, wo_v, rs_v, nb_v, a_arr, ao_v, da_arr, dao_v, tab_arr = args
            w0 = _ptr_at(context, builder, sig.args[0], w_arr, wo_v)
            wbases = [builder.gep(w0, [builder.mul(rs_v, ir.Constant(_I64, r))]) for r in range(ROWDOT_ROWS)]
            col = (_ptr_at(context, builder, sig.args[4], a_arr, ao_v),
                   _ptr_at(context, builder, sig.args[6], da_arr, dao_v))
            tbase = _ptr_at(context, builder, sig.args[8], tab_arr, ir.Constant(_I64, 0))
            sums = _rowdot_blocks(builder, decode, block_bytes, wbases, nb_v, [col], tbase)
            return context.make_tuple(builder, sig.return_type, [row[0] for row in sums])

        return sig, codegen

    return intrinsic(typer)


class RowDots(NamedTuple):
    """One type's row-dot intrinsics: one row and column, a decode's ROWDOT_ROWS rows, a batch's groups of 4
    columns and its last 2 or 3 (one decode of each row for all of them, as ``one``)."""

    one: Any
    rows: Any
    cols4: Any
    cols3: Any
    cols2: Any


def _row_dots(decode, block_bytes: int) -> RowDots:
    return RowDots(_rowdot32(decode, block_bytes), _rowdot32_rows(decode, block_bytes),
                   *(_rowdot32_cols(decode, block_bytes, c) for c in (4, 3, 2)))


#: the row-dot types by name, each (decoder, block bytes) made into its RowDots
ROWDOT = {name: _row_dots(*spec) for name, spec in (("q8_0", (_decode_q8_0, 34)), ("q4_0", (_decode_q4_0, 18)),
                                                     ("q5_0", (_decode_q5_0, 22)), ("iq4_nl", (_decode_iq4_nl, 18)))}


def _reduce_i32(builder: ir.IRBuilder, v: ir.Value) -> ir.Value:
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I32, [v.type]),
                                        f"llvm.vector.reduce.add.v{v.type.count}i32")
    return builder.call(fn, [v])
