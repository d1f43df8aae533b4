"""IQ3_XXS and IQ3_S: 3-bit "importance" quants on a lattice of 4-value grid points.

Both types store, per 32-element sub-block, eight indices into a grid of 4-tuples of odd
magnitudes, the signs of the 32 values, and a 4-bit sub-block scale under one fp16 super-scale.
IQ3_XXS uses a 256-point grid and recovers one sign per 8 values from parity; IQ3_S uses a
512-point grid and stores every sign.

The quantizers are ggml's ``quantize_row_iq3_xxs_impl`` / ``quantize_row_iq3_s_impl``
(ggml-quants.c) step for step, in float32 with the same operation order, so the bytes are
identical. They search a range of trial scales; a 4-tuple that falls off the grid is replaced
by its best grid neighbour from a precomputed list (``iq3xs_init_impl``), which we build lazily
on first use, exactly as ggml builds it in ``ggml_quantize_init``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numba as nb
import numpy as np

from ..types import QK_K, GGMLType
from ._blocks import fp16_bytes, load_table, read_fp16
from .codec import BlockCodec, QuantError, QuantRowError, register
from .fp import nearest_int_nb
from .iq2_quant import block_sigma2, even_sign_groups, scale_nibble, sign_groups
from .iq2_tables import ksigns_iq2xs
from .ksearch import FLT_MAX, imatrix_weights

_F32 = np.float32

#: dequantization magnitudes of IQ3_XXS's 3-bit levels (the byte values in ggml-common.h's
#: iq3xxs_grid); the quantizer itself searches on the odd levels 2l+1 like IQ3_S
IQ3XXS_LEVELS = np.array([4, 12, 20, 28, 36, 44, 52, 62], dtype=np.uint8)

# error codes the numba kernels report instead of ggml's GGML_ASSERT / GGML_ABORT
_ERR_NO_NEIGHBOUR = 1  # iq3_find_best_neighbour found nothing below FLT_MAX
_ERR_OFF_GRID = 2  # "Oops: found point ... not on grid"
_ERR_BAD_SCALE = 3  # GGML_ASSERT(scale >= 0) failed (a NaN scale)

_ERR_TEXT = {
    _ERR_NO_NEIGHBOUR: "no grid neighbour has a finite weighted distance",
    _ERR_OFF_GRID: "a sub-block ended on a point that is not on the grid",
    _ERR_BAD_SCALE: "a sub-block scale came out NaN",
}


# ---------------------------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------------------------


def grid_from_kgrid(kgrid: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Unpack ggml's 3-bits-per-coordinate grid list into (n, 4) uint8 magnitudes ``levels[l]``."""
    shifts = 3 * np.arange(4)
    return np.asarray(levels, dtype=np.uint8)[(np.asarray(kgrid)[:, None] >> shifts) & 7]


@dataclass
class Iq3Tables:
    """The quantizer's search tables for one grid size (ggml's ``iq3_data[gindex]``).

    ``grid`` holds the odd levels 2l+1 the search works on; ``kmap`` maps a packed 12-bit point
    to its grid index, or to ``-(offset+1)`` into ``neighbours``, where ``neighbours[offset]`` is
    a count n followed by n grid indices: every grid point at one of the ``nwant`` smallest
    squared distances, nearest first, ties by index.
    """

    grid: np.ndarray  # uint8 (grid_size, 4)
    kmap: np.ndarray  # int32 (4096,)
    neighbours: np.ndarray  # uint16 (total,)

    @functools.cached_property
    def grid_f32(self) -> np.ndarray:
        """The grid as float32, the form the search multiplies with (saves a conversion per use)."""
        return self.grid.astype(np.float32)


