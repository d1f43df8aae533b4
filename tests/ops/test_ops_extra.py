"""Backward, loss and optimizer ops, convolutions, ROLL, PAD_REFLECT_1D, window and rel-pos ops:
built with their builders (ops/<family>.py, see ops/table.toml) and checked against math."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.opcheck import OpCase, assert_close, values
from pyggml.ops import builders as B
from pyggml.types import GGMLType

F32, I32 = GGMLType.F32, GGMLType.I32




def test_silu_back_is_the_derivative() -> None:
    c = OpCase()
    dy, x = c.tensor(F32, 30, 3), c.tensor(F32, 30, 3, lo=-4, hi=4)
    got = c.compute(B.silu_back(c.ctx, dy, x))
    xv = values(x).astype(np.float64)
    h = 1e-6
    silu = lambda v: v / (1 + np.exp(-v))  # noqa: E731
    deriv = (silu(xv + h) - silu(xv - h)) / (2 * h)
    assert_close(got, (values(dy) * deriv).astype(np.float32), max_nmse=1e-9)


def test_rms_norm_back_is_the_vjp() -> None:
    c = OpCase()
    dz, x = c.tensor(F32, 16, 4), c.tensor(F32, 16, 4)
    eps = 1e-5
    got = c.compute(B.rms_norm_back(c.ctx, dz, x, eps))
    xv, g = values(x).astype(np.float64), values(dz).astype(np.float64)
    ms = (xv**2).mean(axis=-1, keepdims=True) + eps
    ref = (g - xv * (xv * g).mean(axis=-1, keepdims=True) / ms) / np.sqrt(ms)
    assert_close(got, ref.astype(np.float32))


def test_soft_max_back_is_the_vjp() -> None:
    c = OpCase()
    x = c.tensor(F32, 12, 5)
    dy = c.tensor(F32, 12, 5)
    scale = 0.7
    xv = values(x).astype(np.float64) * scale
    y = np.exp(xv - xv.max(axis=-1, keepdims=True))
    y /= y.sum(axis=-1, keepdims=True)
    yt = c.tensor(F32, 12, 5, data=y.astype(np.float32))
    got = c.compute(B.soft_max_ext_back(c.ctx, dy, yt, scale, 0.0))
    g = values(dy).astype(np.float64)
    yv = values(yt).astype(np.float64)
    ref = scale * yv * (g - (yv * g).sum(axis=-1, keepdims=True))
    assert_close(got, ref.astype(np.float32))


def test_rope_back_undoes_rope() -> None:
    c = OpCase()
    a = c.tensor(F32, 16, 2, 4)
    pos = c.ints(I32, 4, data=np.array([0, 7, 30, 99]))
    fwd = B.rope(c.ctx, a, pos, 16, B.GGML_ROPE_TYPE_NEOX)
    back = B.rope_ext_back(c.ctx, fwd, pos, None, 16, B.GGML_ROPE_TYPE_NEOX, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)
    got = c.compute(back)
    assert_close(got, values(a), max_nmse=1e-12)


def test_get_rows_back_scatter_adds() -> None:
    c = OpCase()
    g = c.tensor(F32, 6, 4)
    ids = np.array([2, 0, 2, 5])
    out = B.get_rows_back(c.ctx, g, c.ints(I32, 4, data=ids), c.ctx.new_tensor(F32, 6, 7))
    got = c.compute(out)
    ref = np.zeros((7, 6))
    for i, r in enumerate(ids):
        ref[r] += values(g)[0, 0, i]
    assert_close(got[0, 0], ref.astype(np.float32))


@pytest.mark.parametrize("shifts", [(1, 0, 0, 0), (-2, 1, 1, 0)])
def test_roll(shifts: tuple[int, int, int, int]) -> None:
    c = OpCase()
    a = c.tensor(F32, 5, 3, 2)
    got = c.compute(B.roll(c.ctx, a, *shifts))
    x = values(a)
    ref = np.empty_like(x)
    for i2 in range(2):
        for i1 in range(3):
            for i0 in range(5):
                ref[0, i2, i1, i0] = x[0, (i2 - shifts[2]) % 2, (i1 - shifts[1]) % 3, (i0 - shifts[0]) % 5]
    assert_close(got, ref, max_nmse=0.0)


def test_pad_reflect_1d() -> None:
    c = OpCase()
    a = c.tensor(F32, 5, 2)
    got = c.compute(B.pad_reflect_1d(c.ctx, a, 3, 2))
    x = values(a)[0, 0]
    idx = [3, 2, 1, 0, 1, 2, 3, 4, 3, 2]  # reflect without repeating the edge
    assert_close(got[0, 0], x[:, idx], max_nmse=0.0)


@pytest.mark.parametrize("kt", [F32, GGMLType.F16])
def test_conv_2d_direct(kt: GGMLType) -> None:
    c = OpCase()
    kern = c.tensor(kt, 3, 2, 3, 4)  # [KW, KH, IC, OC]
    img = c.tensor(F32, 7, 6, 3, 2)  # [W, H, IC, N]
    s0, s1, p0, p1, d0, d1 = 2, 1, 1, 0, 1, 2
    ow = (7 + 2 * p0 - d0 * 2 - 1) // s0 + 1
    oh = (6 + 2 * p1 - d1 * 1 - 1) // s1 + 1
    got = c.compute(B.conv_2d_direct(c.ctx, kern, img, s0, s1, p0, p1, d0, d1))
    k = values(kern).astype(np.float64)
    x = values(img)
    if kt == GGMLType.F16:
        x = x.astype(np.float16).astype(np.float32)
    x = x.astype(np.float64)
    ref = np.zeros((2, 4, oh, ow))
    for n in range(2):
        for oc in range(4):
            for oy in range(oh):
                for ox in range(ow):
                    acc = 0.0
                    for ic in range(3):
                        for ky in range(2):
                            for kx in range(3):
                                yy, xx = oy * s1 + ky * d1 - p1, ox * s0 + kx * d0 - p0
                                if 0 <= yy < 6 and 0 <= xx < 7:
                                    acc += k[oc, ic, ky, kx] * x[n, ic, yy, xx]
                    ref[n, oc, oy, ox] = acc
    assert_close(got, ref.astype(np.float32))


def test_conv_2d_dw_direct() -> None:
    c = OpCase()
    kern = c.tensor(F32, 3, 3, 1, 4)  # [KW, KH, 1, C]
    img = c.tensor(F32, 6, 5, 4, 1)
    got = c.compute(B.conv_2d_dw_direct(c.ctx, kern, img, 1, 1, 1, 1, 1, 1))
    k = values(kern)[:, 0].astype(np.float64)
    x = np.pad(values(img)[0].astype(np.float64), ((0, 0), (1, 1), (1, 1)))
    ref = np.zeros((1, 4, 5, 6))
    for ch in range(4):
        for oy in range(5):
            for ox in range(6):
                ref[0, ch, oy, ox] = (k[ch] * x[ch, oy : oy + 3, ox : ox + 3]).sum()
    assert_close(got, ref.astype(np.float32))


def test_conv_transpose_1d() -> None:
    c = OpCase()
    kern = c.tensor(F32, 3, 2, 4)  # [K, OC, IC]
    src = c.tensor(F32, 5, 4)  # [L, IC]
    s0 = 2
    got = c.compute(B.conv_transpose_1d(c.ctx, kern, src, s0, 0, 1))
    w, x = values(kern)[0].astype(np.float64), values(src)[0, 0].astype(np.float64)
    ref = np.zeros((2, 11))
    for t in range(5):
        for k in range(3):
            for oc in range(2):
                ref[oc, t * s0 + k] += (w[:, oc, k] * x[:, t]).sum()
    assert_close(got[0, 0], ref.astype(np.float32))


def test_conv_transpose_2d() -> None:
    c = OpCase()
    kern = c.tensor(F32, 2, 3, 2, 3)  # [KW, KH, OC, IC]
    src = c.tensor(F32, 4, 3, 3)  # [W, H, IC]
    st = 2
    ow, oh = (4 - 1) * st + 2, (3 - 1) * st + 3
    got = c.compute(B.conv_transpose_2d_p0(c.ctx, kern, src, st))
    w, x = values(kern).astype(np.float64), values(src)[0].astype(np.float64)
    ref = np.zeros((2, oh, ow))
    for y in range(3):
        for xx in range(4):
            for ky in range(3):
                for kx in range(2):
                    ref[:, y * st + ky, xx * st + kx] += (w[:, :, ky, kx] * x[:, y, xx][:, None]).sum(axis=0)
    assert_close(got[0], ref.astype(np.float32))


def test_cross_entropy_loss_and_back() -> None:
    c = OpCase()
    logits = c.tensor(F32, 10, 4, lo=-3, hi=3)
    p = c.rng.uniform(0, 1, size=(4, 10))
    labels = c.tensor(F32, 10, 4, data=(p / p.sum(axis=1, keepdims=True)).astype(np.float32))
    loss = B.cross_entropy_loss(c.ctx, logits, labels)
    got = c.compute(loss).reshape(-1)[0]
    x = values(logits)[0, 0].astype(np.float64)
    lsm = x - x.max(axis=1, keepdims=True)
    lsm -= np.log(np.exp(lsm).sum(axis=1, keepdims=True))
    y = values(labels)[0, 0].astype(np.float64)
    ref = -(lsm * y).sum() / 4
    assert abs(got - ref) < 1e-6 * max(1.0, abs(ref))
    grad = c.tensor(F32, 1, data=np.array([1.5], dtype=np.float32))
    back = B.cross_entropy_loss_back(c.ctx, grad, logits, labels)
    gb = c.compute(back)[0, 0]
    assert_close(gb, ((np.exp(lsm) - y) * 1.5 / 4).astype(np.float32))


def test_opt_step_adamw_and_sgd() -> None:
    c = OpCase()
    w0 = c.rng.uniform(-1, 1, size=8).astype(np.float32)
    g0 = c.rng.uniform(-1, 1, size=8).astype(np.float32)
    w = c.tensor(F32, 8, data=w0)
    g = c.tensor(F32, 8, data=g0)
    m = c.tensor(F32, 8, data=np.zeros(8, np.float32))
    v = c.tensor(F32, 8, data=np.zeros(8, np.float32))
    alpha, b1, b2, eps, wd = 1e-2, 0.9, 0.999, 1e-8, 0.1
    prm = c.tensor(F32, 7, data=np.array([alpha, b1, b2, eps, wd, 1 / (1 - b1), 1 / (1 - b2)], np.float32))
    w.set_param()
    step = B.opt_step_adamw(c.ctx, w, g, m, v, prm)
    c.compute(step)
    mm, vv = (1 - b1) * g0, (1 - b2) * g0.astype(np.float64) ** 2
    ref = w0 * (1 - alpha * wd) - alpha * (mm / (1 - b1)) / (np.sqrt(vv / (1 - b2)) + eps)
    assert_close(values(w).reshape(-1), ref.astype(np.float32), max_nmse=1e-12)
    assert_close(values(m).reshape(-1), mm.astype(np.float32))
    w2 = c.tensor(F32, 8, data=w0)
    sp = c.tensor(F32, 2, data=np.array([0.5, 0.2], np.float32))
    w2.set_param()
    sgd = B.opt_step_sgd(c.ctx, w2, g, sp)
    c.compute(sgd)
    assert_close(values(w2).reshape(-1), (w0 * (1 - 0.5 * 0.2) - 0.5 * g0).astype(np.float32))


def test_win_part_and_unpart_round_trip() -> None:
    c = OpCase()
    ch, wd, h, w = 3, 5, 4, 3
    a = c.tensor(F32, ch, wd, h)
    npx, npy = (wd + (w - wd % w) % w) // w, (h + (w - h % w) % w) // w
    part = B.win_part(c.ctx, a, w)
    got = c.compute(part)
    x = values(a)[0]  # (H, W, C)
    ref = np.zeros((npx * npy, w, w, ch), dtype=np.float32)
    for py in range(npy):
        for px in range(npx):
            for i2 in range(w):
                for i1 in range(w):
                    if py * w + i2 < h and px * w + i1 < wd:
                        ref[py * npx + px, i2, i1] = x[py * w + i2, px * w + i1]
    assert_close(got, ref, max_nmse=0.0)
    back = B.win_unpart(c.ctx, part, wd, h, w)
    assert_close(c.compute(back), values(a), max_nmse=0.0)


def test_get_rel_pos() -> None:
    c = OpCase()
    ch, k = 4, 3
    a = c.tensor(GGMLType.F16, ch, 2 * k - 1)
    out = B.get_rel_pos(c.ctx, a, k, k)
    got = c.compute(out)
    x = values(a)[0, 0]
    ref = np.array([[x[(k - i1 - 1) + i2] for i1 in range(k)] for i2 in range(k)])[None]
    assert_close(got, ref, max_nmse=0.0)


def test_add_rel_pos() -> None:
    c = OpCase()
    n, b1, b2, b3 = 3, 2, 2, 2
    a = c.tensor(F32, n * n, b1 * b2, b3)
    pw, ph = c.tensor(F32, n, b1, b2, b3), c.tensor(F32, n, b1, b2, b3)
    got = c.compute(B.add_rel_pos(c.ctx, a, pw, ph))
    dst = values(a).reshape(-1).astype(np.float64).copy()
    pwf, phf = values(pw).reshape(-1), values(ph).reshape(-1)
    for jp0 in range(pwf.size):  # ggml's loop, index for index
        i10 = jp0 % n
        jdh = jp0 * n
        jdw = jdh - (n - 1) * i10
        for j in range(n):
            dst[jdh + j] += phf[jp0]
            dst[jdw + j * n] += pwf[jp0]
    assert_close(got.reshape(-1), dst.astype(np.float32))


@pytest.mark.parametrize("op", [0, 1], ids=["max", "avg"])
def test_pool_2d_back(op: int) -> None:
    c = OpCase()
    k0 = k1 = s0 = s1 = 2
    p0 = p1 = 1
    xf = c.tensor(F32, 5, 4, 2)
    ow, oh = (5 + 2 * p0 - k0) // s0 + 1, (4 + 2 * p1 - k1) // s1 + 1
    grad = c.tensor(F32, ow, oh, 2)
    got = c.compute(B.pool_2d_back(c.ctx, grad, xf, op, k0, k1, s0, s1, p0, p1))
    x, g = values(xf)[0], values(grad)[0]
    ref = np.zeros_like(x, dtype=np.float64)
    for ch in range(2):
        for oy in range(oh):
            for ox in range(ow):
                cells = [(y, xx) for y in range(oy * s1 - p1, oy * s1 - p1 + k1)
                         for xx in range(ox * s0 - p0, ox * s0 - p0 + k0) if 0 <= y < 4 and 0 <= xx < 5]
                if op == 1:
                    for y, xx in cells:
                        ref[ch, y, xx] += g[ch, oy, ox] / (k0 * k1)
                else:
                    best = max(cells, key=lambda p, ch=ch: (x[ch, p[0], p[1]], -cells.index(p)))
                    ref[ch, best[0], best[1]] += g[ch, oy, ox]
    assert_close(got[0], ref.astype(np.float32))


@pytest.mark.parametrize("is_2d", [True, False])
def test_im2col_back_is_the_adjoint_of_im2col(is_2d: bool) -> None:
    """<im2col(x), g> == <x, im2col_back(g)> for any x and g."""
    c = OpCase()
    if is_2d:
        kern, img = c.tensor(F32, 3, 2, 2, 1), c.tensor(F32, 7, 6, 2, 2)
        s0, s1, p0, p1, d0, d1 = 2, 1, 1, 1, 1, 2
    else:
        kern, img = c.tensor(F32, 3, 2, 1), c.tensor(F32, 9, 2, 3)
        s0, s1, p0, p1, d0, d1 = 2, 0, 1, 0, 1, 0
    col = B.im2col(c.ctx, kern, img, s0, s1, p0, p1, d0, d1, is_2d, F32)
    fwd = c.compute(col)
    g = c.tensor(F32, *col.ne)
    back = B.im2col_back(c.ctx, g, kern, list(img.ne), s0, s1, p0, p1, d0, d1, is_2d)
    got = c.compute(back)
    lhs = float((fwd.astype(np.float64) * values(g)).sum())
    rhs = float((values(img).astype(np.float64) * got).sum())
    assert abs(lhs - rhs) < 1e-5 * max(1.0, abs(lhs))


def test_col2im_1d() -> None:
    c = OpCase()
    k, oc, t_in, s0, p0 = 3, 2, 5, 2, 1
    a = c.tensor(F32, k * oc, t_in)
    t_out = (t_in - 1) * s0 + k - 2 * p0
    got = c.compute(B.col2im_1d(c.ctx, a, s0, oc, p0))
    col = values(a)[0, 0].astype(np.float64)
    ref = np.zeros((oc, t_out))
    for o in range(oc):
        for t in range(t_out):
            for ti in range(t_in):
                kk = t + p0 - ti * s0
                if 0 <= kk < k:
                    ref[o, t] += col[ti, o * k + kk]
    assert_close(got[0, 0], ref.astype(np.float32))


def _conv3d_ref(x: np.ndarray, k: np.ndarray, s: tuple, p: tuple, d: tuple, o: tuple) -> np.ndarray:
    """x (N, IC, D, H, W), k (OC, IC, KD, KH, KW) -> (N, OC, OD, OH, OW); tuples in (w, h, d) order."""
    n = x.shape[0]
    oc, _, kd, kh, kw = k.shape
    ow, oh, od = o
    out = np.zeros((n, oc, od, oh, ow))
    for zd in range(od):
        for y in range(oh):
            for xx in range(ow):
                for a in range(kd):
                    for b in range(kh):
                        for e in range(kw):
                            zi = zd * s[2] + a * d[2] - p[2]
                            yi = y * s[1] + b * d[1] - p[1]
                            xi = xx * s[0] + e * d[0] - p[0]
                            if 0 <= zi < x.shape[2] and 0 <= yi < x.shape[3] and 0 <= xi < x.shape[4]:
                                out[:, :, zd, y, xx] += x[:, :, zi, yi, xi] @ k[:, :, a, b, e].T
    return out


def test_im2col_3d_and_conv_3d() -> None:
    c = OpCase()
    ic, oc, n = 2, 3, 2
    kern = c.tensor(F32, 2, 2, 2, oc * ic)  # [KW, KH, KD, OC*IC]
    img = c.tensor(F32, 4, 4, 3, ic * n)  # [W, H, D, IC*N]
    s, p, d = (1, 2, 1), (1, 0, 0), (1, 1, 1)
    ow, oh, od = (4 + 2 - 1 - 1) // 1 + 1, (4 + 0 - 1 - 1) // 2 + 1, (3 + 0 - 1 - 1) // 1 + 1
    params = [*s, *p, *d]
    x = values(img).astype(np.float64).reshape(n, ic, 3, 4, 4)
    k = values(kern).astype(np.float64).reshape(oc, ic, 2, 2, 2)
    ref = _conv3d_ref(x, k, s, p, d, (ow, oh, od))
    got = c.compute(B.conv_3d_direct(c.ctx, kern, img, *params, ic, n, oc))
    assert_close(got, ref.reshape(n * oc, od, oh, ow).astype(np.float32))
    col = c.compute(B.im2col_3d(c.ctx, kern, img, ic, *params, F32))
    # im2col_3d rows times the flattened kernel rows reproduce the convolution
    cols = col.reshape(n, od, oh, ow, ic * 8).astype(np.float64)
    via = np.einsum("nzyxk,ok->nozyx", cols, k.reshape(oc, ic * 8))
    assert_close(via.astype(np.float32), ref.astype(np.float32))
