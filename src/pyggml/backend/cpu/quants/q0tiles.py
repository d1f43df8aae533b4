"""Prompt-size MUL_MAT with Q8_0/Q4_0/Q5_0 weights (x86 AVX2/VNNI): register tiles over decoded rows.

The comment block below says why these tiles keep ggml's per-output order; gemm.py holds the K-quant
tiles and the activation quantization phase both share.
"""

from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ....quants.jitcache import variant
from ..jit.record import AUX, T_DST, T_SRC0, rec
from ..native import atomic_add
from ..simd import _F32, _I8, _I16, _I32, _I64, _VNNI, _fma, _fp16_at, _hsum8, _vec, _x86
from ..threads import C_CHUNK
from .gemm import _at, _opts, _splat_f32, quantize_src1
from .intrinsics import _decode_q4_0, _decode_q5_0, _decode_q8_0, _dpbusd, _maddubs, _maddwd
from .quantize import _quantize_q8_0

# ------------------------------------------------------------------------ Q8_0 / Q4_0 / Q5_0 tiles
# ggml's AVX2 vec_dot and llamafile's tinyBLAS_Q0_AVX (what llama.cpp runs for these types' prompts
# on x86) give every output its own 8 float lanes: per 32-value block, lane i gets the integer sum of
# products 4i..4i+3, converted to float and fma'd with d_w*d_a. The lanes cannot be shared between
# weight rows as the K-quant tiles above share them, so these tiles keep that per-output order and
# save elsewhere: a thread decodes its chunk of weight rows once into scratch, and a register tile of
# rows x activation rows reuses each load. Every output gets the bits of matmul.intrinsics' row dots
# (the mat-vec kernels): the same integer lane sums, the same float steps.
#
# The d_w*d_a products of a tile are computed for all its blocks first (8 at a time, one vmulps) and
# broadcast from memory in the block loop: a scalar multiply and a register broadcast per block and
# output cost as much as the integer work (AVX2, one thread on Zen 3: the 2x3 tile ran at 60 GOPS with
# them and 78 without, the tile alone on L1-resident rows). With VNNI the lane sums take one vpdpbusd (unsigned x
# signed quads) and no sign trick: the activation bytes are offset to unsigned (a ^ 0x80 = a + 128) and
# the sum starts at -128 * (the quad's code sum), decoded once per weight block, so it ends at exactly
# sum(a * w): three vector operations per block and output (vpdpbusd, the int-to-float conversion, the
# fma). Without VNNI, the sign trick (psign, pmaddubsw, pmaddwd) runs on decoded codes and their
# absolute values: five.
Q0_CHUNK_ROWS = 16
#: register tile: weight rows x activation rows (VNNI: 12 accumulators; AVX2's sign trick: 6)
Q0_TILE_M, Q0_TILE_N = (4, 3) if _VNNI else (2, 3)
#: scratch bytes per 32-value block of a decoded row: codes, then |codes| (sign trick) or the negated
#: offset sums (8 i32, VNNI), then the scale
Q0_BLOCK_BYTES = 32 + 32 + 4
_DECODE = {0: (_decode_q8_0, 34), 1: (_decode_q4_0, 18), 2: (_decode_q5_0, 22)}


def _q0_unpack(kind: int):
    """unpack(w_row, nb, codes, aux, d, tab): a Q8_0/Q4_0/Q5_0 row (kind 0/1/2) of nb blocks into signed
    codes (nb*32 i8), per block 32 bytes of aux (VNNI: -128 * each quad's code sum as 8 i32; else the
    codes' absolute values) and scales (nb f32); all byte addresses."""
    decode, block_bytes = _DECODE[kind]

    def typer(typingctx, w, nb, codes, aux, d, tab):
        sig = types.void(*([types.int64] * 6))

        def codegen(context, builder, sig, args):
            w_a, nb_v, c_a, x_a, d_a, t_a = args
            i8ptr = _I8.as_pointer()
            wp, cp, xp = (builder.inttoptr(v, i8ptr) for v in (w_a, c_a, x_a))
            dp = builder.inttoptr(d_a, _F32.as_pointer())
            tbase = builder.inttoptr(t_a, _F32.as_pointer())
            i32x8 = _vec(8, _I32)
            with cgutils.for_range(builder, nb_v) as loop:
                b = loop.index
                blk = builder.gep(wp, [builder.mul(b, ir.Constant(_I64, block_bytes))])
                q = decode(builder, blk)
                off = builder.mul(b, ir.Constant(_I64, 32))
                builder.store(q, _at(builder, cp, off, _vec(32, _I8)), align=1)
                if _VNNI:
                    zero = ir.Constant(i32x8, [0] * 8)
                    offset = _dpbusd(builder, zero, ir.Constant(_vec(32, _I8), [0x80] * 32), q)
                    builder.store(builder.sub(zero, offset), _at(builder, xp, off, i32x8), align=1)
                else:
                    ax = _x86(builder, "llvm.x86.avx2.psign.b", _vec(32), q, q)
                    builder.store(ax, _at(builder, xp, off, _vec(32, _I8)), align=1)
                builder.store(_fp16_at(builder, blk, tbase), builder.gep(dp, [b]))
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(typer)


