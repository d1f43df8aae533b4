"""The ternary types TQ1_0 and TQ2_0 (values -1, 0, +1 times a per-block scale).

TQ1_0 packs five trits per byte as a fixed-point fraction of 243, TQ2_0 four 2-bit codes per
byte. ggml's ``quantize_tq1_0``/``quantize_tq2_0`` ignore the importance matrix; levels are
rounded with ``lroundf`` (half away from zero), as in ggml.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from ..types import QK_K, GGMLType
from ._blocks import fp16_bytes, put_fields, read_fp16
from .codec import BlockCodec, register
from .fp import lroundf_nb
from .ksearch import absmax_macro

F32 = np.float32


BLOCK_TQ1_0 = np.dtype([("qs", "u1", (48,)), ("qh", "u1", (4,)), ("d", "<f2")])
BLOCK_TQ2_0 = np.dtype([("qs", "u1", (64,)), ("d", "<f2")])


# ---------------------------------------------------------------------------------------------
# ternary
# ---------------------------------------------------------------------------------------------
@nb.njit(cache=True, error_model="numpy")
def _trit(v: np.float32, inv: np.float32) -> int:
    """``lroundf(v*id) + 1`` kept to its low byte (only that survives the uint8 arithmetic)."""
    return (lroundf_nb(F32(v * inv)) + 1) & 0xFF


@nb.njit(cache=True, error_model="numpy")
def _pack_trits(x: np.ndarray, inv: np.float32, start: int, stride: int, count: int) -> int:
    """Base-3 digits x[start + n*stride], n < count, most significant first, then scaled so the
    byte's top bits hold them: q*256/243 rounded up (with uint8 wrap-around, as in ggml)."""
    q = 0
    for n in range(count):
        q = (q * 3 + _trit(x[start + n * stride], inv)) & 0xFF
    if count == 4:
        q = (q * 3) & 0xFF
    return ((q * 256 + 242) // 243) & 0xFF


@nb.njit(cache=True, nogil=True, error_model="numpy")
def _tq1_0_kernel(x: np.ndarray, d_out: np.ndarray, qs: np.ndarray, qh: np.ndarray) -> None:
    n_rows, n = x.shape
    for r in range(n_rows):
        for ib in range(n // QK_K):
            xb = x[r, ib * QK_K : (ib + 1) * QK_K]
            d = absmax_macro(xb)
            inv = F32(1.0) / d if d != 0 else F32(0.0)
            d_out[r, ib] = d
            for m in range(32):  # elements 0..159: five trits per byte, stride 32
                qs[r, ib, m] = _pack_trits(xb, inv, m, 32, 5)
            for m in range(16):  # elements 160..239: five trits per byte, stride 16
                qs[r, ib, 32 + m] = _pack_trits(xb, inv, 160 + m, 16, 5)
            for j in range(4):  # elements 240..255: four trits per byte, stride 4
                qh[r, ib, j] = _pack_trits(xb, inv, 240 + j, 4, 4)


@nb.njit(cache=True, nogil=True, error_model="numpy")
def _tq2_0_kernel(x: np.ndarray, d_out: np.ndarray, qs: np.ndarray) -> None:
    n_rows, n = x.shape
    for r in range(n_rows):
        for ib in range(n // QK_K):
            xb = x[r, ib * QK_K : (ib + 1) * QK_K]
            d = absmax_macro(xb)
            inv = F32(1.0) / d if d != 0 else F32(0.0)
            d_out[r, ib] = d
            for half in range(2):
                for m in range(32):
                    q = 0
                    for k in range(4):
                        q += (_trit(xb[half * 128 + k * 32 + m], inv) & 3) << (2 * k)
                    qs[r, ib, half * 32 + m] = q & 0xFF


def _tq1_0_order() -> tuple[np.ndarray, np.ndarray]:
    """For each output element of a TQ1_0 block: which of the 52 trit bytes, and which trit."""
    byte = np.empty(QK_K, dtype=np.int64)
    digit = np.empty(QK_K, dtype=np.int64)
    for n in range(5):
        byte[n * 32 : n * 32 + 32] = np.arange(32)
        digit[n * 32 : n * 32 + 32] = n
        byte[160 + n * 16 : 176 + n * 16] = 32 + np.arange(16)
        digit[160 + n * 16 : 176 + n * 16] = n
    for n in range(4):
        byte[240 + n * 4 : 244 + n * 4] = 48 + np.arange(4)
        digit[240 + n * 4 : 244 + n * 4] = n
    return byte, digit


def _trit_table() -> np.ndarray:
    """(256, 5) float32: trit n of a byte, minus one: ((u8)(byte * 3^n) * 3) >> 8, then - 1."""
    b = np.arange(256, dtype=np.uint16)[:, None]
    pow3 = np.array([1, 3, 9, 27, 81], dtype=np.uint16)[None, :]
    shifted = (b * pow3) & np.uint16(0xFF)  # the product is a uint8 in C
    return (((shifted * np.uint16(3)) >> np.uint16(8)).astype(np.int16) - np.int16(1)).astype(np.float32)


_TQ1_BYTE, _TQ1_DIGIT = _tq1_0_order()
_TQ1_TRITS = _trit_table()


@nb.njit(cache=True, error_model="numpy")
def _deq_tq1_0(
    blocks: np.ndarray, d: np.ndarray, byte: np.ndarray, digit: np.ndarray, trits: np.ndarray, out: np.ndarray
) -> None:
    n_rows, n_blocks, _ = blocks.shape
    for r in range(n_rows):
        for b in range(n_blocks):
            db = d[r, b]
            for k in range(QK_K):
                out[r, b * QK_K + k] = trits[blocks[r, b, byte[k]], digit[k]] * db


@nb.njit(cache=True, error_model="numpy")
def _deq_tq2_0(blocks: np.ndarray, d: np.ndarray, out: np.ndarray) -> None:
    """Element half*128 + k*32 + m is bits 2k..2k+1 of byte half*32 + m; value (code - 1)*d."""
    n_rows, n_blocks, _ = blocks.shape
    for r in range(n_rows):
        for b in range(n_blocks):
            db = d[r, b]
            base = b * QK_K
            for half in range(2):
                for m in range(32):
                    byte = np.int64(blocks[r, b, half * 32 + m])
                    for k in range(4):
                        out[r, base + half * 128 + k * 32 + m] = F32(((byte >> (2 * k)) & 3) - 1) * db


@register
class TQ1_0Codec(BlockCodec):
    """1.6875 bpw ternary: five trits per byte, stored as a fixed-point fraction of 243."""

    qtype = GGMLType.TQ1_0
    vec_dot_type = GGMLType.Q8_K
    block_dtype = BLOCK_TQ1_0

    def _quantize_blocks(self, x: np.ndarray, imatrix: np.ndarray | None, out: np.ndarray) -> None:
        n_rows, nbk, _ = out.shape
        d = np.empty((n_rows, nbk), np.float32)
        qs = np.empty((n_rows, nbk, 48), np.uint8)
        qh = np.empty((n_rows, nbk, 4), np.uint8)
        _tq1_0_kernel(x, d, qs, qh)
        put_fields(out, [(0, qs), (48, qh), (52, fp16_bytes(d))])

    def _dequantize_blocks(self, blocks: np.ndarray, y: np.ndarray) -> None:
        _deq_tq1_0(blocks, read_fp16(blocks, 52), _TQ1_BYTE, _TQ1_DIGIT, _TQ1_TRITS, y)


@register
class TQ2_0Codec(BlockCodec):
    """2.0625 bpw ternary: four 2-bit codes (q+1) per byte."""

    qtype = GGMLType.TQ2_0
    vec_dot_type = GGMLType.Q8_K
    block_dtype = BLOCK_TQ2_0

    def _quantize_blocks(self, x: np.ndarray, imatrix: np.ndarray | None, out: np.ndarray) -> None:
        n_rows, nbk, _ = out.shape
        d = np.empty((n_rows, nbk), np.float32)
        qs = np.empty((n_rows, nbk, 64), np.uint8)
        _tq2_0_kernel(x, d, qs)
        put_fields(out, [(0, qs), (64, fp16_bytes(d))])

    def _dequantize_blocks(self, blocks: np.ndarray, y: np.ndarray) -> None:
        _deq_tq2_0(blocks, read_fp16(blocks, 64), y)


__all__ = [
    "BLOCK_TQ1_0",
    "BLOCK_TQ2_0",
    "TQ1_0Codec",
    "TQ2_0Codec",
]
