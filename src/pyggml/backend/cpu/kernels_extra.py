"""Ops a decoder's forward pass does not use: the backward ops of training graphs, ROLL, PAD_REFLECT_1D.

The kernels follow ggml-cpu; their nodes come from ops/builders_train.py and ops/builders_extra.py
(pyggml/ops/table.py lists where each op's builder, kernel and tests live).
"""

from __future__ import annotations

import numpy as np

from ...ops.enums import Op
from ...tensor import Tensor
from ...types import GGMLType
from ._common import F16, F32, I32, KernelInputError, load_f32, require_types, shape4
from .registry import kernel


@kernel(Op.SILU_BACK)
def silu_back(node: Tensor, n_threads: int) -> None:
    """dx = dy * s * (1 + x (1 - s)), s = sigmoid(x); src0 = dy, src1 = x."""
    dy, x = node.src[0], node.src[1]
    require_types(node, dy, (F32,))
    require_types(node, x, (F32,))
    xv = x.view4()
    with np.errstate(over="ignore"):
        s = np.float32(1.0) / (np.float32(1.0) + np.exp(-xv))
    node.view4()[...] = dy.view4() * (s * (np.float32(1.0) + xv * (np.float32(1.0) - s)))


@kernel(Op.RMS_NORM_BACK)
def rms_norm_back(node: Tensor, n_threads: int) -> None:
    """Gradient of RMS_NORM: dx = (dz + x * (-sum(x dz) / (sum(x^2) + eps n))) / sqrt(mean(x^2) + eps).

    src0 = dz, src1 = x, op_params f32[0] = eps; sums in double as ggml.
    """
    dz, x = node.src[0], node.src[1]
    require_types(node, dz, (F32,))
    require_types(node, x, (F32,))
    eps = np.float32(node.get_op_params_f32(0))
    xv, dzv = x.view4(), dz.view4()
    n = xv.shape[-1]
    sum_xx = np.square(xv).sum(axis=-1, keepdims=True, dtype=np.float64)
    sum_xdz = (xv * dzv).sum(axis=-1, keepdims=True, dtype=np.float64)
    mean_eps = (sum_xx.astype(np.float32) / np.float32(n)) + eps
    sum_eps = sum_xx.astype(np.float32) + eps * np.float32(n)
    rrms = np.float32(1.0) / np.sqrt(mean_eps)
    scale_x = (-sum_xdz).astype(np.float32) / sum_eps
    node.view4()[...] = (dzv + xv * scale_x) * rrms


@kernel(Op.SOFT_MAX_BACK)
def soft_max_back(node: Tensor, n_threads: int) -> None:
    """dx = scale * y * (dy - dot(y, dy)) per row; src0 = dy, src1 = y (the softmax output); max_bias must be 0."""
    dy, y = node.src[0], node.src[1]
    require_types(node, dy, (F32,))
    require_types(node, y, (F32,))
    scale = np.float32(node.get_op_params_f32(0))
    if node.get_op_params_f32(1) != 0:
        raise KernelInputError("SOFT_MAX_BACK: max_bias must be 0 (as in ggml)")
    yv, dyv = y.view4(), dy.view4()
    dot = (yv * dyv).sum(axis=-1, keepdims=True, dtype=np.float32)
    node.view4()[...] = (dyv - dot) * yv * scale


@kernel(Op.GET_ROWS_BACK)
def get_rows_back(node: Tensor, n_threads: int) -> None:
    """Scatter-add: dst = 0; dst[ids[i]] += src0[i] (src0 F32/F16 rows, src1 I32 ids)."""
    g, ids_t = node.src[0], node.src[1]
    require_types(node, g, (F32, F16))
    require_types(node, ids_t, (I32,))
    ids = ids_t.view4().reshape(-1).astype(np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= node.ne[1]):
        raise KernelInputError(f"GET_ROWS_BACK: row index out of range [0, {node.ne[1]})")
    rows = load_f32(g)[0, 0]
    out = np.zeros((node.ne[1], node.ne[0]), dtype=np.float32)
    np.add.at(out, ids, rows[: ids.size])
    node.view4()[0, 0] = out


