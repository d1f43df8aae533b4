"""Mamba/RWKV/GLA recurrences and SOLVE_TRI against scalar loop references (float64).

Nodes come from their builders (ops/recurrent.py, ops/nn.py for DSV4), so the
result shapes checked here are the builders' as well as the kernels'.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from helpers.opcheck import OpCase, assert_close, values
from pyggml.ops import builders as B
from pyggml.tensor import Tensor
from pyggml.types import GGMLType

F32, I32 = GGMLType.F32, GGMLType.I32




def _flat(t: Tensor) -> np.ndarray:
    return values(t).reshape(-1).astype(np.float64)


def test_ssm_conv() -> None:
    c = OpCase()
    d_conv, d_inner, n_t, n_s = 4, 6, 5, 2
    sx = c.tensor(F32, d_conv - 1 + n_t, d_inner, n_s)
    w = c.tensor(F32, d_conv, d_inner)
    got = c.compute(B.ssm_conv(c.ctx, sx, w))
    x, k = values(sx)[0].astype(np.float64), values(w)[0, 0].astype(np.float64)
    ref = np.zeros((n_s, n_t, d_inner))
    for s in range(n_s):
        for t in range(n_t):
            for ch in range(d_inner):
                ref[s, t, ch] = sum(x[s, ch, t + i] * k[ch, i] for i in range(d_conv))
    assert_close(got[0], ref.astype(np.float32))


@pytest.mark.parametrize("mamba", [1, 2])
def test_ssm_scan(mamba: int) -> None:
    c = OpCase()
    d_state, dim, nh, ng, nt, ns = 4, 3, 4, 2, 3, 2
    s = c.tensor(F32, d_state, dim, nh, ns)
    x = c.tensor(F32, dim, nh, nt, ns)
    dt = c.tensor(F32, nh, nt, ns)
    a = c.tensor(F32, 1 if mamba == 2 else d_state, nh, lo=-1, hi=0)
    b = c.tensor(F32, d_state, ng, nt, ns)
    cc = c.tensor(F32, d_state, ng, nt, ns)
    ids = c.ints(I32, ns, data=np.array([1, 0]))
    n_y = dim * nh * nt * ns
    out = B.ssm_scan(c.ctx, s, x, dt, a, b, cc, ids, 1)
    assert out.ne[0] == n_y + d_state * dim * nh * ns
    got = c.compute(out).reshape(-1)
    sv, xv, dtv = values(s).astype(np.float64), values(x).astype(np.float64), values(dt)[0].astype(np.float64)
    av, bv, cv = values(a)[0, 0].astype(np.float64), values(b).astype(np.float64), values(cc).astype(np.float64)
    y = np.zeros((ns, nt, nh, dim))
    final = np.zeros((ns, nh, dim, d_state))
    for i3, sid in enumerate([1, 0]):
        st = sv[sid].copy()  # (nh, dim, d_state)
        for t in range(nt):
            for h in range(nh):
                sp = dtv[i3, t, h] if dtv[i3, t, h] > 20 else math.log1p(math.exp(dtv[i3, t, h]))
                g = h // (nh // ng)
                for i in range(dim):
                    for j in range(d_state):
                        decay = math.exp(sp * (av[h, 0] if mamba == 2 else av[h, j]))
                        st[h, i, j] = st[h, i, j] * decay + bv[i3, t, g, j] * xv[i3, t, h, i] * sp
                    y[i3, t, h, i] = sum(st[h, i, j] * cv[i3, t, g, j] for j in range(d_state))
        final[i3] = st
    assert_close(got, np.concatenate([y.reshape(-1), final.reshape(-1)]).astype(np.float32))


def _wkv_ref(kind: str, ins: dict[str, np.ndarray], state: np.ndarray, t_len: int, heads: int, size: int,
             n_seqs: int, scale: float = 1.0) -> np.ndarray:
    y = np.zeros((t_len, heads, size))
    states = state.reshape(n_seqs, heads, size, size).copy()
    per = t_len // n_seqs
    for t in range(t_len):
        st = states[t // per]
        for h in range(heads):
            S = st[h]
            if kind == "wkv6":
                k, v, r, td = (ins[n][t, h] for n in ("k", "v", "r", "td"))
                tf = ins["tf"][h]
                for i in range(size):
                    for j in range(size):
                        kv = k[i] * v[j]
                        y[t, h, j] += (kv * tf[i] + S[i, j]) * r[i]
                        S[i, j] = S[i, j] * td[i] + kv
            elif kind == "gla":
                k, v, q, g = (ins[n][t, h] for n in ("k", "v", "q", "g"))
                for i in range(size):
                    for j in range(size):
                        S[i, j] = S[i, j] * g[i] + k[i] * v[j]
                        y[t, h, j] += S[i, j] * q[i] * scale
            else:  # wkv7
                r, w, k, v, a, b = (ins[n][t, h] for n in ("r", "w", "k", "v", "a", "b"))
                for i in range(size):
                    sa = sum(a[j] * S[i, j] for j in range(size))
                    for j in range(size):
                        S[i, j] = S[i, j] * w[j] + v[i] * k[j] + sa * b[j]
                    y[t, h, i] = sum(S[i, j] * r[j] for j in range(size))
    return np.concatenate([y.reshape(-1), states.reshape(-1)])


@pytest.mark.parametrize("kind", ["wkv6", "gla", "wkv7"])
def test_linear_attention_recurrences(kind: str) -> None:
    c = OpCase()
    size, heads, t_len, n_seqs = 4, 2, 6, 2
    names = {"wkv6": ["k", "v", "r", "tf", "td"], "gla": ["k", "v", "q", "g"],
             "wkv7": ["r", "w", "k", "v", "a", "b"]}[kind]
    tensors = {}
    for n in names:
        tensors[n] = c.tensor(F32, size, heads, lo=-1, hi=1) if n == "tf" else c.tensor(F32, size, heads, t_len)
    state = c.tensor(F32, size * size * heads, n_seqs)
    args = [tensors[n] for n in names]
    if kind == "wkv6":
        out = B.rwkv_wkv6(c.ctx, *args, state)
    elif kind == "gla":
        out = B.gated_linear_attn(c.ctx, *args, state, 0.5)
    else:
        out = B.rwkv_wkv7(c.ctx, *args, state)
    assert out.ne[:2] == [size * heads, t_len + size * n_seqs]
    got = c.compute(out).reshape(-1)
    ins = {n: values(t).astype(np.float64).reshape((heads, size) if n == "tf" else (t_len, heads, size))
           for n, t in tensors.items()}
    ref = _wkv_ref(kind, ins, _flat(state), t_len, heads, size, n_seqs, 0.5)
    assert_close(got, ref.astype(np.float32))


def test_solve_tri() -> None:
    c = OpCase()
    n, k = 5, 3
    a_np = np.tril(c.rng.uniform(-1, 1, size=(2, n, n))) + 3 * np.eye(n)
    a = c.tensor(F32, n, n, 2, data=a_np.astype(np.float32))
    b = c.tensor(F32, k, n, 2)
    got = c.compute(B.solve_tri(c.ctx, a, b, True, True, False))
    ref = np.stack([np.linalg.solve(values(a)[0, i].astype(np.float64), values(b)[0, i].astype(np.float64))
                    for i in range(2)])[None]
    assert_close(got, ref.astype(np.float32))


@pytest.mark.parametrize(("kda", "n_keep"), [(False, 1), (True, 2)])
def test_gated_delta_net(kda: bool, n_keep: int) -> None:
    c = OpCase()
    size, heads, t_len, n_seqs = 4, 2, 3, 2
    q = c.tensor(F32, size, heads, t_len, n_seqs)
    k = c.tensor(F32, size, 1, t_len, n_seqs)  # one key head shared by both value heads
    v = c.tensor(F32, size, heads, t_len, n_seqs)
    g = c.tensor(F32, size if kda else 1, heads, t_len, n_seqs, lo=-1, hi=0)
    beta = c.tensor(F32, 1, heads, t_len, n_seqs, lo=0, hi=1)
    state = c.tensor(F32, size, size, heads, n_seqs)
    n_out = size * heads * t_len * n_seqs
    out = B.gated_delta_net(c.ctx, q, k, v, g, beta, state, n_keep)
    assert out.nelements() == n_out + size * size * heads * n_seqs * n_keep
    got = c.compute(out).reshape(-1)
    qv, kv, vv = (values(x).astype(np.float64) for x in (q, k, v))
    gv, bv, sv = values(g).astype(np.float64), values(beta).astype(np.float64), values(state).astype(np.float64)
    attn = np.zeros((n_seqs, t_len, heads, size))
    snaps = np.zeros((n_keep, n_seqs, heads, size, size))
    for s in range(n_seqs):
        for h in range(heads):
            S = sv[s, h].T.copy()  # S[i][j]; the stored state is transposed
            for t in range(t_len):
                decay = np.exp(gv[s, t, h]) if kda else np.exp(gv[s, t, h, 0]) * np.ones(size)
                S = S * decay[:, None]
                kk, qq = kv[s, t, 0], qv[s, t, h]
                delta = (vv[s, t, h] - S.T @ kk) * bv[s, t, h, 0]
                S = S + np.outer(kk, delta)
                attn[s, t, h] = (S.T @ qq) / math.sqrt(size)
                slot = t_len - 1 - t
                if slot < n_keep:
                    snaps[slot, s, h] = S.T
    assert_close(got, np.concatenate([attn.reshape(-1), snaps.reshape(-1)]).astype(np.float32))


def test_dsv4_hyper_connections() -> None:
    c = OpCase()
    n_embd, hc, n_tok = 6, 4, 3
    x = c.tensor(F32, n_embd, hc, n_tok)
    w = c.tensor(F32, hc, n_tok)
    pre = c.compute(B.dsv4_hc_pre(c.ctx, x, w))
    ref = np.einsum("the,th->te", values(x)[0].astype(np.float64), values(w)[0, 0].astype(np.float64))
    assert_close(pre[0, 0], ref.astype(np.float32))

    y = c.tensor(F32, n_embd, n_tok)
    res = c.tensor(F32, n_embd, hc, n_tok)
    post = c.tensor(F32, hc, n_tok)
    comb = c.tensor(F32, hc, hc, n_tok)
    got = c.compute(B.dsv4_hc_post(c.ctx, y, res, post, comb))
    yv, rv = values(y)[0, 0].astype(np.float64), values(res)[0].astype(np.float64)
    pv, cv = values(post)[0, 0].astype(np.float64), values(comb)[0].astype(np.float64)
    ref = np.zeros((n_tok, hc, n_embd))
    for t in range(n_tok):
        for d in range(hc):
            ref[t, d] = yv[t] * pv[t, d] + sum(rv[t, s] * cv[t, s, d] for s in range(hc))
    assert_close(got[0], ref.astype(np.float32))

    mixes = c.tensor(F32, (2 + hc) * hc, n_tok, lo=-2, hi=2)
    scale = c.tensor(F32, 3, lo=0.5, hi=1.5)
    base = c.tensor(F32, (2 + hc) * hc)
    eps, n_iter = 1e-3, 3
    out = B.dsv4_hc_comb(c.ctx, mixes, scale, base, eps, n_iter)
    got = c.compute(out)[0]
    mv, sc, bv = values(mixes)[0, 0].astype(np.float64), values(scale).reshape(-1), values(base).reshape(-1)
    for t in range(n_tok):
        m = np.zeros((hc, hc))  # m[src, dst]
        for s in range(hc):
            z = np.array([mv[t, 8 + d + hc * s] * sc[2] + bv[8 + d + hc * s] for d in range(hc)])
            e = np.exp(z - z.max())
            m[s] = e / e.sum() + eps
        m = m / (eps + m.sum(axis=0, keepdims=True))
        for _ in range(n_iter - 1):
            m = m / (eps + m.sum(axis=1, keepdims=True))
            m = m / (eps + m.sum(axis=0, keepdims=True))
        assert_close(got[t], m.astype(np.float32))
