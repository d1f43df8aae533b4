"""Convolution and image kernels: IM2COL (and IM2COL_BACK, IM2COL_3D), the direct convolutions
(CONV_2D, CONV_2D_DW, CONV_3D, CONV_TRANSPOSE_1D/2D), COL2IM_1D, POOL_1D, POOL_2D (and
POOL_2D_BACK), UPSCALE, PAD, PAD_REFLECT_1D.

ggml builds conv_1d / conv_2d from IM2COL followed by MUL_MAT, so IM2COL's layout is the
contract: [N, IC, IH, IW] -> [N, OH, OW, IC*KH*KW] (1-D: IH = KH = OH = 1).

Builders: pyggml/ops/conv.py (the same family).
"""

from __future__ import annotations

import numpy as np

from ....ops.enums import Op
from ....tensor import Tensor
from ....types import GGMLType
from .._common import F16, F32, KernelInputError, load_f32, require_f32, require_types, shape4, store
from ..kernel_table import kernel

GGML_OP_POOL_MAX = 0
GGML_OP_POOL_AVG = 1
_FLT_MAX = np.float32(np.finfo(np.float32).max)

GGML_SCALE_MODE_NEAREST = 0
GGML_SCALE_MODE_BILINEAR = 1
GGML_SCALE_MODE_BICUBIC = 2
GGML_SCALE_FLAG_ALIGN_CORNERS = 1 << 8
GGML_SCALE_FLAG_ANTIALIAS = 1 << 9


@kernel(Op.IM2COL)
def im2col(node: Tensor, n_threads: int) -> None:
    """Unfold the input (src1) into columns; op_params i32 {s0, s1, p0, p1, d0, d1, is_2D}.

    Out-of-image taps read 0. The kernel (src0) only supplies KW (and KH).
    """
    kern, img = node.src[0], node.src[1]
    require_types(node, img, (F32, F16))
    require_types(node, node, (F32, F16))
    s0, s1, p0, p1, d0, d1, is_2d = (node.get_op_params_i32(i) for i in range(7))
    x = load_f32(img)
    if is_2d:
        n, ic, ih, iw = x.shape
        kh, kw = kern.ne[1], kern.ne[0]
        oh, ow = node.ne[2], node.ne[1]
    else:
        n, ic, iw = x.shape[1], x.shape[2], x.shape[3]
        x = x.reshape(n, ic, 1, iw)
        ih, kh, kw, oh, ow = 1, 1, kern.ne[0], 1, node.ne[1]
        p1, s1, d1 = 0, 1, 1
    rows = np.arange(oh)[:, None] * s1 + np.arange(kh)[None, :] * d1 - p1  # (oh, kh)
    cols = np.arange(ow)[:, None] * s0 + np.arange(kw)[None, :] * d0 - p0  # (ow, kw)
    row_ok = (rows >= 0) & (rows < ih)
    col_ok = (cols >= 0) & (cols < iw)
    g = x[:, :, np.clip(rows, 0, ih - 1)[:, None, :, None], np.clip(cols, 0, iw - 1)[None, :, None, :]]
    # g: (n, ic, oh, ow, kh, kw); zero the taps that fall outside the image
    ok = row_ok[:, None, :, None] & col_ok[None, :, None, :]
    g = np.where(ok[None, None], g, np.float32(0.0))
    out = g.transpose(0, 2, 3, 1, 4, 5).reshape(n, oh, ow, ic * kh * kw)
    store(node, out.reshape(shape4(node)))


