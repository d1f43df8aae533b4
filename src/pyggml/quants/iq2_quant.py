"""numba kernels of ggml's IQ2_XXS / IQ2_XS / IQ2_S quantizers (ggml-quants.c), and the helpers
the IQ1 (iq1_quant.py) and IQ3 (iq3.py) quantizers share with them.

Each kernel quantizes one row with the search of the matching
``quantize_row_*_impl``: same candidate scales, same visiting order, same strict comparisons,
so ties resolve the way ggml resolves them. Everything is float32 arithmetic with one rounding
per C operation, in C's evaluation order. There is no fused multiply-add: ggml-quants.c is
part of ggml-base, which is compiled without the CPU backend's ``-march`` flags, so gcc has no
FMA instruction to contract ``a*b + c`` into. (The reference vectors confirm it: fusing the
prefix sums of the IQ1_S search changes a block of the linear-ramp row.)

:data:`DRIVERS` runs a kernel over the rows it is given (codec.BlockCodec spreads rows over threads).
The kernels write every byte of a block except the fp16 super-scale: they return the float32 value to be converted
instead, and the caller converts all of them at once with numpy (round-to-nearest-even, as
``GGML_FP32_TO_FP16``).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from .fp import nearest_int_nb
from .ksearch import FLT_MAX, GROUP_MAX_EPS, imatrix_weights, make_qp_quants, sum_squares

f32 = np.float32

GROUP_MAX_EPS_IQ2_S = f32(1e-8)

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
# drivers: the rows they are given one after another (codec.BlockCodec gives each thread its rows)
# ---------------------------------------------------------------------------------------------


@nb.njit(cache=True, nogil=True)
def quantize_iq2_xxs(x, qw, grid, kmap, neighbours, out, dvals, status):  # pragma: no cover - numba
    for row in range(x.shape[0]):
        _row_iq2_xxs(x, row, qw, grid, kmap, neighbours, out, dvals, status)


@nb.njit(cache=True, nogil=True)
def quantize_iq2_xs(x, qw, grid, kmap, neighbours, out, dvals, status):  # pragma: no cover - numba
    for row in range(x.shape[0]):
        _row_iq2_xs(x, row, qw, grid, kmap, neighbours, out, dvals, status)


@nb.njit(cache=True, nogil=True)
def quantize_iq2_s(x, qw, has_qw, grid, kmap, neighbours, out, dvals, status):  # pragma: no cover - numba
    for row in range(x.shape[0]):
        _row_iq2_s(x, row, qw, has_qw, grid, kmap, neighbours, out, dvals, status)


#: per type name: the driver over a range of rows
DRIVERS = {
    "iq2_xxs": quantize_iq2_xxs,
    "iq2_xs": quantize_iq2_xs,
    "iq2_s": quantize_iq2_s,
}
