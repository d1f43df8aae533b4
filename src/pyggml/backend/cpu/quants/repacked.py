"""MUL_MAT with weights repacked at load (the CPU_REPACK buffer type, cpu/repack.py): decode and prompt.

One kernel per type computes every batch size from the interleaved rows, with no per-call repacking or
decoding (the scratch-tile kernels of gemm.py and q0tiles.py redo that work on every call):

* **Q4_K, Q6_K**: gemm.py's integer tiles, reading the repacked groups in place (gemm._Layout, packed): two
  codes per byte split with a shift and a mask in registers (Q6_K: its two high bits or-ed in from the qh
  words), scales widened from bytes. A decode is the same tile with one activation row: 8 weight rows a lane
  each, no horizontal sums, one group at a time (one read stream, Q4K_STREAM_COLS).
* **Q8_0, Q4_0, Q5_0, IQ4_NL** (VNNI): register tiles of the group's 4 rows x 3 activation rows (1 for a
  decode). Codes are unsigned (Q8_0 stored as w + 128; the 4-bit types looked up in a 16-byte table of
  value + 128, vpshufb; Q5_0's nibbles with their fifth bit, + 112), so vpdpbusd takes them against the
  signed activations directly; each lane starts at -128 * (its activation quad's sum), so one vpdpbusd ends it
  at exactly sum(w * a). Those starting lanes are made once per activation row with its quantization
  (quantize._quantize_q8_0_lanes), not once per group: each took a vpdpbusd and a subtraction per activation
  block and group, an eighth of the tile's vector work on the two pipes that also run its vpdpbusd and fma.

Outputs have the bits of the kernels they replace: the same integer sums and float steps (Q4_K/Q6_K: the
mat-vec's per-lane steps; Q8_0/Q4_0/Q5_0/IQ4_NL: 8 lanes, fma, hsum, as quants.intrinsics._rowdot_blocks).
tests/backend/test_repack.py compares them.
"""

from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ....quants.iq4 import KVALUES_IQ4NL
from ....quants.jitcache import variant
from ....types import GGMLType
from ..jit import enabled as jit_enabled
from ..jit.mathf import LANES
from ..jit.record import T_DST, T_SRC0, chunk_bounds, rec
from ..repack import Q4K_GROUP_BYTES, Q6K_GROUP_BYTES
from ..simd import _F16C, _F32, _I8, _I32, _I64, _VNNI, _fma, _hsum8, _vec
from . import gemm
from .gemm import _at, _opts, _splat_f32
from .intrinsics import _COL_BLOCK_BYTES, _dpbusd, _high_bits32, _lookup16, _nibbles32, _prefetch_ahead, lut16

Q4_K, Q6_K, Q8_0, Q4_0, Q5_0, IQ4_NL = (GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0,
                                       GGMLType.IQ4_NL)

#: the types this CPU has repacked kernels for: the Q4_K/Q6_K tiles need AVX2, the others vpdpbusd; both read
#: fp16 scales with F16C
TYPES: frozenset[GGMLType] = frozenset(
    ([Q4_K, Q6_K] if gemm.AVAILABLE and _F16C else []) + ([Q8_0, Q4_0, Q5_0, IQ4_NL] if _VNNI and _F16C else []))


def enabled() -> bool:
    """Repacked weights need the compiled kernels (PYGGML_JIT=0 turns both off)."""
    return jit_enabled()


# ------------------------------------------------------------------------------------ work split
#: weight bytes per work chunk for a decode (prompts take at least 8 chunks a thread, for balance)
CHUNK_BYTES = 1 << 20
#: activation rows from which a product takes at least PROMPT_CHUNKS chunks a thread: a chunk of a prompt's
#: product is milliseconds of work, and the thread that finishes first waits for the other's last chunk
#: (BERT-base's 3072 x 768 products over 800 tokens took 16 chunks of about 3 ms)
PROMPT_COLS, PROMPT_CHUNKS = 64, 32


@numba.njit(inline="always", **_opts)
def _n_chunks(n_units, unit_bytes, n, nth):  # pragma: no cover - compiled
    """Chunks of whole units (row groups) for nth threads and n activation rows."""
    want = (n_units * unit_bytes) // CHUNK_BYTES
    if n >= PROMPT_COLS:
        want = max(want, PROMPT_CHUNKS * nth)
    elif n > 1:
        want = max(want, 8 * nth)
    return max(1, min(n_units, max(nth, want)))


