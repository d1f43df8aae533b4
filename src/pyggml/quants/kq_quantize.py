"""numba quantizers for Q2_K..Q6_K, bit for bit with ggml-quants.c.

Each ``_q*_block`` function quantizes one 256-value super-block into its bytes. ggml has two
algorithms per type: ``quantize_row_q*_K_ref`` (used by ``ggml_quantize_chunk`` when no
importance matrix is given) and ``quantize_row_q*_K_impl`` (used when one is), and they
differ in the search helper and in how sub-block scales are themselves quantized; both are
here, selected by ``use_qw``. The imatrix slice for a super-block is the one at the same
position in the row, as in ggml.

``SUPERBLOCK_DRIVERS`` has one driver per type, running its block function over every super-block of the
rows it is given (codec.BlockCodec spreads the rows over threads); a driver compiles only its own type's
block function, so a first Q4_K quantization does not compile the other four.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit

from ..types import QK_K
from .fp import fp16_bits_to_fp32_nb, fp32_to_fp16_bits_nb
from .jitcache import variant
from .ksearch import (
    GROUP_MAX_EPS,
    f32,
    imatrix_weights,
    make_q3_quants,
    make_qkx2_quants,
    make_qkx3_quants,
    make_qp_quants,
    make_qx_quants,
    nearest_int,
    put_u16,
    sum_squares,
)


@njit(cache=True, error_model="numpy")
def _scale_min_k4(j: int, s: np.ndarray) -> tuple[int, int]:
    """The 6-bit (scale, min) pair of sub-block j from Q4_K/Q5_K's 12 packed bytes."""
    if j < 4:
        return np.int64(s[j]) & 63, np.int64(s[j + 4]) & 63
    hi = np.int64(s[j + 4])
    return (hi & 0xF) | ((np.int64(s[j - 4]) >> 6) << 4), (hi >> 4) | ((np.int64(s[j]) >> 6) << 4)


@njit(cache=True, error_model="numpy")
def _pack_scale_min_k4(s: np.ndarray, ls: np.ndarray, lm: np.ndarray) -> None:
    """Inverse of ``_scale_min_k4`` for all 8 sub-blocks. Like ggml it stores the first four
    levels as whole bytes, so a level above 63 (possible only in Q4_K's imatrix path, from a
    wrapped negative level) spills into the neighbouring bits exactly as it does in C."""
    for j in range(8):
        a = np.int64(ls[j])
        b = np.int64(lm[j])
        if j < 4:
            s[j] = a
            s[j + 4] = b
        else:
            s[j + 4] = (a & 0xF) | ((b & 0xF) << 4)
            s[j - 4] = (np.int64(s[j - 4]) | ((a >> 4) << 6)) & 0xFF
            s[j] = (np.int64(s[j]) | ((b >> 4) << 6)) & 0xFF


@njit(cache=True, error_model="numpy")
def _pack_2bit(qs: np.ndarray, L: np.ndarray) -> None:
    """Four 2-bit levels per byte: byte l of each 32-byte group holds L[l], L[l+32], L[l+64], L[l+96]."""
    for j in range(0, QK_K, 128):
        for l in range(32):
            qs[j // 4 + l] = (
                (np.int64(L[j + l]) & 3)
                | ((np.int64(L[j + l + 32]) & 3) << 2)
                | ((np.int64(L[j + l + 64]) & 3) << 4)
                | ((np.int64(L[j + l + 96]) & 3) << 6)
            )


@njit(cache=True, error_model="numpy")
def _requantize_asym(x: np.ndarray, L: np.ndarray, d: float, dm: float, j0: int, n: int, nmax: int) -> None:
    """Final levels of an asymmetric sub-block from its stored (rounded) scale and min."""
    if d == 0:
        return
    for ii in range(j0, j0 + n):
        L[ii] = min(max(nearest_int((x[ii] + dm) / d), 0), nmax)


# --------------------------------------------------------------------------- Q2_K


