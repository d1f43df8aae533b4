"""The repacked weight layouts of the CPU_REPACK buffer type (repack_buffer.py): weights interleaved at
load for the compiled tile kernels (quants/repacked.py).

ggml-cpu's CPU_REPACK (cpu/repack.cpp) rewrites Q4_0/Q4_K/IQ4_NL weights as groups of 8 interleaved
rows when they are set, so that its gemv/gemm kernels read one stream with no per-call shuffling.
This is the same idea for pyggml's kernels (quants/repacked.py), in layouts of our own:

* **Q4_K**, groups of 8 rows, per superblock (``Q4K_GROUP_BYTES`` = 1184 bytes for 8 rows, 148 a row
  against 144): the 8 rows' code words interleaved a u32 at a time (the 32 bytes at step p hold bytes
  4p..4p+3 of each row's qs, so one load gives two sub-blocks' 4 codes of all 8 rows in its two
  nibbles), then the 6-bit scales as bytes ``[sub-block][row]``, the mins as ``[pair][row][2]``, and
  the rows' fp16 d and dmin. The kernels no longer unpack the 12 packed scale bytes per call.
* **Q6_K**, groups of 8 rows, per superblock (``Q6K_GROUP_BYTES`` = 1680 bytes, 210 a row as in the GGUF):
  the signed scales as bytes ``[sub-block][row]``, then the 8 rows' ql and qh words interleaved a u32 at a
  time, in the order a kernel reads them (``Q6K_WORDS``: per half superblock, ql words 0-7, qh words 0-7,
  ql words 8-15), then the rows' fp16 d. Word q of the ql words of a half holds the 4 codes of tile step
  q (low nibbles) and of step q + 16 (high nibbles); qh word v's four 2-bit fields are the high bits of
  steps v, v + 8, v + 16, v + 24. A kernel rebuilds a step's 32 codes from two loads, a shift and two
  masks, where the GGUF rows took a gather of 8 rows per step. In read order, because the hardware
  prefetcher follows one forward stream: with each half's qh words after all its ql words a one-row product
  of 8960 x 1536 read 9 GB/s on one thread, against 21 in this order.
* **Q8_0, Q4_0, Q5_0, IQ4_NL**, groups of 4 rows (the register tile's height), same size as the source:
  per block the 4 rows' fp16 scales (one 8-byte load), then the 4 rows' codes (Q5_0: each row's high-bit word
  and its 16 nibble bytes, as in the GGUF block). Q8_0 codes are
  stored offset to unsigned (``w ^ 0x80 = w + 128``) so vpdpbusd multiplies them by the signed
  activations directly; the 4-bit types keep their packed nibbles and go through a 16-byte table.

Every repacked product gives the bits of the kernels it replaces (the same integer sums and float
steps, tests compare them). A tensor stored here is repacked by ``set_tensor`` (whole tensors only,
as in ggml) and read back unpacked by ``get_tensor``, so saving or inspecting a loaded model still
sees the GGUF bytes. Which weights come here is the model loader's choice (llama.cpp's test op: a
weight whose MUL_MAT this buffer type supports), and ``--no-repack`` turns it off.
"""

from __future__ import annotations

import numpy as np

from ...types import GGMLType

#: rows interleaved per group, by type
GROUP_ROWS = {GGMLType.Q4_K: 8, GGMLType.Q6_K: 8, GGMLType.Q8_0: 4, GGMLType.Q4_0: 4, GGMLType.Q5_0: 4,
              GGMLType.IQ4_NL: 4}
#: bytes of one Q4_K superblock of a group of 8 rows: codes, scales, mins, d, dmin
Q4K_CODES, Q4K_SCALES, Q4K_MINS, Q4K_D, Q4K_DMIN = 0, 1024, 1088, 1152, 1168
Q4K_GROUP_BYTES = 1184
#: bytes of one Q6_K superblock of a group of 8 rows: scales, code words (ql and qh, Q6K_WORDS's order), d
Q6K_SCALES, Q6K_CODES, Q6K_D = 0, 128, 1664
Q6K_GROUP_BYTES = 1680
#: the u32 words of a GGUF Q6_K row (ql words 0-31, then qh words 32-47) in the repacked order: per half
#: superblock h, ql words 16h..16h+7, qh words 32+8h..32+8h+7, ql words 16h+8..16h+15
Q6K_WORDS = np.array([w for h in range(2) for w in (*range(16 * h, 16 * h + 8), *range(32 + 8 * h, 40 + 8 * h),
                                                    *range(16 * h + 8, 16 * h + 16))])
#: ggml's row-count rule for every repacked type (ne[1] % 8 == 0)
ROW_MULTIPLE = 8
#: source bytes repacked at a time (repack): a chunk's transposes stay in L2
_CHUNK_BYTES = 256 * 1024