@kernel(Op.POOL_1D)
def pool_1d(node: Tensor, n_threads: int) -> None:
    """Max/avg pooling along dim 0; op_params i32 {op, k0, s0, p0}. Avg divides by the in-range taps."""
    a = node.src[0]
    require_types(node, a, (F32, F16))
    op, k, s, p = (node.get_op_params_i32(i) for i in range(4))
    x = load_f32(a)
    iw, ow = a.ne[0], node.ne[0]
    idx = np.arange(ow)[:, None] * s + np.arange(k)[None, :] - p  # (ow, k)
    ok = (idx >= 0) & (idx < iw)
    taps = x[..., np.clip(idx, 0, iw - 1)]  # (..., ow, k)
    if op == GGML_OP_POOL_MAX:
        res = np.where(ok, taps, -_FLT_MAX).max(axis=-1)
    elif op == GGML_OP_POOL_AVG:
        cnt = ok.sum(axis=-1).astype(np.float32)
        tot = np.where(ok, taps, np.float32(0.0)).sum(axis=-1, dtype=np.float32)
        res = np.where(cnt > 0, tot / np.maximum(cnt, 1), np.float32(0.0))
    else:
        raise KernelInputError(f"POOL_1D: unknown pool op {op}")
    store(node, res)


@kernel(Op.POOL_2D)
def pool_2d(node: Tensor, n_threads: int) -> None:
    """Max/avg pooling over dims 0 and 1; op_params i32 {op, k0, k1, s0, s1, p0, p1}.

    As in ggml, avg divides by k0*k1 even where the window hangs over the padding.
    """
    a = node.src[0]
    require_types(node, a, (F32, F16))
    op, k0, k1, s0, s1, p0, p1 = (node.get_op_params_i32(i) for i in range(7))
    x = load_f32(a)
    iw, ih = a.ne[0], a.ne[1]
    ow, oh = node.ne[0], node.ne[1]
    ys = np.arange(oh)[:, None] * s1 + np.arange(k1)[None, :] - p1  # (oh, k1)
    xs = np.arange(ow)[:, None] * s0 + np.arange(k0)[None, :] - p0  # (ow, k0)
    ok = ((ys >= 0) & (ys < ih))[:, None, :, None] & ((xs >= 0) & (xs < iw))[None, :, None, :]
    taps = x[..., np.clip(ys, 0, ih - 1)[:, None, :, None], np.clip(xs, 0, iw - 1)[None, :, None, :]]
    # taps: (ne3, ne2, oh, ow, k1, k0)
    if op == GGML_OP_POOL_MAX:
        res = np.where(ok, taps, -_FLT_MAX).max(axis=(-2, -1))
    elif op == GGML_OP_POOL_AVG:
        res = np.where(ok, taps, np.float32(0.0)).sum(axis=(-2, -1), dtype=np.float32) / np.float32(k0 * k1)
    else:
        raise KernelInputError(f"POOL_2D: unknown pool op {op}")
    store(node, res)


def _bicubic_weights(t: np.ndarray) -> list[np.ndarray]:
    """Cubic convolution weights (a = -0.75, as PyTorch) for offsets -1, 0, 1, 2 around t in [0, 1)."""
    a = np.float32(-0.75)

    def w1(v: np.ndarray) -> np.ndarray:
        return ((a + 2) * v - (a + 3)) * v * v + 1

    def w2(v: np.ndarray) -> np.ndarray:
        return ((a * v - 5 * a) * v + 8 * a) * v - 4 * a

    return [w2(t + 1), w1(t), w1(1 - t), w2(2 - t)]