@njit(cache=True, error_model="numpy")
def _q2_K_block(x: np.ndarray, qw: np.ndarray, use_qw: bool, out: np.ndarray) -> None:
    """Layout: scales[16] (low nibble scale, high nibble min), qs[64], d f16, dmin f16."""
    L = np.zeros(QK_K, np.uint8)
    Laux = np.zeros(16, np.uint8)
    weight = np.empty(16, np.float32)
    scales = np.empty(16, np.float32)
    mins = np.empty(16, np.float32)
    sc = out[0:16]
    if not use_qw:
        max_scale = f32(0.0)
        max_min = f32(0.0)
        for j in range(16):
            xs = x[16 * j : 16 * j + 16]
            for l in range(16):
                weight[l] = abs(xs[l])
            scales[j], mins[j] = make_qkx2_quants(
                3, xs, weight, L[16 * j : 16 * j + 16], Laux, f32(-0.5), f32(0.1), 15, True
            )
            if scales[j] > max_scale:
                max_scale = scales[j]
            if mins[j] > max_min:
                max_min = mins[j]
        q4scale = f32(15.0)
        if max_scale > 0:
            iscale = q4scale / max_scale
            for j in range(16):
                sc[j] = nearest_int(iscale * scales[j]) & 0xFF
            dbits = fp32_to_fp16_bits_nb(max_scale / q4scale)
        else:
            for j in range(16):
                sc[j] = 0
            dbits = fp32_to_fp16_bits_nb(f32(0.0))
        if max_min > 0:
            iscale = q4scale / max_min
            for j in range(16):
                sc[j] = (np.int64(sc[j]) | (nearest_int(iscale * mins[j]) << 4)) & 0xFF
            mbits = fp32_to_fp16_bits_nb(max_min / q4scale)
        else:
            mbits = fp32_to_fp16_bits_nb(f32(0.0))
    else:
        sigma2 = sum_squares(x) / f32(QK_K)
        sw = np.empty(16, np.float32)
        for j in range(16):
            xs = x[16 * j : 16 * j + 16]
            sw[j] = imatrix_weights(xs, qw[16 * j : 16 * j + 16], sigma2, weight)
            scales[j], mins[j] = make_qkx3_quants(
                3, xs, weight, L[16 * j : 16 * j + 16], Laux, f32(-0.9), f32(0.05), 36, False
            )
        Ls = np.empty(16, np.uint8)
        Lm = np.empty(16, np.uint8)
        dbits = fp32_to_fp16_bits_nb(make_qp_quants(15, scales, Ls, sw))
        mbits = fp32_to_fp16_bits_nb(make_qp_quants(15, mins, Lm, sw))
        for j in range(16):
            sc[j] = (np.int64(Ls[j]) | (np.int64(Lm[j]) << 4)) & 0xFF
    d_all = fp16_bits_to_fp32_nb(dbits)
    m_all = fp16_bits_to_fp32_nb(mbits)
    for j in range(16):
        s = np.int64(sc[j])
        _requantize_asym(x, L, d_all * f32(s & 0xF), m_all * f32(s >> 4), 16 * j, 16, 3)
    _pack_2bit(out[16:80], L)
    put_u16(out, 80, dbits)
    put_u16(out, 82, mbits)


# --------------------------------------------------------------------------- Q3_K


