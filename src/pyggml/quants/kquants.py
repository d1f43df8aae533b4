"""The K-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and their activation type Q8_K.

Every K-quant groups 256 values into a super-block with an fp16 scale (and for the
asymmetric types an fp16 min) that scales 16 or 8 small integer sub-block scales. The
layouts are ggml-common.h's ``block_q*_K``; quantization is ggml's (see kq_quantize.py) and
dequantization reproduces ``dequantize_row_q*_K`` including its float32 operation order,
e.g. Q4_K computes ``(d*sc)*q - (dmin*m)`` with both products rounded.

Q8_K is the ``vec_dot_type`` of the K- and most I-quants. ``ggml_quantize_chunk`` has no
case for it, but pyggml quantizes it with ``quantize_row_q8_K_ref`` so activations can be
converted exactly as ggml-cpu's matmul does.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit

from ..types import QK_K, GGMLType
from ._blocks import read_fp16
from .codec import BlockCodec, Codec, declare, register
from .fp import nearest_int
from .kq_quantize import SUPERBLOCK_DRIVERS
from .ksearch import f32

BLOCK_Q2_K = np.dtype([("scales", "u1", 16), ("qs", "u1", 64), ("d", "<f2"), ("dmin", "<f2")])
BLOCK_Q3_K = np.dtype([("hmask", "u1", 32), ("qs", "u1", 64), ("scales", "u1", 12), ("d", "<f2")])
BLOCK_Q4_K = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qs", "u1", 128)])
BLOCK_Q5_K = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qh", "u1", 32), ("qs", "u1", 128)])
BLOCK_Q6_K = np.dtype([("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<f2")])
BLOCK_Q8_K = np.dtype([("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16)])


# --------------------------------------------------------------------------- dequantizers
#
# One parallel loop over super-blocks. Each block first turns its packed sub-block scales
# into float32 factors (rounded exactly as ggml rounds them), then the inner loops over the
# packed bytes are branch-free uint8 arithmetic that LLVM vectorises.

_U2 = np.uint8(2)
_U3 = np.uint8(3)
_U4 = np.uint8(4)
_U6 = np.uint8(6)
_U15 = np.uint8(15)


@njit(cache=True, error_model="numpy")
def _deq_q2_K(q: np.ndarray, d: np.ndarray, dmin: np.ndarray, y: np.ndarray) -> None:
    # byte l of a 32-byte group holds values l, l+32, l+64, l+96 of its 128 (2 bits each)
    for b in range(q.shape[0]):
        blk = q[b]
        out = y[b]
        dl = np.empty(16, np.float32)
        ml = np.empty(16, np.float32)
        for s in range(16):
            sc = blk[s]
            dl[s] = d[b] * f32(sc & _U15)
            ml[s] = dmin[b] * f32(sc >> _U4)
        for g in range(2):
            for half in range(2):
                s = 8 * g + half
                a0, a1, a2, a3 = dl[s], dl[s + 2], dl[s + 4], dl[s + 6]
                m0, m1, m2, m3 = ml[s], ml[s + 2], ml[s + 4], ml[s + 6]
                src = 16 + 32 * g + 16 * half
                dst = 128 * g + 16 * half
                for l in range(16):
                    v = blk[src + l]
                    out[dst + l] = a0 * f32(v & _U3) - m0
                    out[dst + 32 + l] = a1 * f32((v >> _U2) & _U3) - m1
                    out[dst + 64 + l] = a2 * f32((v >> _U4) & _U3) - m2
                    out[dst + 96 + l] = a3 * f32(v >> _U6) - m3


@njit(cache=True, error_model="numpy")
def _deq_q3_K(q: np.ndarray, d: np.ndarray, y: np.ndarray) -> None:
    # as Q2_K for the low 2 bits; hmask byte l bit 4g+j is the high bit of value 128g+32j+l
    for b in range(q.shape[0]):
        blk = q[b]
        out = y[b]
        dl = np.empty(16, np.float32)
        for s in range(16):
            if s < 8:
                low = np.int32(blk[96 + s]) & 0xF
            else:
                low = np.int32(blk[88 + s]) >> 4
            high = (np.int32(blk[104 + s % 4]) >> (2 * (s // 4))) & 3
            dl[s] = d[b] * f32((low | (high << 4)) - 32)
        for g in range(2):
            for half in range(2):
                s = 8 * g + half
                a0, a1, a2, a3 = dl[s], dl[s + 2], dl[s + 4], dl[s + 6]
                src = 32 + 32 * g + 16 * half
                dst = 128 * g + 16 * half
                for l in range(16):
                    v = np.int32(blk[src + l])
                    hm = np.int32(blk[16 * half + l]) >> (4 * g)
                    out[dst + l] = a0 * f32((v & 3) - 4 + ((hm & 1) << 2))
                    out[dst + 32 + l] = a1 * f32(((v >> 2) & 3) - 4 + (((hm >> 1) & 1) << 2))
                    out[dst + 64 + l] = a2 * f32(((v >> 4) & 3) - 4 + (((hm >> 2) & 1) << 2))
                    out[dst + 96 + l] = a3 * f32((v >> 6) - 4 + (((hm >> 3) & 1) << 2))


@njit(cache=True, error_model="numpy")
def _scale_min_factors(blk: np.ndarray, d: float, dmin: float, dl: np.ndarray, ml: np.ndarray) -> None:
    """Q4_K/Q5_K: the 8 (d*scale, dmin*min) products from the 12 packed scale bytes at 4..15."""
    for s in range(8):
        if s < 4:
            sc = np.int32(blk[4 + s]) & 63
            m = np.int32(blk[8 + s]) & 63
        else:
            hi = np.int32(blk[8 + s])
            sc = (hi & 0xF) | ((np.int32(blk[s]) >> 6) << 4)
            m = (hi >> 4) | ((np.int32(blk[4 + s]) >> 6) << 4)
        dl[s] = d * f32(sc)
        ml[s] = dmin * f32(m)


@njit(cache=True, error_model="numpy")
def _deq_q4_K(q: np.ndarray, d: np.ndarray, dmin: np.ndarray, y: np.ndarray) -> None:
    for b in range(q.shape[0]):
        blk = q[b]
        out = y[b]
        dl = np.empty(8, np.float32)
        ml = np.empty(8, np.float32)
        _scale_min_factors(blk, d[b], dmin[b], dl, ml)
        for c in range(4):
            d1 = dl[2 * c]
            m1 = ml[2 * c]
            d2 = dl[2 * c + 1]
            m2 = ml[2 * c + 1]
            for l in range(32):
                v = blk[16 + 32 * c + l]
                out[64 * c + l] = d1 * f32(v & _U15) - m1
                out[64 * c + 32 + l] = d2 * f32(v >> _U4) - m2


@njit(cache=True, error_model="numpy")
def _deq_q5_K(q: np.ndarray, d: np.ndarray, dmin: np.ndarray, y: np.ndarray) -> None:
    one = np.uint8(1)
    for b in range(q.shape[0]):
        blk = q[b]
        out = y[b]
        dl = np.empty(8, np.float32)
        ml = np.empty(8, np.float32)
        _scale_min_factors(blk, d[b], dmin[b], dl, ml)
        for c in range(4):
            d1 = dl[2 * c]
            m1 = ml[2 * c]
            d2 = dl[2 * c + 1]
            m2 = ml[2 * c + 1]
            sh1 = np.uint8(2 * c)
            sh2 = np.uint8(2 * c + 1)
            for l in range(32):
                v = blk[48 + 32 * c + l]
                h = blk[16 + l]
                lo = (v & _U15) | (((h >> sh1) & one) << _U4)
                hi = (v >> _U4) | (((h >> sh2) & one) << _U4)
                out[64 * c + l] = d1 * f32(lo) - m1
                out[64 * c + 32 + l] = d2 * f32(hi) - m2


@njit(cache=True, error_model="numpy")
def _deq_q6_K(q: np.ndarray, d: np.ndarray, y: np.ndarray) -> None:
    for b in range(q.shape[0]):
        blk = q[b]
        out = y[b]
        dl = np.empty(16, np.float32)
        for s in range(16):
            dl[s] = d[b] * f32(np.int8(blk[192 + s]))
        for h in range(2):
            for half in range(2):
                s = 8 * h + half
                a1 = dl[s]
                a2 = dl[s + 2]
                a3 = dl[s + 4]
                a4 = dl[s + 6]
                for l in range(16 * half, 16 * half + 16):
                    lo1 = np.int32(blk[64 * h + l])
                    lo2 = np.int32(blk[64 * h + 32 + l])
                    hb = np.int32(blk[128 + 32 * h + l])
                    out[128 * h + l] = a1 * f32(((lo1 & 0xF) | ((hb & 3) << 4)) - 32)
                    out[128 * h + 32 + l] = a2 * f32(((lo2 & 0xF) | (((hb >> 2) & 3) << 4)) - 32)
                    out[128 * h + 64 + l] = a3 * f32(((lo1 >> 4) | (((hb >> 4) & 3) << 4)) - 32)
                    out[128 * h + 96 + l] = a4 * f32(((lo2 >> 4) | (((hb >> 6) & 3) << 4)) - 32)


# --------------------------------------------------------------------------- codecs


class _KQuant(BlockCodec):
    """The numba kernels quantize and dequantize every super-block (flat block lists)."""

    vec_dot_type = GGMLType.Q8_K
    kind: int

    def _quantize_blocks(self, x: np.ndarray, imatrix: np.ndarray | None, out: np.ndarray) -> None:
        use_qw = imatrix is not None
        qw = imatrix if use_qw else np.empty(0, np.float32)
        SUPERBLOCK_DRIVERS[self.kind](x, qw, use_qw, out.reshape(x.shape[0], -1))

    #: the type's numba dequantizer, called with the blocks, the fp16 fields at ``fp16_at`` widened, and y
    _deq: Callable[..., None]
    fp16_at: tuple[int, ...]

    def _dequantize_blocks(self, blocks: np.ndarray, y: np.ndarray) -> None:
        blocks = blocks.reshape(-1, self.qtype.type_size)
        self._deq(blocks, *(read_fp16(blocks, at) for at in self.fp16_at), y.reshape(blocks.shape[0], QK_K))


def _kquant(qtype: GGMLType, block: np.dtype, deq: Callable[..., None], fp16_at: tuple[int, ...]) -> type[Codec]:
    """One K-quant's codec: the ``kind`` the shared quantizer dispatches on is the digit of its name."""
    doc = f"ggml's {qtype.type_name}: block_{qtype.type_name} (ggml-common.h)."
    kind = int(qtype.name[1])
    return declare(_KQuant, qtype, doc, block_dtype=block, kind=kind, _deq=staticmethod(deq), fp16_at=fp16_at)


