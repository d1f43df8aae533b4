"""The compiled RWKV_WKV6, GATED_LINEAR_ATTN, RWKV_WKV7, NORM, L2_NORM and GROUP_NORM kernels (ops/wkv_jit.py,
ops/nn_jit.py): ggml-cpu's bits on x86/AVX2 (checked against a numpy transcription of ops.cpp's float order,
written here apart from the kernels), close to the numpy kernels, the same bits on any thread count, and
several sequences in one batch equal to each run alone."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.opcheck import OpCase, values
from pyggml.backend.cpu.compute import _resolve, compute_forward, graph_compute
from pyggml.backend.cpu.plan import plan_for
from pyggml.graph import Graph
from pyggml.ops import builders as B
from pyggml.tensor import Tensor
from pyggml.types import GGMLType

F32 = GGMLType.F32
NAMES = {"wkv6": ("k", "v", "r", "tf", "td"), "gla": ("k", "v", "q", "g"), "wkv7": ("r", "w", "k", "v", "a", "b")}
GLA_SCALE = 0.375


def _fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 fma: the float32 product is exact in float64; the float64 sum rounded to float32 differs from
    one rounding only at rare double-rounding ties."""
    return (np.asarray(a, np.float64) * b + c).astype(np.float32)


def _vec_dot(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f32 on AVX2 over the last axis (a multiple of 32): four 8-lane fma accumulators,
    GGML_F32x8_REDUCE ((x0+x2)+(x1+x3), the 128-bit halves added, two horizontal adds)."""
    x, y = np.broadcast_arrays(x, y)
    acc = np.zeros((*x.shape[:-1], 4, 8), np.float32)
    for j in range(0, x.shape[-1], 32):
        acc = _fma(x[..., j:j + 32].reshape(acc.shape), y[..., j:j + 32].reshape(acc.shape), acc)
    x0 = (acc[..., 0, :] + acc[..., 2, :]) + (acc[..., 1, :] + acc[..., 3, :])
    t0 = x0[..., :4] + x0[..., 4:]
    return (t0[..., 0] + t0[..., 1]) + (t0[..., 2] + t0[..., 3])


def _ggml_order(kind: str, ins: dict[str, np.ndarray], state: np.ndarray, n_seqs: int) -> np.ndarray:
    """ops.cpp's recurrences in its float order: ins[name] is (T, H, S) (tf: (H, S)), state (n_seqs, H, S, S)."""
    t_len, heads, size = ins["v"].shape
    y = np.zeros((t_len, heads, size), np.float32)
    states = state.copy()
    per = t_len // n_seqs
    for t in range(t_len):
        st = states[t // per]  # (H, i, j), updated in place
        if kind == "wkv7":
            r, w, k, v, a, b = (ins[n][t] for n in NAMES["wkv7"])
            sa = _vec_dot(st, a[:, None, :])  # (H, i)
            st[...] = _fma(sa[:, :, None], b[:, None, :], _fma(st, w[:, None, :], v[:, :, None] * k[:, None, :]))
            y[t] = _vec_dot(st, r[:, None, :])
            continue
        for i in range(size):  # the key channel: the outputs' sums run over it in order
            kv = ins["v"][t] * ins["k"][t, :, i, None]  # (H, j)
            prev = st[:, i, :]
            if kind == "wkv6":
                temp = _fma(kv, ins["tf"][:, i, None], prev)
                y[t] = _fma(temp, ins["r"][t, :, i, None], y[t])
                st[:, i, :] = _fma(prev, ins["td"][t, :, i, None], kv)
            else:
                temp = _fma(prev, ins["g"][t, :, i, None], kv)
                y[t] = _fma(temp, ins["q"][t, :, i, None] * np.float32(GLA_SCALE), y[t])
                st[:, i, :] = temp
    return np.concatenate([y.reshape(-1), states.reshape(-1)])


def _build(kind: str, c: OpCase, size: int, heads: int, t_len: int, n_seqs: int) -> tuple[Tensor, dict, Tensor]:
    ts = {}
    for n in NAMES[kind]:
        lo, hi = (0.5, 0.999) if n in ("td", "g", "w") else (-1.0, 1.0)  # decays in (0, 1)
        ts[n] = c.tensor(F32, size, heads, *(() if n == "tf" else (t_len,)), lo=lo, hi=hi)
    state = c.tensor(F32, size * size * heads, n_seqs)
    args = [ts[n] for n in NAMES[kind]]
    if kind == "wkv6":
        out = B.rwkv_wkv6(c.ctx, *args, state)
    elif kind == "gla":
        out = B.gated_linear_attn(c.ctx, *args, state, GLA_SCALE)
    else:
        out = B.rwkv_wkv7(c.ctx, *args, state)
    return out, ts, state


def _compiled(out: Tensor, n_threads: int) -> np.ndarray:
    g = Graph()
    g.build_forward_expand(out)
    assert any(n is out for n in plan_for(g, _resolve).nodes), f"{out.op.name} did not take a compiled kernel"
    assert graph_compute(g, n_threads) == 0
    return values(out).reshape(-1)


def _numpy(out: Tensor) -> np.ndarray:
    compute_forward(out, 1)
    return values(out).reshape(-1)


@pytest.mark.parametrize(("kind", "size", "heads", "t_len", "n_seqs"), [
    *((kind, *dims) for kind in ("wkv6", "gla", "wkv7") for dims in ((64, 3, 4, 2), (32, 2, 3, 3))),
    ("wkv6", 8, 5, 2, 1), ("gla", 12, 3, 2, 1)])  # WKV7 takes heads of 32k only (see the next test)
def test_wkv_is_ggmls_float_order(kind: str, size: int, heads: int, t_len: int, n_seqs: int) -> None:
    c = OpCase()
    out, ts, state = _build(kind, c, size, heads, t_len, n_seqs)
    got = _compiled(out, 3)
    ins = {n: values(t).reshape((heads, size) if n == "tf" else (t_len, heads, size)) for n, t in ts.items()}
    want = _ggml_order(kind, ins, values(state).reshape(n_seqs, heads, size, size), n_seqs)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(_compiled(out, 1), got)  # threads split heads: the same bits
    ref = _numpy(out)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))