@functools.cache
def iq3_tables(grid_size: int) -> Iq3Tables:
    """Build (once) the grid, map and neighbour lists of ``iq3xs_init_impl(grid_size)``."""
    if grid_size not in (256, 512):
        raise QuantError(f"IQ3 grids have 256 or 512 points, not {grid_size}")
    kgrid = load_table(f"iq3_kgrid_{grid_size}.txt")
    nwant = 2 if grid_size == 256 else 3
    grid = grid_from_kgrid(kgrid, 2 * np.arange(8) + 1)

    kmap = np.full(4096, -1, dtype=np.int32)
    kmap[kgrid] = np.arange(grid_size, dtype=np.int32)

    off_grid = np.flatnonzero(kmap < 0)
    points = grid_from_kgrid(off_grid, 2 * np.arange(8) + 1).astype(np.int32)
    diff = points[:, None, :] - grid[None, :, :].astype(np.int32)
    dist2 = (diff * diff).sum(axis=2)  # (n_off, grid_size)
    # qsort on (distance, index) pairs = a stable sort on distance, since indices ascend
    order = np.argsort(dist2, axis=1, kind="stable")
    sorted_d2 = np.take_along_axis(dist2, order, axis=1)

    # rank of each sorted distance among the distinct ones; keep the nwant nearest shells
    rank = np.concatenate(
        [np.zeros((len(off_grid), 1), np.int64), np.cumsum(np.diff(sorted_d2, axis=1) > 0, axis=1)], axis=1
    )
    keep = rank < nwant
    counts = keep.sum(axis=1)
    # each list is [count, idx_1..idx_count]; lists follow one another in point order
    starts = np.concatenate([[0], np.cumsum(counts + 1)[:-1]])
    kmap[off_grid] = -(starts + 1)
    neighbours = np.empty(int((counts + 1).sum()), dtype=np.uint16)
    neighbours[starts] = counts
    slots = starts[:, None] + 1 + np.cumsum(keep, axis=1) - 1  # target slot of every kept entry
    neighbours[slots[keep]] = order[keep]
    return Iq3Tables(grid=grid, kmap=kmap, neighbours=neighbours)


#: ggml-common.h's iq3s_grid (512) and iq3xxs_grid (256): packed u32, four unsigned magnitudes each (the compiled
#: IQ3 products' tables)
IQ3S_GRID = load_table("iq3s_grid.txt").astype(np.uint32)
IQ3XXS_GRID = load_table("iq3xxs_grid.txt").astype(np.uint32)
if IQ3S_GRID.shape != (512,) or IQ3XXS_GRID.shape != (256,):
    raise ImportError(f"data/iq3s_grid.txt / iq3xxs_grid.txt hold {IQ3S_GRID.size} / {IQ3XXS_GRID.size} values, "
                      "expected 512 / 256")


@functools.cache
def _dequant_grid(qtype: GGMLType) -> np.ndarray:
    """The ggml-common.h grid of ``qtype`` as (n, 4) float32 magnitudes."""
    packed = (IQ3XXS_GRID if qtype == GGMLType.IQ3_XXS else IQ3S_GRID).astype("<u4")
    return packed.view(np.uint8).reshape(-1, 4).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# numba search kernels
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True, error_model="numpy")
def _best_neighbour(neighbours, start, grid, xval, waux, off, scale, L):  # pragma: no cover - numba
    """iq3_find_best_neighbour: the listed neighbour closest to xval/scale in waux-weighted L2."""
    count = neighbours[start]
    best_d2 = FLT_MAX
    best = -1
    for j in range(1, count + 1):
        g = np.int64(neighbours[start + j])
        d2 = _F32(0.0)
        for i in range(4):
            diff = _F32(scale * grid[g, i]) - xval[off + i]
            d2 = d2 + _F32(waux[off + i] * diff) * diff
        if d2 < best_d2:
            best_d2 = d2
            best = g
    if best >= 0:
        for i in range(4):
            L[off + i] = np.int64(grid[best, i]) >> 1
    return best


@nb.njit(cache=True, error_model="numpy")
def _levels_to_index(xval, off, inv_scale):  # pragma: no cover - numba
    """Round 4 values at 1/inv_scale to levels 0..7 and pack them 3 bits each (ggml's ``u``)."""
    u = 0
    for i in range(4):
        v = _F32(_F32(0.5) * _F32(_F32(inv_scale * xval[off + i]) - _F32(1.0)))
        l = min(7, max(0, nearest_int_nb(v)))
        u |= l << (3 * i)
    return u


