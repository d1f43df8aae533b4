"""IQ4_NL and IQ4_XS: 4-bit indices into a fixed non-linear table of 16 levels.

IQ4_NL is a 32-value block with one fp16 scale; IQ4_XS is a 256-value super-block whose
eight 32-value sub-blocks carry 6-bit scales relative to one fp16 scale. Both are quantized
by ggml's ``quantize_row_iq4_nl_impl`` (ggml-quants.c), as ``ggml_quantize_chunk`` calls it:
``quantize_iq4_nl`` / ``quantize_iq4_xs`` with a 15-point scale search (``ntry = 7``),
weighting errors by the importance matrix when one is given and by x*x otherwise.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..types import QK_K, GGMLType
from ._blocks import load_table, read_fp16
from .chunks import for_row_chunks
from .codec import SERIAL_BELOW_QUANT, BlockCodec, QuantError, declare
from .fp import fp32_to_fp16_bits_nb
from .ksearch import (
    GROUP_MAX_EPS,
    best_index_int8,
    f32,
    imatrix_weights,
    nearest_int,
    put_u16,
    signed_absmax,
)


def _load_kvalues() -> np.ndarray:
    values = load_table("kvalues_iq4nl.txt").astype(np.int8)
    if values.shape != (16,):
        raise ImportError(f"data/kvalues_iq4nl.txt holds {values.size} values, expected 16")
    return values


#: ggml's kvalues_iq4nl (data/kvalues_iq4nl.txt)
KVALUES_IQ4NL = _load_kvalues()
_KVALUES_F32 = KVALUES_IQ4NL.astype(np.float32)

QK4_NL = 32
BLOCK_IQ4_NL = np.dtype([("d", "<f2"), ("qs", "u1", 16)])
BLOCK_IQ4_XS = np.dtype([("d", "<f2"), ("scales_h", "<u2"), ("scales_l", "u1", 4), ("qs", "u1", 128)])

#: ggml_quantize_chunk's scale search width; quantize_row_iq4_nl_ref (IQ4_NL's from_float)
#: passes -1, which skips the search and keeps the first fit
NTRY_CHUNK = 7
NTRY_REF = -1


@njit(cache=True, error_model="numpy")
def _block_scale(xb: np.ndarray, weight: np.ndarray, values: np.ndarray, Lb: np.ndarray, ntry: int) -> float:
    """Best weighted scale for one 32-value block: start from max/values[0] (negated when
    searching), then try the 2*ntry+1 inverse scales (itry + values[0])/max. Only the scale
    is kept from the trials; Lb holds the levels of the first fit."""
    amax, vmax = signed_absmax(xb)
    if amax < GROUP_MAX_EPS:
        return f32(0.0)
    d = -vmax / values[0] if ntry > 0 else vmax / values[0]
    inv = f32(1.0) / d
    sumqx = f32(0.0)
    sumq2 = f32(0.0)
    for j in range(xb.shape[0]):
        l = best_index_int8(values, inv * xb[j])
        Lb[j] = l
        q = values[l]
        w = weight[j]
        sumqx += w * q * xb[j]
        sumq2 += w * q * q
    d = sumqx / sumq2 if sumq2 > 0 else f32(0.0)
    best = d * sumqx
    v0 = int(values[0])
    for itry in range(-ntry, ntry + 1):
        inv = f32(itry + v0) / vmax
        sumqx = f32(0.0)
        sumq2 = f32(0.0)
        for j in range(xb.shape[0]):
            q = values[best_index_int8(values, inv * xb[j])]
            w = weight[j]
            sumqx += w * q * xb[j]
            sumq2 += w * q * q
        if sumq2 > 0 and sumqx * sumqx > best * sumq2:
            d = sumqx / sumq2
            best = d * sumqx
    return d


@njit(cache=True, error_model="numpy")
def _iq4_block(x: np.ndarray, qw: np.ndarray, use_qw: bool, values: np.ndarray, ntry: int, out: np.ndarray) -> None:
    """One IQ4_NL block (32 values) or IQ4_XS super-block (256 values) into ``out``."""
    n = x.shape[0]
    nsub = n // 32
    sigma2 = f32(0.0)
    for j in range(n):
        sigma2 += x[j] * x[j]
    sigma2 *= f32(2.0) / f32(n)
    L = np.zeros(n, np.uint8)
    weight = np.empty(32, np.float32)
    scales = np.empty(nsub, np.float32)
    max_scale = f32(0.0)
    amax_scale = f32(0.0)
    for ib in range(nsub):
        xb = x[32 * ib : 32 * ib + 32]
        if use_qw:
            imatrix_weights(xb, qw[32 * ib : 32 * ib + 32], sigma2, weight)
        else:
            for j in range(32):
                weight[j] = xb[j] * xb[j]
        d = _block_scale(xb, weight, values, L[32 * ib : 32 * ib + 32], ntry)
        scales[ib] = d
        if abs(d) > amax_scale:
            amax_scale = abs(d)
            max_scale = d
    if nsub > 1:
        # IQ4_XS: 6-bit sub-block scales l-32 of a shared d, levels re-picked for d*l
        d = -max_scale / f32(32.0)
        put_u16(out, 0, fp32_to_fp16_bits_nb(d))
        inv = f32(1.0) / d if d != 0 else f32(0.0)
        scales_h = 0
        for ib in range(nsub):
            l = min(max(nearest_int(inv * scales[ib]), -32), 31)
            dl = d * f32(l)
            idl = f32(1.0) / dl if dl != 0 else f32(0.0)
            for j in range(32 * ib, 32 * ib + 32):
                L[j] = best_index_int8(values, idl * x[j])
            l += 32
            if ib % 2 == 0:
                out[4 + ib // 2] = l & 0xF
            else:
                out[4 + ib // 2] = np.int64(out[4 + ib // 2]) | ((l & 0xF) << 4)
            scales_h |= (l >> 4) << (2 * ib)
        put_u16(out, 2, scales_h)
        q0 = 8
    else:
        # IQ4_NL: the block scale itself (not its fp16 rounding) picks the final levels
        put_u16(out, 0, fp32_to_fp16_bits_nb(scales[0]))
        if ntry > 0:
            inv = f32(1.0) / scales[0] if scales[0] != 0 else f32(0.0)
            for j in range(n):
                L[j] = best_index_int8(values, inv * x[j])
        q0 = 2
    for i in range(nsub):
        for j in range(16):
            out[q0 + 16 * i + j] = np.int64(L[32 * i + j]) | (np.int64(L[32 * i + 16 + j]) << 4)


@njit(cache=True, nogil=True, error_model="numpy")
def _quantize_iq4(
    x: np.ndarray, qw: np.ndarray, use_qw: bool, values: np.ndarray, bk: int, ntry: int, out: np.ndarray
) -> None:
    """Every block of ``bk`` values of every row."""
    nb = x.shape[1] // bk
    bs = out.shape[1] // nb
    for k in range(x.shape[0] * nb):
        r = k // nb
        b = k - r * nb
        wb = qw[b * bk : (b + 1) * bk] if use_qw else qw[:0]
        _iq4_block(x[r, b * bk : (b + 1) * bk], wb, use_qw, values, ntry, out[r, b * bs : (b + 1) * bs])


@njit(cache=True, error_model="numpy")
def _deq_iq4_nl(q: np.ndarray, d: np.ndarray, values: np.ndarray, y: np.ndarray) -> None:
    for b in range(q.shape[0]):
        blk = q[b]
        out = y[b]
        dl = d[b]
        for j in range(16):
            v = blk[2 + j]
            out[j] = dl * values[v & np.uint8(15)]
            out[16 + j] = dl * values[v >> np.uint8(4)]


@njit(cache=True, error_model="numpy")
def _deq_iq4_xs(q: np.ndarray, d: np.ndarray, values: np.ndarray, y: np.ndarray) -> None:
    for b in range(q.shape[0]):
        blk = q[b]
        out = y[b]
        scales_h = np.int32(blk[2]) | (np.int32(blk[3]) << 8)
        for ib in range(8):
            low = (np.int32(blk[4 + ib // 2]) >> (4 * (ib % 2))) & 0xF
            high = (scales_h >> (2 * ib)) & 3
            dl = d[b] * f32((low | (high << 4)) - 32)
            for j in range(16):
                v = blk[8 + 16 * ib + j]
                out[32 * ib + j] = dl * values[v & np.uint8(15)]
                out[32 * ib + 16 + j] = dl * values[v >> np.uint8(4)]


class _IQ4(BlockCodec):
    block_values: int

    def _quantize_blocks(self, x: np.ndarray, imatrix: np.ndarray | None, out: np.ndarray) -> None:
        use_qw = imatrix is not None
        qw = imatrix if use_qw else np.empty(0, np.float32)
        _quantize_iq4(x, qw, use_qw, _KVALUES_F32, self.block_values, NTRY_CHUNK, out.reshape(x.shape[0], -1))

    def _dequantize_blocks(self, blocks: np.ndarray, y: np.ndarray) -> None:
        blocks = blocks.reshape(-1, self.qtype.type_size)
        deq = _deq_iq4_xs if self.block_values == QK_K else _deq_iq4_nl
        deq(blocks, read_fp16(blocks, 0), _KVALUES_F32, y.reshape(blocks.shape[0], self.block_values))


IQ4_NL = declare(_IQ4, GGMLType.IQ4_NL, "ggml's iq4_nl: 32 values, one fp16 scale, the non-linear 4-bit grid.",
                 block_dtype=BLOCK_IQ4_NL, vec_dot_type=GGMLType.Q8_0, block_values=QK4_NL)
IQ4_XS = declare(_IQ4, GGMLType.IQ4_XS, "ggml's iq4_xs: iq4_nl's grid in super-blocks of 256 with 6-bit scales.",
                 block_dtype=BLOCK_IQ4_XS, vec_dot_type=GGMLType.Q8_K, block_values=QK_K)


def quantize_iq4_nl_ref(x: np.ndarray) -> np.ndarray:
    """``quantize_row_iq4_nl_ref``, which is also ggml-cpu's IQ4_NL ``from_float``.

    Unlike ``ggml_quantize_chunk`` (``quantize(x, IQ4_NL)``) it does no scale search: each
    block keeps its first x*x-weighted fit. This is what CPY / SET_ROWS into an IQ4_NL tensor
    produce. ``x``: float32 (n_rows, n_per_row), n_per_row a multiple of 32.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % QK4_NL:
        raise QuantError(f"quantize_iq4_nl_ref expects (n_rows, 32*k) float32, got shape {x.shape}")
    out = np.empty((x.shape[0], GGMLType.IQ4_NL.row_size(x.shape[1])), np.uint8)
    if out.size:
        def rows(r0: int, r1: int) -> None:
            _quantize_iq4(x[r0:r1], np.empty(0, np.float32), False, _KVALUES_F32, QK4_NL, NTRY_REF, out[r0:r1])

        for_row_chunks(rows, x.shape[0], x.size // QK_K, SERIAL_BELOW_QUANT)
    return out


__all__ = ["BLOCK_IQ4_NL", "BLOCK_IQ4_XS", "KVALUES_IQ4NL", "quantize_iq4_nl_ref"]