def test_wkv7_odd_head_size_runs_the_numpy_kernel() -> None:
    c = OpCase()
    out, _, _ = _build("wkv7", c, 16, 2, 2, 1)
    g = Graph()
    g.build_forward_expand(out)
    assert not any(n is out for n in plan_for(g, _resolve).nodes)


@pytest.mark.parametrize("kind", ["wkv6", "gla", "wkv7"])
def test_sequences_together_equal_each_alone(kind: str) -> None:
    """Three sequences of 2 tokens in one batch: each sequence's outputs and final state are those of a batch
    holding only it (its initial state, its tokens)."""
    size, heads, per, n_seqs = 32, 2, 2, 3
    c = OpCase()
    out, ts, state = _build(kind, c, size, heads, per * n_seqs, n_seqs)
    got = _compiled(out, 2)
    n_out = per * n_seqs * heads * size
    ys, finals = got[:n_out].reshape(n_seqs, -1), got[n_out:].reshape(n_seqs, -1)
    st_all = values(state).reshape(n_seqs, -1)
    for s in range(n_seqs):
        one = OpCase()
        data = {n: values(t) if n == "tf" else values(t).reshape(n_seqs, per, heads, size)[s] for n, t in ts.items()}
        args = [one.tensor(F32, size, heads, *(() if n == "tf" else (per,)), data=data[n]) for n in NAMES[kind]]
        st = one.tensor(F32, size * size * heads, 1, data=st_all[s])
        fn = {"wkv6": B.rwkv_wkv6, "wkv7": B.rwkv_wkv7}.get(kind)
        alone = fn(one.ctx, *args, st) if fn else B.gated_linear_attn(one.ctx, *args, st, GLA_SCALE)
        res = _compiled(alone, 2)
        np.testing.assert_array_equal(res[:per * heads * size], ys[s])
        np.testing.assert_array_equal(res[per * heads * size:], finals[s])


