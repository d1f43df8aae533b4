"""The K-quants' superblock dot products as numba intrinsics (LLVM vector IR): the sub-block sums stay in 8
int32 lanes, are multiplied by their sub-block scale as vectors and reduced once per 256 codes instead of
once per 32 or 16, four products' sums in one reduction, their float steps as one vector. Built on
intrinsics.py's block helpers."""

from __future__ import annotations

from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from ....quants.iq2_tables import common_grid_u64
from ....quants.iq3 import IQ3S_GRID, IQ3XXS_GRID, ksigns_iq2xs
from ....types import GGMLType
from ..simd import _AVX2, _AVX512, _F32, _I8, _I16, _I32, _I64, _fp16_lanes, _halves, _insert_lanes, _splat, _vec
from .intrinsics import (
    _IQ4NL_LUT,
    ROWDOT_COLS,
    RowDots,
    _arr1,
    _consts,
    _i16_lanes,
    _lookup16,
    _maddubs,
    _maddwd,
    _nibbles32,
    _pairs,
    _prefetch_ahead,
    _ptr_at,
    _signed_lanes8,
)


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
    """Q4_K (five=False) / Q5_K superblock codegen: body(builder, wb, cols) -> per column (ab, bb) two
    <8 x i32> whose lane totals are [sum_s sc_s * sum q*a, sum_s m_s * sum a], the second from the
    activation's 16-sums at bb (int32). Q5_K adds bit 2g+half of each qh byte as the codes' fifth bit."""
    qs_at = 48 if five else 16

    def body(builder, wb, cols):
        scales, mins = _k4_scale_words(builder, builder.gep(wb, [ir.Constant(_I64, 4)]))
        qh = _load_at(builder, wb, 16, 32) if five else None
        accs = [ir.Constant(_vec(16 if _AVX512 else 8, _I32), [0] * (16 if _AVX512 else 8))] * len(cols)
        sc16 = builder.trunc(scales, _vec(8, _I16))
        for g in range(4):
            v = _load_at(builder, wb, qs_at + 32 * g, 32)
            halves = []
            for half in range(2):
                if half == 0:
                    codes = builder.and_(v, _consts(32, [15] * 32))
                else:
                    codes = builder.lshr(v, _consts(32, [4] * 32))
                if five:
                    bit = builder.and_(qh, _consts(32, [1 << (2 * g + half)] * 32))
                    hit = builder.icmp_unsigned("!=", bit, _consts(32, [0] * 32))
                    codes = builder.or_(codes, builder.select(hit, _consts(32, [16] * 32), _consts(32, [0] * 32)))
                halves.append(codes)
            if _AVX512:  # both sub-blocks of the group in one 64-byte register (the same integer sums)
                codes = builder.shuffle_vector(halves[0], halves[1], ir.Constant(_vec(64, _I32), list(range(64))))
                sc = builder.shuffle_vector(sc16, ir.Constant(sc16.type, ir.Undefined),
                                            ir.Constant(_vec(32, _I32), [2 * g] * 16 + [2 * g + 1] * 16))
                for c, (ab, _) in enumerate(cols):
                    p = _maddubs(builder, codes, _load_at(builder, ab, 64 * g, 64))
                    accs[c] = builder.add(accs[c], _maddwd(builder, p, sc))
                continue
            for half, codes in enumerate(halves):
                scale = builder.extract_element(scales, ir.Constant(_I32, 2 * g + half))
                for c, (ab, _) in enumerate(cols):
                    a32 = _load_at(builder, ab, 64 * g + 32 * half, 32)
                    accs[c] = builder.add(accs[c], _scaled_lanes8(builder, codes, a32, [scale]))
        if _AVX512:
            accs = [_halves(builder, acc) for acc in accs]
        out = []
        for acc, (_, bb) in zip(accs, cols, strict=True):
            bsums = builder.load(builder.bitcast(bb, _vec(16, _I32).as_pointer()), align=4)
            out.append([acc, builder.mul(_pairs(builder, bsums), mins)])
        return out

    return body


