"""Recurrent and solver kernels: SSM_CONV, SSM_SCAN (Mamba), RWKV_WKV6, GATED_LINEAR_ATTN, RWKV_WKV7, SOLVE_TRI.

The recurrences run token by token as in ggml-cpu, vectorized over heads and state dims. Their
outputs are 1-d/2-d concatenations (outputs, then the final states) laid out as ggml's.

Builders: pyggml/ops/recurrent.py (the same family).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ....ops.enums import Op
from ....tensor import Tensor
from .._common import I32, KernelInputError, require_f32, require_types
from ..kernel_table import kernel


def _f32(node: Tensor, *ts: Tensor | None) -> None:
    for t in ts:
        require_f32(node, t)


def _flat(t: Tensor) -> np.ndarray:
    """A contiguous tensor as a flat float32 array (these ggml kernels index raw memory)."""
    if not t.is_contiguous():
        raise KernelInputError(f"{t.name or 'operand'} must be contiguous for this op")
    return t.view4().reshape(-1)


@kernel(Op.SSM_CONV)
def ssm_conv(node: Tensor, n_threads: int) -> None:
    """Sliding causal conv: dst[c, t, s] = sum_i sx[t + i, c, s] * w[i, c] (float accumulation)."""
    sx, w = node.src[0], node.src[1]
    _f32(node, sx, w, node)
    x = sx.view4()[0]  # (n_s, d_inner, d_conv - 1 + n_t)
    c = w.view4()[0, 0]  # (d_inner, d_conv)
    d_conv = c.shape[1]
    n_t = node.ne[1]
    win = np.lib.stride_tricks.sliding_window_view(x, d_conv, axis=2)[:, :, :n_t]  # (n_s, d_inner, n_t, d_conv)
    out = np.zeros(win.shape[:3], dtype=np.float32)
    for i in range(d_conv):  # sequential float sum, as ggml (not its double-sum vec_dot)
        out += win[..., i] * c[None, :, None, i]
    node.view4()[0] = out.transpose(0, 2, 1)


def _softplus(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.where(x > 20, x, np.log1p(np.exp(x))).astype(np.float32)


@kernel(Op.SSM_SCAN)
def ssm_scan(node: Tensor, n_threads: int) -> None:
    """Mamba selective scan. src: s {d_state, dim, n_head, *}, x {dim, n_head, nt, ns}, dt {n_head, nt, ns},
    A {d_state or 1, n_head}, B/C {d_state, n_group, nt, ns}, ids {ns}; dst = [y | K state slots].

    op_params i32[0] = K (1 when unset): slot 0 holds each sequence's final state, slot k (0 < k < K)
    the state after token nt-1-k (rollback snapshots; slots k >= nt are left untouched, as ggml)."""
    s_t, x_t, dt_t, a_t, b_t, c_t, ids_t = (node.src[i] for i in range(7))
    _f32(node, s_t, x_t, dt_t, a_t, b_t, c_t, node)
    require_types(node, ids_t, (I32,))
    nc, nr, nh = s_t.ne[0], s_t.ne[1], s_t.ne[2]
    nt, ns = x_t.ne[2], x_t.ne[3]
    ng = b_t.ne[1]
    states = s_t.view4()  # (*, nh, nr, nc)
    xs = x_t.view4()  # (ns, nt, nh, nr)
    dts = dt_t.view4()[0]  # (ns, nt, nh)
    a = a_t.view4()[0, 0]  # (nh, nc or 1)
    bs, cs = b_t.view4(), c_t.view4()  # (ns, nt, ng, nc)
    ids = ids_t.view4().reshape(-1)
    n_slots = max(1, node.get_op_params_i32(0))
    out = _flat(node)
    y = out[: ns * nt * nh * nr].reshape(ns, nt, nh, nr)
    s_out = out[ns * nt * nh * nr :].reshape(n_slots, ns, nh, nr, nc)
    group = np.arange(nh) // (nh // ng)
    for i3 in range(ns):
        if not 0 <= ids[i3] < states.shape[0]:
            raise KernelInputError(f"SSM_SCAN: state id {ids[i3]} out of range")
        st = states[ids[i3]].astype(np.float32)  # (nh, nr, nc)
        for t in range(nt):
            dt_sp = _softplus(dts[i3, t])  # (nh,)
            x_dt = xs[i3, t] * dt_sp[:, None]  # (nh, nr)
            b = bs[i3, t][group]  # (nh, nc)
            c = cs[i3, t][group]
            decay = np.exp(dt_sp[:, None] * a)  # (nh, 1) for Mamba-2, (nh, nc) for Mamba-1
            st = st * decay[:, None, :] + b[:, None, :] * x_dt[:, :, None]
            y[i3, t] = (st * c[:, None, :]).sum(axis=-1, dtype=np.float32)
            slot = nt - 1 - t
            if 0 < slot < n_slots:
                s_out[slot, i3] = st
        s_out[0, i3] = st


def _wkv_shapes(node: Tensor, v_t: Tensor, state_t: Tensor) -> tuple[int, int, int, int]:
    t_len, heads = v_t.ne[2], v_t.ne[1]
    c = node.ne[0]
    n_seqs = state_t.ne[1]
    if c % heads or t_len % n_seqs:
        raise KernelInputError(f"{node.op.name}: {c} channels / {heads} heads, {t_len} tokens / {n_seqs} seqs")
    return t_len, heads, c // heads, n_seqs


def _run_wkv(node: Tensor, state_t: Tensor,
             step: Callable[[int, np.ndarray], tuple[np.ndarray, np.ndarray]]) -> None:
    """Shared driver: per token, the state of its sequence is updated by ``step`` and the output written."""
    t_len, heads, size, n_seqs = _wkv_shapes(node, node.src[1], state_t)
    out = _flat(node)
    y = out[: t_len * heads * size].reshape(t_len, heads, size)
    states = out[t_len * heads * size :].reshape(n_seqs, heads, size, size)
    init = _flat(state_t).reshape(n_seqs, heads, size, size)
    per_seq = t_len // n_seqs
    for t in range(t_len):
        seq = t // per_seq
        prev = init[seq] if t % per_seq == 0 else states[seq]
        y[t], states[seq] = step(t, prev.astype(np.float32))


@kernel(Op.RWKV_WKV6)
def rwkv_wkv6(node: Tensor, n_threads: int) -> None:
    """RWKV-6: out_j = sum_i r_i (tf_i k_i v_j + S_ij); S_ij <- S_ij td_i + k_i v_j. src: k, v, r, tf, td, state."""
    k_t, v_t, r_t, tf_t, td_t, s_t = (node.src[i] for i in range(6))
    _f32(node, k_t, v_t, r_t, tf_t, td_t, s_t, node)
    t_len, heads, size, _ = _wkv_shapes(node, v_t, s_t)
    k, v, r, td = (_flat(x).reshape(t_len, heads, size) for x in (k_t, v_t, r_t, td_t))
    tf = _flat(tf_t).reshape(heads, size)

    def step(t: int, prev: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        kv = k[t][:, :, None] * v[t][:, None, :]  # (H, i, j)
        temp = kv * tf[:, :, None] + prev
        out = (temp * r[t][:, :, None]).sum(axis=1, dtype=np.float32)
        return out, prev * td[t][:, :, None] + kv

    _run_wkv(node, s_t, step)


@kernel(Op.GATED_LINEAR_ATTN)
def gated_linear_attn(node: Tensor, n_threads: int) -> None:
    """GLA: S_ij <- S_ij g_i + k_i v_j; out_j = scale sum_i q_i S_ij.

    src: k, v, q, g, state; op_params f32[0] = scale.
    """
    k_t, v_t, q_t, g_t, s_t = (node.src[i] for i in range(5))
    _f32(node, k_t, v_t, q_t, g_t, s_t, node)
    scale = np.float32(node.get_op_params_f32(0))
    t_len, heads, size, _ = _wkv_shapes(node, v_t, s_t)
    k, v, q, g = (_flat(x).reshape(t_len, heads, size) for x in (k_t, v_t, q_t, g_t))

    def step(t: int, prev: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        temp = prev * g[t][:, :, None] + k[t][:, :, None] * v[t][:, None, :]
        return (temp * (q[t] * scale)[:, :, None]).sum(axis=1, dtype=np.float32), temp

    _run_wkv(node, s_t, step)


@kernel(Op.RWKV_WKV7)
def rwkv_wkv7(node: Tensor, n_threads: int) -> None:
    """RWKV-7: sa_i = sum_j a_j S_ij; S_ij <- S_ij w_j + v_i k_j + sa_i b_j; out_i = sum_j S_ij r_j.

    src: r, w, k, v, a, b, state (the state row index is the v channel).
    """
    r_t, w_t, k_t, v_t, a_t, b_t, s_t = (node.src[i] for i in range(7))
    _f32(node, r_t, w_t, k_t, v_t, a_t, b_t, s_t, node)
    t_len, heads, size, _ = _wkv_shapes(node, v_t, s_t)
    r, w, k, v, a, b = (_flat(x).reshape(t_len, heads, size) for x in (r_t, w_t, k_t, v_t, a_t, b_t))

    def step(t: int, prev: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        sa = (prev * a[t][:, None, :]).sum(axis=-1, dtype=np.float32)  # (H, i)
        new = prev * w[t][:, None, :] + v[t][:, :, None] * k[t][:, None, :] + sa[:, :, None] * b[t][:, None, :]
        return (new * r[t][:, None, :]).sum(axis=-1, dtype=np.float32), new

    _run_wkv(node, s_t, step)


@kernel(Op.SOLVE_TRI)
def solve_tri(node: Tensor, n_threads: int) -> None:
    """X with A X = B for lower-triangular A [n, n, ...] and B [k, n, ...], by forward substitution."""
    a_t, b_t = node.src[0], node.src[1]
    _f32(node, a_t, b_t, node)
    a = a_t.view4()  # (B2, B1, n, n): a[..., row, col]
    b = b_t.view4()  # (B2, B1, n, k)
    n = a.shape[-1]
    x = np.zeros(b.shape, dtype=np.float32)
    for i in range(n):
        acc = np.zeros((*b.shape[:2], b.shape[-1]), dtype=np.float32)
        for t in range(i):  # sequential float sum, as ggml
            acc += a[:, :, i, t, None] * x[:, :, t, :]
        x[:, :, i, :] = (b[:, :, i, :] - acc) / a[:, :, i, i, None]
    node.view4()[...] = x


@kernel(Op.GATED_DELTA_NET)
def gated_delta_net(node: Tensor, n_threads: int) -> None:
    """Gated delta rule, token by token per (head, sequence); op_params i32[0] = K snapshot slots.

    src: q, k [S, Hq|Hk, T, n], v [S, H, T, n], g [1 or S, H, T, n], beta [1, H, T, n], state [S, S, H, n].
    Per token: S *= exp(g); delta = (v - S^T k) beta; S += k delta^T; out = S^T q / sqrt(S).
    dst holds the outputs [S, H, T, n] then K state snapshots (slot 0 = the last token's state).
    """
    q_t, k_t, v_t, g_t, b_t, s_t = (node.src[i] for i in range(6))
    _f32(node, q_t, k_t, v_t, g_t, b_t, s_t, node)
    n_keep = node.get_op_params_i32(0)
    if n_keep < 1:
        raise KernelInputError(f"GATED_DELTA_NET: K must be >= 1, got {n_keep}")
    q, k, v = q_t.view4(), k_t.view4(), v_t.view4()  # (n, T, H, S)
    g, beta = g_t.view4(), b_t.view4()  # (n, T, H, 1 or S), (n, T, H, 1)
    n_seqs, t_len, heads, size = v.shape
    hq, hk = q.shape[2], k.shape[2]
    rq, rk = n_seqs // q.shape[0], n_seqs // k.shape[0]
    scale = np.float32(1.0) / np.sqrt(np.float32(size))
    out = _flat(node)
    attn = out[: n_seqs * t_len * heads * size].reshape(n_seqs, t_len, heads, size)
    snaps = out[n_seqs * t_len * heads * size :].reshape(n_keep, n_seqs, heads, size, size)
    init = s_t.view4()  # (n, H, S, S): init[s, h, j, i] = S[i][j]
    hidx = np.arange(heads)
    for s in range(n_seqs):
        m = init[s].astype(np.float32)  # (H, j, i)
        for t in range(t_len):
            qq, kk = q[s // rq, t, hidx % hq], k[s // rk, t, hidx % hk]  # (H, S)
            m = m * np.exp(g[s, t])[:, None, :]  # per-i decay (or one factor per head)
            delta = (v[s, t] - (m * kk[:, None, :]).sum(axis=-1, dtype=np.float32)) * beta[s, t]  # (H, j)
            m = m + delta[:, :, None] * kk[:, None, :]
            attn[s, t] = (m * qq[:, None, :]).sum(axis=-1, dtype=np.float32) * scale
            slot = t_len - 1 - t
            if slot < n_keep:
                snaps[slot, s] = m