@njit(cache=True, error_model="numpy")
def _q3_K_block(x: np.ndarray, qw: np.ndarray, use_qw: bool, out: np.ndarray) -> None:
    """Layout: hmask[32], qs[64] (low 2 bits), scales[12] (16 six-bit), d f16."""
    L = np.zeros(QK_K, np.int8)
    scales = np.empty(16, np.float32)
    sc = out[96:108]
    sc[:] = 0
    if not use_qw:
        max_scale = f32(0.0)
        amax = f32(0.0)
        for j in range(16):
            scales[j] = make_q3_quants(4, x[16 * j : 16 * j + 16], L[16 * j : 16 * j + 16])
            a = abs(scales[j])
            if a > amax:
                amax = a
                max_scale = scales[j]
        if max_scale != 0:
            iscale = f32(-32.0) / max_scale
            for j in range(16):
                l = nearest_int(iscale * scales[j])
                l = ((l + 128) & 0xFF) - 128  # stored in an int8_t first
                _put_scale6(sc, j, min(max(l, -32), 31) + 32)
            dbits = fp32_to_fp16_bits_nb(f32(1.0) / iscale)
        else:
            dbits = fp32_to_fp16_bits_nb(f32(0.0))
    else:
        sigma2 = f32(2.0) * sum_squares(x) / f32(QK_K)
        weight = np.empty(16, np.float32)
        sw = np.empty(16, np.float32)
        for j in range(16):
            xs = x[16 * j : 16 * j + 16]
            sw[j] = imatrix_weights(xs, qw[16 * j : 16 * j + 16], sigma2, weight)
            scales[j] = make_qx_quants(4, xs, L[16 * j : 16 * j + 16], weight, True)
        Ls = np.empty(16, np.int8)
        d_block = make_qx_quants(32, scales, Ls, sw, True)
        for j in range(16):
            _put_scale6(sc, j, Ls[j])
        dbits = fp32_to_fp16_bits_nb(d_block)
    d_all = fp16_bits_to_fp32_nb(dbits)
    for j in range(16):
        if j < 8:
            s = np.int64(sc[j]) & 0xF
        else:
            s = np.int64(sc[j - 8]) >> 4
        s = (s | ((np.int64(sc[8 + j % 4]) >> (2 * (j // 4))) & 3) << 4) - 32
        d = d_all * f32(s)
        if d == 0:
            continue
        for ii in range(16 * j, 16 * j + 16):
            L[ii] = min(max(nearest_int(x[ii] / d), -4), 3) + 4
    hmask = out[0:32]
    hmask[:] = 0
    for j in range(QK_K):
        if L[j] > 3:
            hmask[j % 32] = np.int64(hmask[j % 32]) | (1 << (j // 32))
            L[j] -= 4
    _pack_2bit(out[32:96], L)
    put_u16(out, 108, dbits)


@njit(cache=True, error_model="numpy")
def _put_scale6(sc: np.ndarray, j: int, l: int) -> None:
    """Q3_K's 6-bit scale j: low nibble into bytes 0-7, top two bits into bytes 8-11."""
    l = np.int64(l)
    if j < 8:
        sc[j] = l & 0xF
    else:
        sc[j - 8] = np.int64(sc[j - 8]) | ((l & 0xF) << 4)
    sc[8 + j % 4] = np.int64(sc[8 + j % 4]) | (((l >> 4) & 3) << (2 * (j // 4)))


# --------------------------------------------------------------------------- Q4_K / Q5_K


@njit(cache=True, error_model="numpy")
def _q45_K_scales(x: np.ndarray, qw: np.ndarray, use_qw: bool, nmax: int, L: np.ndarray, out: np.ndarray) -> None:
    """Shared first half of Q4_K and Q5_K: per-32 search, then the 6-bit scales and mins.

    Writes d, dmin and the 12 scale bytes (bytes 0-15 of ``out``) and fills ``L``.
    """
    sc = out[4:16]
    Laux = np.zeros(32, np.uint8)
    weights = np.empty(32, np.float32)
    scales = np.empty(8, np.float32)
    mins = np.empty(8, np.float32)
    ls = np.empty(8, np.uint8)
    lm = np.empty(8, np.uint8)
    if not use_qw:
        # the ref quantizers differ only in the search's trial range
        rmin = f32(-1.0) if nmax == 15 else f32(-0.5)
        nstep = 20 if nmax == 15 else 15
        max_scale = f32(0.0)
        max_min = f32(0.0)
        for j in range(8):
            xs = x[32 * j : 32 * j + 32]
            av_x = np.sqrt(sum_squares(xs) / f32(32.0))
            for l in range(32):
                weights[l] = av_x + abs(xs[l])
            scales[j], mins[j] = make_qkx2_quants(
                nmax, xs, weights, L[32 * j : 32 * j + 32], Laux, rmin, f32(0.1), nstep, False
            )
            if scales[j] > max_scale:
                max_scale = scales[j]
            if mins[j] > max_min:
                max_min = mins[j]
        inv_scale = f32(63.0) / max_scale if max_scale > 0 else f32(0.0)
        inv_min = f32(63.0) / max_min if max_min > 0 else f32(0.0)
        for j in range(8):
            ls[j] = min(nearest_int(inv_scale * scales[j]) & 0xFF, 63)
            lm[j] = min(nearest_int(inv_min * mins[j]) & 0xFF, 63)
        dbits = fp32_to_fp16_bits_nb(max_scale / f32(63.0))
        mbits = fp32_to_fp16_bits_nb(max_min / f32(63.0))
    else:
        sigma2 = f32(2.0) * sum_squares(x) / f32(QK_K)
        sw = np.empty(8, np.float32)
        for j in range(8):
            xs = x[32 * j : 32 * j + 32]
            sw[j] = imatrix_weights(xs, qw[32 * j : 32 * j + 32], sigma2, weights)
            scales[j], mins[j] = make_qkx3_quants(
                nmax, xs, weights, L[32 * j : 32 * j + 32], Laux, f32(-0.9), f32(0.05), 36, False
            )
        dbits = fp32_to_fp16_bits_nb(make_qp_quants(63, scales, ls, sw))
        mbits = fp32_to_fp16_bits_nb(make_qp_quants(63, mins, lm, sw))
        if nmax == 31:  # only quantize_row_q5_K_impl clamps the (possibly wrapped) levels
            for j in range(8):
                ls[j] = min(np.int64(ls[j]), 63)
                lm[j] = min(np.int64(lm[j]), 63)
    sc[:] = 0
    _pack_scale_min_k4(sc, ls, lm)
    d_all = fp16_bits_to_fp32_nb(dbits)
    m_all = fp16_bits_to_fp32_nb(mbits)
    for j in range(8):
        s, m = _scale_min_k4(j, sc)
        _requantize_asym(x, L, d_all * f32(s), m_all * f32(m), 32 * j, 32, nmax)
    put_u16(out, 0, dbits)
    put_u16(out, 2, mbits)


@njit(cache=True, error_model="numpy")
def _q4_K_block(x: np.ndarray, qw: np.ndarray, use_qw: bool, out: np.ndarray) -> None:
    """Layout: d f16, dmin f16, scales[12], qs[128] (sub-blocks 2c/2c+1 in low/high nibbles)."""
    L = np.zeros(QK_K, np.uint8)
    _q45_K_scales(x, qw, use_qw, 15, L, out)
    for c in range(4):
        for l in range(32):
            out[16 + 32 * c + l] = np.int64(L[64 * c + l]) | (np.int64(L[64 * c + 32 + l]) << 4)


@njit(cache=True, error_model="numpy")
def _q5_K_block(x: np.ndarray, qw: np.ndarray, use_qw: bool, out: np.ndarray) -> None:
    """Layout: d, dmin, scales[12], qh[32] (5th bits), qs[128] (low nibbles as Q4_K)."""
    L = np.zeros(QK_K, np.uint8)
    _q45_K_scales(x, qw, use_qw, 31, L, out)
    qh = out[16:48]
    qh[:] = 0
    for c in range(4):
        for l in range(32):
            l1 = np.int64(L[64 * c + l])
            l2 = np.int64(L[64 * c + 32 + l])
            h = np.int64(qh[l])
            if l1 > 15:
                l1 -= 16
                h |= 1 << (2 * c)
            if l2 > 15:
                l2 -= 16
                h |= 2 << (2 * c)
            qh[l] = h
            out[48 + 32 * c + l] = l1 | (l2 << 4)


# --------------------------------------------------------------------------- Q6_K


@njit(cache=True, error_model="numpy")
def _q6_K_block(x: np.ndarray, qw: np.ndarray, use_qw: bool, out: np.ndarray) -> None:
    """Layout: ql[128] (low nibbles), qh[64] (high 2 bits), scales[16] int8, d f16.

    The imatrix path is the ref algorithm with the raw importance as the search weights.
    """
    L = np.zeros(QK_K, np.int8)
    scales = np.empty(16, np.float32)
    max_scale = f32(0.0)
    max_abs_scale = f32(0.0)
    for ib in range(16):
        s = make_qx_quants(32, x[16 * ib : 16 * ib + 16], L[16 * ib : 16 * ib + 16], qw[16 * ib : 16 * ib + 16], use_qw)
        scales[ib] = s
        if abs(s) > max_abs_scale:
            max_abs_scale = abs(s)
            max_scale = s
    if max_abs_scale < GROUP_MAX_EPS:
        out[:] = 0
        return
    iscale = f32(-128.0) / max_scale
    dbits = fp32_to_fp16_bits_nb(f32(1.0) / iscale)
    sc = out[192:208]
    for ib in range(16):
        sc[ib] = min(127, nearest_int(iscale * scales[ib])) & 0xFF
    d_all = fp16_bits_to_fp32_nb(dbits)
    for j in range(16):
        s8 = np.int64(sc[j])
        if s8 > 127:
            s8 -= 256
        d = d_all * f32(s8)
        if d == 0:
            continue
        for ii in range(16 * j, 16 * j + 16):
            L[ii] = min(max(nearest_int(x[ii] / d), -32), 31) + 32
    for h in range(2):
        j = 128 * h
        for l in range(32):
            q1 = np.int64(L[j + l])
            q2 = np.int64(L[j + l + 32])
            q3 = np.int64(L[j + l + 64])
            q4 = np.int64(L[j + l + 96])
            out[64 * h + l] = (q1 & 0xF) | ((q3 & 0xF) << 4)
            out[64 * h + l + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4)
            out[128 + 32 * h + l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6)
    put_u16(out, 208, dbits)


# --------------------------------------------------------------------------- driver


def _superblock_driver(kind: int, block: Callable[..., None]) -> Callable[..., None]:
    """The driver of one type: ``drive(x, qw, use_qw, out)`` quantizes every super-block of ``x`` (n_rows,
    n_per_row) into ``out`` (n_rows, row_bytes), ``qw`` being the imatrix (n_per_row values) when ``use_qw``."""

    @njit(cache=True, nogil=True, error_model="numpy")
    @variant(kind)
    def drive(x, qw, use_qw, out):  # pragma: no cover - compiled
        nb = x.shape[1] // QK_K
        bs = out.shape[1] // nb
        for r in range(x.shape[0]):
            for b in range(nb):
                wb = qw[b * QK_K : (b + 1) * QK_K] if use_qw else qw[:0]
                block(x[r, b * QK_K : (b + 1) * QK_K], wb, use_qw, out[r, b * bs : (b + 1) * bs])

    return drive


#: kind (2..6 for Q2_K..Q6_K) -> its driver
SUPERBLOCK_DRIVERS = {kind: _superblock_driver(kind, block) for kind, block in
                      ((2, _q2_K_block), (3, _q3_K_block), (4, _q4_K_block), (5, _q5_K_block), (6, _q6_K_block))}