def _idx(values: list[int]) -> ir.Constant:
    return ir.Constant(_vec(len(values), _I32), values)


def _q6_scale_pair(builder: ir.IRBuilder, group: ir.Value, i: int, j: int) -> ir.Value:
    """<16 x i16> lanes 0..7 = scale i, lanes 8..15 = scale j of a <16 x i16> holding 8 scales in both 128-bit
    halves: one in-lane byte shuffle (vpshufb), where 16 lane inserts of two loaded bytes took 7 instructions."""
    return builder.shuffle_vector(group, ir.Constant(group.type, ir.Undefined), _idx([i] * 8 + [8 + j] * 8))


def _sub16_body(codes_at, scale_bytes, tail):
    """Codegen of a superblock of 16 sub-blocks of 16 (Q2_K, Q3_K, Q6_K): body(builder, wb, cols) -> per column
    (ab, bb) the <8 x i32> sums tail(builder, wb, acc, bsums) makes of acc (lane total sum_j scale_j * sum over
    sub-block j of code*a, codes unsigned) and the activation's 16-sums at bb (int32). codes_at(builder, wb, h,
    k) gives the <32 x i8> unsigned codes of values 128h+32k..+31 (sub-blocks 8h+2k and 8h+2k+1), scale_bytes
    (builder, wb) the 16 scales as <16 x i8> (signed), widened once per superblock."""

    def body(builder, wb, cols):
        accs = [ir.Constant(_vec(8, _I32), [0] * 8)] * len(cols)
        sc8 = scale_bytes(builder, wb)
        sc16 = builder.sext(sc8, _vec(16, _I16))
        undef16 = ir.Constant(sc16.type, ir.Undefined)
        # scales 8h..8h+7 in both halves (a vpermq each), for _q6_scale_pair
        groups = [builder.shuffle_vector(sc16, undef16, _idx([8 * h + i for i in range(8)] * 2)) for h in range(2)]
        for hf in range(2):
            for k in range(4):
                codes = codes_at(builder, wb, hf, k)
                if _AVX2:
                    pair = _q6_scale_pair(builder, groups[hf], 2 * k, 2 * k + 1)
                else:
                    scales = [builder.sext(builder.extract_element(sc8, ir.Constant(_I32, 8 * hf + 2 * k + g)), _I32)
                              for g in range(2)]
                for c, (ab, _) in enumerate(cols):
                    a32 = _load_at(builder, ab, 128 * hf + 32 * k, 32)
                    if _AVX2:
                        lanes = _maddwd(builder, _maddubs(builder, codes, a32), pair)
                    else:
                        lanes = _scaled_lanes8(builder, codes, a32, scales)
                    accs[c] = builder.add(accs[c], lanes)
        out = []
        for acc, (_, bb) in zip(accs, cols, strict=True):
            bsums = builder.load(builder.bitcast(bb, _vec(16, _I32).as_pointer()), align=4)
            out.append(tail(builder, wb, sc8, acc, bsums))
        return out

    return body


def _bits(builder: ir.IRBuilder, v: ir.Value, shift: int, mask: int) -> ir.Value:
    """(v >> shift) & mask, bytewise."""
    return builder.and_(builder.lshr(v, _consts(32, [shift] * 32)), _consts(32, [mask] * 32))


def _offset_tail(shift: int):
    """Codes stored as value + 2^shift: the offset comes off as 2^shift * sum_j scale_j * bsum_j, lane-wise (the
    same int32 total), as ggml's AVX2 kernels do."""

    def tail(builder, wb, sc8, acc, bsums):
        off = _halves(builder, builder.mul(builder.sext(sc8, _vec(16, _I32)), bsums))
        return [builder.sub(acc, builder.shl(off, ir.Constant(_vec(8, _I32), [shift] * 8)))]

    return tail