@kernel(Op.ROLL)
def roll(node: Tensor, n_threads: int) -> None:
    """Cyclic shift of every dim: dst[i] = src[(i - shift) mod ne]; op_params i32 shift0..shift3."""
    a = node.src[0]
    require_types(node, a, (F32,))
    shifts = [node.get_op_params_i32(i) for i in range(4)]
    node.view4()[...] = np.roll(a.view4(), shift=(shifts[3], shifts[2], shifts[1], shifts[0]), axis=(0, 1, 2, 3))


@kernel(Op.PAD_REFLECT_1D)
def pad_reflect_1d(node: Tensor, n_threads: int) -> None:
    """Reflection padding of dim 0 by (p0, p1) (the edge element is not repeated)."""
    a = node.src[0]
    require_types(node, a, (F32,))
    p0, p1 = node.get_op_params_i32(0), node.get_op_params_i32(1)
    if shape4(node)[-1] != a.ne[0] + p0 + p1:
        raise KernelInputError("PAD_REFLECT_1D: dst width does not match the padding")
    node.view4()[...] = np.pad(a.view4(), ((0, 0), (0, 0), (0, 0), (p0, p1)), mode="reflect")


@kernel(Op.CROSS_ENTROPY_LOSS)
def cross_entropy_loss(node: Tensor, n_threads: int) -> None:
    """-(1/nr) sum_rows sum_i labels_i * log_softmax(logits)_i; src0 = logits, src1 = labels (F32)."""
    a, b = node.src[0], node.src[1]
    require_types(node, a, (F32,))
    require_types(node, b, (F32,))
    x = a.view4()
    nr = x.shape[0] * x.shape[1] * x.shape[2]
    st = x - x.max(axis=-1, keepdims=True)
    log_sum = np.log(np.exp(st).sum(axis=-1, keepdims=True, dtype=np.float64)).astype(np.float32)
    total = ((st - log_sum) * b.view4()).sum(dtype=np.float64)
    node.view4()[...] = np.float32(-total / nr)


@kernel(Op.CROSS_ENTROPY_LOSS_BACK)
def cross_entropy_loss_back(node: Tensor, n_threads: int) -> None:
    """d logits = (softmax(logits) - labels) * grad / nr; src0 = grad (scalar), src1 = logits, src2 = labels."""
    g, a, b = node.src[0], node.src[1], node.src[2]
    for t in (g, a, b):
        require_types(node, t, (F32,))
    x = a.view4()
    nr = x.shape[0] * x.shape[1] * x.shape[2]
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    sm = e * (1.0 / e.sum(axis=-1, keepdims=True, dtype=np.float64)).astype(np.float32)
    d_by_nr = np.float32(g.view4().reshape(-1)[0]) / np.float32(nr)
    node.view4()[...] = (sm - b.view4()) * d_by_nr


@kernel(Op.OPT_STEP_ADAMW)
def opt_step_adamw(node: Tensor, n_threads: int) -> None:
    """One AdamW step in place on src0 (param), src2 (m), src3 (v) with gradient src1.

    src4 holds 7 floats: alpha, beta1, beta2, eps, wd, beta1h, beta2h (the bias corrections).
    """
    w, g, m, v, p = (node.src[i] for i in range(5))
    for t in (w, g, m, v, p):
        require_types(node, t, (F32,))
    alpha, beta1, beta2, eps, wd, beta1h, beta2h = (np.float32(x) for x in p.view4().reshape(-1)[:7])
    one = np.float32(1.0)
    gv, mv, vv, wv = g.view4(), m.view4(), v.view4(), w.view4()
    mv[...] = mv * beta1 + gv * (one - beta1)
    vv[...] = vv * beta2 + gv * gv * (one - beta2)
    mh = mv * beta1h
    vh = np.sqrt(vv * beta2h) + eps
    wv[...] = wv * (one - alpha * wd) - alpha * mh / vh