def _q0_scale_products(builder, drow, darow, nb_v, prod_p) -> ir.Value:
    """prod[(j*rm + i)*nbp + b] = d_w[i][b] * d_a[j][b] for every block b, 8 blocks a multiply; nbp (returned)
    is nb rounded up to 8: the last multiply reads up to 7 floats past a row's scales (the next row's, or
    the scratch after them; q0_scratch_bytes leaves room) and its extra products are never used."""
    rm, f8 = len(drow), _vec(8, _F32)
    n8 = builder.udiv(builder.add(nb_v, ir.Constant(_I64, 7)), ir.Constant(_I64, 8))
    nbp = builder.mul(n8, ir.Constant(_I64, 8))
    with cgutils.for_range(builder, n8) as loop:
        b = builder.mul(loop.index, ir.Constant(_I64, 8))
        dw = [builder.load(builder.bitcast(builder.gep(p, [b]), f8.as_pointer()), align=4) for p in drow]
        for j, pa in enumerate(darow):
            da = builder.load(builder.bitcast(builder.gep(pa, [b]), f8.as_pointer()), align=4)
            for i in range(rm):
                dst = builder.gep(prod_p, [builder.add(builder.mul(nbp, ir.Constant(_I64, j * rm + i)), b)])
                builder.store(builder.fmul(dw[i], da), builder.bitcast(dst, f8.as_pointer()), align=4)
    return nbp