def repacked_nbytes(ty: GGMLType, ne0: int, ne1: int) -> int:
    """Bytes of a repacked ne0 x ne1 weight (Q4_K grows by 4 bytes a superblock; the others keep their size)."""
    if ty == GGMLType.Q4_K:
        return ne1 // 8 * (ne0 // 256) * Q4K_GROUP_BYTES
    return ne1 * (ne0 // ty.blck_size) * ty.type_size


# ----------------------------------------------------------------------------------- layouts
def _q4k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sc, mn): the 8 six-bit scales and mins of each 12-byte Q4_K scale group (last axis), as uint8."""
    s = s.astype(np.uint8)
    lo, hi = s[..., 0:4], s[..., 4:8]
    top = s[..., 8:12]
    sc = np.concatenate([lo & 63, (top & 0xF) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([hi & 63, (top >> 4) | ((hi >> 6) << 4)], axis=-1)
    return sc, mn


def _q4k_pack_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """The inverse of _q4k_scales: 12 packed bytes from 8 six-bit scales and mins (every bit used once)."""
    out = np.empty((*sc.shape[:-1], 12), np.uint8)
    out[..., 0:4] = sc[..., 0:4] | ((sc[..., 4:8] >> 4) << 6)
    out[..., 4:8] = mn[..., 0:4] | ((mn[..., 4:8] >> 4) << 6)
    out[..., 8:12] = (sc[..., 4:8] & 0xF) | ((mn[..., 4:8] & 0xF) << 4)
    return out


def _split_last(a: np.ndarray, *shape: int) -> np.ndarray:
    """A view of ``a`` with its last axis split into ``shape``: always a view (a reshape of a strided slice
    could be a copy, and the writes into it would be lost)."""
    strides, step = [], a.strides[-1]
    for d in reversed(shape):
        strides.insert(0, step)
        step *= d
    return np.lib.stride_tricks.as_strided(a, a.shape[:-1] + shape, a.strides[:-1] + tuple(strides))


def _repack_q4_k(blk: np.ndarray, out: np.ndarray) -> None:
    """blk: (m, nsb, 144) Q4_K blocks -> out (m/8, nsb, 1184): repacked groups, written through strided views of
    ``out`` (no whole-tensor temporaries: a load repacks straight into the weight buffer)."""
    m, nsb, _ = blk.shape
    g = blk.reshape(m // 8, 8, nsb, 144)
    qs = np.ascontiguousarray(g[..., 16:144]).view(np.uint32)  # (G, 8, nsb, 32)
    _split_last(out[..., Q4K_CODES:Q4K_SCALES].view(np.uint32), 32, 8)[:] = qs.transpose(0, 2, 3, 1)
    sc, mn = _q4k_scales(g[..., 4:16])  # (G, 8, nsb, 8)
    _split_last(out[..., Q4K_SCALES:Q4K_MINS], 8, 8)[:] = sc.transpose(0, 2, 3, 1)
    _split_last(out[..., Q4K_MINS:Q4K_D], 4, 8, 2)[:] = mn.reshape(m // 8, 8, nsb, 4, 2).transpose(0, 2, 3, 1, 4)
    _split_last(out[..., Q4K_D:Q4K_DMIN], 8, 2)[:] = g[..., 0:2].transpose(0, 2, 1, 3)
    _split_last(out[..., Q4K_DMIN:], 8, 2)[:] = g[..., 2:4].transpose(0, 2, 1, 3)


def _unpack_q4_k(rp: np.ndarray, m: int, nsb: int) -> np.ndarray:
    rp = rp.reshape(m // 8, nsb, Q4K_GROUP_BYTES)
    g = np.empty((m // 8, 8, nsb, 144), np.uint8)
    codes = np.ascontiguousarray(rp[..., Q4K_CODES:Q4K_SCALES]).view(np.uint32).reshape(m // 8, nsb, 32, 8)
    g[..., 16:144] = np.ascontiguousarray(codes.transpose(0, 3, 1, 2)).view(np.uint8)
    sc = rp[..., Q4K_SCALES:Q4K_MINS].reshape(m // 8, nsb, 8, 8).transpose(0, 3, 1, 2)
    mn = rp[..., Q4K_MINS:Q4K_D].reshape(m // 8, nsb, 4, 8, 2).transpose(0, 3, 1, 2, 4).reshape(m // 8, 8, nsb, 8)
    g[..., 4:16] = _q4k_pack_scales(sc, mn)
    g[..., 0:2] = rp[..., Q4K_D:Q4K_DMIN].reshape(m // 8, nsb, 8, 2).transpose(0, 2, 1, 3)
    g[..., 2:4] = rp[..., Q4K_DMIN:].reshape(m // 8, nsb, 8, 2).transpose(0, 2, 1, 3)
    return g.reshape(m, nsb * 144)


def _repack_q6_k(blk: np.ndarray, out: np.ndarray) -> None:
    """blk: (m, nsb, 210) Q6_K blocks -> out (m/8, nsb, 1680): repacked groups (as _repack_q4_k)."""
    m, nsb, _ = blk.shape
    g = blk.reshape(m // 8, 8, nsb, 210)
    words = np.ascontiguousarray(g[..., 0:192]).view(np.uint32)[..., Q6K_WORDS]  # (G, 8, nsb, 48), read order
    _split_last(out[..., Q6K_CODES:Q6K_D].view(np.uint32), 48, 8)[:] = words.transpose(0, 2, 3, 1)
    _split_last(out[..., Q6K_SCALES:Q6K_CODES], 16, 8)[:] = g[..., 192:208].transpose(0, 2, 3, 1)
    _split_last(out[..., Q6K_D:], 8, 2)[:] = g[..., 208:210].transpose(0, 2, 1, 3)


def _unpack_q6_k(rp: np.ndarray, m: int, nsb: int) -> np.ndarray:
    rp = rp.reshape(m // 8, nsb, Q6K_GROUP_BYTES)
    g = np.empty((m // 8, 8, nsb, 210), np.uint8)
    words = np.ascontiguousarray(rp[..., Q6K_CODES:Q6K_D]).view(np.uint32).reshape(m // 8, nsb, 48, 8)
    gguf = np.empty((m // 8, 8, nsb, 48), np.uint32)
    gguf[..., Q6K_WORDS] = words.transpose(0, 3, 1, 2)
    g[..., 0:192] = gguf.view(np.uint8)
    g[..., 192:208] = rp[..., Q6K_SCALES:Q6K_CODES].reshape(m // 8, nsb, 16, 8).transpose(0, 3, 1, 2)
    g[..., 208:210] = rp[..., Q6K_D:].reshape(m // 8, nsb, 8, 2).transpose(0, 2, 1, 3)
    return g.reshape(m, nsb * 210)


def _repack_q0(blk: np.ndarray, flip: bool, out: np.ndarray) -> None:
    """blk: (m, nb, 2 + cb) Q8_0/Q4_0/Q5_0/IQ4_NL blocks -> out (m/4, nb, 4 * (2 + cb)): per block the 4 rows' fp16
    scales, then their codes (flip: Q8_0's offset to unsigned)."""
    m, nb, bb = blk.shape
    g = blk.reshape(m // 4, 4, nb, bb).transpose(0, 2, 1, 3)  # (G, nb, 4, bb)
    _split_last(out[..., :8], 4, 2)[:] = g[..., 0:2]
    codes = _split_last(out[..., 8:], 4, bb - 2)
    codes[:] = g[..., 2:]
    if flip:
        codes ^= np.uint8(0x80)


def _unpack_q0(rp: np.ndarray, m: int, nb: int, bb: int, flip: bool) -> np.ndarray:
    rp = rp.reshape(m // 4, nb, 4 * bb)
    g = np.empty((m // 4, nb, 4, bb), np.uint8)
    g[..., 0:2] = rp[..., :8].reshape(m // 4, nb, 4, 2)
    g[..., 2:] = rp[..., 8:].reshape(m // 4, nb, 4, bb - 2)
    if flip:
        g[..., 2:] ^= np.uint8(0x80)
    return g.transpose(0, 2, 1, 3).reshape(m, nb * bb)


def repack(ty: GGMLType, raw: np.ndarray, ne0: int, ne1: int, out: np.ndarray | None = None) -> np.ndarray:
    """The repacked bytes of an ne0 x ne1 weight whose GGUF bytes are ``raw`` (uint8), written into ``out``
    (uint8, repacked_nbytes long) when given."""
    nb = ne0 // ty.blck_size
    blk = raw.reshape(ne1, nb, ty.type_size)
    n = repacked_nbytes(ty, ne0, ne1)
    out = np.empty(n, np.uint8) if out is None else out
    if out.nbytes != n:
        raise ValueError(f"repack: the output holds {out.nbytes} bytes, the repacked {ty.name} weight {n}")
    rows = GROUP_ROWS[ty]
    dst = out.reshape(ne1 // rows, nb, -1)
    step = max(1, _CHUNK_BYTES // (rows * nb * ty.type_size))  # row groups a chunk
    for g0 in range(0, ne1 // rows, step):
        src, into = blk[g0 * rows : (g0 + step) * rows], dst[g0 : g0 + step]
        if ty == GGMLType.Q4_K:
            _repack_q4_k(src, into)
        elif ty == GGMLType.Q6_K:
            _repack_q6_k(src, into)
        else:
            _repack_q0(src, ty == GGMLType.Q8_0, into)
    return out


def unpack(ty: GGMLType, packed: np.ndarray, ne0: int, ne1: int) -> np.ndarray:
    """The GGUF bytes of a repacked weight (repack's inverse)."""
    nb = ne0 // ty.blck_size
    if ty == GGMLType.Q4_K:
        return _unpack_q4_k(packed, ne1, nb).reshape(-1)
    if ty == GGMLType.Q6_K:
        return _unpack_q6_k(packed, ne1, nb).reshape(-1)
    return _unpack_q0(packed, ne1, nb, ty.type_size, ty == GGMLType.Q8_0).reshape(-1)


__all__ = ["GROUP_ROWS", "Q4K_GROUP_BYTES", "Q6K_GROUP_BYTES", "ROW_MULTIPLE", "repack", "repacked_nbytes", "unpack"]
