"""Scalar numba kernels shared by the quantizers: the K-quants, IQ4, the legacy and ternary
types and the IQ2/IQ3 families (block statistics, importance weights, ggml's searches).

ggml's super-block quantizers are float32 C code whose exact bits depend on the order and
width of every operation. The helpers here are therefore written so that numba keeps every
intermediate in float32: operands are cast with ``f32(...)`` (numba would otherwise promote
``float32 * int`` or ``float32 * 0.1`` to float64), sums accumulate left to right, and no
fused multiply-add is ever formed (numba only contracts with ``fastmath``). Every kernel uses
``error_model="numpy"``: in degenerate blocks (NaN/inf input, zero weights) ggml's C divides
by zero and carries on with inf/NaN, where numba's default would raise.

The search helpers follow ggml-quants.c (``make_qx_quants``, ``make_q3_quants``,
``make_qkx2_quants``, ``make_qkx3_quants``, ``make_qp_quants``, ``best_index_int8``); the
level arrays they fill are the caller's, so a block kernel can hand in views of its
per-super-block scratch arrays.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .fp import nearest_int_nb as nearest_int

f32 = np.float32

#: C's FLT_MAX as float32
FLT_MAX = f32(3.4028234663852886e38)

#: ggml-quants.c GROUP_MAX_EPS: a group whose largest |x| is below this is treated as zero
GROUP_MAX_EPS = f32(1e-15)


# --------------------------------------------------------------------------- bytes


@njit(cache=True, error_model="numpy")
def put_u16(out: np.ndarray, off: int, v: int) -> None:
    """Write ``v`` as a little-endian u16 at ``out[off]`` (a block's fp16 bits, for instance)."""
    out[off] = v & 0xFF
    out[off + 1] = (v >> 8) & 0xFF


# --------------------------------------------------------------------------- block statistics


@njit(cache=True, error_model="numpy")
def signed_absmax(x: np.ndarray) -> tuple[np.float32, np.float32]:
    """(max |x|, the first x reaching it), starting from (0, 0): ggml's ``if (ax > amax)`` loop,
    so ties and NaNs never replace the first maximum."""
    amax = f32(0.0)
    vmax = f32(0.0)
    for v in x:
        a = abs(v)
        if a > amax:
            amax = a
            vmax = v
    return amax, vmax


@njit(cache=True, error_model="numpy")
def sum_squares(x: np.ndarray) -> np.float32:
    """sum(x*x) in float32, left to right from 0, each product rounded before it is added."""
    s = f32(0.0)
    for v in x:
        s += v * v
    return s


@njit(cache=True, error_model="numpy")
def absmax_macro(x: np.ndarray) -> np.float32:
    """max |x| as ggml's ``amax = MAX(amax, fabsf(v))`` computes it: the macro is
    ``amax > a ? amax : a``, so a NaN |v| is taken (and replaced by the next larger value)."""
    amax = f32(0.0)
    for v in x:
        a = abs(v)
        amax = amax if amax > a else a
    return amax


# --------------------------------------------------------------------------- weights


@njit(cache=True, error_model="numpy")
def imatrix_weights(x: np.ndarray, qw: np.ndarray, sigma2: float, weight: np.ndarray) -> float:
    """ggml's importance weights ``qw[i] * sqrtf(sigma2 + x[i]*x[i])`` into ``weight``.

    Returns their float32 sum, accumulated left to right from 0 (the ``sumw``/``sw[j]`` that
    the K-quant imatrix paths hand to ``make_qx_quants``/``make_qp_quants``).
    """
    s = f32(0.0)
    for i in range(x.shape[0]):
        w = qw[i] * np.sqrt(sigma2 + x[i] * x[i])
        weight[i] = w
        s += w
    return s


# --------------------------------------------------------------------------- searches


@njit(cache=True, error_model="numpy")
def make_qx_quants(nmax: int, x: np.ndarray, L: np.ndarray, qw: np.ndarray, use_qw: bool) -> float:
    """Symmetric levels in [-nmax, nmax-1] (stored +nmax) with a weighted scale search.

    ggml's ``make_qx_quants`` with ``rmse_type == 1`` (the only mode the quantizers call):
    weights are ``qw`` when given, else ``x*x``. Tries 19 trial inverse scales around
    ``-nmax/max`` and keeps the least-squares scale of the best one.
    """
    n = x.shape[0]
    amax, vmax = signed_absmax(x)
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return f32(0.0)
    fn = f32(nmax)
    iscale = -fn / vmax
    sumlx = f32(0.0)
    suml2 = f32(0.0)
    for i in range(n):
        l = min(max(nearest_int(iscale * x[i]), -nmax), nmax - 1)
        L[i] = l + nmax
        w = qw[i] if use_qw else x[i] * x[i]
        fl = f32(l)
        sumlx += w * x[i] * fl
        suml2 += w * fl * fl
    scale = sumlx / suml2 if suml2 != 0 else f32(0.0)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(fn + f32(0.1) * f32(step)) / vmax
        sumlx = f32(0.0)
        suml2 = f32(0.0)
        for i in range(n):
            fl = f32(min(max(nearest_int(iscale * x[i]), -nmax), nmax - 1))
            w = qw[i] if use_qw else x[i] * x[i]
            sumlx += w * x[i] * fl
            suml2 += w * fl * fl
        if suml2 > 0 and sumlx * sumlx > best * suml2:
            for i in range(n):
                L[i] = nmax + min(max(nearest_int(iscale * x[i]), -nmax), nmax - 1)
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@njit(cache=True, error_model="numpy")
def make_q3_quants(nmax: int, x: np.ndarray, L: np.ndarray) -> float:
    """Q3_K's reference search (``make_q3_quants`` with ``do_rmse``): x*x-weighted, then up
    to five passes that move single levels while that improves the least-squares fit."""
    n = x.shape[0]
    amax, vmax = signed_absmax(x)
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return f32(0.0)
    iscale = -f32(nmax) / vmax
    sumlx = f32(0.0)
    suml2 = f32(0.0)
    for i in range(n):
        l = min(max(nearest_int(iscale * x[i]), -nmax), nmax - 1)
        L[i] = l
        w = x[i] * x[i]
        fl = f32(l)
        sumlx += w * x[i] * fl
        suml2 += w * fl * fl
    for _ in range(5):
        n_changed = 0
        for i in range(n):
            w = x[i] * x[i]
            li = f32(L[i])
            slx = sumlx - w * x[i] * li
            if slx > 0:
                sl2 = suml2 - w * li * li
                new_l = min(max(nearest_int(x[i] * sl2 / slx), -nmax), nmax - 1)
                if new_l != L[i]:
                    fl = f32(new_l)
                    slx += w * x[i] * fl
                    sl2 += w * fl * fl
                    if sl2 > 0 and slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    for i in range(n):
        L[i] += nmax
    return sumlx / suml2 if suml2 > 0 else f32(0.0)


@njit(cache=True, error_model="numpy")
def make_qkx2_quants(
    nmax: int,
    x: np.ndarray,
    weights: np.ndarray,
    L: np.ndarray,
    Laux: np.ndarray,
    rmin: float,
    rdelta: float,
    nstep: int,
    use_mad: bool,
) -> tuple[float, float]:
    """Asymmetric levels in [0, nmax] with a min: ``make_qkx2_quants`` and ``make_qkx3_quants``.

    Returns ``(scale, the_min)`` where x ~ scale*L - the_min. Each of ``nstep+1`` trial
    inverse scales gets its weighted least-squares (scale, min); the one with the smallest
    weighted error (squared, or absolute with ``use_mad``) wins.

    ggml has two copies of this search. ``make_qkx3_quants`` (the imatrix paths) gives up when
    ``max <= min`` where qkx2 tests ``max == min``, but after ``min`` is clamped to <= 0 the
    max is never below the min (a NaN fails both tests), so one function serves both. qkx3
    also accepts NULL weights (x*x); no caller of it passes NULL.
    """
    n = x.shape[0]
    vmin = x[0]
    vmax = x[0]
    sum_w = weights[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        if x[i] < vmin:
            vmin = x[i]
        if x[i] > vmax:
            vmax = x[i]
        w = weights[i]
        sum_w += w
        sum_x += w * x[i]
    if vmin > 0:
        vmin = f32(0.0)
    if vmax <= vmin:
        for i in range(n):
            L[i] = 0
        return f32(0.0), -vmin
    fn = f32(nmax)
    iscale = fn / (vmax - vmin)
    scale = f32(1.0) / iscale
    best_mad = f32(0.0)
    for i in range(n):
        l = min(max(nearest_int(iscale * (x[i] - vmin)), 0), nmax)
        L[i] = l
        diff = scale * f32(l) + vmin - x[i]
        diff = abs(diff) if use_mad else diff * diff
        best_mad += weights[i] * diff
    if nstep < 1:
        return scale, -vmin
    for step in range(nstep + 1):
        # vmin follows the best fit so far, so (vmax - vmin) may be tiny or negative here
        iscale = (rmin + rdelta * f32(step) + fn) / (vmax - vmin)
        sum_l = f32(0.0)
        sum_l2 = f32(0.0)
        sum_xl = f32(0.0)
        for i in range(n):
            l = min(max(nearest_int(iscale * (x[i] - vmin)), 0), nmax)
            Laux[i] = l
            w = weights[i]
            fl = f32(l)
            sum_l += w * fl
            sum_l2 += w * fl * fl
            sum_xl += w * fl * x[i]
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > 0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            if this_min > 0:
                this_min = f32(0.0)
                this_scale = sum_xl / sum_l2
            mad = f32(0.0)
            for i in range(n):
                diff = this_scale * f32(Laux[i]) + this_min - x[i]
                diff = abs(diff) if use_mad else diff * diff
                mad += weights[i] * diff
            if mad < best_mad:
                for i in range(n):
                    L[i] = Laux[i]
                best_mad = mad
                scale = this_scale
                vmin = this_min
    return scale, -vmin


#: ggml's ``make_qkx3_quants``: the same search as ``make_qkx2_quants`` (see there)
make_qkx3_quants = make_qkx2_quants


@njit(cache=True, error_model="numpy")
def make_qp_quants(nmax: int, x: np.ndarray, L: np.ndarray, qw: np.ndarray) -> float:
    """Non-negative levels in [0, nmax] for a row of (non-negative) sub-block scales.

    ``make_qp_quants``: 9 trial inverse scales, then up to five single-level refinement
    passes. L is uint8 as in ggml, so a (rare) negative level wraps modulo 256 exactly as
    the C assignment does, while the running sums use the unwrapped integer.
    """
    n = x.shape[0]
    vmax = f32(0.0)
    for i in range(n):
        vmax = vmax if vmax > x[i] else x[i]  # C's MAX(a, b): a NaN x[i] wins
    if vmax < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return f32(0.0)
    fn = f32(nmax)
    iscale = fn / vmax
    for i in range(n):
        L[i] = nearest_int(iscale * x[i]) & 0xFF
    scale = f32(1.0) / iscale
    best_mse = f32(0.0)
    for i in range(n):
        diff = x[i] - scale * f32(L[i])
        best_mse += qw[i] * diff * diff
    for step in range(-4, 5):
        if step == 0:
            continue
        iscale_is = (f32(0.1) * f32(step) + fn) / vmax
        scale_is = f32(1.0) / iscale_is
        mse = f32(0.0)
        for i in range(n):
            l = min(nearest_int(iscale_is * x[i]), nmax)
            diff = x[i] - scale_is * f32(l)
            mse += qw[i] * diff * diff
        if mse < best_mse:
            best_mse = mse
            iscale = iscale_is
    sumlx = f32(0.0)
    suml2 = f32(0.0)
    for i in range(n):
        l = min(nearest_int(iscale * x[i]), nmax)
        L[i] = l & 0xFF
        w = qw[i]
        fl = f32(l)
        sumlx += w * x[i] * fl
        suml2 += w * fl * fl
    for _ in range(5):
        n_changed = 0
        for i in range(n):
            w = qw[i]
            li = f32(L[i])
            slx = sumlx - w * x[i] * li
            sl2 = suml2 - w * li * li
            if slx > 0 and sl2 > 0:
                new_l = min(nearest_int(x[i] * sl2 / slx), nmax)
                if new_l != L[i]:
                    fl = f32(new_l)
                    slx += w * x[i] * fl
                    sl2 += w * fl * fl
                    if slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l & 0xFF
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    return sumlx / suml2 if suml2 > 0 else f32(0.0)


@njit(cache=True, error_model="numpy")
def best_index_int8(values: np.ndarray, x: float) -> int:
    """Index of the entry of the sorted table ``values`` nearest to ``x`` (ties go up).

    ggml's ``best_index_int8``: clamp to the ends, bisect, then compare the two distances
    in float32 (``x - lo < hi - x`` picks the lower one).
    """
    n = values.shape[0]
    if x <= values[0]:
        return 0
    if x >= values[n - 1]:
        return n - 1
    lo = 0
    hi = n - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if x < values[mid]:
            hi = mid
        else:
            lo = mid
    if x - values[hi - 1] < values[hi] - x:
        return hi - 1
    return hi