def _q0_tile(rm: int, rn: int):
    """tile(codes, aux, d, srow, nb, qa, k, da, out, ocol, prod): rm decoded weight rows (scratch rows srow
    bytes apart; scales nb f32 a row) times rn Q8_0 activation rows (qa int8 rows of k, da f32 rows of
    nb); out[j][i] (f32) at out + 4*i + j*ocol; prod: scratch for the tile's scale products (rm*rn rows of
    nb rounded up to 8 floats, see _q0_scale_products).
    Per output exactly quants.intrinsics._rowdot_blocks's steps."""

    def typer(typingctx, codes, aux, d, srow, nb, qa, k, da, out, ocol, prod):
        sig = types.void(*([types.int64] * 11))

        def codegen(context, builder, sig, args):
            c_a, x_a, d_a, srow_v, nb_v, qa_a, k_v, da_a, out_a, ocol_v, prod_a = args
            i8ptr, f32ptr = _I8.as_pointer(), _F32.as_pointer()
            f8, i32x8 = _vec(8, _F32), _vec(8, _I32)
            ones = ir.Constant(_vec(16, _I16), [1] * 16)
            c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
            row = lambda base, stride, i, ty: builder.inttoptr(  # noqa: E731
                builder.add(base, builder.mul(stride, c64(i))), ty)
            crow = [row(c_a, srow_v, i, i8ptr) for i in range(rm)]
            xrow = [row(x_a, srow_v, i, i8ptr) for i in range(rm)]
            drow = [row(d_a, builder.mul(nb_v, c64(4)), i, f32ptr) for i in range(rm)]
            arow = [row(qa_a, k_v, j, i8ptr) for j in range(rn)]
            darow = [row(da_a, builder.mul(nb_v, c64(4)), j, f32ptr) for j in range(rn)]
            prod_p = builder.inttoptr(prod_a, f32ptr)
            nbp = _q0_scale_products(builder, drow, darow, nb_v, prod_p)
            accs = [[cgutils.alloca_once_value(builder, ir.Constant(f8, [0.0] * 8)) for _ in range(rm)]
                    for _ in range(rn)]
            flip = ir.Constant(_vec(32, _I8), [-128] * 32)
            with cgutils.for_range(builder, nb_v) as loop:
                b = loop.index
                off = builder.mul(b, c64(32))
                w = [builder.load(_at(builder, crow[i], off, _vec(32, _I8)), align=1) for i in range(rm)]
                if _VNNI:
                    x = [builder.load(_at(builder, xrow[i], off, i32x8), align=1) for i in range(rm)]
                else:
                    x = [builder.load(_at(builder, xrow[i], off, _vec(32, _I8)), align=1) for i in range(rm)]
                for j in range(rn):
                    a = builder.load(_at(builder, arow[j], off, _vec(32, _I8)), align=1)
                    au = builder.xor(a, flip) if _VNNI else None
                    for i in range(rm):
                        if _VNNI:
                            lanes = _dpbusd(builder, x[i], au, w[i])
                        else:
                            sy = _x86(builder, "llvm.x86.avx2.psign.b", _vec(32), a, w[i])
                            lanes = _maddwd(builder, _maddubs(builder, x[i], sy), ones)
                        p = builder.gep(prod_p, [builder.add(builder.mul(nbp, c64(j * rm + i)), b)])
                        scale = _splat_f32(builder, builder.load(p), 8)
                        acc = accs[j][i]
                        builder.store(_fma(builder, scale, builder.sitofp(lanes, f8), builder.load(acc)), acc)
            out_p = builder.inttoptr(out_a, i8ptr)
            for j in range(rn):
                for i in range(rm):
                    res = _hsum8(builder, builder.load(accs[j][i]))
                    o = builder.add(builder.mul(ocol_v, c64(j)), c64(4 * i))
                    builder.store(res, _at(builder, out_p, o, _F32), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(typer)


_unpack_q8_0, _unpack_q4_0, _unpack_q5_0 = (_q0_unpack(kind) for kind in range(3))
_q0_full, _q0_m1 = _q0_tile(Q0_TILE_M, Q0_TILE_N), _q0_tile(Q0_TILE_M, 1)
_q0_1n, _q0_11 = _q0_tile(1, Q0_TILE_N), _q0_tile(1, 1)


def q0_chunk_bytes(k: int) -> int:
    """Bytes of a thread's decoded chunk of Q0_CHUNK_ROWS rows of k values (64-aligned)."""
    return (Q0_CHUNK_ROWS * (k // 32) * Q0_BLOCK_BYTES + 63) // 64 * 64


def q0_scratch_bytes(k: int) -> int:
    """Bytes of one thread's scratch: its decoded chunk, then a tile's scale products (64-aligned)."""
    products = Q0_TILE_M * Q0_TILE_N * ((k // 32 + 7) // 8 * 8)  # see _q0_scale_products
    return q0_chunk_bytes(k) + (4 * products + 63) // 64 * 64


def q0_tiles_kernel(kind: int):
    """MUL_MAT of a Q8_0/Q4_0/Q5_0 weight (kind 0/1/2) by many F32 rows: activations quantized to Q8_0
    into the work buffer, then chunks of Q0_CHUNK_ROWS weight rows from the chunk counter, each decoded
    into the thread's scratch and run against the activation rows a column block at a time. kind is a
    closure constant, so each kernel compiles its own unpacker only (see quants.dots._rowdot_kernel)."""

    @numba.njit(inline="always", **_opts)
    @variant(kind)
    def q0_tiles(node, ith, nth, ctrl, col_block_bytes):  # pragma: no cover - compiled
        r = rec(node)
        w, k, m, rs = r[T_SRC0], r[T_SRC0 + 1], r[T_SRC0 + 2], r[T_SRC0 + 6]
        nb = k // 32
        qa_at, da_at, _, _, _, _, n = quantize_src1(node, ith, nth, ctrl, _quantize_q8_0, 32, 32)
        d = r[T_DST]
        srow = 32 * nb
        scratch_at, thread_bytes, chunk_bytes = r[AUX + 1], r[AUX + 2], r[AUX + 3]  # see q0_scratch_bytes
        sc = qa_at + scratch_at + ith * thread_bytes
        codes, aux, scales, prod = sc, sc + Q0_CHUNK_ROWS * srow, sc + 2 * Q0_CHUNK_ROWS * srow, sc + chunk_bytes
        cb = max(Q0_TILE_N, (col_block_bytes // k) // Q0_TILE_N * Q0_TILE_N)
        n_chunks = (m + Q0_CHUNK_ROWS - 1) // Q0_CHUNK_ROWS
        tab = r[AUX]
        c = ith
        while c < n_chunks:
            row0 = c * Q0_CHUNK_ROWS
            rows = min(Q0_CHUNK_ROWS, m - row0)
            for i in range(rows):
                wr = w + (row0 + i) * rs
                if kind == 0:
                    _unpack_q8_0(wr, nb, codes + i * srow, aux + i * srow, scales + 4 * i * nb, tab)
                elif kind == 1:
                    _unpack_q4_0(wr, nb, codes + i * srow, aux + i * srow, scales + 4 * i * nb, tab)
                else:
                    _unpack_q5_0(wr, nb, codes + i * srow, aux + i * srow, scales + 4 * i * nb, tab)
            for j0 in range(0, n, cb):
                j1 = min(n, j0 + cb)
                i = 0
                while i < rows:
                    rm = Q0_TILE_M if rows - i >= Q0_TILE_M else 1
                    ci, xi, di = codes + i * srow, aux + i * srow, scales + 4 * i * nb
                    j = j0
                    while j < j1:
                        rn = Q0_TILE_N if j1 - j >= Q0_TILE_N else 1
                        qa, da, out = qa_at + j * k, da_at + 4 * j * nb, d + 4 * (j * m + row0 + i)
                        if rm == Q0_TILE_M and rn == Q0_TILE_N:
                            _q0_full(ci, xi, di, srow, nb, qa, k, da, out, 4 * m, prod)
                        elif rm == Q0_TILE_M:
                            _q0_m1(ci, xi, di, srow, nb, qa, k, da, out, 4 * m, prod)
                        elif rn == Q0_TILE_N:
                            _q0_1n(ci, xi, di, srow, nb, qa, k, da, out, 4 * m, prod)
                        else:
                            _q0_11(ci, xi, di, srow, nb, qa, k, da, out, 4 * m, prod)
                        j += rn
                    i += rm
            c = atomic_add(ctrl + 8 * C_CHUNK, 1)

    return q0_tiles
