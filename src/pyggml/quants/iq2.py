"""IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S and IQ1_M: the 2-bit and 1.5-bit "importance" quants.

All five store, per group of 8 weights, an index into a fixed grid of 8-vectors (the
ggml-common.h grids), plus signs (IQ2) or a shift (IQ1) and small sub-block scales under an
fp16 super-scale. Dequantization is a table gather; quantization is ggml's search
(``quantize_row_*_impl`` in ggml-quants.c), run by the numba kernels of :mod:`.iq2_quant` (IQ2)
and :mod:`.iq1_quant` (IQ1) on the tables of :mod:`.iq2_tables`.

Block layouts (bytes, ggml-common.h)::

    iq2_xxs  66: d f16 | qs u16[32]   (per 32 values: 4 grid bytes, 4x7 sign bits + 4-bit scale)
    iq2_xs   74: d f16 | qs u16[32]   (9-bit grid index | 7-bit sign index) | scales u8[8]
    iq2_s    82: d f16 | qs u8[64]    (32 low index bytes, 32 sign bytes) | qh u8[8] | scales u8[8]
    iq1_s    50: d f16 | qs u8[32]    | qh u16[8]  (3 high index bits x4, 3-bit scale, shift sign)
    iq1_m    56: qs u8[32] | qh u8[16] | scales u8[8]  (the fp16 scale is spread over 4 nibbles)
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import numba as nb
import numpy as np

from ..types import QK_K, GGMLType
from ._blocks import fp16_bytes
from .codec import BlockCodec, QuantError, QuantRowError, register
from .fp import fp16_bits_to_fp32, fp32_to_fp16_bits
from .iq1_quant import DRIVERS as IQ1_DRIVERS
from .iq2_quant import DRIVERS as IQ2_DRIVERS
from .iq2_tables import IQ1_DELTA, common_grid_bytes, ksigns_iq2xs, quant_tables

f32 = np.float32

#: per type name: the driver over a range of rows
DRIVERS = {**IQ2_DRIVERS, **IQ1_DRIVERS}


@cache
def _fp16_table() -> np.ndarray:
    """fp16 bits -> float32 for all 65536 patterns, so kernels convert with one load."""
    return fp16_bits_to_fp32(np.arange(65536, dtype=np.uint16))


@cache
def _grid_f32(qtype: GGMLType) -> np.ndarray:
    return common_grid_bytes(qtype).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# dequantization kernels: one block per iteration, ggml's float32 expression for each value.
# They run on one thread: a table gather is memory-bound, and a parallel region would cost more
# than it saves on anything but huge tensors.
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True, inline="always")
def _signed(v, sign_byte, j):  # pragma: no cover - numba
    return v * f32(-1.0) if (sign_byte >> j) & 1 else v


@nb.njit(cache=True, inline="always")
def _u16(blk, off):  # pragma: no cover - numba
    return np.int64(blk[off]) | (np.int64(blk[off + 1]) << 8)


@nb.njit(cache=True, inline="always")
def _half_scale(d, nibble):  # pragma: no cover - numba
    """d * (0.5f + s) * 0.25f, the IQ2 sub-block scale."""
    return f32(f32(d * f32(f32(0.5) + f32(nibble))) * f32(0.25))


@nb.njit(cache=True)
def _dequant_iq2_xxs(blocks, fp16, grid, ksigns, out):  # pragma: no cover - numba
    for b in range(blocks.shape[0]):
        blk = blocks[b]
        d = fp16[_u16(blk, 0)]
        for ib in range(8):
            off = 2 + 8 * ib
            aux = _u16(blk, off + 4) | (_u16(blk, off + 6) << 16)
            db = _half_scale(d, aux >> 28)
            for l in range(4):
                g = blk[off + l]
                s = ksigns[(aux >> (7 * l)) & 127]
                for j in range(8):
                    out[b, 32 * ib + 8 * l + j] = _signed(f32(db * grid[g, j]), s, j)


@nb.njit(cache=True)
def _dequant_iq2_xs(blocks, fp16, grid, ksigns, out):  # pragma: no cover - numba
    for b in range(blocks.shape[0]):
        blk = blocks[b]
        d = fp16[_u16(blk, 0)]
        for ib in range(8):
            sc = blk[66 + ib]
            for l in range(4):
                db = _half_scale(d, (sc & 15) if l < 2 else (sc >> 4))
                q = _u16(blk, 2 + 2 * (4 * ib + l))
                s = ksigns[q >> 9]
                g = q & 511
                for j in range(8):
                    out[b, 32 * ib + 8 * l + j] = _signed(f32(db * grid[g, j]), s, j)


@nb.njit(cache=True)
def _dequant_iq2_s(blocks, fp16, grid, ksigns, out):  # pragma: no cover - numba
    for b in range(blocks.shape[0]):
        blk = blocks[b]
        d = fp16[_u16(blk, 0)]
        for ib in range(8):
            sc = blk[74 + ib]
            qh = np.int64(blk[66 + ib])
            for l in range(4):
                db = _half_scale(d, (sc & 15) if l < 2 else (sc >> 4))
                g = np.int64(blk[2 + 4 * ib + l]) | ((qh << (8 - 2 * l)) & 0x300)
                s = blk[34 + 4 * ib + l]
                for j in range(8):
                    out[b, 32 * ib + 8 * l + j] = _signed(f32(db * grid[g, j]), s, j)


@nb.njit(cache=True)
def _dequant_iq1_s(blocks, fp16, grid, out):  # pragma: no cover - numba
    for b in range(blocks.shape[0]):
        blk = blocks[b]
        d = fp16[_u16(blk, 0)]
        for ib in range(8):
            qh = _u16(blk, 34 + 2 * ib)
            dl = f32(d * f32(2 * ((qh >> 12) & 7) + 1))
            delta = -IQ1_DELTA if qh & 0x8000 else IQ1_DELTA
            for l in range(4):
                g = np.int64(blk[2 + 4 * ib + l]) | (((qh >> (3 * l)) & 7) << 8)
                for j in range(8):
                    out[b, 32 * ib + 8 * l + j] = f32(dl * f32(grid[g, j] + delta))


@nb.njit(cache=True)
def _dequant_iq1_m(blocks, fp16, grid, out):  # pragma: no cover - numba
    for b in range(blocks.shape[0]):
        blk = blocks[b]
        sc0 = _u16(blk, 48)
        sc1 = _u16(blk, 50)
        sc2 = _u16(blk, 52)
        sc3 = _u16(blk, 54)
        d = fp16[(sc0 >> 12) | ((sc1 >> 8) & 0x00F0) | ((sc2 >> 4) & 0x0F00) | (sc3 & 0xF000)]
        for ib in range(8):
            sc = _u16(blk, 48 + 2 * (ib // 2))
            shift = 6 * (ib % 2)
            dl1 = f32(d * f32(2 * ((sc >> shift) & 7) + 1))
            dl2 = f32(d * f32(2 * ((sc >> (shift + 3)) & 7) + 1))
            qh0 = np.int64(blk[32 + 2 * ib])
            qh1 = np.int64(blk[33 + 2 * ib])
            for l in range(4):
                qh = qh0 if l < 2 else qh1
                hi = (qh << 8) & 0x700 if l % 2 == 0 else (qh << 4) & 0x700
                g = np.int64(blk[4 * ib + l]) | hi
                neg = qh & (0x08 if l % 2 == 0 else 0x80)
                delta = -IQ1_DELTA if neg else IQ1_DELTA
                dl = dl1 if l < 2 else dl2
                for j in range(8):
                    out[b, 32 * ib + 8 * l + j] = f32(dl * f32(grid[g, j] + delta))


# ---------------------------------------------------------------------------------------------
# codecs
# ---------------------------------------------------------------------------------------------


class _IQ2Family(BlockCodec):
    """Shared plumbing: input checks, running a row kernel, writing the fp16 super-scales."""

    vec_dot_type = GGMLType.Q8_K
    #: the quantizer takes "an imatrix was given" (IQ2_S, IQ1_M: their search differs without one)
    imatrix_flag = False
    #: the dequantizer also takes the ksigns table (the IQ2 types)
    ksigns = False
    _dequant: Callable[..., None]

    def _check(self, x: np.ndarray, imatrix: np.ndarray | None) -> np.ndarray:
        name = self.qtype.type_name
        if x.ndim != 2 or x.shape[1] % QK_K:
            raise QuantError(f"{name}: rows must be a multiple of {QK_K} values, got shape {x.shape}")
        if not np.isfinite(x).all():
            raise QuantError(f"{name}: cannot quantize non-finite values (ggml aborts on them)")
        if imatrix is None:
            if self.requires_imatrix:
                raise QuantError(f"type {name} requires an importance matrix (imatrix)")
            return np.zeros(0, dtype=np.float32)
        qw = np.ascontiguousarray(imatrix, dtype=np.float32).reshape(-1)
        if qw.shape[0] != x.shape[1]:
            raise QuantError(f"{name}: imatrix has {qw.shape[0]} values, expected {x.shape[1]}")
        if not np.isfinite(qw).all() or (qw < 0).any():
            raise QuantError(f"{name}: imatrix values must be finite and non-negative")
        return qw

    def _quantize_blocks(self, x: np.ndarray, imatrix: np.ndarray | None, out: np.ndarray) -> None:
        qw = self._check(x, imatrix)
        flag = (imatrix is not None,) if self.imatrix_flag else ()
        tables = quant_tables(self.qtype)
        n_rows, n_blocks, _ = out.shape
        dvals = np.zeros((n_rows, n_blocks), dtype=np.float32)
        status = np.zeros(n_rows, dtype=np.int32)
        x = np.ascontiguousarray(x, dtype=np.float32)
        driver = DRIVERS[self.qtype.type_name]
        driver(x, qw, *flag, tables.grid, tables.kmap, tables.neighbours, out.reshape(n_rows, -1), dvals, status)
        if status.any():
            row = int(np.flatnonzero(status)[0])
            raise QuantRowError(self.qtype, row, "could not be quantized (ggml would abort)")
        self._store_d(out, dvals)

    @staticmethod
    def _store_d(blocks: np.ndarray, dvals: np.ndarray) -> None:
        blocks[..., 0:2] = fp16_bytes(dvals)

    def _dequantize_blocks(self, blocks: np.ndarray, y: np.ndarray) -> None:
        blocks = blocks.reshape(-1, self.qtype.type_size)
        signs = (ksigns_iq2xs(),) if self.ksigns else ()
        self._dequant(blocks, _fp16_table(), _grid_f32(self.qtype), *signs, y.reshape(blocks.shape[0], QK_K))


@register
class IQ2_XXS(_IQ2Family):
    qtype = GGMLType.IQ2_XXS
    block_dtype = np.dtype([("d", "<f2"), ("qs", "<u2", (32,))])
    requires_imatrix = True
    ksigns = True
    _dequant = staticmethod(_dequant_iq2_xxs)


@register
class IQ2_XS(_IQ2Family):
    qtype = GGMLType.IQ2_XS
    block_dtype = np.dtype([("d", "<f2"), ("qs", "<u2", (32,)), ("scales", "u1", (8,))])
    requires_imatrix = True
    ksigns = True
    _dequant = staticmethod(_dequant_iq2_xs)


@register
class IQ2_S(_IQ2Family):
    qtype = GGMLType.IQ2_S
    block_dtype = np.dtype([("d", "<f2"), ("qs", "u1", (64,)), ("qh", "u1", (8,)), ("scales", "u1", (8,))])
    imatrix_flag = True
    ksigns = True
    _dequant = staticmethod(_dequant_iq2_s)


@register
class IQ1_S(_IQ2Family):
    qtype = GGMLType.IQ1_S
    block_dtype = np.dtype([("d", "<f2"), ("qs", "u1", (32,)), ("qh", "<u2", (8,))])
    requires_imatrix = True
    _dequant = staticmethod(_dequant_iq1_s)


@register
class IQ1_M(_IQ2Family):
    qtype = GGMLType.IQ1_M
    block_dtype = np.dtype([("qs", "u1", (32,)), ("qh", "u1", (16,)), ("scales", "u1", (8,))])
    imatrix_flag = True
    _dequant = staticmethod(_dequant_iq1_m)

    @staticmethod
    def _store_d(blocks: np.ndarray, dvals: np.ndarray) -> None:
        # the fp16 scale has no field of its own: its 4 nibbles top the 4 scale words
        bits = fp32_to_fp16_bits(dvals).astype(np.uint16)
        for word in range(4):
            nibble = (bits >> np.uint16(4 * word)) & np.uint16(0xF)
            blocks[..., 49 + 2 * word] |= (nibble << np.uint16(4)).astype(np.uint8)


__all__ = ["IQ1_M", "IQ1_S", "IQ2_S", "IQ2_XS", "IQ2_XXS"]