def _l2_ggml(x: np.ndarray, eps: float) -> np.ndarray:
    ssq = np.zeros(x.shape[:-1], np.float64)
    for i in range(x.shape[-1]):  # in order, each float square widened
        ssq += (x[..., i] * x[..., i]).astype(np.float64)
    scale = np.float32(1.0) / np.maximum(np.sqrt(ssq.astype(np.float32)), np.float32(eps))
    return x * scale[..., None]


@pytest.mark.parametrize("eps", [1e-12, 4.0])
def test_l2_norm(eps: float) -> None:
    c = OpCase()
    a = c.tensor(F32, 64, 5, 3, lo=-2, hi=2)
    out = B.l2_norm(c.ctx, a, eps)
    got = _compiled(out, 2).reshape(3, 5, 64)
    np.testing.assert_array_equal(got, _l2_ggml(values(a)[0], eps))
    np.testing.assert_allclose(got, _numpy(out).reshape(3, 5, 64), rtol=1e-6, atol=1e-7)


def _group_norm_ggml(x: np.ndarray, n_groups: int, eps: float) -> np.ndarray:
    """ggml's group norm on (ne3, ne2, ne1, ne0): per group and batch, per-row double sums added in order."""
    y = np.empty_like(x)
    per = (x.shape[1] + n_groups - 1) // n_groups
    for g in range(n_groups):
        c0, c1 = g * per, min(g * per + per, x.shape[1])
        for b in range(x.shape[0]):
            blk = x[b, c0:c1]
            cnt = blk.size
            total = 0.0
            for row in blk.reshape(-1, x.shape[3]):
                s = 0.0
                for v in row:
                    s += float(v)
                total += s
            mean = np.float32(total / cnt)
            d = blk - mean
            total = 0.0
            for row in d.reshape(-1, x.shape[3]):
                s = 0.0
                for v in row:
                    s += float(v * v)
                total += s
            scale = np.float32(1.0) / np.sqrt(np.float32(total / cnt) + np.float32(eps))
            y[b, c0:c1] = d * scale
    return y


@pytest.mark.parametrize("n_groups", [2, 3])
def test_group_norm(n_groups: int) -> None:
    c = OpCase()
    a = c.tensor(F32, 6, 4, 5, 2, lo=-3, hi=5)
    out = B.group_norm(c.ctx, a, n_groups, 1e-5)
    got = _compiled(out, 2).reshape(2, 5, 4, 6)
    np.testing.assert_array_equal(got, _group_norm_ggml(values(a), n_groups, 1e-5))
    np.testing.assert_allclose(got, _numpy(out).reshape(2, 5, 4, 6), rtol=1e-5, atol=1e-6)


def _norm_ggml(x: np.ndarray, eps: float) -> np.ndarray:
    """ggml_compute_forward_norm_f32 on AVX2: float mean from a double sum; ggml_vec_cvar_f32's variance."""
    n = x.shape[-1]
    mean = np.float32(x.astype(np.float64).sum(-1).astype(np.float32)) / np.float32(n)  # exact: a short sum
    d = (x - mean[..., None]).astype(np.float32)
    q = d * d
    nv = n - n % 8
    g = q[..., :nv].reshape(*q.shape[:-1], -1, 8)
    lanes = ((g[..., 4] + g[..., 0]) + (g[..., 6] + g[..., 2])) + ((g[..., 5] + g[..., 1]) + (g[..., 7] + g[..., 3]))
    total = np.zeros(q.shape[:-1], np.float64)
    for k in range(lanes.shape[-1]):  # in order
        total += lanes[..., k].astype(np.float64)
    for i in range(nv, n):
        total += q[..., i].astype(np.float64)
    scale = np.float32(1.0) / np.sqrt((total / n).astype(np.float32) + np.float32(eps))
    return d * scale[..., None]


@pytest.mark.parametrize("ne0", [64, 37])
def test_norm(ne0: int) -> None:
    c = OpCase()
    a = c.tensor(F32, ne0, 5, 3, lo=-2, hi=3)
    out = B.norm(c.ctx, a, 1e-5)
    got = _compiled(out, 2).reshape(3, 5, ne0)
    np.testing.assert_array_equal(got, _norm_ggml(values(a)[0], 1e-5))
    np.testing.assert_allclose(got, _numpy(out).reshape(3, 5, ne0), rtol=1e-5, atol=1e-6)