@kernel(Op.OPT_STEP_SGD)
def opt_step_sgd(node: Tensor, n_threads: int) -> None:
    """w = w (1 - alpha wd) - alpha g in place on src0; src2 holds {alpha, wd}."""
    w, g, p = node.src[0], node.src[1], node.src[2]
    for t in (w, g, p):
        require_types(node, t, (F32,))
    alpha, wd = (np.float32(x) for x in p.view4().reshape(-1)[:2])
    wv = w.view4()
    wv[...] = wv * (np.float32(1.0) - alpha * wd) - alpha * g.view4()


@kernel(Op.WIN_PART)
def win_part(node: Tensor, n_threads: int) -> None:
    """Split [C, W, H] into zero-padded w x w windows [C, w, w, npx*npy]; op_params i32 {npx, npy, w}."""
    a = node.src[0]
    require_types(node, a, (F32,))
    npx, npy, w = (node.get_op_params_i32(i) for i in range(3))
    x = a.view4()[0]  # (H, W, C)
    h, wd, ch = x.shape
    padded = np.zeros((npy * w, npx * w, ch), dtype=np.float32)
    padded[:h, :wd] = x
    win = padded.reshape(npy, w, npx, w, ch).transpose(0, 2, 1, 3, 4).reshape(npy * npx, w, w, ch)
    node.view4()[...] = win


@kernel(Op.WIN_UNPART)
def win_unpart(node: Tensor, n_threads: int) -> None:
    """Reassemble w x w windows [C, w, w, n] into [C, W, H] (the inverse of WIN_PART); op_params i32 {w}."""
    a = node.src[0]
    require_types(node, a, (F32,))
    w = node.get_op_params_i32(0)
    wd, h = node.ne[1], node.ne[2]
    npx = (wd + (w - wd % w) % w) // w
    x = a.view4()  # (n, w, w, C)
    npy = x.shape[0] // npx
    full = x.reshape(npy, npx, w, w, -1).transpose(0, 2, 1, 3, 4).reshape(npy * w, npx * w, -1)
    node.view4()[0] = full[:h, :wd]


@kernel(Op.GET_REL_POS)
def get_rel_pos(node: Tensor, n_threads: int) -> None:
    """SAM relative positions: dst[:, i1, i2] = src[:, (kh - i1 - 1) + i2] (F16/BF16 bits copied)."""
    a = node.src[0]
    require_types(node, a, (F16, GGMLType.BF16))
    kh, qh = node.ne[1], node.ne[2]
    idx = (kh - np.arange(kh)[None, :] - 1) + np.arange(qh)[:, None]  # (qh, kh)
    node.view4()[0] = a.view4()[0, 0][idx]


@kernel(Op.ADD_REL_POS)
def add_rel_pos(node: Tensor, n_threads: int) -> None:
    """SAM decomposed relative positions: dst = a, then per block of ne10 rows, dst[b, i, j] += ph[b, i] + pw[b, j]."""
    a, pw, ph = node.src[0], node.src[1], node.src[2]
    for t in (a, pw, ph):
        require_types(node, t, (F32,))
    n = pw.ne[0]
    d = load_f32(a).reshape(-1, n, n) + ph.view4().reshape(-1, n)[:, :, None] + pw.view4().reshape(-1, n)[:, None, :]
    node.view4()[...] = d.reshape(shape4(node))


@kernel(Op.POOL_2D_BACK)
def pool_2d_back(node: Tensor, n_threads: int) -> None:
    """Gradient of POOL_2D: src0 = output gradient, src1 = the forward input; op_params as POOL_2D.

    Max sends each gradient to the first maximum of its window; avg spreads grad / (k0*k1).
    """
    g_t, xf_t = node.src[0], node.src[1]
    require_types(node, g_t, (F32,))
    require_types(node, xf_t, (F32, F16))
    require_types(node, node, (F32,))
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


_HC = 4  # DeepSeek-V4 hyper-connection count (fixed in ggml)


