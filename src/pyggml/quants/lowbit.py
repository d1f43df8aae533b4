"""Q1_0 and Q2_0: 1- and 2-bit block quants with one fp16 scale per block.

Q1_0 keeps the sign of each weight times the block's mean magnitude; Q2_0 codes -1, 0, +1, +2
times the block's absolute maximum, rounded with ``roundf``. ``quantize_q1_0``/``quantize_q2_0``
run the reference row quantizer with or without an importance matrix.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from ..types import GGMLType
from ._blocks import fp16_bytes, pack_bits, put_fields, read_fp16
from .codec import BlockCodec, register
from .fp import roundf_nb, trunc_to_i32_nb

F32 = np.float32


QK1_0 = 128
QK2_0 = 64
BLOCK_Q1_0 = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])
BLOCK_Q2_0 = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])


# ---------------------------------------------------------------------------------------------
# Q1_0 / Q2_0
# ---------------------------------------------------------------------------------------------
@nb.njit(cache=True, nogil=True, error_model="numpy")
def _q1_0_kernel(x: np.ndarray, d_out: np.ndarray, bits: np.ndarray) -> None:
    """d = mean |x| (summed left to right in float32); bit = x >= 0."""
    n_rows, n = x.shape
    for r in range(n_rows):
        for ib in range(n // QK1_0):
            base = ib * QK1_0
            total = F32(0.0)
            for j in range(QK1_0):
                total = F32(total + abs(x[r, base + j]))
            d_out[r, ib] = F32(total / F32(QK1_0))
            for j in range(QK1_0):
                bits[r, base + j] = 1 if x[r, base + j] >= 0 else 0


@nb.njit(cache=True, nogil=True, error_model="numpy")
def _q2_0_kernel(x: np.ndarray, d_out: np.ndarray, codes: np.ndarray) -> None:
    """d = amax; code = clamp((int)roundf(x/d) + 1, 0, 3), so codes mean -1, 0, +1, +2 times d."""
    n_rows, n = x.shape
    for r in range(n_rows):
        for ib in range(n // QK2_0):
            base = ib * QK2_0
            amax = F32(0.0)
            for j in range(QK2_0):
                a = abs(x[r, base + j])
                if a > amax:
                    amax = a
            inv = F32(1.0) / amax if amax > 0 else F32(0.0)
            d_out[r, ib] = amax
            for j in range(QK2_0):
                c = trunc_to_i32_nb(roundf_nb(F32(x[r, base + j] * inv))) + 1
                codes[r, base + j] = min(3, max(0, c))


@nb.njit(cache=True, error_model="numpy")
def _deq_q1_0(blocks: np.ndarray, d: np.ndarray, out: np.ndarray) -> None:
    """Bit j (LSB first) set -> +d, clear -> -d."""
    n_rows, n_blocks, _ = blocks.shape
    for r in range(n_rows):
        for b in range(n_blocks):
            db = d[r, b]
            for j in range(QK1_0):
                bit = (blocks[r, b, 2 + j // 8] >> (j % 8)) & 1
                out[r, b * QK1_0 + j] = db if bit else -db


@nb.njit(cache=True, error_model="numpy")
def _deq_q2_0(blocks: np.ndarray, d: np.ndarray, out: np.ndarray) -> None:
    """Element j is bits 2*(j%4) of byte j/4; value (code - 1)*d."""
    n_rows, n_blocks, _ = blocks.shape
    for r in range(n_rows):
        for b in range(n_blocks):
            db = d[r, b]
            for j in range(QK2_0):
                code = (np.int64(blocks[r, b, 2 + j // 4]) >> (2 * (j % 4))) & 3
                out[r, b * QK2_0 + j] = F32(code - 1) * db


@register
class Q1_0Codec(BlockCodec):
    """1.125 bpw: the sign of each weight, times the block's mean magnitude."""

    qtype = GGMLType.Q1_0
    vec_dot_type = GGMLType.Q8_0
    block_dtype = BLOCK_Q1_0

    def _quantize_blocks(self, x: np.ndarray, imatrix: np.ndarray | None, out: np.ndarray) -> None:
        n_rows, nbk, _ = out.shape
        d = np.empty((n_rows, nbk), np.float32)
        bits = np.empty(x.shape, np.uint8)
        _q1_0_kernel(x, d, bits)
        put_fields(out, [(0, fp16_bytes(d)), (2, pack_bits(bits.reshape(n_rows, nbk, QK1_0)))])

    def _dequantize_blocks(self, blocks: np.ndarray, y: np.ndarray) -> None:
        _deq_q1_0(blocks, read_fp16(blocks, 0), y)


@register
class Q2_0Codec(BlockCodec):
    """2.25 bpw: codes -1, 0, +1, +2 times the block's absolute maximum."""

    qtype = GGMLType.Q2_0
    vec_dot_type = GGMLType.Q8_0
    block_dtype = BLOCK_Q2_0

    def _quantize_blocks(self, x: np.ndarray, imatrix: np.ndarray | None, out: np.ndarray) -> None:
        n_rows, nbk, _ = out.shape
        d = np.empty((n_rows, nbk), np.float32)
        codes = np.empty(x.shape, np.uint8)
        _q2_0_kernel(x, d, codes)
        c = codes.reshape(n_rows, nbk, 16, 4)
        put_fields(out, [(0, fp16_bytes(d)), (2, c[..., 0] | (c[..., 1] << 2) | (c[..., 2] << 4) | (c[..., 3] << 6))])

    def _dequantize_blocks(self, blocks: np.ndarray, y: np.ndarray) -> None:
        _deq_q2_0(blocks, read_fp16(blocks, 0), y)


__all__ = [
    "BLOCK_Q1_0",
    "BLOCK_Q2_0",
    "Q1_0Codec",
    "Q2_0Codec",
]