def _q6_codes(builder, wb, hf, k):
    """Q6_K: 4 low bits from ql (bytes 0..127), 2 high bits from qh (128..191); codes 0..63 (value + 32)."""
    ql = _load_at(builder, wb, 64 * hf + 32 * (k % 2), 32)
    lo = _bits(builder, ql, 4 * (k // 2), 15)
    hi = _bits(builder, _load_at(builder, wb, 128 + 32 * hf, 32), 2 * k, 3)
    return builder.or_(lo, builder.shl(hi, _consts(32, [4] * 32)))


def _q3_codes(builder, wb, hf, k):
    """Q3_K: 2 bits from qs (bytes 32..95), the third from hmask (0..31) bit 4h+k; codes 0..7 (value + 4)."""
    lo = _bits(builder, _load_at(builder, wb, 32 + 32 * hf, 32), 2 * k, 3)
    hi = _bits(builder, _load_at(builder, wb, 0, 32), 4 * hf + k, 1)
    return builder.or_(lo, builder.shl(hi, _consts(32, [2] * 32)))


def _q2_codes(builder, wb, hf, k):
    """Q2_K: 2 bits from qs (bytes 16..79); codes 0..3."""
    return _bits(builder, _load_at(builder, wb, 16 + 32 * hf, 32), 2 * k, 3)


def _q3_scales(builder, wb):
    """Q3_K's 12 scale bytes (96..107) -> its 16 6-bit scales minus 32, on four little-endian u32 words as
    ggml's dequantize_row_q3_K unpacks them."""
    def word(i: int) -> ir.Value:
        return builder.load(builder.bitcast(builder.gep(wb, [ir.Constant(_I64, 96 + 4 * i)]), _I32.as_pointer()),
                            align=1)

    def c(v: int) -> ir.Constant:
        return ir.Constant(_I32, v)

    a0, a1, tmp = word(0), word(1), word(2)
    low, two = c(0x0F0F0F0F), c(0x03030303)
    w = [builder.or_(builder.and_(a, low), builder.shl(builder.and_(builder.lshr(tmp, c(sh)), two), c(4)))
         for a, sh in ((a0, 0), (a1, 2))]
    w += [builder.or_(builder.and_(builder.lshr(a, c(4)), low),
                      builder.shl(builder.and_(builder.lshr(tmp, c(sh)), two), c(4))) for a, sh in ((a0, 4), (a1, 6))]
    v = ir.Constant(_vec(4, _I32), ir.Undefined)
    for i, x in enumerate(w):
        v = builder.insert_element(v, x, c(i))
    return builder.sub(builder.bitcast(v, _vec(16)), _consts(16, [32] * 16))


def _q2_scale_bytes(builder, wb):
    """Q2_K's 16 scale bytes (0..15): the scale is the low nibble (the high one is the min)."""
    return builder.and_(_load_at(builder, wb, 0, 16), _consts(16, [15] * 16))


def _q2_tail(builder, wb, sc8, acc, bsums):
    """Q2_K: [sum_j scale_j * sum q*a, sum_j min_j * bsum_j], the mins the scale bytes' high nibbles."""
    mins = builder.zext(builder.lshr(_load_at(builder, wb, 0, 16), _consts(16, [4] * 16)), _vec(16, _I32))
    return [acc, _halves(builder, builder.mul(mins, bsums))]


def _iq4xs_body(builder, wb, cols):
    """IQ4_XS superblock codegen: per column (ab, bb) one <8 x i32> whose lane total is sum_{s<8} (ls_s - 32) *
    sum over sub-block s of value*a, the values IQ4_NL's (a 16-byte lookup of the nibbles: qs at byte 8, 16 bytes a
    sub-block, low nibbles first) and ls_s the 6-bit scale from scales_l (byte 4, a nibble each) and scales_h (byte
    2, two bits each). Signed codes: ggml's sign trick on AVX2 (intrinsics._signed_lanes8)."""
    def c(v: int) -> ir.Constant:
        return ir.Constant(_I32, v)

    lo = builder.load(builder.bitcast(builder.gep(wb, [ir.Constant(_I64, 4)]), _I32.as_pointer()), align=1)
    hi = builder.zext(builder.load(builder.bitcast(builder.gep(wb, [ir.Constant(_I64, 2)]), _I16.as_pointer()),
                                   align=1), _I32)
    low = builder.and_(builder.lshr(_splat(builder, lo, 8), _idx([4 * i for i in range(8)])), _idx([15] * 8))
    high = builder.and_(builder.lshr(_splat(builder, hi, 8), _idx([2 * i for i in range(8)])), _idx([3] * 8))
    ls = builder.or_(low, builder.shl(high, _idx([4] * 8)))
    scales = builder.sub(ls, _idx([32] * 8))
    accs = [ir.Constant(_vec(8, _I32), [0] * 8)] * len(cols)
    for sb in range(8):
        codes = _lookup16(builder, _IQ4NL_LUT[False], _nibbles32(builder, _load_at(builder, wb, 8 + 16 * sb, 16)))
        scale = builder.extract_element(scales, c(sb))
        for k, (ab, _) in enumerate(cols):
            accs[k] = builder.add(accs[k], _signed_lanes8(builder, codes, _load_at(builder, ab, 32 * sb, 32), scale))
    return [[acc] for acc in accs]


def _table(builder: ir.IRBuilder, name: str, ty: ir.Type, values) -> ir.Value:
    """An integer table as the module's internal constant global (made once per module)."""
    module = builder.module
    try:
        return module.get_global(name)
    except KeyError:
        aty = ir.ArrayType(ty, len(values))
        g = ir.GlobalVariable(module, aty, name)
        g.linkage, g.global_constant = "internal", True
        g.initializer = ir.Constant(aty, [int(v) for v in values])
        return g


def _iq3_body(xxs: bool):
    """IQ3_S (xxs False) / IQ3_XXS superblock codegen: per column (ab, bb) one <8 x i32> whose lane total is
    sum_{s<8} (2*ls_s + 1) * sum over sub-block s of grid*sign*a, as ggml's vec_dot_iq3_s/_iq3_xxs_q8_K: per
    sub-block its 8 grid points (4 unsigned magnitudes each, loaded one by one from a vector of indices, as ggml
    does; vpgatherdd measured slower, 7.7 against 8.3 GB/s), and its 32 sign bits applied to the activation.
    IQ3_S: d, qs at 2 (+ a 9th index bit from qh at 66), signs at 74, 4-bit scales at 106. IQ3_XXS: d, qs at 2, a u32
    per sub-block at 66: four 7-bit sign codes (ksigns_iq2xs) and the scale in its top 4 bits; ggml's 1/4 on the
    whole sum comes with d (_sbacc's d_scale)."""

    def body(builder, wb, cols):
        def c(v: int) -> ir.Constant:
            return ir.Constant(_I32, v)

        grid = (_table(builder, "pyggml_iq3xxs_grid", _I32, IQ3XXS_GRID) if xxs
                else _table(builder, "pyggml_iq3s_grid", _I32, IQ3S_GRID))
        ksigns = _table(builder, "pyggml_ksigns_iq2xs", _I8, ksigns_iq2xs()) if xxs else None
        zero8 = ir.Constant(_vec(8, _I32), [0] * 8)
        accs = [zero8] * len(cols)
        bit_of = _consts(32, [1 << (v % 8) for v in range(32)])
        for sb in range(8):
            idx = builder.zext(_load_at(builder, wb, 2 + 8 * sb, 8), _vec(8, _I32))
            if xxs:
                aux = builder.load(builder.bitcast(builder.gep(wb, [ir.Constant(_I64, 66 + 4 * sb)]),
                                                   _I32.as_pointer()), align=1)
                sbytes = ir.Constant(_vec(4), ir.Undefined)
                for g in range(4):
                    code = builder.and_(builder.lshr(aux, c(7 * g)), c(127))
                    sbytes = builder.insert_element(sbytes, builder.load(builder.gep(ksigns, [c(0), code])), c(g))
                ls = builder.lshr(aux, c(28))
            else:  # the 9th index bit: bit k of qh byte sb for point k
                qh = _splat(builder, builder.zext(builder.load(builder.gep(wb, [ir.Constant(_I64, 66 + sb)])), _I32), 8)
                idx = builder.or_(idx, builder.shl(builder.and_(builder.lshr(qh, _idx(list(range(8)))),
                                                                _idx([1] * 8)), _idx([8] * 8)))
                sbytes = _load_at(builder, wb, 74 + 4 * sb, 4)  # <4 x i8>: bit j of byte l signs value 8l + j
                sc_byte = builder.zext(builder.load(builder.gep(wb, [ir.Constant(_I64, 106 + sb // 2)])), _I32)
                ls = builder.and_(builder.lshr(sc_byte, c(4 * (sb % 2))), c(15))
            pts = zero8
            for k in range(8):
                at = builder.extract_element(idx, c(k))
                pts = builder.insert_element(pts, builder.load(builder.gep(grid, [c(0), at])), c(k))
            codes = builder.bitcast(pts, _vec(32))
            spread = builder.shuffle_vector(sbytes, ir.Constant(sbytes.type, ir.Undefined),
                                            _idx([v // 8 for v in range(32)]))
            neg = builder.icmp_unsigned("!=", builder.and_(spread, bit_of), _consts(32, [0] * 32))
            scale = builder.add(builder.shl(ls, c(1)), c(1))
            for k, (ab, _) in enumerate(cols):
                a32 = _load_at(builder, ab, 32 * sb, 32)
                signed = builder.select(neg, builder.sub(_consts(32, [0] * 32), a32), a32)
                accs[k] = builder.add(accs[k], _scaled_lanes8(builder, codes, signed, [scale]))
        return [[acc] for acc in accs]

    return body


def _iq2_body(kind: str):
    """IQ2_XXS / IQ2_XS / IQ2_S (kind "xxs", "xs", "s") superblock codegen: per column (ab, bb) one <8 x i32> whose
    lane total is sum over the 8 sub-blocks of 32 of (2*ls + 1) * sum(grid * sign * a) (IQ2_XS/IQ2_S: a scale per
    16 values), as ggml's vec_dot_iq2_*_q8_K; its 1/8 on the whole sum comes with d (_sbacc's d_scale). Per
    sub-block the 4 grid points (8 unsigned magnitudes each, a u64 table loaded point by point, as ggml does) and
    the 32 sign bits applied to the activation. IQ2_XXS: d, then per sub-block 4 index bytes and a u32 of four
    7-bit sign codes (ksigns_iq2xs) with the scale in its top 4 bits. IQ2_XS: d, a u16 per point (9-bit index,
    7-bit sign code) at 2, the two 4-bit scales of each sub-block at 66. IQ2_S: d, index bytes at 2 with two more
    bits each from the qh byte at 66, sign bytes at 34, scales at 74."""
    grid_name = {"xxs": "pyggml_iq2xxs_grid", "xs": "pyggml_iq2xs_grid", "s": "pyggml_iq2s_grid"}[kind]
    grid_values = common_grid_u64({"xxs": GGMLType.IQ2_XXS, "xs": GGMLType.IQ2_XS, "s": GGMLType.IQ2_S}[kind])

    def body(builder, wb, cols):
        def c(v: int) -> ir.Constant:
            return ir.Constant(_I32, v)

        grid = _table(builder, grid_name, _I64, grid_values)
        ksigns = _table(builder, "pyggml_ksigns_iq2xs", _I8, ksigns_iq2xs()) if kind != "s" else None
        zero8 = ir.Constant(_vec(8, _I32), [0] * 8)
        accs = [zero8] * len(cols)
        bit_of = _consts(32, [1 << (v % 8) for v in range(32)])
        for sb in range(8):
            if kind == "xxs":
                idx = [builder.zext(builder.load(builder.gep(wb, [ir.Constant(_I64, 2 + 8 * sb + p)])), _I32)
                       for p in range(4)]
                aux = builder.load(builder.bitcast(builder.gep(wb, [ir.Constant(_I64, 6 + 8 * sb)]),
                                                   _I32.as_pointer()), align=1)
                codes7 = [builder.and_(builder.lshr(aux, c(7 * p)), c(127)) for p in range(4)]
                scales = [builder.add(builder.shl(builder.lshr(aux, c(28)), c(1)), c(1))]
            else:
                if kind == "xs":
                    words = [builder.zext(builder.load(builder.bitcast(
                        builder.gep(wb, [ir.Constant(_I64, 2 + 8 * sb + 2 * p)]), ir.IntType(16).as_pointer()),
                        align=1), _I32) for p in range(4)]
                    idx = [builder.and_(w, c(511)) for w in words]
                    codes7 = [builder.lshr(w, c(9)) for w in words]
                else:
                    qh = builder.zext(builder.load(builder.gep(wb, [ir.Constant(_I64, 66 + sb)])), _I32)
                    idx = [builder.or_(builder.zext(builder.load(builder.gep(wb, [ir.Constant(_I64, 2 + 4 * sb + p)])),
                                                    _I32),
                                       builder.shl(builder.and_(builder.lshr(qh, c(2 * p)), c(3)), c(8)))
                           for p in range(4)]
                sc = builder.zext(builder.load(builder.gep(wb, [ir.Constant(_I64, (66 if kind == "xs" else 74) + sb)])),
                                  _I32)
                scales = [builder.add(builder.shl(builder.and_(v, c(15)), c(1)), c(1))
                          for v in (sc, builder.lshr(sc, c(4)))]
            pts = ir.Constant(_vec(4, _I64), ir.Undefined)
            for p in range(4):
                pts = builder.insert_element(pts, builder.load(builder.gep(grid, [c(0), idx[p]])), c(p))
            codes = builder.bitcast(pts, _vec(32))
            if kind == "s":  # <4 x i8>: bit j of byte p signs value 8p + j
                sbytes = _load_at(builder, wb, 34 + 4 * sb, 4)
            else:
                sbytes = ir.Constant(_vec(4), ir.Undefined)
                for p in range(4):
                    sbytes = builder.insert_element(sbytes, builder.load(builder.gep(ksigns, [c(0), codes7[p]])), c(p))
            spread = builder.shuffle_vector(sbytes, ir.Constant(sbytes.type, ir.Undefined),
                                            _idx([v // 8 for v in range(32)]))
            neg = builder.icmp_unsigned("!=", builder.and_(spread, bit_of), _consts(32, [0] * 32))
            for k, (ab, _) in enumerate(cols):
                a32 = _load_at(builder, ab, 32 * sb, 32)
                signed = builder.select(neg, builder.sub(_consts(32, [0] * 32), a32), a32)
                accs[k] = builder.add(accs[k], _scaled_lanes8(builder, codes, signed, scales))
        return [[acc] for acc in accs]

    return body


_q6_body = _sub16_body(_q6_codes, lambda builder, wb: _load_at(builder, wb, 192, 16), _offset_tail(5))
_q3_body = _sub16_body(_q3_codes, _q3_scales, _offset_tail(2))
_q2_body = _sub16_body(_q2_codes, _q2_scale_bytes, _q2_tail)


def _hadd(builder: ir.IRBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
    """<8 x i32> a, b -> per 128-bit half [a0+a1, a2+a3, b0+b1, b2+b3] (phaddd's lane order)."""
    even = builder.shuffle_vector(a, b, _idx([0, 2, 8, 10, 4, 6, 12, 14]))
    odd = builder.shuffle_vector(a, b, _idx([1, 3, 9, 11, 5, 7, 13, 15]))
    return builder.add(even, odd)


def _lane_totals(builder: ir.IRBuilder, vecs: list[ir.Value]) -> ir.Value:
    """Four or eight <8 x i32> -> <4|8 x i32>, lane i the total of vecs[i]: one pairwise-add tree over all of
    them (7 shuffle-add steps for eight) where a horizontal sum each took 3 steps apiece. Integer sums, so
    the order changes nothing."""
    quads = []
    for q in range(0, len(vecs), 4):
        v = vecs[q:q + 4]
        quads.append(_hadd(builder, _hadd(builder, v[0], v[1]), _hadd(builder, v[2], v[3])))
    if len(quads) == 1:  # [v0..v3 of the low lanes | v0..v3 of the high lanes]
        return _halves(builder, quads[0])
    lo = builder.shuffle_vector(quads[0], quads[1], _idx([0, 1, 2, 3, 8, 9, 10, 11]))
    hi = builder.shuffle_vector(quads[0], quads[1], _idx([4, 5, 6, 7, 12, 13, 14, 15]))
    return builder.add(lo, hi)


def _sbacc(body, d_at: tuple[int, ...], block_bytes: int, d_scale: float, rows: bool, g: int = ROWDOT_COLS):
    """An accumulating superblock intrinsic for g <= 4 (ROWDOT_COLS) products at once, from a codegen body.

    Columns (rows=False): sbacc(w, o, a, ao, bs, bso, ak, bk, da, dao, dak, tab, acc), the superblock at w[o]
    against activation rows p = 0..g-1 at a[ao + p*ak], 16-sums bs[bso + p*bk], scales da[dao + p*dak].
    Weight rows (rows=True): sbacc(w, o, ws, a, ao, bs, bso, dab, tab, acc), the superblocks at w[o + p*ws]
    against one activation row (scale dab).
    d_at: the byte offsets of the superblock's fp16 scales, one per value of the body (Q4_K/Q5_K/Q2_K: d and dmin;
    Q6_K/Q3_K: d), d_scale a power of two they are multiplied by. Either way product p's value i (the scale and the
    min term, or one) is added to acc[4*i + p] as (d_i * da) * float(sum): the float steps of a scalar loop over the
    products, done as one vector (the same bits), with the integer totals of all the sums from one reduction tree
    (_lane_totals) instead of a horizontal sum each. Lanes p >= g stay 0.

    The columns' superblock is prefetched PREFETCH_BYTES ahead: a batch streams one weight row after another
    at a fraction of a decode's pace, which the hardware prefetcher alone served at half the speed (Q6_K
    1536 x 8960 past the caches, 4 columns, 1 thread: 1.80 ms without, 1.27 with). A decode's four streams
    are left to it (prefetched: 0.60 -> 0.73 ms a row)."""
    n = ROWDOT_COLS
    nret = len(d_at)
    m = nret * n
    zero_i = ir.Constant(_vec(8, _I32), [0] * 8)
    zero_f = ir.Constant(_F32, 0.0)

    def codegen(context, builder, sig, args):
        wb = _ptr_at(context, builder, sig.args[0], args[0], args[1])
        if rows:
            ab = _ptr_at(context, builder, sig.args[3], args[3], args[4])
            bb = _ptr_at(context, builder, sig.args[5], args[5], args[6])
            wbs = [wb] + [builder.gep(wb, [builder.mul(args[2], ir.Constant(_I64, p))]) for p in range(1, g)]
            vecs = [body(builder, w, [(ab, bb)])[0] for w in wbs]
            dab = args[7]
            other = _splat(builder, dab, m) if g == n else _insert_lanes(
                builder, [dab if p < g else zero_f for _ in d_at for p in range(n)])
            tab, tarr, acc, aarr = args[8], sig.args[8], args[9], sig.args[9]
        else:
            ab = _ptr_at(context, builder, sig.args[2], args[2], args[3])
            bb = _ptr_at(context, builder, sig.args[4], args[4], args[5])
            cols = [(ab, bb)] + [(builder.gep(ab, [builder.mul(args[6], ir.Constant(_I64, p))]),
                                  builder.gep(bb, [builder.mul(args[7], ir.Constant(_I64, p))])) for p in range(1, g)]
            _prefetch_ahead(builder, wb, block_bytes)
            vecs = body(builder, wb, cols)
            wbs = [wb]
            da0 = _ptr_at(context, builder, sig.args[8], args[8], args[9])
            das = [builder.load(builder.gep(da0, [builder.mul(args[10], ir.Constant(_I64, p))])) for p in range(g)]
            other = _insert_lanes(builder, (das + [zero_f] * (n - g)) * nret)
            tab, tarr, acc, aarr = args[11], sig.args[11], args[12], sig.args[12]
        totals = _lane_totals(builder, [vecs[p][i] if p < g else zero_i for i in range(nret) for p in range(n)])
        tbase = _ptr_at(context, builder, tarr, tab, ir.Constant(_I64, 0))
        ds = _fp16_lanes(builder, [builder.gep(wbs[min(p, len(wbs) - 1)], [ir.Constant(_I64, off)])
                                   for off in d_at for p in range(n)], tbase)
        if d_scale != 1.0:  # a power of two (IQ3_XXS's 1/4): exact
            ds = builder.fmul(ds, ir.Constant(ds.type, [d_scale] * m))
        prod = builder.fmul(builder.fmul(ds, other), builder.sitofp(totals, _vec(m, _F32)))
        ptr = builder.bitcast(_ptr_at(context, builder, aarr, acc, ir.Constant(_I64, 0)), _vec(m, _F32).as_pointer())
        builder.store(builder.fadd(builder.load(ptr, align=4), prod), ptr, align=4)
        return context.get_dummy_value()

    def ok(w, a, bs, tab, acc) -> bool:
        return (_arr1(w) and _arr1(a) and isinstance(bs, types.Array) and bs.layout == "C"
                and bs.dtype == types.int32 and all(isinstance(t, types.Array) and t.layout == "C"
                                                    and t.dtype == types.float32 for t in (tab, acc)))

    if rows:
        def typer(typingctx, w, o, ws, a, ao, bs, bso, dab, tab, acc):
            return (types.void(w, o, ws, a, ao, bs, bso, dab, tab, acc), codegen) \
                if ok(w, a, bs, tab, acc) and dab == types.float32 else None
    else:
        def typer(typingctx, w, o, a, ao, bs, bso, ak, bk, da, dao, dak, tab, acc):
            good = ok(w, a, bs, tab, acc) and isinstance(da, types.Array) and da.dtype == types.float32 \
                and da.layout == "C" and da.ndim == 1
            return (types.void(w, o, a, ao, bs, bso, ak, bk, da, dao, dak, tab, acc), codegen) if good else None

    return intrinsic(typer)


#: per superblock type: (codegen body, byte offsets of d [and dmin], block bytes, d's factor), in dots.K_KINDS's order
_TYPES = {"q4_k": (_k4_body(False), (0, 2), 144, 1.0), "q5_k": (_k4_body(True), (0, 2), 176, 1.0),
          "q6_k": (_q6_body, (208,), 210, 1.0), "q2_k": (_q2_body, (80, 82), 84, 1.0),
          "q3_k": (_q3_body, (108,), 110, 1.0), "iq4_xs": (_iq4xs_body, (0,), 136, 1.0),
          "iq3_s": (_iq3_body(False), (0,), 110, 1.0), "iq3_xxs": (_iq3_body(True), (0,), 98, 0.25),
          "iq2_xxs": (_iq2_body("xxs"), (0,), 66, 0.125), "iq2_xs": (_iq2_body("xs"), (0,), 74, 0.125),
          "iq2_s": (_iq2_body("s"), (0,), 82, 0.125)}
#: superblock bytes per type
BLOCK_BYTES = {name: spec[2] for name, spec in _TYPES.items()}
#: per type its intrinsics (see _sbacc), named as the row dots' (intrinsics.RowDots): one weight row, a decode's four
#: rows, a batch's groups of four columns and its last two or three
SBACC = {name: RowDots(_sbacc(*spec, True, 1), _sbacc(*spec, True, 4), _sbacc(*spec, False, 4),
                       _sbacc(*spec, False, 3), _sbacc(*spec, False, 2)) for name, spec in _TYPES.items()}