@kernel(Op.DSV4_HC_PRE)
def dsv4_hc_pre(node: Tensor, n_threads: int) -> None:
    """dst[:, t] = scale * sum_h x[:, h, t] * w; x [n_embd, hc, T]; op_params {f32 scale, i32 gated}.

    Plain: w = weights[h, t] ([hc, T]). Gated: w = sigmoid(gate[:, h, t]) ([n_embd, hc, T]).
    """
    x, w = node.src[0], node.src[1]
    for t in (x, w, node):
        require_types(node, t, (F32,))
    scale = np.float32(node.get_op_params_f32(0))
    gated = node.get_op_params_i32(1) != 0
    xv = x.view4()[0]  # (T, hc, n_embd)
    if gated:
        g = w.view4()[0]  # (T, hc, n_embd)
        wv = np.float32(1.0) / (np.float32(1.0) + np.exp(-g))
    else:
        wv = w.view4()[0, 0][:, :, None]  # (T, hc, 1)
    acc = np.zeros((xv.shape[0], xv.shape[2]), dtype=np.float32)
    for h in range(xv.shape[1]):  # sequential float sum over the streams, as ggml
        acc += xv[:, h, :] * wv[:, h, :]
    node.view4()[0, 0] = scale * acc


@kernel(Op.DSV4_HC_POST)
def dsv4_hc_post(node: Tensor, n_threads: int) -> None:
    """dst[:, d, t] = x[:, t] post[d, t] + sum_s residual[:, s, t] comb[d, s, t].

    Without comb (src3 NULL) the mixing is the identity: each stream adds its own residual.
    """
    x, res, post, comb = (node.src[i] for i in range(4))
    for t in (x, res, post, comb, node):
        require_types(node, t, (F32,))
    xv = x.view4()[0, 0]  # (T, n_embd)
    rv = res.view4()[0]  # (T, hc, n_embd)
    pv = post.view4()[0, 0]  # (T, hc)
    out = xv[:, None, :] * pv[:, :, None]  # (T, d, n_embd)
    if comb is None:
        out = out + rv
    else:
        cv = comb.view4()[0]  # (T, s, d)
        for s in range(rv.shape[1]):
            out = out + rv[:, s, None, :] * cv[:, s, :, None]
    node.view4()[0] = out


@kernel(Op.DSV4_HC_COMB)
def dsv4_hc_comb(node: Tensor, n_threads: int) -> None:
    """The 4x4 mixing matrix per token: softmax over destinations of mixes*scale[2] + base, plus eps, then
    Sinkhorn-style column/row normalisation (n_iter = op_params i32[1], eps = f32[0])."""
    mixes, scale, base = node.src[0], node.src[1], node.src[2]
    for t in (mixes, scale, base, node):
        require_types(node, t, (F32,))
    eps = np.float32(node.get_op_params_f32(0))
    n_iter = node.get_op_params_i32(1)
    if n_iter < 1:
        raise KernelInputError(f"DSV4_HC_COMB: n_iter must be positive, got {n_iter}")
    off = 2 * _HC
    mv = mixes.view4()[0, 0][:, off : off + _HC * _HC].reshape(-1, _HC, _HC)  # (T, src, dst)
    bv = base.view4().reshape(-1)[off : off + _HC * _HC].reshape(_HC, _HC)
    v = mv * np.float32(scale.view4().reshape(-1)[2]) + bv
    e = np.exp(v - v.max(axis=-1, keepdims=True))
    comb = e * (np.float32(1.0) / e.sum(axis=-1, keepdims=True, dtype=np.float32)) + eps

    def norm_cols(cm: np.ndarray) -> np.ndarray:  # each destination column, summed over sources
        return cm * (np.float32(1.0) / (eps + cm.sum(axis=1, keepdims=True, dtype=np.float32)))

    def norm_rows(cm: np.ndarray) -> np.ndarray:
        return cm * (np.float32(1.0) / (eps + cm.sum(axis=2, keepdims=True, dtype=np.float32)))

    comb = norm_cols(comb)
    for _ in range(1, n_iter):
        comb = norm_cols(norm_rows(comb))
    node.view4()[0] = comb
