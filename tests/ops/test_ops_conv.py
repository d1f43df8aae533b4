"""IM2COL (and conv_1d built on it), pooling and upscaling against direct loop references."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.opcheck import NMSE_MATMUL, OpCase, assert_close, round_f16, values
from pyggml.ops import builders as B
from pyggml.types import GGMLType

F32, F16 = GGMLType.F32, GGMLType.F16


def _im2col_ref(x: np.ndarray, kh: int, kw: int, s: tuple[int, int], p: tuple[int, int],
                d: tuple[int, int], oh: int, ow: int) -> np.ndarray:
    """x (N, IC, IH, IW) -> (N, OH, OW, IC*KH*KW) by explicit loops."""
    n, ic, ih, iw = x.shape
    out = np.zeros((n, oh, ow, ic * kh * kw), dtype=np.float32)
    for b in range(n):
        for oy in range(oh):
            for ox in range(ow):
                for c in range(ic):
                    for ky in range(kh):
                        for kx in range(kw):
                            yy = oy * s[1] + ky * d[1] - p[1]
                            xx = ox * s[0] + kx * d[0] - p[0]
                            if 0 <= yy < ih and 0 <= xx < iw:
                                out[b, oy, ox, c * kh * kw + ky * kw + kx] = x[b, c, yy, xx]
    return out


@pytest.mark.parametrize("dst_type", [F32, F16])
def test_im2col_2d(dst_type: GGMLType) -> None:
    c = OpCase()
    kern = c.tensor(F32, 3, 2, 2, 4)  # [KW, KH, IC, OC]
    img = c.tensor(F32, 7, 6, 2, 2)  # [IW, IH, IC, N]
    s, p, d = (2, 1), (1, 0), (1, 2)
    out = B.im2col(c.ctx, kern, img, s[0], s[1], p[0], p[1], d[0], d[1], True, dst_type)
    got = c.compute(out)
    oh, ow = out.ne[2], out.ne[1]
    ref = _im2col_ref(values(img), 2, 3, s, p, d, oh, ow)
    assert_close(got, round_f16(ref) if dst_type == F16 else ref)


def test_im2col_1d() -> None:
    c = OpCase()
    kern = c.tensor(F32, 3, 2, 5)  # [K, IC, OC]
    sig = c.tensor(F32, 11, 2, 3)  # [L, IC, N]
    out = B.im2col(c.ctx, kern, sig, 2, 0, 1, 0, 1, 0, False, F32)
    got = c.compute(out)
    x = values(sig)[0][:, :, None, :]  # (N, IC, 1, L)
    ref = _im2col_ref(x, 1, 3, (2, 1), (1, 0), (1, 1), 1, out.ne[1])  # (N, 1, OW, IC*K)
    assert_close(got, ref.reshape(1, 3, out.ne[1], 6))


def test_conv_1d() -> None:
    c = OpCase()
    kern = c.tensor(F32, 3, 2, 4)  # [K, IC, OC]
    sig = c.tensor(F32, 10, 2, 1)  # [L, IC, N]
    got = c.compute(B.conv_1d(c.ctx, kern, sig, 1, 1, 1))
    k = values(kern)[0].astype(np.float64)  # (OC, IC, K)
    x = np.pad(values(sig)[0, 0].astype(np.float64), ((0, 0), (1, 1)))  # (IC, L+2)
    ref = np.array([[(k[oc] * x[:, t : t + 3]).sum() for t in range(10)] for oc in range(4)])
    # im2col goes through F16, so the inputs are rounded to fp16 first, as in ggml
    assert_close(got.reshape(4, 10), ref.astype(np.float32), NMSE_MATMUL)


@pytest.mark.parametrize("op", [B.OpPool.MAX, B.OpPool.AVG], ids=["max", "avg"])
def test_pool_1d(op: B.OpPool) -> None:
    c = OpCase()
    a = c.tensor(F32, 13, 3, 2)
    k, s, p = 3, 2, 1
    out = B.pool_1d(c.ctx, a, op, k, s, p)
    got = c.compute(out)
    x = values(a)
    ref = np.zeros(got.shape, dtype=np.float64)
    for o in range(out.ne[0]):
        taps = [j for j in range(o * s - p, o * s - p + k) if 0 <= j < 13]
        w = x[..., taps].astype(np.float64)
        ref[..., o] = w.max(axis=-1) if op == B.OpPool.MAX else w.mean(axis=-1)  # avg over in-range taps
    assert_close(got, ref.astype(np.float32))


@pytest.mark.parametrize("op", [B.OpPool.MAX, B.OpPool.AVG], ids=["max", "avg"])
def test_pool_2d(op: B.OpPool) -> None:
    c = OpCase()
    a = c.tensor(F32, 9, 8, 3, 2)
    k0, k1, s0, s1, p0, p1 = 3, 2, 2, 2, 1, 1
    out = B.pool_2d(c.ctx, a, op, k0, k1, s0, s1, p0, p1)
    got = c.compute(out)
    x = values(a).astype(np.float64)
    ref = np.zeros(got.shape)
    for oy in range(out.ne[1]):
        for ox in range(out.ne[0]):
            ys = [y for y in range(oy * s1 - p1, oy * s1 - p1 + k1) if 0 <= y < 8]
            xs = [xx for xx in range(ox * s0 - p0, ox * s0 - p0 + k0) if 0 <= xx < 9]
            w = x[:, :, ys][:, :, :, xs]
            ref[:, :, oy, ox] = w.max(axis=(2, 3)) if op == B.OpPool.MAX else w.sum(axis=(2, 3)) / (k0 * k1)
    assert_close(got, ref.astype(np.float32))


def test_upscale_nearest() -> None:
    c = OpCase()
    a = c.tensor(F32, 4, 3, 2)
    got = c.compute(B.upscale(c.ctx, a, 2))
    ref = values(a).repeat(2, axis=3).repeat(2, axis=2)
    assert_close(got, ref)


def _bilinear_ref(x: np.ndarray, oh: int, ow: int, align: bool) -> np.ndarray:
    ih, iw = x.shape[-2:]
    out = np.zeros((*x.shape[:-2], oh, ow))
    for oy in range(oh):
        for ox in range(ow):
            if align:
                y = oy * (ih - 1) / (oh - 1)
                xx = ox * (iw - 1) / (ow - 1)
            else:
                y = (oy + 0.5) * ih / oh - 0.5
                xx = (ox + 0.5) * iw / ow - 0.5
            y0, x0 = int(np.floor(y)), int(np.floor(xx))
            dy = min(max(y - max(0, min(y0, ih - 1)), 0), 1)
            dx = min(max(xx - max(0, min(x0, iw - 1)), 0), 1)
            yc = [max(0, min(y0, ih - 1)), max(0, min(y0 + 1, ih - 1))]
            xc = [max(0, min(x0, iw - 1)), max(0, min(x0 + 1, iw - 1))]
            out[..., oy, ox] = (x[..., yc[0], xc[0]] * (1 - dx) * (1 - dy) + x[..., yc[0], xc[1]] * dx * (1 - dy)
                                + x[..., yc[1], xc[0]] * (1 - dx) * dy + x[..., yc[1], xc[1]] * dx * dy)
    return out


@pytest.mark.parametrize("align", [False, True])
def test_upscale_bilinear(align: bool) -> None:
    c = OpCase()
    a = c.tensor(F32, 5, 4, 2)
    mode = B.ScaleMode.BILINEAR | (B.GGML_SCALE_FLAG_ALIGN_CORNERS if align else 0)
    got = c.compute(B.interpolate(c.ctx, a, 9, 7, 2, 1, mode))
    assert_close(got, _bilinear_ref(values(a).astype(np.float64), 7, 9, align).astype(np.float32))


def _keys(t: float, a: float = -0.75) -> float:
    """Keys' cubic convolution kernel."""
    t = abs(t)
    if t <= 1:
        return (a + 2) * t**3 - (a + 3) * t**2 + 1
    if t < 2:
        return a * t**3 - 5 * a * t**2 + 8 * a * t - 4 * a
    return 0.0


def test_upscale_bicubic() -> None:
    """Bicubic (a = -0.75, border pixels clamped, half-pixel centres) against a direct loop."""
    c = OpCase()
    a = c.tensor(F32, 6, 5)
    got = c.compute(B.interpolate(c.ctx, a, 11, 9, 1, 1, B.ScaleMode.BICUBIC))[0, 0]
    x = values(a)[0, 0].astype(np.float64)
    ref = np.zeros((9, 11))
    for oy in range(9):
        for ox in range(11):
            y = (oy + 0.5) * 5 / 9 - 0.5
            xx = (ox + 0.5) * 6 / 11 - 0.5
            y0, x0 = int(np.floor(y)), int(np.floor(xx))
            acc = 0.0
            for j in range(-1, 3):
                for i in range(-1, 3):
                    px = x[min(max(y0 + j, 0), 4), min(max(x0 + i, 0), 5)]
                    acc += px * _keys(y - (y0 + j)) * _keys(xx - (x0 + i))
            ref[oy, ox] = acc
    assert_close(got, ref.astype(np.float32))
