"""Prompt-size MUL_MAT with Q4_K/Q6_K weights (x86 AVX2): integer tiles over interleaved rows (the
Q8_0/Q4_0/Q5_0 register tiles are in q0tiles.py, the tiles over load-time repacked weights in repacked.py).

Why: a prompt multiplies every weight by hundreds of activation rows, so it is compute-bound. The
numpy kernel dequantizes to float32 and uses BLAS sgemm, which is capped by the float multiply-add
rate; pmaddubsw multiplies 32 int8 pairs per instruction, twice that rate. ggml's Q4_K prompt
kernel (repack.cpp, gemm_q4_K_8x8_q8_K) gets there by interleaving 8 weight rows, so that one
32-byte register holds 4 codes of each of 8 rows and its integer sums land in 8 lanes, one per row:
no horizontal sums, and the sub-block scales apply per lane through pmaddwd.

Here the interleaving happens per work chunk instead of at load: a thread takes 8 weight rows,
unpacks them once into an interleaved scratch tile (about 2.5 KB per 256 columns, L1/L2 sized) and
streams every activation row past it, 4 at a time. The activations are quantized to Q8_K first, as
for every Q4_K product. Each output is the same integer superblock dots and the same float
operations, in the same order, as the mat-vec kernel (quants.dots._mv_q4_k): prompt and decode give
the same bits for a token. The 32-value block types cannot share lanes that way (see q0tiles.py).

Scratch tile, per superblock (``SB_BYTES``): codes (64 steps of 32 bytes: rows 0..7, 4 codes each),
sub-block scales (8 x 16 i16, each row's scale in its two lanes), mins (4 x 16 i16, pairs of
sub-blocks), d and dmin (8 f32 each).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ....quants.jitcache import variant
from ..jit.record import AUX, T_DST, T_SRC0, T_SRC1, rec, row_index, span
from ..native import atomic_add, atomic_store, f32p, i8p, i32p, i64p, u8p
from ..repack import (
    Q4K_CODES,
    Q4K_D,
    Q4K_DMIN,
    Q4K_GROUP_BYTES,
    Q4K_MINS,
    Q4K_SCALES,
    Q6K_CODES,
    Q6K_D,
    Q6K_GROUP_BYTES,
    Q6K_SCALES,
    Q6K_WORDS,
)
from ..simd import _AVX2, _AVX512, _VNNI, _VNNI512, _vec
from ..threads import C_CHUNK, C_WDATA, barrier
from .dots import _h, _scale_min_k4, _u32
from .intrinsics import _dpbusd, _maddubs, _maddwd, _prefetch_ahead

ROWS = 8  # interleaved weight rows per tile
COLS = 4  # activation rows per micro-kernel call
SB_CODES = 2048
SB_SCALES = SB_CODES
SB_MINS = SB_SCALES + 256
SB_D = SB_MINS + 128
SB_DMIN = SB_D + 32
SB_BYTES = SB_DMIN + 32
#: Q6_K tile: codes, 16 sub-block scales (16 i16 each), scale pairs for the -32 offset (8 x 16 i16), d
Q6_SCALES = SB_CODES
Q6_PAIRS = Q6_SCALES + 512
Q6_D = Q6_PAIRS + 256
Q6_BYTES = Q6_D + 32
_opts = {"cache": True, "error_model": "numpy"}

_I8, _I16, _I32, _I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
_F32 = ir.FloatType()


#: the four 4-bit (Q4_K) or 2-bit (Q6_K high bits) fields of a little-endian u32 of codes
_LO4, _LO2 = np.uint32(0x0F0F0F0F), np.uint32(0x03030303)


@numba.njit(**_opts)
def repack_q4_k(wu, row0, rs, nsb, tab, out):  # pragma: no cover - compiled
    """Interleave weight rows row0..row0+7 (Q4_K, row stride rs bytes) into the scratch tile ``out``.

    The codes move a u32 (4 codes of one row) at a time: byte i of the 32-byte group g holds
    element 64g+i in its low nibble and 64g+32+i in its high one, and a tile step takes 4
    consecutive elements of each row. The 8 rows are the inner loop so a step's 32 bytes are
    written together."""
    o16 = out.view(np.int16)
    of = out.view(np.float32)
    o32 = out.view(np.uint32)
    sc = np.empty(8, np.int32)
    mn = np.empty(8, np.int32)
    for b in range(nsb):
        b4 = b * SB_BYTES // 4
        for g in range(4):
            for j in range(8):
                for r in range(ROWS):
                    v = np.uint32(_u32(wu, (row0 + r) * rs + 144 * b + 16 + 32 * g + 4 * j))
                    o32[b4 + (16 * g + j) * 8 + r] = v & _LO4
                    o32[b4 + (16 * g + 8 + j) * 8 + r] = (v >> np.uint32(4)) & _LO4
    for r in range(ROWS):
        for b in range(nsb):
            o = (row0 + r) * rs + 144 * b
            base = b * SB_BYTES
            of[(base + SB_D) // 4 + r] = _h(tab, wu, o)
            of[(base + SB_DMIN) // 4 + r] = _h(tab, wu, o + 2)
            _scale_min_k4(wu, o + 4, sc, mn)
            for s in range(8):
                o16[(base + SB_SCALES + 32 * s) // 2 + 2 * r] = sc[s]
                o16[(base + SB_SCALES + 32 * s) // 2 + 2 * r + 1] = sc[s]
            for j in range(4):
                o16[(base + SB_MINS + 32 * j) // 2 + 2 * r] = mn[2 * j]
                o16[(base + SB_MINS + 32 * j) // 2 + 2 * r + 1] = mn[2 * j + 1]


@numba.njit(**_opts)
def repack_q6_k(wu, row0, rs, nsb, tab, out):  # pragma: no cover - compiled
    """Interleave Q6_K weight rows row0..row0+7 into a scratch tile (codes unsigned 0..63), a u32 of
    4 codes at a time: ql bytes 64h+l and 64h+32+l give elements 128h+l, +32 (low nibbles) and
    +64, +96 (high nibbles), each with its 2 bits of qh byte 32h+l."""
    o16 = out.view(np.int16)
    of = out.view(np.float32)
    o32 = out.view(np.uint32)
    wi = wu.view(np.int8)
    four, two = np.uint32(4), np.uint32(2)
    for r in range(ROWS):
        for b in range(nsb):
            o = (row0 + r) * rs + 210 * b
            base = b * Q6_BYTES
            of[(base + Q6_D) // 4 + r] = _h(tab, wu, o + 208)
            for j in range(16):
                sc = wi[o + 192 + j]
                o16[(base + Q6_SCALES + 32 * j) // 2 + 2 * r] = sc
                o16[(base + Q6_SCALES + 32 * j) // 2 + 2 * r + 1] = sc
                o16[(base + Q6_PAIRS + 32 * (j // 2)) // 2 + 2 * r + j % 2] = sc
            for hf in range(2):
                for j in range(8):
                    w0 = np.uint32(_u32(wu, o + 64 * hf + 4 * j))
                    w1 = np.uint32(_u32(wu, o + 64 * hf + 32 + 4 * j))
                    h = np.uint32(_u32(wu, o + 128 + 32 * hf + 4 * j))
                    st = base // 4 + r + (32 * hf + j) * 8  # steps 32h+j, +8, +16, +24: 64 u32 apart
                    o32[st] = (w0 & _LO4) | ((h & _LO2) << four)
                    o32[st + 64] = (w1 & _LO4) | (((h >> two) & _LO2) << four)
                    o32[st + 128] = ((w0 >> four) & _LO4) | (((h >> four) & _LO2) << four)
                    o32[st + 192] = ((w1 >> four) & _LO4) | (((h >> np.uint32(6)) & _LO2) << four)


@numba.njit(**_opts)
def repack_q3_k(wu, row0, rs, nsb, tab, out):  # pragma: no cover - compiled
    """Q3_K weight rows row0..row0+7 as a Q6_K scratch tile: Q3_K's superblock has Q6_K's 16 sub-blocks of 16
    with signed scales, so its codes (value + 4: two bits of qs byte 32h+l shifted by 2k, the third from hmask
    byte l, bit 4h+k, for element 128h+32k+l) stored + 28 take the Q6_K tile's -32 offset unchanged, and the
    same integer sums and float steps as the mat-vec (dots._mv_q3_k) come out."""
    o16 = out.view(np.int16)
    of = out.view(np.float32)
    o32 = out.view(np.uint32)
    one, two, offset = np.uint32(0x01010101), np.uint32(2), np.uint32(0x1C1C1C1C)
    for r in range(ROWS):
        for b in range(nsb):
            o = (row0 + r) * rs + 110 * b
            base = b * Q6_BYTES
            of[(base + Q6_D) // 4 + r] = _h(tab, wu, o + 108)
            a0, a1, tmp = np.uint32(_u32(wu, o + 96)), np.uint32(_u32(wu, o + 100)), np.uint32(_u32(wu, o + 104))
            for j in range(16):  # ggml's dequantize_row_q3_K unpacking of the 12 scale bytes
                q, sh = j // 4, np.uint32(8 * (j % 4))
                word = a0 if q % 2 == 0 else a1
                lo = ((word >> np.uint32(4)) if q >= 2 else word) & _LO4
                hi = (tmp >> np.uint32(2 * q)) & _LO2
                sc = np.int32(((lo | (hi << np.uint32(4))) >> sh) & np.uint32(0xFF)) - 32
                o16[(base + Q6_SCALES + 32 * j) // 2 + 2 * r] = sc
                o16[(base + Q6_SCALES + 32 * j) // 2 + 2 * r + 1] = sc
                o16[(base + Q6_PAIRS + 32 * (j // 2)) // 2 + 2 * r + j % 2] = sc
            for hf in range(2):
                for t in range(8):
                    w = np.uint32(_u32(wu, o + 32 + 32 * hf + 4 * t))
                    h = np.uint32(_u32(wu, o + 4 * t))
                    for k in range(4):
                        code = ((w >> np.uint32(2 * k)) & _LO2) | (((h >> np.uint32(4 * hf + k)) & one) << two)
                        o32[base // 4 + r + (32 * hf + 8 * k + t) * 8] = code + offset


def _splat_i32(builder: ir.IRBuilder, v: ir.Value, n: int) -> ir.Value:
    vec = builder.insert_element(ir.Constant(_vec(n, _I32), ir.Undefined), v, ir.Constant(_I32, 0))
    return builder.shuffle_vector(vec, ir.Constant(_vec(n, _I32), ir.Undefined), ir.Constant(_vec(n, _I32), [0] * n))


def _splat_f32(builder: ir.IRBuilder, v: ir.Value, n: int) -> ir.Value:
    vec = builder.insert_element(ir.Constant(_vec(n, _F32), ir.Undefined), v, ir.Constant(_I32, 0))
    return builder.shuffle_vector(vec, ir.Constant(_vec(n, _F32), ir.Undefined), ir.Constant(_vec(n, _I32), [0] * n))


def _at(builder: ir.IRBuilder, base: ir.Value, off, ty: ir.Type) -> ir.Value:
    """Pointer of type ty* at byte base + off (off: int or i64 value)."""
    if isinstance(off, int):
        off = ir.Constant(_I64, off)
    return builder.bitcast(builder.gep(base, [off]), ty.as_pointer())


def _bcast_pairs(builder: ir.IRBuilder, v8: ir.Value) -> list[ir.Value]:
    """<8 x i32> small sums -> 4 x <16 x i16>: pair j = (v[2j], v[2j+1]) repeated over the 8 lanes."""
    pairs = builder.bitcast(builder.trunc(v8, _vec(8, _I16)), _vec(4, _I32))
    return [builder.bitcast(_splat_i32(builder, builder.extract_element(pairs, ir.Constant(_I32, j)), 8),
                            _vec(16, _I16)) for j in range(4)]


#: where GGUF Q6_K word w (ql words 0-31, qh words 32-47) sits among a repacked superblock's interleaved words
_Q6K_AT = {int(w): i for i, w in enumerate(Q6K_WORDS)}


class _Layout:
    """Where a tile kernel finds a superblock's codes, scales, mins and d/dmin: the scratch tiles repack_q4_k
    and repack_q6_k write (one code per byte, i16 scales, f32 d), or (packed) a Q4_K or Q6_K weight repacked at
    load (cpu/repack.py: the GGUF's packed codes, u8/i8 scales and mins, fp16 d; widened here, in registers)."""

    def __init__(self, q6: bool, packed: bool = False) -> None:
        self.q6, self.packed = q6, packed
        if packed:
            self.sb_bytes = Q6K_GROUP_BYTES if q6 else Q4K_GROUP_BYTES
        else:
            self.sb_bytes = Q6_BYTES if q6 else SB_BYTES

    def codes(self, builder: ir.IRBuilder, tb: ir.Value, step: int) -> ir.Value:
        """<32 x i8>: 4 codes of each of the 8 rows at tile step ``step`` (Q4_K: sub-block step // 8)."""
        if not self.packed:
            return builder.load(_at(builder, tb, 32 * step, _vec(32, _I8)), align=1)
        if self.q6:  # repack.py's Q6_K words: low nibbles of ql word 16h + r % 16, 2 bits of qh word 8h + r % 8
            h, r = divmod(step, 32)
            b32 = lambda v: ir.Constant(_vec(32, _I8), [v] * 32)  # noqa: E731
            word = lambda w: _at(builder, tb, Q6K_CODES + 32 * _Q6K_AT[w], _vec(32, _I8))  # noqa: E731
            lo = builder.load(word(16 * h + r % 16), align=1)
            if r >= 16:
                lo = builder.lshr(lo, b32(4))
            hi = builder.load(word(32 + 8 * h + r % 8), align=1)
            shift = 2 * (r // 8)  # the field's bits moved to 4..5: << 4, << 2, as they are, >> 2
            hi = builder.shl(hi, b32(4 - shift)) if shift < 4 else builder.lshr(hi, b32(shift - 4)) if shift > 4 else hi
            return builder.or_(builder.and_(lo, b32(15)), builder.and_(hi, b32(48)))
        sub, t = divmod(step, 8)
        v = builder.load(_at(builder, tb, Q4K_CODES + 32 * (8 * (sub // 2) + t), _vec(32, _I8)), align=1)
        if sub % 2:
            v = builder.lshr(v, ir.Constant(_vec(32, _I8), [4] * 32))
        return builder.and_(v, ir.Constant(_vec(32, _I8), [15] * 32))

    def scales(self, builder: ir.IRBuilder, tb: ir.Value, sub: int) -> ir.Value:
        """<16 x i16>: sub-block ``sub``'s scale of row r in lanes 2r and 2r+1."""
        if not self.packed:
            return builder.load(_at(builder, tb, (Q6_SCALES if self.q6 else SB_SCALES) + 32 * sub, _vec(16, _I16)),
                                align=1)
        v = self._scale_bytes(builder, tb, sub, _vec(8, _I16))
        return builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                      ir.Constant(_vec(16, _I32), [i // 2 for i in range(16)]))

    def scales32(self, builder: ir.IRBuilder, tb: ir.Value, sub: int) -> ir.Value:
        """<8 x i32>: sub-block ``sub``'s scale of row r in lane r."""
        if not self.packed:
            v = self.scales(builder, tb, sub)
            even = ir.Constant(_vec(8, _I32), list(range(0, 16, 2)))
            return builder.sext(builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), even), _vec(8, _I32))
        return self._scale_bytes(builder, tb, sub, _vec(8, _I32))

    def _scale_bytes(self, builder: ir.IRBuilder, tb: ir.Value, sub: int, ty: ir.Type) -> ir.Value:
        """A packed layout's 8 scale bytes of sub-block ``sub`` (row r in lane r), widened to ``ty`` (Q6_K's
        signed, Q4_K's unsigned)."""
        v = builder.load(_at(builder, tb, (Q6K_SCALES if self.q6 else Q4K_SCALES) + 8 * sub, _vec(8, _I8)), align=1)
        return builder.sext(v, ty) if self.q6 else builder.zext(v, ty)

    def pairs(self, builder: ir.IRBuilder, tb: ir.Value, j: int) -> ir.Value:
        """<16 x i16>: row r's Q6_K scales of sub-blocks 2j and 2j+1 in lanes 2r and 2r+1 (the -32 offset's)."""
        if not self.packed:
            return builder.load(_at(builder, tb, Q6_PAIRS + 32 * j, _vec(16, _I16)), align=1)
        v = builder.sext(builder.load(_at(builder, tb, Q6K_SCALES + 16 * j, _vec(16, _I8)), align=1), _vec(16, _I16))
        return builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                      ir.Constant(_vec(16, _I32), [(i % 2) * 8 + i // 2 for i in range(16)]))

    def mins(self, builder: ir.IRBuilder, tb: ir.Value, j: int) -> ir.Value:
        """<16 x i16>: row r's mins of sub-blocks 2j and 2j+1 in lanes 2r and 2r+1 (Q4_K)."""
        if not self.packed:
            return builder.load(_at(builder, tb, SB_MINS + 32 * j, _vec(16, _I16)), align=1)
        return builder.zext(builder.load(_at(builder, tb, Q4K_MINS + 16 * j, _vec(16, _I8)), align=1), _vec(16, _I16))

    def d(self, builder: ir.IRBuilder, tb: ir.Value, dmin: bool = False) -> ir.Value:
        """<8 x float>: the 8 rows' d (or dmin)."""
        if not self.packed:
            at = SB_DMIN if dmin else Q6_D if self.q6 else SB_D
            return builder.load(_at(builder, tb, at, _vec(8, _F32)), align=4)
        at = Q6K_D if self.q6 else Q4K_DMIN if dmin else Q4K_D
        h = builder.load(_at(builder, tb, at, _vec(8, ir.HalfType())), align=2)
        return builder.fpext(h, _vec(8, _F32))


def _tile_kernel(cols: int, q6: bool, nt: int, packed: bool = False):
    """gemm_tile(tile, nsb, qa, k, da, bs, out, out_stride, tstride): ``cols`` activation rows (Q8_K: qa int8
    rows of k, da f32 rows of nsb, bs int32 rows of nsb*16, all row-major and addressed from their first row)
    times the 8 rows of each of ``nt`` Q4_K (q6=False) or Q6_K scratch tiles, tile t at tile + t*tstride;
    writes out[c][8t..8t+8] (f32) at out + c*out_stride + 32t. Two tiles share each activation load:
    the kernel is bound by loads (a broadcast per pmaddubsw), not by the multiplies.

    Per lane (weight row) the float steps are the mat-vec kernel's: Q4_K acc0 += (d*da)*sumi,
    acc1 += (dmin*da)*summ, out = acc0 - acc1; Q6_K acc += (d*da)*(sumi - 32*sum sc*bsum)."""
    lay = _Layout(q6, packed)
    wide = _AVX512 and nt == 2

    def typer(typingctx, tile, nsb, qa, k, da, bs, out, out_stride, tstride):
        sig = types.void(*([types.int64] * 9))

        def codegen(context, builder, sig, args):
            tile_a, nsb_v, qa_a, k_v, da_a, bs_a, out_a, ostride, tstride_v = args
            i8ptr = _I8.as_pointer()
            tile_ps = [builder.inttoptr(builder.add(tile_a, builder.mul(tstride_v, ir.Constant(_I64, t))), i8ptr)
                       for t in range(nt)]
            qa_p = builder.inttoptr(qa_a, i8ptr)
            da_p = builder.inttoptr(da_a, i8ptr)
            bs_p = builder.inttoptr(bs_a, i8ptr)
            f8 = _vec(8, _F32)
            zero_f = ir.Constant(f8, [0.0] * 8)
            acc0 = [[cgutils.alloca_once_value(builder, zero_f) for _ in range(cols)] for _ in range(nt)]
            acc1 = [[cgutils.alloca_once_value(builder, zero_f) for _ in range(cols)] for _ in range(nt)]
            with cgutils.for_range(builder, nsb_v) as loop:
                b = loop.index
                tbs = [builder.gep(tp, [builder.mul(b, ir.Constant(_I64, lay.sb_bytes))]) for tp in tile_ps]
                if packed:  # the weight itself, streamed once by a decode (the scratch tiles sit in L1/L2)
                    for tb in tbs:
                        _prefetch_ahead(builder, tb, lay.sb_bytes)
                arow = [builder.gep(qa_p, [builder.add(builder.mul(ir.Constant(_I64, c), k_v),
                                                       builder.mul(b, ir.Constant(_I64, 256)))]) for c in range(cols)]
                if wide:  # AVX-512: the two tiles side by side in 64-byte registers, their lanes never mixed
                    acc32 = _wide_sums(builder, lay, tbs, arow, cols)
                else:
                    acc32 = _sums(builder, lay, tbs, arow, cols)
                nsb16 = builder.mul(nsb_v, ir.Constant(_I64, 16))
                for i, tb in enumerate(tbs):
                    _tile_floats(builder, lay, tb, b, cols, nsb_v, nsb16, da_p, bs_p, acc32[i], acc0[i], acc1[i])
            out_p = builder.inttoptr(out_a, i8ptr)
            for i in range(nt):
                for c in range(cols):
                    res = builder.load(acc0[i][c]) if q6 else builder.fsub(builder.load(acc0[i][c]),
                                                                            builder.load(acc1[i][c]))
                    at = builder.add(builder.mul(ir.Constant(_I64, c), ostride), ir.Constant(_I64, 32 * i))
                    builder.store(res, _at(builder, out_p, at, f8), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(typer)


def _step(builder, lay, tbs, arow, cols, step, sums, add, wide=False):
    """Tile step ``step`` (4 codes of each row): each column's 4 activation bytes broadcast against the step's
    code register of each tile (wide: of both tiles, one 64-byte register), sums[tile][col] = add(sum, codes,
    activation)."""
    ws = [lay.codes(builder, tb, step) for tb in tbs]
    if wide:
        ws = [builder.shuffle_vector(*ws, ir.Constant(_vec(64, _I32), list(range(64))))]
    lanes = 16 if wide else 8
    for c in range(cols):
        a4 = builder.load(_at(builder, arow[c], 4 * step, _I32), align=1)
        av = builder.bitcast(_splat_i32(builder, a4, lanes), _vec(4 * lanes, _I8))
        for i, w in enumerate(ws):
            sums[i][c] = add(sums[i][c], w, av)


def _sub_sums(builder, lay, tbs, arow, cols, wide, scales, scales32):
    """The integer loop of a tile kernel over one superblock: per sub-block, per (tile, column), the 8 rows'
    sums of scale * sum(code * activation), as <8|16 x i32> (wide: both tiles). ``scales(s)`` and
    ``scales32(s)`` give sub-block s's scales per tile (wide: one entry, both tiles) as i16 pairs / i32 lanes.

    With VNNI and several columns (or wide): vpdpbusd per step (4 products into each row's i32 lane, two
    chains of alternate steps so that its latency overlaps), the scale once per sub-block (vpmulld): one
    instruction a step where pmaddubsw + add + pmaddwd took two. One column's two chains wait on its latency
    (a decode, Q4_K 8960 x 1536 repacked, 1 thread: 22.1 GB/s against 23.9 with pmaddubsw), so it keeps those;
    so does a CPU without VNNI: i16 sums of ``group`` steps (Q4_K: sub-blocks of 32 = 8 steps,
    8*2*15*127 < 2^15; Q6_K: of 16 = 4 steps, i16 sums of 2 steps, 2*2*63*127 < 2^15), pmaddwd by the scales.
    Integer sums: the same either way."""
    n_sub, per, group = (16, 4, 2) if lay.q6 else (8, 8, 8)
    n = 16 if wide else 8
    groups = 1 if wide else len(tbs)
    zero = ir.Constant(_vec(n, _I32), [0] * n)
    acc = [[zero] * cols for _ in range(groups)]
    vnni = (_VNNI512 if wide else _VNNI) and (cols > 1 or wide)
    for s in range(n_sub):
        if vnni:
            chains = [[[zero] * cols for _ in range(groups)] for _ in range(2)]
            for t in range(per):
                _step(builder, lay, tbs, arow, cols, per * s + t, chains[t % 2],
                      lambda a, w, av: _dpbusd(builder, a, w, av), wide)
            sc = scales32(s)
            for i in range(groups):
                for c in range(cols):
                    acc[i][c] = builder.add(acc[i][c], builder.mul(builder.add(chains[0][i][c], chains[1][i][c]),
                                                                   sc[i]))
            continue
        sc = scales(s)
        for g0 in range(0, per, group):
            acc16 = [[ir.Constant(_vec(2 * n, _I16), [0] * (2 * n))] * cols for _ in range(groups)]
            for t in range(g0, g0 + group):
                _step(builder, lay, tbs, arow, cols, per * s + t, acc16,
                      lambda a, w, av: builder.add(a, _maddubs(builder, w, av)), wide)
            for i in range(groups):
                for c in range(cols):
                    acc[i][c] = builder.add(acc[i][c], _maddwd(builder, acc16[i][c], sc[i]))
    return acc


def _sums(builder, lay, tbs, arow, cols):
    """_sub_sums on 32-byte registers, a tile at a time: acc32[tile][col]."""
    return _sub_sums(builder, lay, tbs, arow, cols, False, lambda s: [lay.scales(builder, tb, s) for tb in tbs],
                     lambda s: [lay.scales32(builder, tb, s) for tb in tbs])


def _wide_sums(builder, lay, tbs, arow, cols):
    """_sub_sums of a two-tile kernel on AVX-512: each step's two 32-byte tile rows as one 64-byte register
    against one 16-lane broadcast of the activation's 4 bytes; lanes 0..7 are tile 0's rows, 8..15 tile 1's.
    Returns acc32[tile][col]."""
    both = ir.Constant(_vec(32, _I32), list(range(32)))
    acc = _sub_sums(builder, lay, tbs, arow, cols, True,
                    lambda s: [builder.shuffle_vector(*(lay.scales(builder, tb, s) for tb in tbs), both)],
                    lambda s: [builder.shuffle_vector(*(lay.scales32(builder, tb, s) for tb in tbs),
                                                      ir.Constant(_vec(16, _I32), list(range(16))))])[0]
    undef = ir.Constant(_vec(16, _I32), ir.Undefined)
    return [[builder.shuffle_vector(a, undef, ir.Constant(_vec(8, _I32), list(range(8 * h, 8 * h + 8)))) for a in acc]
            for h in range(2)]


def _tile_floats(builder, lay, tb, b, cols, nsb_v, nsb16, da_p, bs_p, acc32, acc0, acc1) -> None:
    """One superblock's float steps for one tile: its integer sums (acc32, per column) scaled into the
    float accumulators acc0/acc1 (allocas), with the mins (Q4_K) or the -32 offset (Q6_K) from the
    activation's 16-sums."""
    f8 = _vec(8, _F32)
    zero_i = ir.Constant(_vec(8, _I32), [0] * 8)
    q6 = lay.q6
    d = lay.d(builder, tb)
    if q6:
        pairs_sc = [lay.pairs(builder, tb, j) for j in range(8)]
    else:
        dmin = lay.d(builder, tb, dmin=True)
        mins = [lay.mins(builder, tb, j) for j in range(4)]
    for c in range(cols):
        brow = builder.add(builder.mul(ir.Constant(_I64, c), nsb16), builder.mul(b, ir.Constant(_I64, 16)))
        b16 = builder.load(_at(builder, bs_p, builder.mul(brow, ir.Constant(_I64, 4)), _vec(16, _I32)), align=4)
        undef16 = ir.Constant(b16.type, ir.Undefined)
        dap = builder.add(builder.mul(ir.Constant(_I64, c), nsb_v), b)
        da = _splat_f32(builder, builder.load(_at(builder, da_p, builder.mul(dap, ir.Constant(_I64, 4)), _F32)), 8)
        if q6:  # sum_j sc_j * bsum16_j over the 16 sub-blocks, as 8 pairs
            off = zero_i
            lo = _bcast_pairs(builder, builder.shuffle_vector(b16, undef16, ir.Constant(_vec(8, _I32), list(range(8)))))
            hi = _bcast_pairs(builder, builder.shuffle_vector(b16, undef16,
                                                              ir.Constant(_vec(8, _I32), list(range(8, 16)))))
            for j, bj in enumerate(lo + hi):
                off = builder.add(off, _maddwd(builder, pairs_sc[j], bj))
            sumi = builder.sub(acc32[c], builder.shl(off, ir.Constant(_vec(8, _I32), [5] * 8)))
            t0 = builder.fmul(builder.fmul(d, da), builder.sitofp(sumi, f8))
            builder.store(builder.fadd(builder.load(acc0[c]), t0), acc0[c])
            continue
        ev = builder.shuffle_vector(b16, undef16, ir.Constant(_vec(8, _I32), list(range(0, 16, 2))))
        od = builder.shuffle_vector(b16, undef16, ir.Constant(_vec(8, _I32), list(range(1, 16, 2))))
        summ = zero_i
        for j, bj in enumerate(_bcast_pairs(builder, builder.add(ev, od))):
            summ = builder.add(summ, _maddwd(builder, mins[j], bj))
        t0 = builder.fmul(builder.fmul(d, da), builder.sitofp(acc32[c], f8))
        t1 = builder.fmul(builder.fmul(dmin, da), builder.sitofp(summ, f8))
        builder.store(builder.fadd(builder.load(acc0[c]), t0), acc0[c])
        builder.store(builder.fadd(builder.load(acc1[c]), t1), acc1[c])


#: tiles per kernel call (an odd last tile takes the one-tile kernels)
TILES = 2
q4k_tile_4, q4k_tile_1 = _tile_kernel(COLS, False, TILES), _tile_kernel(1, False, TILES)
q6k_tile_4, q6k_tile_1 = _tile_kernel(COLS, True, TILES), _tile_kernel(1, True, TILES)
q4k_one_4, q4k_one_1 = _tile_kernel(COLS, False, 1), _tile_kernel(1, False, 1)
q6k_one_4, q6k_one_1 = _tile_kernel(COLS, True, 1), _tile_kernel(1, True, 1)


def _tile_call(tile_intrinsic, tag: str):
    """A numba function calling a tile intrinsic: functions, unlike intrinsics, can be passed to
    gemm_tiles as arguments. ``tag`` names the variant (jitcache.variant)."""

    @numba.njit(inline="always", **_opts)
    @variant(tag)
    def call(tile, nblk, qa, k, da, ex, out, stride, tstride):  # pragma: no cover - compiled
        tile_intrinsic(tile, nblk, qa, k, da, ex, out, stride, tstride)

    return call


# the tile kernels gemm_tiles takes: TILES tiles x 4 activation rows, x 1 row; one tile x 4, x 1
_q4k_4, _q4k_1, _q4k_one4, _q4k_one1 = (_tile_call(f, f"q4k{i}") for i, f in
                                        enumerate((q4k_tile_4, q4k_tile_1, q4k_one_4, q4k_one_1)))
_q6k_4, _q6k_1, _q6k_one4, _q6k_one1 = (_tile_call(f, f"q6k{i}") for i, f in
                                        enumerate((q6k_tile_4, q6k_tile_1, q6k_one_4, q6k_one_1)))


def tile_bytes(k: int, blk_len: int, blk_bytes: int) -> int:
    """Bytes of one tile for rows of k values (64-aligned)."""
    return (k // blk_len * blk_bytes + 63) // 64 * 64


def tiles_scratch_bytes(k: int, blk_len: int, blk_bytes: int) -> int:
    """Bytes of one thread's scratch: TILES tiles."""
    return TILES * tile_bytes(k, blk_len, blk_bytes)


def act_bytes(n: int, k: int, blk_len: int, es: int) -> int:
    """Work-buffer bytes quantize_src1 fills for n rows of k values: codes, scales, block sums (each 64-aligned)."""
    pad = lambda v: (v + 63) // 64 * 64  # noqa: E731
    return pad(n * k) + pad(4 * n * (k // blk_len)) + pad(4 * n * (k // es))


@numba.njit(inline="always", **_opts)
def quantize_src1(node, ith, nth, ctrl, quantize, blk_len, es):  # pragma: no cover - compiled
    """ggml's first MUL_MAT phase: src1's n = ne11*ne12*ne13 rows quantized to the weight's vec_dot_type
    (Q8_K: blk_len 256, block sums every es=16 values; Q8_0: 32 and 32) into the shared work buffer,
    rows split between the threads; then the chunk counter is reset and the threads meet.
    Returns the work buffer's (qa, da, extra) addresses and arrays and n."""
    r = rec(node)
    k = r[T_SRC0 + 1]
    x, ne11, ne12 = r[T_SRC1], r[T_SRC1 + 2], r[T_SRC1 + 3]
    nx1, nx2, nx3 = r[T_SRC1 + 6], r[T_SRC1 + 7], r[T_SRC1 + 8]
    n = ne11 * ne12 * r[T_SRC1 + 4]
    nblk = k // blk_len
    qa_at = i64p(ctrl + 8 * C_WDATA)[0]
    da_at = qa_at + ((n * k + 63) // 64) * 64
    ex_at = da_at + ((4 * n * nblk + 63) // 64) * 64
    qa = numba.carray(i8p(qa_at), (n, k))
    da = numba.carray(f32p(da_at), (n, nblk))
    ex = numba.carray(i32p(ex_at), (n, k // es))
    j0, j1 = span(n, ith, nth)
    for j in range(j0, j1):
        i1, i2, i3 = row_index(j, ne11, ne12)
        xr = numba.carray(f32p(x + i1 * nx1 + i2 * nx2 + i3 * nx3), (1, k))
        quantize(xr, qa[j : j + 1], da[j : j + 1], ex[j : j + 1])
    if ith == 0:
        atomic_store(ctrl + 8 * C_CHUNK, nth)
    barrier(ctrl, nth)
    return qa_at, da_at, ex_at, qa, da, ex, n


@numba.njit(inline="always", **_opts)
def walk(node, ith, nth, ctrl, quantize, bs, es, chunks, run, arg):  # pragma: no cover - compiled
    """A quantized MUL_MAT: src1 rows quantized (quantize_src1: shared work buffer, barrier), then chunks from
    the shared counter (``chunks``/``run``: the weight layout's split and work; ``arg`` is passed to ``run``)."""
    q = quantize_src1(node, ith, nth, ctrl, quantize, bs, es)
    n_chunks = chunks(node, q[6], nth)
    c = ith
    while c < n_chunks:
        run(node, c, n_chunks, q, ith, arg)
        c = atomic_add(ctrl + 8 * C_CHUNK, 1)


@numba.njit(inline="always", **_opts)
def tiles_by_rows(ta, nt, tstride, nblk, k, n, qa_at, da_at, ex_at, da_row, ex_row, out_at, out_stride, tile4,
                  tile1, one4, one1):  # pragma: no cover - compiled
    """nt (TILES or fewer) 8-row tiles at ta (tstride bytes apart) against all n activation rows, COLS at a time
    while COLS are left, then one by one; row j's outputs at out_at + j * out_stride."""
    j = 0
    while j < n:
        four = j + COLS <= n
        qa_j, da_j, ex_j, out_j = qa_at + j * k, da_at + j * da_row, ex_at + j * ex_row, out_at + j * out_stride
        if nt == TILES:
            if four:
                tile4(ta, nblk, qa_j, k, da_j, ex_j, out_j, out_stride, tstride)
            else:
                tile1(ta, nblk, qa_j, k, da_j, ex_j, out_j, out_stride, tstride)
        elif four:
            one4(ta, nblk, qa_j, k, da_j, ex_j, out_j, out_stride, tstride)
        else:
            one1(ta, nblk, qa_j, k, da_j, ex_j, out_j, out_stride, tstride)
        j += COLS if four else 1


@numba.njit(inline="always", **_opts)
def gemm_tiles(node, ith, nth, ctrl, tile_at, blk_len, blk_bytes, es, quantize, repack, tile4, tile1, one4, one1,
               mv):  # pragma: no cover - compiled
    """MUL_MAT of a quantized weight by many F32 rows (src1 rows of n = ne11*ne12*ne13, contiguous dst).

    Activations are quantized into the work buffer (Q8_K: blk_len 256, block sums every es=16; Q8_0: 32
    and 32), the threads meet at a barrier, then take TILES 8-row weight tiles at a time from the chunk
    counter, each repacked into the thread's scratch and run against all activation rows, 4 at a time."""
    r = rec(node)
    tab = numba.carray(f32p(r[AUX]), 65536)
    w, k, m, rs = r[T_SRC0], r[T_SRC0 + 1], r[T_SRC0 + 2], r[T_SRC0 + 6]
    nblk = k // blk_len
    qa_at, da_at, ex_at, qa, da, ex, n = quantize_src1(node, ith, nth, ctrl, quantize, blk_len, es)
    base = qa_at
    wu = numba.carray(u8p(w), m * rs)
    d = r[T_DST]
    out_stride = 4 * m
    one = ((nblk * blk_bytes + 63) // 64) * 64
    ta = base + tile_at + ith * TILES * one
    n_tiles = m // ROWS
    da_row, ex_row = 4 * nblk, 4 * (k // es)
    c = ith
    while c * TILES < n_tiles:
        row0 = c * TILES * ROWS
        nt = min(TILES, n_tiles - c * TILES)
        for t in range(nt):
            repack(wu, row0 + t * ROWS, rs, nblk, tab, numba.carray(u8p(ta + t * one), nblk * blk_bytes))
        tiles_by_rows(ta, nt, one, nblk, k, n, qa_at, da_at, ex_at, da_row, ex_row, d + 4 * row0, out_stride,
                      tile4, tile1, one4, one1)
        c = atomic_add(ctrl + 8 * C_CHUNK, 1)
    if ith == 0 and m % ROWS:  # rows past the last whole tile: the mat-vec kernel
        wi = numba.carray(i8p(w), m * rs)
        out = numba.carray(f32p(d), (n, m))
        mv(wu, wi, rs, m, qa, da, ex, tab, out, m - m % ROWS, m)


AVAILABLE = _AVX2