Q2_K = _kquant(GGMLType.Q2_K, BLOCK_Q2_K, _deq_q2_K, (80, 82))
Q3_K = _kquant(GGMLType.Q3_K, BLOCK_Q3_K, _deq_q3_K, (108,))
Q4_K = _kquant(GGMLType.Q4_K, BLOCK_Q4_K, _deq_q4_K, (0, 2))
Q5_K = _kquant(GGMLType.Q5_K, BLOCK_Q5_K, _deq_q5_K, (0, 2))
Q6_K = _kquant(GGMLType.Q6_K, BLOCK_Q6_K, _deq_q6_K, (208,))


def quantize_q8_K(x: np.ndarray) -> np.ndarray:
    """``quantize_row_q8_K_ref`` over whole rows: float32 (n, k*256) -> block_q8_K bytes.

    Scale -max/127 where max is the (first) value of largest magnitude, levels rounded with
    ``nearest_int`` and capped at 127, plus the per-16 sums the dot kernels use. An all-zero
    block gets d = 0 and zero levels (ggml leaves its bsums unwritten; we zero them).
    """
    xb = x.reshape(-1, QK_K)
    nb = xb.shape[0]
    ax = np.abs(xb)
    ax[np.isnan(ax)] = -1.0  # NaN never wins ggml's strict "ax > amax"
    first = np.argmax(ax, axis=1)
    vmax = xb[np.arange(nb), first]
    live = ax[np.arange(nb), first] > 0
    blocks = np.zeros(nb, BLOCK_Q8_K)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = np.float32(-127.0) / np.where(live, vmax, np.float32(1.0))
        qs = np.minimum(nearest_int(iscale[:, None] * xb), 127)
        d = np.float32(1.0) / iscale
    qs[~live] = 0
    qs8 = qs.astype(np.int8)
    blocks["qs"] = qs8
    blocks["bsums"] = qs8.reshape(nb, 16, 16).sum(axis=2, dtype=np.int32).astype(np.int16)
    blocks["d"] = np.where(live, d, np.float32(0.0))
    return blocks.view(np.uint8).reshape(x.shape[0], x.shape[1] // QK_K * BLOCK_Q8_K.itemsize)


@register
class Q8_K(BlockCodec):
    qtype = GGMLType.Q8_K
    block_dtype = BLOCK_Q8_K
    vec_dot_type = GGMLType.F32  # ggml-cpu gives Q8_K no vec_dot of its own

    def _quantize_blocks(self, x: np.ndarray, imatrix: np.ndarray | None, out: np.ndarray) -> None:
        out.reshape(x.shape[0], -1)[...] = quantize_q8_K(x)

    def _dequantize_blocks(self, blocks: np.ndarray, y: np.ndarray) -> None:
        b = np.ascontiguousarray(blocks).reshape(-1, BLOCK_Q8_K.itemsize).view(BLOCK_Q8_K)[:, 0]
        with np.errstate(invalid="ignore", over="ignore"):
            y.reshape(-1, QK_K)[...] = b["d"][:, None] * b["qs"].astype(np.float32)


__all__ = ["BLOCK_Q2_K", "BLOCK_Q3_K", "BLOCK_Q4_K", "BLOCK_Q5_K", "BLOCK_Q6_K", "BLOCK_Q8_K", "quantize_q8_K"]