@nb.njit(cache=True, error_model="numpy")
def _fit_subblock(
    xval, weight, waux, vmax, grid, kmap, neighbours, n_steps, refine_all, init_on_grid, L, Laux, on_grid, on_grid_aux
):  # pragma: no cover - numba
    """The trial-scale search shared by both types; returns (scale, error code) and fills L.

    IQ3_XXS tries 31 scales and re-rounds only the off-grid groups at the best one; IQ3_S tries
    19 and re-rounds all of them (its ``continue`` is commented out in ggml).
    """
    n = xval.shape[0]
    ngroups = n // 4
    for i in range(n):
        L[i] = 0
    best = _F32(0.0)
    scale = _F32(vmax / _F32(15.0))
    for k in range(ngroups):
        on_grid[k] = init_on_grid
    for step in range(-n_steps, n_steps + 1):
        inv = _F32(_F32(_F32(15.0) + _F32(_F32(step) * _F32(0.2))) / vmax)
        this_scale = _F32(_F32(1.0) / inv)
        for k in range(ngroups):
            u = _levels_to_index(xval, 4 * k, inv)
            for i in range(4):
                Laux[4 * k + i] = (u >> (3 * i)) & 7
            on_grid_aux[k] = True
            if kmap[u] < 0:
                on_grid_aux[k] = False
                if _best_neighbour(neighbours, -kmap[u] - 1, grid, xval, waux, 4 * k, this_scale, Laux) < 0:
                    return scale, _ERR_NO_NEIGHBOUR
        sumqx = _F32(0.0)
        sumq2 = _F32(0.0)
        for i in range(n):
            w = weight[i]
            q = _F32(2 * Laux[i] + 1)
            sumqx = sumqx + _F32(w * xval[i]) * q
            sumq2 = sumq2 + _F32(w * q) * q
        if sumq2 > _F32(0.0) and _F32(sumqx * sumqx) > _F32(best * sumq2):
            scale = _F32(sumqx / sumq2)
            best = _F32(scale * sumqx)
            for i in range(n):
                L[i] = Laux[i]
            for k in range(ngroups):
                on_grid[k] = on_grid_aux[k]
    n_off = 0
    for k in range(ngroups):
        if not on_grid[k]:
            n_off += 1
    if n_off > 0 and scale > _F32(0.0):
        inv = _F32(_F32(1.0) / scale)
        for k in range(ngroups):
            if on_grid[k] and not refine_all:
                continue
            u = _levels_to_index(xval, 4 * k, inv)
            g = np.int64(kmap[u])
            if g < 0:
                g = _best_neighbour(neighbours, -kmap[u] - 1, grid, xval, waux, 4 * k, scale, L)
                if g < 0:
                    return scale, _ERR_NO_NEIGHBOUR
            for i in range(4):
                L[4 * k + i] = np.int64(grid[g, i]) >> 1
        sumqx = _F32(0.0)
        sumq2 = _F32(0.0)
        for i in range(n):
            w = weight[i]
            q = _F32(2 * L[i] + 1)
            sumqx = sumqx + _F32(w * xval[i]) * q
            sumq2 = sumq2 + _F32(w * q) * q
        if sumq2 > _F32(0.0):
            scale = _F32(sumqx / sumq2)
    return scale, 0


@nb.njit(cache=True, error_model="numpy")
def _subblock_weights(xb, qw, has_qw, sigma2, weight, waux):  # pragma: no cover - numba
    """Per-element weights: imatrix * sqrt(sigma2 + x^2) with an imatrix, x^2 without."""
    if has_qw:
        imatrix_weights(xb, qw, sigma2, weight)
    else:
        for i in range(xb.shape[0]):
            weight[i] = _F32(xb[i] * xb[i])
    for i in range(xb.shape[0]):
        waux[i] = np.sqrt(weight[i])