@kernel(Op.UPSCALE)
def upscale(node: Tensor, n_threads: int) -> None:
    """Resize to dst's shape: nearest, bilinear or bicubic (op_params i32[0] = mode | flags).

    Scale factors are float ne_dst/ne_src; align-corners maps ends onto ends for dims 0 and 1.
    Dims 2 and 3 always resample by nearest.
    """
    a = node.src[0]
    require_f32(node, a, node)
    flags = node.get_op_params_i32(0)
    mode = flags & 0xFF
    x = a.view4()
    s3, s2, s1, s0 = x.shape
    d3, d2, d1, d0 = shape4(node)
    sf = [np.float32(d) / np.float32(s) for d, s in ((d0, s0), (d1, s1), (d2, s2), (d3, s3))]
    offset = np.float32(0.5)
    if flags & GGML_SCALE_FLAG_ALIGN_CORNERS:
        offset = np.float32(0.0)
        if d0 > 1 and s0 > 1:
            sf[0] = np.float32(d0 - 1) / np.float32(s0 - 1)
        if d1 > 1 and s1 > 1:
            sf[1] = np.float32(d1 - 1) / np.float32(s1 - 1)
    i3 = (np.arange(d3).astype(np.float32) / sf[3]).astype(np.int64)
    i2 = (np.arange(d2).astype(np.float32) / sf[2]).astype(np.int64)
    x = x[i3][:, i2]
    if mode == GGML_SCALE_MODE_NEAREST:
        i1 = (np.arange(d1).astype(np.float32) / sf[1]).astype(np.int64)
        i0 = (np.arange(d0).astype(np.float32) / sf[0]).astype(np.int64)
        node.view4()[...] = x[:, :, i1][:, :, :, i0]
        return
    if flags & GGML_SCALE_FLAG_ANTIALIAS and mode == GGML_SCALE_MODE_BILINEAR:  # other modes ignore the flag
        w1, w0 = _antialias_weights(d1, s1, sf[1], offset), _antialias_weights(d0, s0, sf[0], offset)
        val = np.matmul(np.matmul(w1, x), w0.T)  # (.., d1, d0): sum over sy, sx of wy*wx*pixel
        tot = w1.sum(axis=1, dtype=np.float32)[:, None] * w0.sum(axis=1, dtype=np.float32)[None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            node.view4()[...] = np.where(tot > 0, val / tot, val)
        return
    y = (np.arange(d1).astype(np.float32) + offset) / sf[1] - offset
    xx = (np.arange(d0).astype(np.float32) + offset) / sf[0] - offset
    yf, xf = np.floor(y), np.floor(xx)
    if mode == GGML_SCALE_MODE_BILINEAR:
        y0 = np.clip(yf.astype(np.int64), 0, s1 - 1)
        y1 = np.clip(yf.astype(np.int64) + 1, 0, s1 - 1)
        x0 = np.clip(xf.astype(np.int64), 0, s0 - 1)
        x1 = np.clip(xf.astype(np.int64) + 1, 0, s0 - 1)
        dy = np.clip(y - y0.astype(np.float32), 0, 1)[:, None]
        dx = np.clip(xx - x0.astype(np.float32), 0, 1)[None, :]
        a_ = x[:, :, y0][:, :, :, x0]
        b_ = x[:, :, y0][:, :, :, x1]
        c_ = x[:, :, y1][:, :, :, x0]
        d_ = x[:, :, y1][:, :, :, x1]
        one = np.float32(1)
        val = a_ * (one - dx) * (one - dy) + b_ * dx * (one - dy) + c_ * (one - dx) * dy + d_ * dx * dy
        node.view4()[...] = val
        return
    if mode == GGML_SCALE_MODE_BICUBIC:
        dy = (y - yf).astype(np.float32)
        dx = (xx - xf).astype(np.float32)
        wy = _bicubic_weights(dy)
        wx = _bicubic_weights(dx)
        yi = [np.clip(yf.astype(np.int64) + o, 0, s1 - 1) for o in (-1, 0, 1, 2)]
        xi = [np.clip(xf.astype(np.int64) + o, 0, s0 - 1) for o in (-1, 0, 1, 2)]
        rows = []
        for yy in yi:
            r = x[:, :, yy]
            rows.append(sum(r[:, :, :, xj] * wx[j][None, :] for j, xj in enumerate(xi)))
        val = sum(rows[j] * wy[j][:, None] for j in range(4))
        node.view4()[...] = val
        return
    raise KernelInputError(f"UPSCALE: unknown mode {mode}")


def _antialias_weights(n_dst: int, n_src: int, sf: np.float32, offset: np.float32) -> np.ndarray:
    """(n_dst, n_src) triangle-filter weights of antialiased bilinear resampling along one axis.

    The support widens to 1/sf source pixels when shrinking (at least 1); source pixel s weighs
    max(0, 1 - |(s - x + offset) / support|) for x = (i + offset) / sf, over the pixels in
    [trunc(x - support + offset), trunc(x + support + offset)) clipped to the image (ggml-cpu).
    """
    one = np.float32(1.0)
    support = max(one, one / sf)
    invscale = one / support
    xs = (np.arange(n_dst, dtype=np.float32) + offset) / sf
    lo = np.maximum(np.trunc(xs - support + offset), 0)[:, None]
    hi = np.minimum(np.trunc(xs + support + offset), n_src)[:, None]
    src = np.arange(n_src, dtype=np.float32)[None, :]
    w = np.maximum(one - np.abs((src - xs[:, None] + offset) * invscale), np.float32(0.0))
    return np.where((src >= lo) & (src < hi), w, np.float32(0.0)).astype(np.float32)


def _taps_2d(x: np.ndarray, kh: int, kw: int, oh: int, ow: int, s: tuple[int, int], p: tuple[int, int],
             d: tuple[int, int]) -> np.ndarray:
    """x (n, c, ih, iw) -> (n, c, oh, ow, kh, kw): the input under every kernel tap, 0 outside the image."""
    ih, iw = x.shape[-2:]
    rows = np.arange(oh)[:, None] * s[1] + np.arange(kh)[None, :] * d[1] - p[1]
    cols = np.arange(ow)[:, None] * s[0] + np.arange(kw)[None, :] * d[0] - p[0]
    ok = ((rows >= 0) & (rows < ih))[:, None, :, None] & ((cols >= 0) & (cols < iw))[None, :, None, :]
    g = x[:, :, np.clip(rows, 0, ih - 1)[:, None, :, None], np.clip(cols, 0, iw - 1)[None, :, None, :]]
    return np.where(ok[None, None], g, np.float32(0.0))


@kernel(Op.CONV_2D)
def conv_2d(node: Tensor, n_threads: int) -> None:
    """Direct 2-D convolution: kernel [KW, KH, IC, OC] over input [W, H, IC, N] -> [OW, OH, OC, N].

    op_params i32 {s0, s1, p0, p1, d0, d1}. ggml gathers patches in the kernel's type (so an F16
    kernel sees fp16-rounded input) and multiplies them with MUL_MAT.
    """
    kern, img = node.src[0], node.src[1]
    require_types(node, kern, (F32, F16))
    require_f32(node, img)
    s0, s1, p0, p1, d0, d1 = (node.get_op_params_i32(i) for i in range(6))
    k = load_f32(kern)  # (OC, IC, KH, KW)
    x = load_f32(img)  # (N, IC, H, W)
    if kern.type == F16:
        x = x.astype(np.float16).astype(np.float32)
    oh, ow = node.ne[1], node.ne[0]
    g = _taps_2d(x, k.shape[2], k.shape[3], oh, ow, (s0, s1), (p0, p1), (d0, d1))
    out = np.einsum("ncyxij,ocij->noyx", g, k, optimize=True)
    store(node, out.astype(np.float32))


@kernel(Op.CONV_2D_DW)
def conv_2d_dw(node: Tensor, n_threads: int) -> None:
    """Depthwise 2-D convolution: kernel [KW, KH, 1, C] over input [W, H, C, N] -> [OW, OH, C, N].

    op_params i32 {s0, s1, p0, p1, d0, d1}. Works for any input layout (ggml's WHCN and CWHN); the
    result is written through dst's own strides.
    """
    kern, img = node.src[0], node.src[1]
    require_types(node, kern, (F32, F16))
    require_f32(node, img)
    s0, s1, p0, p1, d0, d1 = (node.get_op_params_i32(i) for i in range(6))
    k = load_f32(kern)[:, 0]  # (C, KH, KW)
    x = load_f32(img)  # (N, C, H, W)
    g = _taps_2d(x, k.shape[1], k.shape[2], node.ne[1], node.ne[0], (s0, s1), (p0, p1), (d0, d1))
    store(node, np.einsum("ncyxij,cij->ncyx", g, k, optimize=True).astype(np.float32))


@kernel(Op.CONV_TRANSPOSE_1D)
def conv_transpose_1d(node: Tensor, n_threads: int) -> None:
    """Transposed 1-D convolution: kernel [K, OC, IC], input [L, IC] -> [(L-1)*s0 + K, OC]; op_params i32 {s0}.

    An F16 kernel makes ggml round the input to fp16 before the products.
    """
    kern, src = node.src[0], node.src[1]
    require_types(node, kern, (F32, F16))
    require_f32(node, src)
    s0 = node.get_op_params_i32(0)
    w = load_f32(kern)[0]  # (IC, OC, K)
    x = load_f32(src)[0, 0]  # (IC, L)
    if kern.type == F16:
        x = x.astype(np.float16).astype(np.float32)
    _, oc, klen = w.shape
    length = x.shape[1]
    contrib = np.einsum("iok,il->olk", w, x, optimize=True)  # (OC, L, K)
    out = np.zeros((oc, node.ne[0]), dtype=np.float32)
    for t in range(length):
        out[:, t * s0 : t * s0 + klen] += contrib[:, t, :]
    store(node, out.reshape(shape4(node)))


@kernel(Op.CONV_TRANSPOSE_2D)
def conv_transpose_2d(node: Tensor, n_threads: int) -> None:
    """Transposed 2-D convolution (padding 0): kernel [KW, KH, OC, IC], input [W, H, IC, N] -> [OW, OH, OC, N]."""
    kern, src = node.src[0], node.src[1]
    require_types(node, kern, (F32, F16))
    require_f32(node, src)
    stride = node.get_op_params_i32(0)
    w = load_f32(kern)  # (IC, OC, KH, KW)
    x = load_f32(src)  # (N, IC, H, W)
    if kern.type == F16:
        x = x.astype(np.float16).astype(np.float32)
    _, oc, kh, kw = w.shape
    n, _, h, wd = x.shape
    contrib = np.einsum("iokq,niyx->noyxkq", w, x, optimize=True)  # (N, OC, H, W, KH, KW)
    out = np.zeros((n, oc, node.ne[1], node.ne[0]), dtype=np.float32)
    for y in range(h):
        for xx in range(wd):
            out[:, :, y * stride : y * stride + kh, xx * stride : xx * stride + kw] += contrib[:, :, y, xx]
    store(node, out)


def _taps_3d(x: np.ndarray, k: tuple[int, int, int], o: tuple[int, int, int], s: tuple[int, int, int],
             p: tuple[int, int, int], d: tuple[int, int, int]) -> np.ndarray:
    """x (b, c, id, ih, iw) -> (b, c, od, oh, ow, kd, kh, kw), zero outside the volume. Tuples are (w, h, d)."""
    dims = x.shape[2:][::-1]  # (iw, ih, id)
    idx, ok = [], []
    for ax in range(3):
        pos = np.arange(o[ax])[:, None] * s[ax] + np.arange(k[ax])[None, :] * d[ax] - p[ax]
        idx.append(np.clip(pos, 0, dims[ax] - 1))
        ok.append((pos >= 0) & (pos < dims[ax]))
    iw, ih, idd = idx
    g = x[:, :, idd[:, None, None, :, None, None], ih[None, :, None, None, :, None], iw[None, None, :, None, None, :]]
    mask = (ok[2][:, None, None, :, None, None] & ok[1][None, :, None, None, :, None]
            & ok[0][None, None, :, None, None, :])
    return np.where(mask[None, None], g, np.float32(0.0))


@kernel(Op.IM2COL_3D)
def im2col_3d(node: Tensor, n_threads: int) -> None:
    """[N*IC, ID, IH, IW] -> [N*OD, OH, OW, IC*KD*KH*KW]; op_params i32 {s0, s1, s2, p0, p1, p2, d0, d1, d2, IC}."""
    kern, img = node.src[0], node.src[1]
    require_f32(node, img)
    require_types(node, node, (F32, F16))
    s0, s1, s2, p0, p1, p2, d0, d1, d2, ic = (node.get_op_params_i32(i) for i in range(10))
    if node.is_empty():  # fewer than IC input channels make N = 0; ggml computes nothing for an empty dst
        return
    x = load_f32(img)  # (N*IC, ID, IH, IW)
    n = x.shape[0] // ic
    x = x.reshape(n, ic, *x.shape[1:])
    ow, oh, od = node.ne[1], node.ne[2], node.ne[3] // n
    kw, kh, kd = kern.ne[0], kern.ne[1], kern.ne[2]
    g = _taps_3d(x, (kw, kh, kd), (ow, oh, od), (s0, s1, s2), (p0, p1, p2), (d0, d1, d2))
    out = g.transpose(0, 2, 3, 4, 1, 5, 6, 7).reshape(n * od, oh, ow, ic * kd * kh * kw)
    store(node, out)


@kernel(Op.CONV_3D)
def conv_3d(node: Tensor, n_threads: int) -> None:
    """Direct 3-D convolution: kernel [KW, KH, KD, OC*IC] over [W, H, D, IC*N] -> [OW, OH, OD, OC*N].

    op_params i32 {s0, s1, s2, p0, p1, p2, d0, d1, d2, IC, N, OC}; an F16 kernel sees fp16-rounded input.
    """
    kern, img = node.src[0], node.src[1]
    require_types(node, kern, (F32, F16))
    require_f32(node, img)
    s0, s1, s2, p0, p1, p2, d0, d1, d2, ic, n, oc = (node.get_op_params_i32(i) for i in range(12))
    k = load_f32(kern)
    k = k.reshape(oc, ic, *k.shape[1:])  # (OC, IC, KD, KH, KW)
    x = load_f32(img)
    if kern.type == F16:
        x = x.astype(np.float16).astype(np.float32)
    x = x.reshape(n, ic, *x.shape[1:])
    ow, oh, od = node.ne[0], node.ne[1], node.ne[2]
    g = _taps_3d(x, (k.shape[4], k.shape[3], k.shape[2]), (ow, oh, od), (s0, s1, s2), (p0, p1, p2), (d0, d1, d2))
    out = np.einsum("ncdyxabe,ocabe->nodyx", g, k, optimize=True)  # (N, OC, OD, OH, OW)
    store(node, out.reshape(n * oc, od, oh, ow).astype(np.float32))


@kernel(Op.IM2COL_BACK)
def im2col_back(node: Tensor, n_threads: int) -> None:
    """Gradient of IM2COL: scatter-add the columns (src0) back onto the input grid (dst); src1 gives KW/KH."""
    grad, kern = node.src[0], node.src[1]
    require_f32(node, grad, node)
    s0, s1, p0, p1, d0, d1, is_2d = (node.get_op_params_i32(i) for i in range(7))
    if is_2d:
        n, ic, ih, iw = shape4(node)
        kh, kw = kern.ne[1], kern.ne[0]
        oh, ow = grad.ne[2], grad.ne[1]
    else:
        _, n, ic, iw = shape4(node)
        ih, kh, kw, oh, ow = 1, 1, kern.ne[0], 1, grad.ne[1]
        p1, s1, d1 = 0, 1, 1
    g = np.ascontiguousarray(grad.view4()).reshape(n, oh, ow, ic, kh, kw)
    rows = np.arange(oh)[:, None] * s1 + np.arange(kh)[None, :] * d1 - p1  # (oh, kh)
    cols = np.arange(ow)[:, None] * s0 + np.arange(kw)[None, :] * d0 - p0  # (ow, kw)
    r = np.broadcast_to(rows[None, :, None, None, :, None], g.shape)
    cc = np.broadcast_to(cols[None, None, :, None, None, :], g.shape)
    bi = np.broadcast_to(np.arange(n)[:, None, None, None, None, None], g.shape)
    ci = np.broadcast_to(np.arange(ic)[None, None, None, :, None, None], g.shape)
    ok = (r >= 0) & (r < ih) & (cc >= 0) & (cc < iw)
    out = np.zeros((n, ic, ih, iw), dtype=np.float32)
    np.add.at(out, (bi[ok], ci[ok], r[ok], cc[ok]), g[ok])
    node.view4()[...] = out.reshape(shape4(node))


@kernel(Op.COL2IM_1D)
def col2im_1d(node: Tensor, n_threads: int) -> None:
    """Scatter-add GEMM columns [K*OC, T_in] to a signal [T_out, OC]; op_params i32 {s0, OC, p0}."""
    a = node.src[0]
    require_types(node, a, (F32, F16, GGMLType.BF16))
    s0, oc, p0 = (node.get_op_params_i32(i) for i in range(3))
    col = load_f32(a)[0, 0]  # (T_in, K*OC)
    t_in, k_oc = col.shape
    k = k_oc // oc
    full = np.zeros((oc, (t_in - 1) * s0 + k), dtype=np.float32)
    for t in range(t_in):  # ascending t_in: ggml's summation order per output sample
        full[:, t * s0 : t * s0 + k] += col[t].reshape(oc, k)
    store(node, full[:, p0 : p0 + node.ne[0]].reshape(shape4(node)))


@kernel(Op.PAD)
def pad(node: Tensor, n_threads: int) -> None:
    """Pad each dim with lp/rp zeros (op_params i32 lp0,rp0,...,lp3,rp3), or wrap around when i32[8] is set."""
    a = node.src[0]
    require_f32(node, a)
    p = [node.get_op_params_i32(i) for i in range(9)]
    lp = (p[6], p[4], p[2], p[0])  # numpy order: dims 3, 2, 1, 0
    x = a.view4()
    out = node.view4()
    if p[8]:
        idx = [(np.arange(n) - l) % s for n, l, s in zip(out.shape, lp, x.shape, strict=True)]
        out[...] = x[np.ix_(*idx)]
        return
    out[...] = 0
    sl = tuple(slice(l, l + s) for l, s in zip(lp, x.shape, strict=True))
    out[sl] = x


@kernel(Op.PAD_REFLECT_1D)
def pad_reflect_1d(node: Tensor, n_threads: int) -> None:
    """Reflection padding of dim 0 by (p0, p1) (the edge element is not repeated)."""
    a = node.src[0]
    require_f32(node, a)
    p0, p1 = node.get_op_params_i32(0), node.get_op_params_i32(1)
    if shape4(node)[-1] != a.ne[0] + p0 + p1:
        raise KernelInputError("PAD_REFLECT_1D: dst width does not match the padding")
    node.view4()[...] = np.pad(a.view4(), ((0, 0), (0, 0), (0, 0), (p0, p1)), mode="reflect")


@kernel(Op.POOL_2D_BACK)
def pool_2d_back(node: Tensor, n_threads: int) -> None:
    """Gradient of POOL_2D: src0 = output gradient, src1 = the forward input; op_params as POOL_2D.

    Max sends each gradient to the first maximum of its window; avg spreads grad / (k0*k1).
    """
    g_t, xf_t = node.src[0], node.src[1]
    require_f32(node, g_t)
    require_types(node, xf_t, (F32, F16))
    require_f32(node, node)
    op, k0, k1, s0, s1, p0, p1 = (node.get_op_params_i32(i) for i in range(7))
    grad = g_t.view4()  # (.., .., oh, ow)
    xf = load_f32(xf_t)  # (.., .., ih, iw)
    ih, iw = xf.shape[-2:]
    out = np.zeros(xf.shape, dtype=np.float32)
    for oy in range(grad.shape[2]):
        for ox in range(grad.shape[3]):
            ys = [y for y in range(oy * s1 - p1, oy * s1 - p1 + k1) if 0 <= y < ih]
            xs = [x for x in range(ox * s0 - p0, ox * s0 - p0 + k0) if 0 <= x < iw]
            if not ys or not xs:
                continue
            g = grad[:, :, oy, ox]
            if op == 1:  # AVG
                out[:, :, ys[0] : ys[-1] + 1, xs[0] : xs[-1] + 1] += (g / np.float32(k0 * k1))[..., None, None]
                continue
            win = xf[:, :, ys[0] : ys[-1] + 1, xs[0] : xs[-1] + 1].reshape(*g.shape, -1)
            first = win.argmax(axis=-1)  # the first maximum, as ggml's strict '>' scan
            yy, xx = ys[0] + first // len(xs), xs[0] + first % len(xs)
            i3, i2 = np.indices(g.shape)
            np.add.at(out, (i3, i2, yy, xx), g)
    node.view4()[...] = out

