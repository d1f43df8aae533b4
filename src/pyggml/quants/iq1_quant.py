"""numba kernels of ggml's IQ1_S / IQ1_M quantizers (ggml-quants.c): values in {-1, 0, 1} shifted
by +-IQ1_DELTA, with an exhaustive search of the split points.

The same rules as the IQ2 kernels (iq2_quant.py, whose float32 helpers these share): ggml's
visiting order and strict comparisons, one rounding per C operation, no fused multiply-add.
:data:`DRIVERS` runs a kernel over the rows it is given; the caller converts the
returned float32 super-scales to fp16.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .iq2_quant import (
    ERR_NO_NEIGHBOUR,
    _madd,
    _msub,
    _pack,
    block_sigma2,
    scale_nibble,
)
from .ksearch import FLT_MAX, imatrix_weights

f32 = np.float32

GROUP_MAX_EPS_IQ1_M = f32(1e-7)
GROUP_MAX_EPS_IQ1_S = f32(1e-12)


# ---------------------------------------------------------------------------------------------
# IQ1_S and IQ1_M: values in {-1, 0, 1} shifted by +-IQ1_DELTA, exhaustive split search
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True)
def _best_neighbour_iq1(neighbours, start, grid, xb, weight, off, scale, xg, L, terms):  # pragma: no cover
    """iq1_find_best_neighbour2: closest listed grid point, coordinates mapped through xg."""
    for i in range(8):
        for lv in range(3):
            diff = _msub(scale, xg[lv], xb[off + i])
            terms[i, lv] = f32(f32(weight[off + i] * diff) * diff)
    count = neighbours[start]
    best_score = FLT_MAX
    best = -1
    for j in range(1, count + 1):
        idx = np.int64(neighbours[start + j])
        d2 = f32(0.0)
        for i in range(8):
            d2 = f32(d2 + terms[i, (grid[idx, i] - 1) >> 1])
        if d2 < best_score:
            best_score = d2
            best = idx
    if best < 0:
        # ggml's fallback scans the whole grid; only reachable with non-finite data
        for idx in range(grid.shape[0]):
            d2 = f32(0.0)
            for i in range(8):
                d2 = f32(d2 + terms[i, (grid[idx, i] - 1) >> 1])
            if d2 < best_score:
                best_score = d2
                best = idx
    if best >= 0:
        for i in range(8):
            L[off + i] = (grid[best, i] - 1) // 2
    return best


@nb.njit(cache=True)
def _iq1_place(order, n, i1, i2, L):  # pragma: no cover - numba
    for j in range(n):
        L[order[j]] = 0 if j < i1 else (1 if j < i2 else 2)


@nb.njit(cache=True)
def _iq1_grid_indices(xb, weight, grid, kmap, neighbours, L, scale, xg0, xg1, index, terms):  # pragma: no cover
    """Map each group of 8 levels to a grid index (nearest neighbour when off the grid).

    Returns False when some group was off the grid, i.e. the scale has to be refit.
    """
    all_on_grid = True
    for k in range(index.shape[0]):
        xg = xg0 if k == 0 else xg1
        u = _pack(L, 8 * k)
        gi = kmap[u]
        if gi < 0:
            all_on_grid = False
            gi = _best_neighbour_iq1(neighbours, -kmap[u] - 1, grid, xb, weight, 8 * k, scale, xg, L, terms)
        index[k] = gi
    return all_on_grid


@nb.njit(cache=True)
def _iq1_refit(xb, weight, grid, index, xg0, xg1, scale):  # pragma: no cover - numba
    sumqx = f32(0.0)
    sumq2 = f32(0.0)
    for k in range(index.shape[0]):
        xg = xg0 if k == 0 else xg1
        for j in range(8):
            w = weight[8 * k + j]
            q = xg[(grid[index[k], j] - 1) // 2]
            sumqx = _madd(f32(w * q), xb[8 * k + j], sumqx)
            sumq2 = _madd(f32(w * q), q, sumq2)
    if sumqx > 0 and sumq2 > 0:
        return f32(sumqx / sumq2)
    return scale


@nb.njit(cache=True)
def _row_iq1_s(x, row, qw, grid, kmap, neighbours, out, dvals, status):  # pragma: no cover - numba
    n_per_row = x.shape[1]
    terms = np.empty((8, 3), dtype=np.float32)
    x_p = np.array([-1 + 0.125, 0.125, 1 + 0.125], dtype=np.float32)
    x_m = np.array([-1 - 0.125, -0.125, 1 - 0.125], dtype=np.float32)
    weight = np.empty(32, dtype=np.float32)
    xb = np.empty(32, dtype=np.float32)
    sumx = np.zeros(33, dtype=np.float32)
    sumw = np.zeros(33, dtype=np.float32)
    L = np.zeros(32, dtype=np.int64)
    index = np.zeros(4, dtype=np.int64)
    scales = np.zeros(8, dtype=np.float32)
    shifts = np.zeros(8, dtype=np.int64)
    for ibl in range(n_per_row // 256):
        xbase = 256 * ibl
        obase = 50 * ibl
        out[row, obase : obase + 50] = 0
        max_scale = f32(0.0)
        sigma2 = block_sigma2(x, row, xbase, f32(2.0))
        for ib in range(8):
            base = xbase + 32 * ib
            imatrix_weights(x[row, base : base + 32], qw[base : base + 32], sigma2, weight)
            mx = abs(x[row, base])
            for i in range(32):
                xb[i] = x[row, base + i]
                a = abs(xb[i])
                mx = mx if mx > a else a
            if mx < GROUP_MAX_EPS_IQ1_S:
                scales[ib] = 0
                shifts[ib] = 1
                continue
            order = np.argsort(xb, kind="mergesort")
            for j in range(32):
                i = order[j]
                sumx[j + 1] = _madd(weight[i], xb[i], sumx[j])
                sumw[j + 1] = f32(sumw[j] + weight[i])
            best_score = -FLT_MAX
            scale = mx
            besti1 = -1
            besti2 = -1
            best_shift = 0
            for i1 in range(33):
                a_x = f32(sumx[i1] - sumx[0])
                a_w = f32(sumw[i1] - sumw[0])
                ap_x = f32(a_x * x_p[0])
                am_x = f32(a_x * x_m[0])
                ap_w = f32(f32(a_w * x_p[0]) * x_p[0])
                am_w = f32(f32(a_w * x_m[0]) * x_m[0])
                for i2 in range(i1, 33):
                    b_x = f32(sumx[i2] - sumx[i1])
                    c_x = f32(sumx[32] - sumx[i2])
                    b_w = f32(sumw[i2] - sumw[i1])
                    c_w = f32(sumw[32] - sumw[i2])
                    sumqx = _madd(c_x, x_p[2], _madd(b_x, x_p[1], ap_x))
                    sumq2 = _madd(f32(c_w * x_p[2]), x_p[2], _madd(f32(b_w * x_p[1]), x_p[1], ap_w))
                    if sumq2 > 0 and f32(sumqx * sumqx) > f32(best_score * sumq2):
                        scale = f32(sumqx / sumq2)
                        best_score = f32(scale * sumqx)
                        besti1 = i1
                        besti2 = i2
                        best_shift = 1
                    sumqx = _madd(c_x, x_m[2], _madd(b_x, x_m[1], am_x))
                    sumq2 = _madd(f32(c_w * x_m[2]), x_m[2], _madd(f32(b_w * x_m[1]), x_m[1], am_w))
                    if sumq2 > 0 and f32(sumqx * sumqx) > f32(best_score * sumq2):
                        scale = f32(sumqx / sumq2)
                        best_score = f32(scale * sumqx)
                        besti1 = i1
                        besti2 = i2
                        best_shift = -1
            if besti1 < 0 or besti2 < 0 or best_shift == 0:
                scales[ib] = 0
                shifts[ib] = 1
                continue
            _iq1_place(order, 32, besti1, besti2, L)
            if scale < 0:
                for j in range(32):
                    L[j] = 2 - L[j]
                scale = -scale
                best_shift = -best_shift
            xx = x_p if best_shift == 1 else x_m
            if not _iq1_grid_indices(xb, weight, grid, kmap, neighbours, L, scale, xx, xx, index, terms):
                scale = _iq1_refit(xb, weight, grid, index, xx, xx, scale)
            h = 0
            for k in range(4):
                if index[k] < 0:
                    status[row] = ERR_NO_NEIGHBOUR
                    index[k] = 0
                out[row, obase + 2 + 4 * ib + k] = index[k] & 255
                h |= (index[k] >> 8) << (3 * k)
            out[row, obase + 34 + 2 * ib] = h & 255
            out[row, obase + 35 + 2 * ib] = h >> 8
            scales[ib] = scale
            shifts[ib] = best_shift
            max_scale = max_scale if max_scale > scale else scale
        if max_scale == 0:
            dvals[row, ibl] = 0
            continue
        d = f32(max_scale / f32(15.0))
        dvals[row, ibl] = f32(d * f32(1.125))
        inv_d = f32(f32(1.0) / d)
        for ib in range(8):
            lv = scale_nibble(inv_d, scales[ib], 7)
            if shifts[ib] == -1:
                lv |= 8
            out[row, obase + 35 + 2 * ib] |= lv << 4


@nb.njit(cache=True)
def _iq1m_weights(x, row, base, qw, has_qw, sigma2, weight):  # pragma: no cover - numba
    if has_qw:
        imatrix_weights(x[row, base : base + 16], qw[base : base + 16], sigma2, weight)
    else:
        for i in range(16):
            v = x[row, base + i]
            weight[i] = f32(v * v)


@nb.njit(cache=True)
def _row_iq1_m(x, row, qw, has_qw, grid, kmap, neighbours, out, dvals, status):  # pragma: no cover - numba
    n_per_row = x.shape[1]
    terms = np.empty((8, 3), dtype=np.float32)
    x_p = np.array([-1 + 0.125, 0.125, 1 + 0.125], dtype=np.float32)
    x_m = np.array([-1 - 0.125, -0.125, 1 - 0.125], dtype=np.float32)
    masks = np.array([0x00, 0x80, 0x08, 0x88], dtype=np.int64)
    # the split score collapses to T*v[2] - px[i1] - px[i2] because v[0]-v[1] = v[1]-v[2] = -1
    p2 = x_p[2]
    m2 = x_m[2]
    cp1 = f32(f32(x_p[0] * x_p[0]) - f32(x_p[1] * x_p[1]))
    cp2 = f32(f32(x_p[1] * x_p[1]) - f32(x_p[2] * x_p[2]))
    cm1 = f32(f32(x_m[0] * x_m[0]) - f32(x_m[1] * x_m[1]))
    cm2 = f32(f32(x_m[1] * x_m[1]) - f32(x_m[2] * x_m[2]))
    weight = np.empty(16, dtype=np.float32)
    xb = np.empty(16, dtype=np.float32)
    px = np.zeros((2, 17), dtype=np.float32)
    pw = np.zeros((2, 17), dtype=np.float32)
    L = np.zeros(16, dtype=np.int64)
    index = np.zeros(2, dtype=np.int64)
    scales = np.zeros(16, dtype=np.float32)
    shifts = np.zeros(16, dtype=np.int64)
    sumqx = np.zeros(4, dtype=np.float32)
    sumq2 = np.zeros(4, dtype=np.float32)
    txp = np.zeros(2, dtype=np.float32)
    txm = np.zeros(2, dtype=np.float32)
    tw2p = np.zeros(2, dtype=np.float32)
    tw2m = np.zeros(2, dtype=np.float32)
    for ibl in range(n_per_row // 256):
        xbase = 256 * ibl
        obase = 56 * ibl
        out[row, obase : obase + 56] = 0
        max_scale = f32(0.0)
        sigma2 = block_sigma2(x, row, xbase, f32(2.0))
        for ib in range(16):
            base = xbase + 16 * ib
            _iq1m_weights(x, row, base, qw, has_qw, sigma2, weight)
            mx = abs(x[row, base])
            for i in range(16):
                xb[i] = x[row, base + i]
                a = abs(xb[i])
                mx = mx if mx > a else a
            if mx < GROUP_MAX_EPS_IQ1_M:
                scales[ib] = 0
                shifts[ib] = 0
                continue
            order = np.argsort(xb, kind="mergesort")
            for j in range(16):
                i = order[j]
                h = 0 if i < 8 else 1
                px[h, j + 1] = _madd(weight[i], xb[i], px[h, j])
                px[1 - h, j + 1] = px[1 - h, j]
                pw[h, j + 1] = f32(pw[h, j] + weight[i])
                pw[1 - h, j + 1] = pw[1 - h, j]
            for h in range(2):
                txp[h] = f32(px[h, 16] * p2)
                txm[h] = f32(px[h, 16] * m2)
                tw2p[h] = f32(f32(pw[h, 16] * p2) * p2)
                tw2m[h] = f32(f32(pw[h, 16] * m2) * m2)
            best_score = -FLT_MAX
            scale = mx
            besti1 = -1
            besti2 = -1
            best_k = -1
            for i1 in range(17):
                vp0 = _madd(pw[0, i1], cp1, tw2p[0])
                vp1 = _madd(pw[1, i1], cp1, tw2p[1])
                vm0 = _madd(pw[0, i1], cm1, tw2m[0])
                vm1 = _madd(pw[1, i1], cm1, tw2m[1])
                for i2 in range(i1, 17):
                    sx0 = f32(px[0, i1] + px[0, i2])
                    sx1 = f32(px[1, i1] + px[1, i2])
                    qxp0 = f32(txp[0] - sx0)
                    qxm0 = f32(txm[0] - sx0)
                    qxp1 = f32(txp[1] - sx1)
                    qxm1 = f32(txm[1] - sx1)
                    q2p0 = _madd(pw[0, i2], cp2, vp0)
                    q2m0 = _madd(pw[0, i2], cm2, vm0)
                    q2p1 = _madd(pw[1, i2], cp2, vp1)
                    q2m1 = _madd(pw[1, i2], cm2, vm1)
                    sumqx[0] = f32(qxp0 + qxp1)
                    sumqx[1] = f32(qxp0 + qxm1)
                    sumqx[2] = f32(qxm0 + qxp1)
                    sumqx[3] = f32(qxm0 + qxm1)
                    sumq2[0] = f32(q2p0 + q2p1)
                    sumq2[1] = f32(q2p0 + q2m1)
                    sumq2[2] = f32(q2m0 + q2p1)
                    sumq2[3] = f32(q2m0 + q2m1)
                    for k in range(4):
                        if sumq2[k] > 0 and f32(sumqx[k] * sumqx[k]) > f32(best_score * sumq2[k]):
                            scale = f32(sumqx[k] / sumq2[k])
                            best_score = f32(scale * sumqx[k])
                            besti1 = i1
                            besti2 = i2
                            best_k = k
            if besti1 < 0 or besti2 < 0 or best_k < 0:
                scales[ib] = 0
                shifts[ib] = 0
                continue
            _iq1_place(order, 16, besti1, besti2, L)
            if scale < 0:
                for j in range(16):
                    L[j] = 2 - L[j]
                scale = -scale
                best_k = 3 - best_k
            xg0 = x_p if best_k < 2 else x_m
            xg1 = x_p if best_k % 2 == 0 else x_m
            if not _iq1_grid_indices(xb, weight, grid, kmap, neighbours, L, scale, xg0, xg1, index, terms):
                scale = _iq1_refit(xb, weight, grid, index, xg0, xg1, scale)
            for k in range(2):
                if index[k] < 0:
                    status[row] = ERR_NO_NEIGHBOUR
                    index[k] = 0
            out[row, obase + 2 * ib] = index[0] & 255
            out[row, obase + 2 * ib + 1] = index[1] & 255
            out[row, obase + 32 + ib] = (index[0] >> 8) | ((index[1] >> 8) << 4)
            scales[ib] = scale
            shifts[ib] = best_k
            max_scale = max_scale if max_scale > scale else scale
        if max_scale == 0:
            dvals[row, ibl] = 0
            continue
        d = f32(max_scale / f32(15.0))
        inv_d = f32(f32(1.0) / d)
        sumqx_f = f32(0.0)
        sumq2_f = f32(0.0)
        for ib in range(16):
            lv = scale_nibble(inv_d, scales[ib], 7)
            word = obase + 48 + 2 * (ib // 4)
            packed = lv << (3 * (ib % 4))
            out[row, word] |= packed & 255
            out[row, word + 1] |= packed >> 8
            qh = out[row, obase + 32 + ib] | masks[shifts[ib]]
            out[row, obase + 32 + ib] = qh
            base = xbase + 16 * ib
            _iq1m_weights(x, row, base, qw, has_qw, sigma2, weight)
            mult = f32(2 * lv + 1)
            for k in range(2):
                xg = x_p if (shifts[ib] < 2 if k == 0 else shifts[ib] % 2 == 0) else x_m
                gi = np.int64(out[row, obase + 2 * ib + k]) + ((np.int64(qh) << (8 - 4 * k)) & 0x700)
                for j in range(8):
                    w = weight[8 * k + j]
                    q = f32(xg[(grid[gi, j] - 1) // 2] * mult)
                    sumqx_f = _madd(f32(w * q), x[row, base + 8 * k + j], sumqx_f)
                    sumq2_f = _madd(f32(w * q), q, sumq2_f)
        if sumq2_f > 0:
            d = f32(sumqx_f / sumq2_f)
        dvals[row, ibl] = f32(d * f32(1.1125))


@nb.njit(cache=True, nogil=True)
def quantize_iq1_s(x, qw, grid, kmap, neighbours, out, dvals, status):  # pragma: no cover - numba
    for row in range(x.shape[0]):
        _row_iq1_s(x, row, qw, grid, kmap, neighbours, out, dvals, status)


@nb.njit(cache=True, nogil=True)
def quantize_iq1_m(x, qw, has_qw, grid, kmap, neighbours, out, dvals, status):  # pragma: no cover - numba
    for row in range(x.shape[0]):
        _row_iq1_m(x, row, qw, has_qw, grid, kmap, neighbours, out, dvals, status)


#: per type name: the driver over a range of rows
DRIVERS = {
    "iq1_s": quantize_iq1_s,
    "iq1_m": quantize_iq1_m,
}