@nb.njit(cache=True, nogil=True, error_model="numpy")
def _quantize_iq3_xxs(x, qw, has_qw, grid, kmap, neighbours, out, dvals, errors):  # pragma: no cover - numba
    """quantize_row_iq3_xxs_impl(256, ...) on every row; d (before fp16) goes to ``dvals``."""
    n_rows, n_per_row = x.shape
    nbl = n_per_row // QK_K
    for row in range(n_rows):
        weight = np.empty(32, np.float32)
        waux = np.empty(32, np.float32)
        xval = np.empty(32, np.float32)
        L = np.empty(32, np.int64)
        Laux = np.empty(32, np.int64)
        on_grid = np.empty(8, np.bool_)
        on_grid_aux = np.empty(8, np.bool_)
        signs = np.empty(4, np.int64)
        scales = np.empty(8, np.float32)
        q3 = np.zeros(96, np.uint8)  # 64 grid indices, then 8 little-endian u32 scales_and_signs
        for ibl in range(nbl):
            q3[:] = 0
            sigma2 = block_sigma2(x, row, ibl * QK_K, _F32(2.0))
            max_scale = _F32(0.0)
            for ib in range(8):
                off = ibl * QK_K + 32 * ib
                xb = x[row, off : off + 32]
                _subblock_weights(xb, qw[off : off + 32], has_qw, sigma2, weight, waux)
                # odd flips cannot be stored: the cheapest element is flipped back instead
                even_sign_groups(x, row, off, 4, weight, xval, signs)
                vmax = xval[0]
                for i in range(1, 32):
                    vmax = vmax if vmax > xval[i] else xval[i]
                if vmax < _F32(1e-8):
                    scales[ib] = _F32(0.0)
                    continue
                scale, err = _fit_subblock(
                    xval, weight, waux, vmax, grid, kmap, neighbours, 15, False, True, L, Laux, on_grid, on_grid_aux
                )
                if err:
                    errors[row] = err
                    break
                if scale < _F32(0.0):
                    scale = -scale
                    for k in range(4):
                        signs[k] = (~signs[k]) & 127
                for k in range(8):
                    u = L[4 * k] | (L[4 * k + 1] << 3) | (L[4 * k + 2] << 6) | (L[4 * k + 3] << 9)
                    if kmap[u] < 0:
                        errors[row] = _ERR_OFF_GRID
                    q3[8 * ib + k] = kmap[u]
                packed = signs[0] | (signs[1] << 7) | (signs[2] << 14) | (signs[3] << 21)
                for b in range(4):
                    q3[64 + 4 * ib + b] = (packed >> (8 * b)) & 255
                if not scale >= _F32(0.0):
                    errors[row] = _ERR_BAD_SCALE
                scales[ib] = scale
                max_scale = max_scale if max_scale > scale else scale
            if errors[row]:
                break
            base = ibl * 98
            if max_scale == _F32(0.0):
                dvals[row, ibl] = _F32(0.0)
                out[row, base + 2 : base + 98] = 0
                continue
            d = _F32(max_scale / _F32(31.0))
            dvals[row, ibl] = _F32(d * _F32(1.0125))
            inv_d = _F32(_F32(1.0) / d)
            for ib in range(8):
                q3[64 + 4 * ib + 3] |= scale_nibble(inv_d, scales[ib], 15) << 4
            out[row, base + 2 : base + 98] = q3


