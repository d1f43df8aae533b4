"""The fp4 types MXFP4 and NVFP4: E2M1 values under a shared scale.

MXFP4 (OCP microscaling) shares one power-of-two E8M0 exponent per 32 values, from
``floorf(log2f(amax))``; NVFP4 has four groups of 16 with a UE4M3 scale each. The code book is
kvalues_fp4; a value takes the first nearest code (ties go to the lower index), as in ggml. The
importance matrix is ignored, as ggml's ``quantize_mxfp4`` ignores it.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from ..types import GGMLType
from ._blocks import load_table, pack_nibbles, put_fields
from .codec import BlockCodec, register
from .fp import E8M0_HALF, UE4M3, fp32_to_ue4m3_nb, trunc_to_i32_nb

F32 = np.float32


#: kvalues_mxfp4 / kvalues_fp4 (data/kvalues_fp4.txt): the E2M1 code book, doubled to integers
KVALUES_FP4 = load_table("kvalues_fp4.txt").astype(np.int8)
_KV_F32 = KVALUES_FP4.astype(np.float32)

QK_MXFP4 = 32
QK_NVFP4 = 64
QK_NVFP4_SUB = 16
BLOCK_MXFP4 = np.dtype([("e", "u1"), ("qs", "u1", (16,))])
BLOCK_NVFP4 = np.dtype([("d", "u1", (4,)), ("qs", "u1", (32,))])


# ---------------------------------------------------------------------------------------------
# fp4
# ---------------------------------------------------------------------------------------------
@nb.njit(cache=True, error_model="numpy")
def _best_fp4(v: np.float32, scale: np.float32, kv: np.ndarray) -> int:
    """best_index_mxfp4: the first code minimising |kv*scale - v| (NaN input -> code 0)."""
    best = 0
    best_err = abs(F32(kv[0] * scale) - v)
    for i in range(1, 16):
        err = abs(F32(kv[i] * scale) - v)
        if err < best_err:
            best = i
            best_err = err
    return best


@nb.njit(cache=True, error_model="numpy")
def _mxfp4_exponent(amax: np.float32) -> int:
    """``(uint8_t)(floorf(log2f(amax)) - 2 + 127)``, 0 when amax is 0.

    log2f is taken as the correctly rounded float32 of the exact log2; the cast keeps the low
    byte of x86's truncating conversion (inf -> INT_MIN -> 0, like ggml on x86).
    """
    if not amax > 0:
        return 0
    lg = F32(math.log2(np.float64(amax))) if not math.isinf(amax) else F32(np.inf)
    e = F32(F32(F32(np.floor(lg)) - F32(2.0)) + F32(127.0))
    return trunc_to_i32_nb(e) & 0xFF


@nb.njit(cache=True, nogil=True, error_model="numpy")
def _mxfp4_kernel(x: np.ndarray, kv: np.ndarray, half: np.ndarray, e_out: np.ndarray, levels: np.ndarray) -> None:
    n_rows, n = x.shape
    for r in range(n_rows):
        for ib in range(n // QK_MXFP4):
            base = ib * QK_MXFP4
            amax = F32(0.0)
            for j in range(QK_MXFP4):
                a = abs(x[r, base + j])
                if amax < a:
                    amax = a
            e = _mxfp4_exponent(amax)
            e_out[r, ib] = e
            d = half[e]
            for j in range(QK_MXFP4):
                levels[r, base + j] = _best_fp4(x[r, base + j], d, kv)


@nb.njit(cache=True, nogil=True, error_model="numpy")
def _nvfp4_kernel(x: np.ndarray, kv: np.ndarray, ue4m3: np.ndarray, ue_out: np.ndarray, levels: np.ndarray) -> None:
    n_rows, n = x.shape
    n_sub = n // QK_NVFP4_SUB
    for r in range(n_rows):
        for s in range(n_sub):
            base = s * QK_NVFP4_SUB
            amax = F32(0.0)
            for j in range(QK_NVFP4_SUB):
                a = abs(x[r, base + j])
                if amax < a:
                    amax = a
            ue = fp32_to_ue4m3_nb(F32(amax / F32(6.0)))
            ue_out[r, s] = ue
            d = ue4m3[ue]
            for j in range(QK_NVFP4_SUB):
                levels[r, base + j] = _best_fp4(x[r, base + j], d, kv)


@nb.njit(cache=True, error_model="numpy")
def _deq_fp4(qs: np.ndarray, scale: np.ndarray, kv: np.ndarray, out: np.ndarray) -> None:
    """qs (rows, blocks, groups, h): code j of a group is the low nibble of byte j (j < h) or the
    high nibble of byte j-h; value kv[code] * scale[group] (one group for MXFP4, four for NVFP4)."""
    n_rows, n_blocks, n_groups, h = qs.shape
    for r in range(n_rows):
        for b in range(n_blocks):
            for g in range(n_groups):
                sg = scale[r, b, g]
                base = (b * n_groups + g) * 2 * h
                for j in range(h):
                    byte = qs[r, b, g, j]
                    out[r, base + j] = kv[byte & 15] * sg
                    out[r, base + h + j] = kv[byte >> 4] * sg


@register
class MXFP4Codec(BlockCodec):
    """OCP microscaling fp4: 32 E2M1 values sharing one power-of-two (E8M0) exponent."""

    qtype = GGMLType.MXFP4
    vec_dot_type = GGMLType.Q8_0
    block_dtype = BLOCK_MXFP4

    def _quantize_blocks(self, x: np.ndarray, imatrix: np.ndarray | None, out: np.ndarray) -> None:
        n_rows, nbk, _ = out.shape
        e = np.empty((n_rows, nbk), np.uint8)
        levels = np.empty(x.shape, np.uint8)
        _mxfp4_kernel(x, _KV_F32, E8M0_HALF, e, levels)
        qs = pack_nibbles(levels.reshape(n_rows, nbk, QK_MXFP4))
        put_fields(out, [(0, e[..., None]), (1, qs)])

    def _dequantize_blocks(self, blocks: np.ndarray, y: np.ndarray) -> None:
        n_rows, n_blocks, _ = blocks.shape
        scale = E8M0_HALF[blocks[..., :1]]
        _deq_fp4(blocks[..., 1:].reshape(n_rows, n_blocks, 1, 16), scale, _KV_F32, y)


@register
class NVFP4Codec(BlockCodec):
    """NVIDIA fp4: 64 E2M1 values in four groups of 16, each with a UE4M3 scale."""

    qtype = GGMLType.NVFP4
    vec_dot_type = GGMLType.Q8_0
    block_dtype = BLOCK_NVFP4

    def _quantize_blocks(self, x: np.ndarray, imatrix: np.ndarray | None, out: np.ndarray) -> None:
        n_rows, nbk, _ = out.shape
        ue = np.empty((n_rows, nbk * 4), np.uint8)
        levels = np.empty(x.shape, np.uint8)
        _nvfp4_kernel(x, _KV_F32, UE4M3, ue, levels)
        qs = pack_nibbles(levels.reshape(n_rows, nbk, 4, QK_NVFP4_SUB)).reshape(n_rows, nbk, 32)
        put_fields(out, [(0, ue.reshape(n_rows, nbk, 4)), (4, qs)])

    def _dequantize_blocks(self, blocks: np.ndarray, y: np.ndarray) -> None:
        n_rows, n_blocks, _ = blocks.shape
        scale = UE4M3[blocks[..., :4]]
        _deq_fp4(blocks[..., 4:].reshape(n_rows, n_blocks, 4, 8), scale, _KV_F32, y)


__all__ = [
    "BLOCK_MXFP4",
    "BLOCK_NVFP4",
    "KVALUES_FP4",
    "MXFP4Codec",
    "NVFP4Codec",
]
