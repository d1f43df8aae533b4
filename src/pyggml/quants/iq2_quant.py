"""numba kernels of ggml's IQ2_XXS / IQ2_XS / IQ2_S / IQ1_S / IQ1_M quantizers (ggml-quants.c).

Each kernel quantizes one row with the search of the matching
``quantize_row_*_impl``: same candidate scales, same visiting order, same strict comparisons,
so ties resolve the way ggml resolves them. Everything is float32 arithmetic with one rounding
per C operation, in C's evaluation order. There is no fused multiply-add: ggml-quants.c is
part of ggml-base, which is compiled without the CPU backend's ``-march`` flags, so gcc has no
FMA instruction to contract ``a*b + c`` into. (The reference vectors confirm it: fusing the
prefix sums of the IQ1_S search changes a block of the linear-ramp row.)

:data:`DRIVERS` runs a kernel over all rows, serially or in parallel. The kernels write every
byte of a block except the fp16 super-scale: they return the float32 value to be converted
instead, and the caller converts all of them at once with numpy (round-to-nearest-even, as
``GGML_FP32_TO_FP16``).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np
from numba import prange

from .fp import nearest_int_nb
from .ksearch import FLT_MAX, GROUP_MAX_EPS, imatrix_weights, make_qp_quants, sum_squares

f32 = np.float32

GROUP_MAX_EPS_IQ2_S = f32(1e-8)
GROUP_MAX_EPS_IQ1_M = f32(1e-7)
GROUP_MAX_EPS_IQ1_S = f32(1e-12)

# error codes a kernel leaves in its per-row status array (ggml aborts in these places)
ERR_OFF_GRID = 1
ERR_NO_NEIGHBOUR = 2


@nb.njit(cache=True, inline="always")
def _madd(a, b, c):  # pragma: no cover - numba
    """float32 ``a*b + c`` rounded after each operation, as ggml-quants.c computes it."""
    return f32(f32(a * b) + c)


@nb.njit(cache=True, inline="always")
def _msub(a, b, c):  # pragma: no cover - numba
    """float32 ``a*b - c`` rounded after each operation."""
    return f32(f32(a * b) - c)


@nb.njit(cache=True, inline="always")
def _sqrtf(v):  # pragma: no cover - numba
    return f32(math.sqrt(np.float64(v)))


@nb.njit(cache=True, inline="always")
def _clamp(v, lo, hi):  # pragma: no cover - numba
    return lo if v < lo else (hi if v > hi else v)


@nb.njit(cache=True, inline="always")
def _level(inv_scale, v):  # pragma: no cover - numba
    """Grid level of ``v``: nearest_int(0.5f*(id*x - 1))."""
    return nearest_int_nb(f32(f32(0.5) * _msub(inv_scale, v, f32(1.0))))


@nb.njit(cache=True)
def _best_neighbour(neighbours, start, grid, xval, waux, off, scale, L, terms):  # pragma: no cover - numba
    """iq2_find_best_neighbour: the listed grid point closest to xval/scale (weights waux).

    A coordinate takes one of three values, so its weighted squared error is computed once per
    value (into ``terms``) and each candidate just adds its eight terms up, in ggml's order.
    """
    for i in range(8):
        for lv in range(3):
            diff = _msub(scale, f32(2 * lv + 1), xval[off + i])
            terms[i, lv] = f32(f32(waux[off + i] * diff) * diff)
    count = neighbours[start]
    best_d2 = FLT_MAX
    best = -1
    for j in range(1, count + 1):
        idx = np.int64(neighbours[start + j])
        d2 = f32(0.0)
        for i in range(8):
            d2 = f32(d2 + terms[i, (grid[idx, i] - 1) >> 1])
        if d2 < best_d2:
            best_d2 = d2
            best = idx
    if best >= 0:
        for i in range(8):
            L[off + i] = (grid[best, i] - 1) // 2
    return best


@nb.njit(cache=True)
def _pack(L, off):  # pragma: no cover - numba
    u = 0
    for i in range(8):
        u |= np.int64(L[off + i]) << (2 * i)
    return u


@nb.njit(cache=True)
def block_sigma2(x, row, base, factor):  # pragma: no cover - numba
    """factor * sum(x^2) / QK_K over one super-block (sequential, in C order)."""
    return f32(f32(factor * sum_squares(x[row, base : base + 256])) / f32(256.0))


@nb.njit(cache=True)
def sign_groups(x, row, base, ngroups, xval, signs):  # pragma: no cover - numba
    """|x| per group of 8 into ``xval``, and per group its sign byte (bit i: x < 0) into ``signs``.

    IQ2_S and IQ3_S store these bytes as they are.
    """
    for k in range(ngroups):
        s = 0
        for i in range(8):
            v = x[row, base + 8 * k + i]
            if v >= 0:
                xval[8 * k + i] = v
            else:
                xval[8 * k + i] = -v
                s |= 1 << i
        signs[k] = s


@nb.njit(cache=True)
def even_sign_groups(x, row, base, ngroups, weight, xval, signs):  # pragma: no cover - numba
    """|x| per group of 8 with an even number of negatives: the least important one is flipped.

    Writes the 7-bit sign indices into ``signs`` (ksigns_iq2xs stores the 8th bit as parity);
    IQ2_XXS, IQ2_XS and IQ3_XXS store signs this way.
    """
    for k in range(ngroups):
        nflip = 0
        s = 0
        for i in range(8):
            v = x[row, base + 8 * k + i]
            if v >= 0:
                xval[8 * k + i] = v
            else:
                xval[8 * k + i] = -v
                nflip += 1
                s |= 1 << i
        if nflip % 2:
            imin = 0
            v0 = x[row, base + 8 * k]
            vmin = f32(f32(weight[8 * k] * v0) * v0)
            for i in range(1, 8):
                v = x[row, base + 8 * k + i]
                ax = f32(f32(weight[8 * k + i] * v) * v)
                if ax < vmin:
                    vmin = ax
                    imin = i
            xval[8 * k + imin] = -xval[8 * k + imin]
            s ^= 1 << imin
        signs[k] = s & 127


@nb.njit(cache=True)
def _weighted_sums(n, weight, xval, L):  # pragma: no cover - numba
    """sum w*x*q and sum w*q*q with q = 2*L + 1."""
    sumqx = f32(0.0)
    sumq2 = f32(0.0)
    for i in range(n):
        w = weight[i]
        q = f32(2 * L[i] + 1)
        sumqx = _madd(f32(w * xval[i]), q, sumqx)
        sumq2 = _madd(f32(w * q), q, sumq2)
    return sumqx, sumq2


@nb.njit(cache=True)
def _levels_for(inv_scale, xval, off, L):  # pragma: no cover - numba
    """Clamped levels of 8 values written into L; returns their packed index."""
    u = 0
    for i in range(8):
        lv = _clamp(_level(inv_scale, xval[off + i]), 0, 2)
        L[off + i] = lv
        u |= lv << (2 * i)
    return u


@nb.njit(cache=True)
def scale_nibble(inv_d, scale, top):  # pragma: no cover - numba
    """A sub-block scale as stored by the IQ2/IQ3 types: nearest_int(0.5*(scale/d - 1)) in 0..top."""
    return _clamp(_level(inv_d, scale), 0, top)


# ---------------------------------------------------------------------------------------------
# IQ2_XXS: 8 groups of 32, one 4-bit scale each, signs with even parity
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True)
def _row_iq2_xxs(x, row, qw, grid, kmap, neighbours, out, dvals, status):  # pragma: no cover - numba
    n_per_row = x.shape[1]
    terms = np.empty((8, 3), dtype=np.float32)
    weight = np.empty(32, dtype=np.float32)
    waux = np.empty(32, dtype=np.float32)
    xval = np.empty(32, dtype=np.float32)
    L = np.zeros(32, dtype=np.int64)
    Laux = np.zeros(32, dtype=np.int64)
    Lqp = np.zeros(32, dtype=np.uint8)
    scales = np.zeros(8, dtype=np.float32)
    signs = np.zeros(4, dtype=np.int64)
    q2 = np.zeros(16, dtype=np.uint32)
    for ibl in range(n_per_row // 256):
        xbase = 256 * ibl
        q2[:] = 0
        max_scale = f32(0.0)
        sigma2 = block_sigma2(x, row, xbase, f32(1.0))
        for ib in range(8):
            base = xbase + 32 * ib
            imatrix_weights(x[row, base : base + 32], qw[base : base + 32], sigma2, weight)
            for i in range(32):
                waux[i] = _sqrtf(weight[i])
            even_sign_groups(x, row, base, 4, weight, xval, signs)
            mx = xval[0]
            for i in range(1, 32):
                mx = mx if mx > xval[i] else xval[i]
            if mx < GROUP_MAX_EPS:
                scales[ib] = 0
                continue
            scale = make_qp_quants(4, xval, Lqp, weight)
            for i in range(32):
                L[i] = np.int8(Lqp[i])
            eff_max = f32(scale * f32(3.0))
            if eff_max <= 0:
                scales[ib] = 0
                continue
            best = f32(0.0)
            for step in range(-6, 7):
                inv = f32(_madd(f32(step), f32(0.1), f32(5.0)) / eff_max)
                this_scale = f32(f32(1.0) / inv)
                for k in range(4):
                    u = _levels_for(inv, xval, 8 * k, Laux)
                    if kmap[u] < 0:
                        _best_neighbour(neighbours, -kmap[u] - 1, grid, xval, waux, 8 * k, this_scale, Laux, terms)
                sumqx, sumq2 = _weighted_sums(32, weight, xval, Laux)
                if sumq2 > 0 and f32(sumqx * sumqx) > f32(best * sumq2):
                    scale = f32(sumqx / sumq2)
                    best = f32(scale * sumqx)
                    L[:] = Laux
            if scale > 0:
                inv = f32(f32(1.0) / scale)
                for k in range(4):
                    u = _levels_for(inv, xval, 8 * k, L)
                    gi = kmap[u]
                    if gi < 0:
                        gi = _best_neighbour(neighbours, -kmap[u] - 1, grid, xval, waux, 8 * k, scale, L, terms)
                        if gi < 0:
                            status[row] = ERR_NO_NEIGHBOUR
                            gi = 0
                    for i in range(8):
                        L[8 * k + i] = (grid[gi, i] - 1) // 2
                sumqx, sumq2 = _weighted_sums(32, weight, xval, L)
                if sumq2 > 0:
                    scale = f32(sumqx / sumq2)
            if scale < 0:
                scale = -scale
                for k in range(4):
                    signs[k] = (~signs[k]) & 127
            for k in range(4):
                gi = kmap[_pack(L, 8 * k)]
                if gi < 0:
                    status[row] = ERR_OFF_GRID
                    gi = 0
                q2[2 * ib] |= np.uint32(gi << (8 * k))
                q2[2 * ib + 1] |= np.uint32(signs[k] << (7 * k))
            scales[ib] = scale
            max_scale = max_scale if max_scale > scale else scale
        obase = 66 * ibl
        if max_scale == 0:
            dvals[row, ibl] = 0
            out[row, obase + 2 : obase + 66] = 0
            continue
        d = f32(max_scale / f32(31.0))
        dvals[row, ibl] = d
        inv_d = f32(f32(1.0) / d)
        for ib in range(8):
            q2[2 * ib + 1] |= np.uint32(scale_nibble(inv_d, scales[ib], 15) << 28)
        for w in range(16):
            for b in range(4):
                out[row, obase + 2 + 4 * w + b] = (q2[w] >> (8 * b)) & 255


# ---------------------------------------------------------------------------------------------
# IQ2_XS and IQ2_S: 16 groups of 16, one 4-bit scale each
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True)
def _search_16(xval, weight, waux, grid, kmap, neighbours, L, Laux, on_grid, on_grid_aux, terms):  # pragma: no cover
    """The scale search shared by IQ2_XS and IQ2_S; returns the scale (L holds the levels)."""
    mx = xval[0]
    for i in range(1, 16):
        mx = mx if mx > xval[i] else xval[i]
    best = f32(0.0)
    scale = f32(mx / f32(5.0))
    on_grid[0] = True
    on_grid[1] = True
    for step in range(-9, 10):
        inv = f32(_madd(f32(step), f32(0.1), f32(5.0)) / mx)
        this_scale = f32(f32(1.0) / inv)
        for k in range(2):
            u = _levels_for(inv, xval, 8 * k, Laux)
            on_grid_aux[k] = True
            if kmap[u] < 0:
                on_grid_aux[k] = False
                _best_neighbour(neighbours, -kmap[u] - 1, grid, xval, waux, 8 * k, this_scale, Laux, terms)
        sumqx, sumq2 = _weighted_sums(16, weight, xval, Laux)
        if sumq2 > 0 and f32(sumqx * sumqx) > f32(best * sumq2):
            scale = f32(sumqx / sumq2)
            best = f32(scale * sumqx)
            L[:] = Laux
            on_grid[0] = on_grid_aux[0]
            on_grid[1] = on_grid_aux[1]
    if (not on_grid[0] or not on_grid[1]) and scale > 0:
        inv = f32(f32(1.0) / scale)
        for k in range(2):
            if on_grid[k]:
                continue
            u = _levels_for(inv, xval, 8 * k, L)
            if kmap[u] < 0:
                _best_neighbour(neighbours, -kmap[u] - 1, grid, xval, waux, 8 * k, scale, L, terms)
        sumqx, sumq2 = _weighted_sums(16, weight, xval, L)
        if sumq2 > 0:
            scale = f32(sumqx / sumq2)
    return scale


@nb.njit(cache=True)
def _row_iq2_xs(x, row, qw, grid, kmap, neighbours, out, dvals, status):  # pragma: no cover - numba
    n_per_row = x.shape[1]
    terms = np.empty((8, 3), dtype=np.float32)
    weight = np.empty(16, dtype=np.float32)
    waux = np.empty(16, dtype=np.float32)
    xval = np.empty(16, dtype=np.float32)
    L = np.zeros(16, dtype=np.int64)
    Laux = np.zeros(16, dtype=np.int64)
    on_grid = np.ones(2, dtype=np.bool_)
    on_grid_aux = np.ones(2, dtype=np.bool_)
    scales = np.zeros(16, dtype=np.float32)
    signs = np.zeros(2, dtype=np.int64)
    q2 = np.zeros(32, dtype=np.int64)
    for ibl in range(n_per_row // 256):
        xbase = 256 * ibl
        obase = 74 * ibl
        q2[:] = 0
        max_scale = f32(0.0)
        sigma2 = block_sigma2(x, row, xbase, f32(1.0))
        for ib in range(16):
            base = xbase + 16 * ib
            imatrix_weights(x[row, base : base + 16], qw[base : base + 16], sigma2, weight)
            for i in range(16):
                waux[i] = _sqrtf(weight[i])
            even_sign_groups(x, row, base, 2, weight, xval, signs)
            mx = xval[0]
            for i in range(1, 16):
                mx = mx if mx > xval[i] else xval[i]
            L[:] = 0
            if mx < GROUP_MAX_EPS:
                scales[ib] = 0
                continue
            scale = _search_16(xval, weight, waux, grid, kmap, neighbours, L, Laux, on_grid, on_grid_aux, terms)
            if scale < 0:
                scale = -scale
                for k in range(2):
                    signs[k] = (~signs[k]) & 127
            for k in range(2):
                gi = kmap[_pack(L, 8 * k)]
                if gi < 0:
                    status[row] = ERR_OFF_GRID
                    gi = 0
                q2[2 * ib + k] = gi | (signs[k] << 9)
            scales[ib] = scale
            max_scale = max_scale if max_scale > scale else scale
        out[row, obase + 66 : obase + 74] = 0
        if max_scale == 0:
            dvals[row, ibl] = 0
            out[row, obase + 2 : obase + 66] = 0
            continue
        d = f32(max_scale / f32(31.0))
        dvals[row, ibl] = d
        inv_d = f32(f32(1.0) / d)
        for ib in range(16):
            lv = scale_nibble(inv_d, scales[ib], 15)
            out[row, obase + 66 + ib // 2] |= lv << (4 * (ib % 2))
        for w in range(32):
            out[row, obase + 2 + 2 * w] = q2[w] & 255
            out[row, obase + 3 + 2 * w] = (q2[w] >> 8) & 255


@nb.njit(cache=True)
def _row_iq2_s(x, row, qw, has_qw, grid, kmap, neighbours, out, dvals, status):  # pragma: no cover - numba
    n_per_row = x.shape[1]
    terms = np.empty((8, 3), dtype=np.float32)
    weight = np.empty(16, dtype=np.float32)
    waux = np.empty(16, dtype=np.float32)
    xval = np.empty(16, dtype=np.float32)
    L = np.zeros(16, dtype=np.int64)
    Laux = np.zeros(16, dtype=np.int64)
    on_grid = np.ones(2, dtype=np.bool_)
    on_grid_aux = np.ones(2, dtype=np.bool_)
    scales = np.zeros(16, dtype=np.float32)
    signs = np.zeros(2, dtype=np.int64)
    for ibl in range(n_per_row // 256):
        xbase = 256 * ibl
        obase = 82 * ibl
        out[row, obase : obase + 82] = 0
        max_scale = f32(0.0)
        sigma2 = block_sigma2(x, row, xbase, f32(2.0))
        for ib in range(16):
            base = xbase + 16 * ib
            if has_qw:
                imatrix_weights(x[row, base : base + 16], qw[base : base + 16], sigma2, weight)
            else:
                quarter = f32(f32(0.25) * sigma2)
                for i in range(16):
                    v = x[row, base + i]
                    weight[i] = _madd(v, v, quarter)
            for i in range(16):
                waux[i] = _sqrtf(weight[i])
            sign_groups(x, row, base, 2, xval, signs)
            mx = xval[0]
            for i in range(1, 16):
                mx = mx if mx > xval[i] else xval[i]
            L[:] = 0
            if mx < GROUP_MAX_EPS_IQ2_S:
                scales[ib] = 0
                continue
            scale = _search_16(xval, weight, waux, grid, kmap, neighbours, L, Laux, on_grid, on_grid_aux, terms)
            if scale < 0:
                scale = -scale
                for k in range(2):
                    signs[k] = (~signs[k]) & 255
            for k in range(2):
                gi = kmap[_pack(L, 8 * k)]
                if gi < 0:
                    status[row] = ERR_OFF_GRID
                    gi = 0
                i8 = 2 * ib + k
                out[row, obase + 2 + i8] = gi & 255
                out[row, obase + 66 + i8 // 4] |= (gi >> 8) << (2 * (i8 % 4))
                out[row, obase + 2 + 32 + i8] = signs[k]
            scales[ib] = scale
            max_scale = max_scale if max_scale > scale else scale
        if max_scale == 0:
            dvals[row, ibl] = 0
            continue
        d = f32(max_scale / f32(31.0))
        dvals[row, ibl] = f32(d * f32(0.9875))
        inv_d = f32(f32(1.0) / d)
        for ib in range(16):
            lv = scale_nibble(inv_d, scales[ib], 15)
            out[row, obase + 74 + ib // 2] |= lv << (4 * (ib % 2))


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


# ---------------------------------------------------------------------------------------------
# drivers: rows one after another, or spread over numba's threads (worth it for big matrices
# only: a parallel region costs a thread hand-off, which is slow on a loaded machine)
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True)
def serial_iq2_xxs(x, qw, grid, kmap, neighbours, out, dvals, status):  # pragma: no cover - numba
    for row in range(x.shape[0]):
        _row_iq2_xxs(x, row, qw, grid, kmap, neighbours, out, dvals, status)


@nb.njit(cache=True, parallel=True)
def parallel_iq2_xxs(x, qw, grid, kmap, neighbours, out, dvals, status):  # pragma: no cover - numba
    for row in prange(x.shape[0]):
        _row_iq2_xxs(x, row, qw, grid, kmap, neighbours, out, dvals, status)


@nb.njit(cache=True)
def serial_iq2_xs(x, qw, grid, kmap, neighbours, out, dvals, status):  # pragma: no cover - numba
    for row in range(x.shape[0]):
        _row_iq2_xs(x, row, qw, grid, kmap, neighbours, out, dvals, status)


@nb.njit(cache=True, parallel=True)
def parallel_iq2_xs(x, qw, grid, kmap, neighbours, out, dvals, status):  # pragma: no cover - numba
    for row in prange(x.shape[0]):
        _row_iq2_xs(x, row, qw, grid, kmap, neighbours, out, dvals, status)


@nb.njit(cache=True)
def serial_iq2_s(x, qw, has_qw, grid, kmap, neighbours, out, dvals, status):  # pragma: no cover - numba
    for row in range(x.shape[0]):
        _row_iq2_s(x, row, qw, has_qw, grid, kmap, neighbours, out, dvals, status)


@nb.njit(cache=True, parallel=True)
def parallel_iq2_s(x, qw, has_qw, grid, kmap, neighbours, out, dvals, status):  # pragma: no cover - numba
    for row in prange(x.shape[0]):
        _row_iq2_s(x, row, qw, has_qw, grid, kmap, neighbours, out, dvals, status)


@nb.njit(cache=True)
def serial_iq1_s(x, qw, grid, kmap, neighbours, out, dvals, status):  # pragma: no cover - numba
    for row in range(x.shape[0]):
        _row_iq1_s(x, row, qw, grid, kmap, neighbours, out, dvals, status)


@nb.njit(cache=True, parallel=True)
def parallel_iq1_s(x, qw, grid, kmap, neighbours, out, dvals, status):  # pragma: no cover - numba
    for row in prange(x.shape[0]):
        _row_iq1_s(x, row, qw, grid, kmap, neighbours, out, dvals, status)


@nb.njit(cache=True)
def serial_iq1_m(x, qw, has_qw, grid, kmap, neighbours, out, dvals, status):  # pragma: no cover - numba
    for row in range(x.shape[0]):
        _row_iq1_m(x, row, qw, has_qw, grid, kmap, neighbours, out, dvals, status)


@nb.njit(cache=True, parallel=True)
def parallel_iq1_m(x, qw, has_qw, grid, kmap, neighbours, out, dvals, status):  # pragma: no cover - numba
    for row in prange(x.shape[0]):
        _row_iq1_m(x, row, qw, has_qw, grid, kmap, neighbours, out, dvals, status)


#: per type name: (serial driver, parallel driver)
DRIVERS = {
    "iq2_xxs": (serial_iq2_xxs, parallel_iq2_xxs),
    "iq2_xs": (serial_iq2_xs, parallel_iq2_xs),
    "iq2_s": (serial_iq2_s, parallel_iq2_s),
    "iq1_s": (serial_iq1_s, parallel_iq1_s),
    "iq1_m": (serial_iq1_m, parallel_iq1_m),
}