@nb.njit(cache=True, nogil=True, error_model="numpy")
def _quantize_iq3_s(x, qw, has_qw, grid, kmap, neighbours, out, dvals, errors):  # pragma: no cover - numba
    """quantize_row_iq3_s_impl(32, ...) on every row; d (before fp16) goes to ``dvals``.

    As in ggml, a sub-block skipped for being all zero does not advance the qs/signs write
    positions, so the following sub-blocks' bytes land one slot early.
    """
    n_rows, n_per_row = x.shape
    nbl = n_per_row // QK_K
    for row in range(n_rows):
        weight = np.empty(32, np.float32)
        waux = np.empty(32, np.float32)
        xval = np.empty(32, np.float32)
        L = np.empty(32, np.int64)
        Laux = np.empty(32, np.int64)
        on_grid = np.empty(8, np.bool_)
        on_grid_aux = np.empty(8, np.bool_)
        signs = np.empty(4, np.int64)
        scales = np.empty(8, np.float32)
        for ibl in range(nbl):
            base = ibl * 110
            blk = out[row, base : base + 110]
            blk[:] = 0
            qs_pos = 2
            signs_pos = 74
            sigma2 = block_sigma2(x, row, ibl * QK_K, _F32(2.0))
            max_scale = _F32(0.0)
            for ib in range(8):
                off = ibl * QK_K + 32 * ib
                xb = x[row, off : off + 32]
                _subblock_weights(xb, qw[off : off + 32], has_qw, sigma2, weight, waux)
                sign_groups(x, row, off, 4, xval, signs)
                vmax = xval[0]
                for i in range(1, 32):
                    vmax = vmax if vmax > xval[i] else xval[i]
                if vmax == _F32(0.0):
                    scales[ib] = _F32(0.0)
                    continue
                scale, err = _fit_subblock(
                    xval, weight, waux, vmax, grid, kmap, neighbours, 9, True, False, L, Laux, on_grid, on_grid_aux
                )
                if err:
                    errors[row] = err
                    break
                if scale < _F32(0.0):
                    scale = -scale
                    for k in range(4):
                        signs[k] = (~signs[k]) & 255
                for k in range(8):
                    u = L[4 * k] | (L[4 * k + 1] << 3) | (L[4 * k + 2] << 6) | (L[4 * k + 3] << 9)
                    g = kmap[u]
                    if g < 0:
                        errors[row] = _ERR_OFF_GRID
                    blk[qs_pos + k] = g & 255
                    blk[66 + ib] |= (g >> 8) << k
                qs_pos += 8
                for k in range(4):
                    blk[signs_pos + k] = signs[k]
                signs_pos += 4
                if not scale >= _F32(0.0):
                    errors[row] = _ERR_BAD_SCALE
                scales[ib] = scale
                max_scale = max_scale if max_scale > scale else scale
            if errors[row]:
                break
            if max_scale == _F32(0.0):
                dvals[row, ibl] = _F32(0.0)
                continue
            d = _F32(max_scale / _F32(31.0))
            dvals[row, ibl] = _F32(d * _F32(1.033))
            inv_d = _F32(_F32(1.0) / d)
            for ib in range(0, 8, 2):
                lo = scale_nibble(inv_d, scales[ib], 15)
                blk[106 + ib // 2] = lo | (scale_nibble(inv_d, scales[ib + 1], 15) << 4)


# ---------------------------------------------------------------------------------------------
# codecs
# ---------------------------------------------------------------------------------------------


def _run_quantizer(kernel, qtype: GGMLType, grid_size: int, x: np.ndarray, imatrix: np.ndarray | None,
                   out: np.ndarray) -> None:
    """Call a row kernel on out (n_rows, n_blocks, type_size), then drop the fp16 super-scales into
    bytes 0-1 of every block."""
    tables = iq3_tables(grid_size)
    n_rows, nbl, _ = out.shape
    has_qw = imatrix is not None
    qw = np.ascontiguousarray(imatrix, dtype=np.float32) if has_qw else np.zeros(x.shape[1], np.float32)
    dvals = np.zeros((n_rows, nbl), dtype=np.float32)
    errors = np.zeros(n_rows, dtype=np.int64)
    kernel(x, qw, has_qw, tables.grid_f32, tables.kmap, tables.neighbours, out.reshape(n_rows, -1), dvals, errors)
    bad = np.flatnonzero(errors)
    if bad.size:
        row = int(bad[0])
        raise QuantRowError(qtype, row, f"cannot be quantized ({_ERR_TEXT[int(errors[row])]}); ggml aborts here "
                            "too - check the input and imatrix for NaN/inf or float32 overflow")
    out[:, :, 0:2] = fp16_bytes(dvals)


@nb.njit(cache=True, error_model="numpy")
def _dequantize_iq3_xxs(blocks, d, grid, ksigns, sign_rows, out):  # pragma: no cover - numba
    """dequantize_row_iq3_xxs over all blocks: y = (d*(0.5+s)*0.5) * grid * sign."""
    for b in range(blocks.shape[0]):
        for ib in range(8):
            p = 66 + 4 * ib
            aux = (
                np.uint32(blocks[b, p])
                | (np.uint32(blocks[b, p + 1]) << 8)
                | (np.uint32(blocks[b, p + 2]) << 16)
                | (np.uint32(blocks[b, p + 3]) << 24)
            )
            db = _F32(_F32(d[b] * _F32(_F32(0.5) + _F32(aux >> 28))) * _F32(0.5))
            for l in range(4):
                sign = sign_rows[ksigns[(aux >> (7 * l)) & 127]]
                g1 = blocks[b, 2 + 8 * ib + 2 * l]
                g2 = blocks[b, 3 + 8 * ib + 2 * l]
                o = 32 * ib + 8 * l
                for j in range(4):
                    out[b, o + j] = _F32(db * grid[g1, j]) * sign[j]
                    out[b, o + 4 + j] = _F32(db * grid[g2, j]) * sign[4 + j]


@nb.njit(cache=True, error_model="numpy")
def _dequantize_iq3_s(blocks, d, grid, sign_rows, out):  # pragma: no cover - numba
    """dequantize_row_iq3_s over all blocks: y = d*(1+2*scale) * grid[qs | qh bit << 8] * sign."""
    for b in range(blocks.shape[0]):
        for ib in range(8):
            db = _F32(d[b] * _F32(1 + 2 * ((blocks[b, 106 + ib // 2] >> (4 * (ib % 2))) & 15)))
            qh = np.int64(blocks[b, 66 + ib])
            for l in range(4):
                sign = sign_rows[blocks[b, 74 + 4 * ib + l]]
                g1 = np.int64(blocks[b, 2 + 8 * ib + 2 * l]) | (((qh >> (2 * l)) & 1) << 8)
                g2 = np.int64(blocks[b, 3 + 8 * ib + 2 * l]) | (((qh >> (2 * l + 1)) & 1) << 8)
                o = 32 * ib + 8 * l
                for j in range(4):
                    out[b, o + j] = _F32(db * grid[g1, j]) * sign[j]
                    out[b, o + 4 + j] = _F32(db * grid[g2, j]) * sign[4 + j]


@functools.cache
def _sign_rows() -> np.ndarray:
    """(256, 8) float32 of +-1: bit j of a sign byte as ggml's ``(signs & kmask_iq2xs[j] ? -1.f : 1.f)``.

    Multiplying by -1 is an exact negation (a zero becomes -0.0), so the table reproduces the
    C expression bit for bit."""
    bits = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little")
    return np.where(bits.astype(bool), np.float32(-1.0), np.float32(1.0)).astype(np.float32)


class _IQ3(BlockCodec):
    """The IQ3 row glue: one quantizer kernel on a grid of ``grid_size`` points, one dequantizer."""

    vec_dot_type = GGMLType.Q8_K
    grid_size: int
    _quantize: Callable[..., None]
    _dequantize: Callable[..., None]

    def _tables(self) -> tuple[np.ndarray, ...]:
        raise NotImplementedError

    def _quantize_blocks(self, x: np.ndarray, imatrix: np.ndarray | None, out: np.ndarray) -> None:
        _run_quantizer(self._quantize, self.qtype, self.grid_size, x, imatrix, out)

    def _dequantize_blocks(self, blocks: np.ndarray, y: np.ndarray) -> None:
        blocks = blocks.reshape(-1, self.qtype.type_size)
        self._dequantize(blocks, read_fp16(blocks, 0), *self._tables(), y.reshape(blocks.shape[0], QK_K))


@register
class IQ3XXSCodec(_IQ3):
    """IQ3_XXS: 3.0625 bpw; 256-point grid, parity-completed signs, 4-bit scales in the sign words."""

    qtype = GGMLType.IQ3_XXS
    block_dtype = np.dtype([("d", "<f2"), ("qs", "u1", (QK_K // 4,)), ("scales_and_signs", "<u4", (QK_K // 32,))])
    grid_size = 256
    _quantize = staticmethod(_quantize_iq3_xxs)
    _dequantize = staticmethod(_dequantize_iq3_xxs)

    def _tables(self) -> tuple[np.ndarray, ...]:
        return _dequant_grid(self.qtype), ksigns_iq2xs(), _sign_rows()


@register
class IQ3SCodec(_IQ3):
    """IQ3_S: 3.4375 bpw; 512-point grid (9-bit indices), explicit signs, 4-bit scales."""

    qtype = GGMLType.IQ3_S
    block_dtype = np.dtype(
        [
            ("d", "<f2"),
            ("qs", "u1", (QK_K // 4,)),
            ("qh", "u1", (QK_K // 32,)),
            ("signs", "u1", (QK_K // 8,)),
            ("scales", "u1", (QK_K // 64,)),
        ]
    )

    grid_size = 512
    _quantize = staticmethod(_quantize_iq3_s)
    _dequantize = staticmethod(_dequantize_iq3_s)

    def _tables(self) -> tuple[np.ndarray, ...]:
        return _dequant_grid(self.qtype), _sign_rows()


__all__ = [
    "IQ3S_GRID",
    "IQ3XXS_GRID",
    "IQ3XXS_LEVELS",
    "IQ3SCodec",
    "IQ3XXSCodec",
    "Iq3Tables",
    "grid_from_kgrid",
    "iq3_tables",
    "ksigns_iq2xs",
    "load_table",
]