# ---------------------------------------------------------------------------------------- Q4_K / Q6_K
#: activation rows up to which a repacked Q4_K/Q6_K product takes its 8-row groups one at a time. A tile pair
#: reads two streams a group (7 KB at K = 1536) apart, which the hardware prefetcher follows worse than one: Q4_K
#: 8960 x 1536 (x16 copies, past the caches), the product's GB/s over a streaming read's, 1 thread: pairs 0.69,
#: single groups 1.00 (the plain mat-vec 0.98); 2 activation rows 0.58 / 0.97, 8 rows 0.38 / 0.41. Prompts keep
#: the pairs (two tiles share each activation load; on AVX-512 they fill one 64-byte register).
Q4K_STREAM_COLS = 8


def _k_kernel(q6: bool):
    """The repacked Q4_K (q6 False) or Q6_K MUL_MAT's (chunks, run) for gemm.walk: gemm.py's integer tiles reading
    the groups in place (gemm._Layout, packed); q6 is a closure constant, so each kernel compiles its own tiles."""
    gbytes_sb = Q6K_GROUP_BYTES if q6 else Q4K_GROUP_BYTES
    tag = "q6k" if q6 else "q4k"
    pair4, pair1, one4, one1, one2, one3 = (
        gemm._tile_call(gemm._tile_kernel(cols, q6, nt, packed=True), f"r{tag}{nt}_{cols}")
        for nt, cols in ((gemm.TILES, gemm.COLS), (gemm.TILES, 1), (1, gemm.COLS), (1, 1), (1, 2), (1, 3)))

    @numba.njit(inline="always", **_opts)
    def units(m):  # pragma: no cover - compiled
        """Work units of an m-row weight: TILES 8-row groups (the last one may be short)."""
        return (m // gemm.ROWS + gemm.TILES - 1) // gemm.TILES

    @numba.njit(inline="always", **_opts)
    @variant(tag)
    def stream(ta, gbytes, nsb, k, n, qa_at, da_at, ex_at, da_row, ex_row, out_at, out_stride):  # pragma: no cover
        """One 8-row group against n <= Q4K_STREAM_COLS activation rows: 4 at a time, the last 1-3 as one call. A
        speculative verification's 2-3 rows each took the one-row kernel (Q4_K 8960 x 1536, 2 threads: 3 rows 2.0x
        a decode's time, 4 rows 1.5x); every row's float steps are the same whichever kernel takes it."""
        j = 0
        while j < n:
            g = min(gemm.COLS, n - j)
            qa_j, da_j, ex_j, out_j = qa_at + j * k, da_at + j * da_row, ex_at + j * ex_row, out_at + j * out_stride
            if g == 4:
                one4(ta, nsb, qa_j, k, da_j, ex_j, out_j, out_stride, gbytes)
            elif g == 3:
                one3(ta, nsb, qa_j, k, da_j, ex_j, out_j, out_stride, gbytes)
            elif g == 2:
                one2(ta, nsb, qa_j, k, da_j, ex_j, out_j, out_stride, gbytes)
            else:
                one1(ta, nsb, qa_j, k, da_j, ex_j, out_j, out_stride, gbytes)
            j += g

    @numba.njit(**_opts)
    @variant(tag)
    def chunks(node, n, nth):  # pragma: no cover - compiled
        r = rec(node)
        return _n_chunks(units(r[T_SRC0 + 2]), gemm.TILES * (r[T_SRC0 + 1] // 256) * gbytes_sb, n, nth)

    @numba.njit(**_opts)
    @variant(tag)
    def run(node, c, n_chunks, q, ith, arg):  # pragma: no cover - compiled
        """Chunk c: its tile pairs (8-row groups) against every activation row, 4 at a time (gemm.gemm_tiles
        without the per-call repack: the same gemm.tiles_by_rows); returns its weight rows."""
        r = rec(node)
        w, k, m = r[T_SRC0], r[T_SRC0 + 1], r[T_SRC0 + 2]
        nsb = k // 256
        qa_at, da_at, ex_at, _, _, _, n = q
        d = r[T_DST]
        gbytes = nsb * gbytes_sb
        n_tiles = m // gemm.ROWS
        u0, u1 = chunk_bounds(units(m), c, n_chunks, 1)
        da_row, ex_row = 4 * nsb, 4 * (k // 16)
        for u in range(u0, u1):
            t = u * gemm.TILES
            nt = min(gemm.TILES, n_tiles - t)
            if n <= Q4K_STREAM_COLS:  # a decode or a small batch: the groups one after another, one read stream
                for i in range(nt):
                    stream(w + (t + i) * gbytes, gbytes, nsb, k, n, qa_at, da_at, ex_at, da_row, ex_row,
                           d + 4 * gemm.ROWS * (t + i), 4 * m)
                continue
            gemm.tiles_by_rows(w + t * gbytes, nt, gbytes, nsb, k, n, qa_at, da_at, ex_at, da_row, ex_row,
                               d + 4 * gemm.ROWS * t, 4 * m, pair4, pair1, one4, one1)
        rows = gemm.TILES * gemm.ROWS
        return min(m, u0 * rows), min(m, u1 * rows)

    return chunks, run


(_q4k_chunks, _q4k_run), (_q6k_chunks, _q6k_run) = _k_kernel(False), _k_kernel(True)


# ------------------------------------------------------------------------------ Q8_0 / Q4_0 / IQ4_NL
#: rows of a Q0 group (the register tile's height) and activation rows of a full tile
GROUP, TILE_N = 4, 3
#: the Q0 kernels' activations: Q8_0 blocks of 32, with a starting lane per 4 codes (_quantize_q8_0_lanes)
ACT_BLOCK = (32, 4)


#: code bytes of a row's block in a repacked group, by kind (Q8_0, Q4_0, IQ4_NL, Q5_0: its qh word and nibbles)
_Q0_CODE_BYTES = (32, 16, 16, 20)


def _q0_tile(rn: int, kind: int):
    """tile(group, nb, qa, k, da, st, out, ocol): a repacked group's 4 rows (kind 0 Q8_0, 1 Q4_0, 2 IQ4_NL, 3 Q5_0)
    times rn Q8_0 activation rows (qa int8 rows of k, da f32 rows of nb, st the rows' starting lanes: int32 rows
    of k/4, -128 * each quad's sum); out[j][i] at out + 4*i + j*ocol. The scale products d_w * d_a are made
    block by block beside the sums: a first pass over the group's scales for them (scratch floats, as this had)
    read the group from memory without the prefetch and made 2-5 rows cost 1.9-4.7x one row's time (Q4_0 8960 x
    1536, 2 threads) where they now cost 1.4-3.0x."""
    cb = _Q0_CODE_BYTES[kind]  # code bytes of a row's block
    block = GROUP * (2 + cb)  # a block of the group: 4 fp16 scales, 4 rows of codes
    lut = lut16(range(-8, 8) if kind == 1 else KVALUES_IQ4NL, True)

    def typer(typingctx, group, nb, qa, k, da, st, out, ocol):
        sig = types.void(*([types.int64] * 8))

        def codegen(context, builder, sig, args):
            g_a, nb_v, qa_a, k_v, da_a, st_a, out_a, ocol_v = args
            i8ptr, f32ptr = _I8.as_pointer(), _F32.as_pointer()
            f4, f8, i32x8 = _vec(4, _F32), _vec(8, _F32), _vec(8, _I32)
            c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
            gp = builder.inttoptr(g_a, i8ptr)
            arow = [builder.inttoptr(builder.add(qa_a, builder.mul(k_v, c64(j))), i8ptr) for j in range(rn)]
            darow = [builder.inttoptr(builder.add(da_a, builder.mul(nb_v, c64(4 * j))), f32ptr) for j in range(rn)]
            strow = [builder.inttoptr(builder.add(st_a, builder.mul(k_v, c64(j))), i8ptr) for j in range(rn)]

            def weight_scales(b):  # <4 x float>: the 4 rows' d of block b
                h = builder.load(_at(builder, gp, builder.mul(b, c64(block)), _vec(4, ir.HalfType())), align=2)
                return builder.fpext(h, f4)

            zero = ir.Constant(f8, [0.0] * 8)
            accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(GROUP)] for _ in range(rn)]
            with cgutils.for_range(builder, nb_v) as loop:
                b = loop.index
                blk = builder.gep(gp, [builder.add(builder.mul(b, c64(block)), c64(2 * GROUP))])
                _prefetch_ahead(builder, blk, block)
                if kind == 0:
                    u = [builder.load(_at(builder, blk, cb * i, _vec(32, _I8)), align=1) for i in range(GROUP)]
                elif kind == 3:  # Q5_0: nibbles | the fifth bit, + 112 (value + 128, as the other kinds' codes)
                    u = [builder.add(builder.or_(
                        _nibbles32(builder, builder.load(_at(builder, blk, cb * i + 4, _vec(16, _I8)), align=1)),
                        _high_bits32(builder, builder.load(_at(builder, blk, cb * i, _I32), align=1))),
                        ir.Constant(_vec(32, _I8), [112] * 32)) for i in range(GROUP)]
                else:
                    u = [_lookup16(builder, lut, _nibbles32(builder, builder.load(_at(builder, blk, cb * i,
                                                                                       _vec(16, _I8)), align=1)))
                         for i in range(GROUP)]
                dw = weight_scales(b)
                for j in range(rn):
                    a = builder.load(_at(builder, arow[j], builder.mul(b, c64(32)), _vec(32, _I8)), align=1)
                    start = builder.load(_at(builder, strow[j], builder.mul(b, c64(32)), i32x8), align=4)
                    # the 4 rows' scale products d_w * d_a, one vector multiply (the same bits as four scalar ones)
                    prod4 = builder.fmul(dw, _splat_f32(builder, builder.load(builder.gep(darow[j], [b])), 4))
                    for i in range(GROUP):
                        lanes = _dpbusd(builder, start, u[i], a)
                        p = builder.extract_element(prod4, ir.Constant(_I32, i))
                        acc = accs[j][i]
                        builder.store(_fma(builder, _splat_f32(builder, p, 8), builder.sitofp(lanes, f8),
                                           builder.load(acc)), acc)
            out_p = builder.inttoptr(out_a, i8ptr)
            for j in range(rn):
                for i in range(GROUP):
                    res = _hsum8(builder, builder.load(accs[j][i]))
                    at = builder.add(builder.mul(ocol_v, c64(j)), c64(4 * i))
                    builder.store(res, _at(builder, out_p, at, _F32), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(typer)


def _q0_kernel(kind: int):
    """The repacked Q8_0/Q4_0/IQ4_NL/Q5_0 MUL_MAT's (chunks, run) for gemm.walk (kind 0/1/2/3, a closure constant:
    each kernel compiles its own tiles only): chunks of groups, column block by column block, TILE_N activation rows
    at a time and the last two as a pair (two requests decoding together: Q4_0 8960 x 1536, 2 threads, 0.29 ms
    against 0.41 as two one-row passes)."""
    cb = _Q0_CODE_BYTES[kind]
    tile_n, tile_2, tile_1 = _q0_tile(TILE_N, kind), _q0_tile(2, kind), _q0_tile(1, kind)

    @numba.njit(**_opts)
    @variant(kind)
    def chunks(node, n, nth):  # pragma: no cover - compiled
        r = rec(node)
        k, m = r[T_SRC0 + 1], r[T_SRC0 + 2]
        return _n_chunks(m // GROUP, (k // 32) * GROUP * (2 + cb), n, nth)

    @numba.njit(**_opts)
    @variant(kind)
    def run(node, c, n_chunks, q, ith, arg):  # pragma: no cover - compiled
        r = rec(node)
        w, k, m = r[T_SRC0], r[T_SRC0 + 1], r[T_SRC0 + 2]
        nb = k // 32
        qa_at, da_at, st_at, _, _, _, n = q
        d = r[T_DST]
        gbytes = nb * GROUP * (2 + cb)  # a group's bytes
        col_block = max(TILE_N, (_COL_BLOCK_BYTES // k) // TILE_N * TILE_N)
        g0, g1 = chunk_bounds(m // GROUP, c, n_chunks, LANES // GROUP)
        for j0 in range(0, n, col_block):
            j1 = min(n, j0 + col_block)
            for gi in range(g0, g1):
                ga = w + gi * gbytes
                j = j0
                while j < j1:  # TILE_N rows at a time, the last two as a pair
                    qa, da, st, out = qa_at + j * k, da_at + 4 * j * nb, st_at + j * k, d + 4 * (j * m + GROUP * gi)
                    g = min(TILE_N, j1 - j)
                    if g == TILE_N:
                        tile_n(ga, nb, qa, k, da, st, out, 4 * m)
                    elif g == 2:
                        tile_2(ga, nb, qa, k, da, st, out, 4 * m)
                    else:
                        tile_1(ga, nb, qa, k, da, st, out, 4 * m)
                    j += g
        return g0 * GROUP, g1 * GROUP

    return chunks, run


(_q8_0_chunks, _q8_0_run), (_q4_0_chunks, _q4_0_run), (_iq4_nl_chunks, _iq4_nl_run), (_q5_0_chunks, _q5_0_run) = (
    _q0_kernel(kind) for kind in range(4))


__all__ = ["TYPES", "enabled"]
