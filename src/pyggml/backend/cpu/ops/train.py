"""Training kernels: CROSS_ENTROPY_LOSS (and its gradient CROSS_ENTROPY_LOSS_BACK), OPT_STEP_ADAMW
and OPT_STEP_SGD. The other backward ops sit with their forward op's family (SILU_BACK in
unary.py, RMS_NORM_BACK and SOFT_MAX_BACK in nn.py, POOL_2D_BACK in conv.py, GET_ROWS_BACK in
rows.py).

Builders: pyggml/ops/train.py (the same family).
"""

from __future__ import annotations

import numpy as np

from ....ops.enums import Op
from ....tensor import Tensor
from .._common import require_f32
from ..kernel_table import kernel


@kernel(Op.CROSS_ENTROPY_LOSS)
def cross_entropy_loss(node: Tensor, n_threads: int) -> None:
    """-(1/nr) sum_rows sum_i labels_i * log_softmax(logits)_i; src0 = logits, src1 = labels (F32)."""
    a, b = node.src[0], node.src[1]
    require_f32(node, a, b)
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
        require_f32(node, t)
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
        require_f32(node, t)
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
        require_f32(node, t)
    alpha, wd = (np.float32(x) for x in p.view4().reshape(-1)[:2])
    wv = w.view4()
    wv[...] = wv * (np.float32(1.0) - alpha * wd) - alpha * g.view4()

