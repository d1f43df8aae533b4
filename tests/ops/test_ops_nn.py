"""Norms, softmax, RoPE and flash attention against float64 numpy references."""

from __future__ import annotations

import math

import numpy as np
import pytest

from helpers.opcheck import NMSE_MATMUL, NMSE_SOFTMAX, OpCase, assert_close, rope_ref, round_f16, values
from pyggml.ops import builders as B
from pyggml.types import GGMLType

F32, F16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.I32

# ------------------------------------------------------------------------------------------ norms


def test_rms_norm_matches_double_sum_model_bitwise() -> None:
    c = OpCase()
    a = c.tensor(F32, 640, 5, 2, lo=-3, hi=3)
    eps = 1e-6
    got = c.compute(B.rms_norm(c.ctx, a, eps))
    x = values(a)
    # squares rounded to float32, summed exactly (ggml sums them in double)
    ssq = np.array([[[math.fsum(float(v) for v in np.square(row)) for row in p] for p in q] for q in x])
    mean = (ssq / 640).astype(np.float32)[..., None]
    ref = x * (np.float32(1) / np.sqrt(mean + np.float32(eps)))
    assert_close(got, ref, max_nmse=1e-12)


def test_rms_norm_permuted_input() -> None:
    c = OpCase()
    base = c.tensor(F32, 6, 32, 3)
    a = B.permute(c.ctx, base, 1, 0, 2, 3)  # rows are strided
    got = c.compute(B.rms_norm(c.ctx, a, 1e-5))
    x = values(a).astype(np.float64)
    assert_close(got, (x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-5)).astype(np.float32))


def test_norm() -> None:
    c = OpCase()
    a = c.tensor(F32, 100, 4, 3, lo=-2, hi=5)
    got = c.compute(B.norm(c.ctx, a, 1e-5))
    x = values(a).astype(np.float64)
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    assert_close(got, ((x - mu) / np.sqrt(var + 1e-5)).astype(np.float32))


def test_l2_norm() -> None:
    c = OpCase()
    a = c.tensor(F32, 64, 6)
    got = c.compute(B.l2_norm(c.ctx, a, 1e-12))
    x = values(a).astype(np.float64)
    assert_close(got, (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32))


@pytest.mark.parametrize("n_groups", [2, 3])
def test_group_norm(n_groups: int) -> None:
    c = OpCase()
    a = c.tensor(F32, 8, 5, 6, 2, lo=-1, hi=3)
    got = c.compute(B.group_norm(c.ctx, a, n_groups, 1e-6))
    x = values(a).astype(np.float64)
    ref = np.empty_like(x)
    per = (6 + n_groups - 1) // n_groups
    for g in range(n_groups):
        sl = slice(g * per, min(6, (g + 1) * per))
        blk = x[:, sl]
        mu = blk.mean(axis=(1, 2, 3), keepdims=True)
        var = ((blk - mu) ** 2).mean(axis=(1, 2, 3), keepdims=True)
        ref[:, sl] = (blk - mu) / np.sqrt(var + 1e-6)
    assert_close(got, ref.astype(np.float32))


# --------------------------------------------------------------------------------------- softmax


def _alibi(n_head: int, max_bias: float) -> np.ndarray:
    if max_bias <= 0:
        return np.ones(n_head)
    n2 = 2 ** math.floor(math.log2(n_head))
    m0 = 2 ** (-max_bias / n2)
    m1 = 2 ** (-(max_bias / 2) / n2)
    return np.array([m0 ** (h + 1) if h < n2 else m1 ** (2 * (h - n2) + 1) for h in range(n_head)])


def _softmax_ref(x: np.ndarray, sinks: np.ndarray | None = None) -> np.ndarray:
    mx = x.max(axis=-1, keepdims=True)
    if sinks is not None:
        mx = np.maximum(mx, sinks)
    e = np.exp(x - mx)
    tot = e.sum(axis=-1, keepdims=True)
    if sinks is not None:
        tot = tot + np.exp(sinks - mx)
    return e / tot


def test_soft_max_plain() -> None:
    c = OpCase()
    a = c.tensor(F32, 37, 4, 3, lo=-5, hi=5)
    got = c.compute(B.soft_max(c.ctx, a))
    assert_close(got, _softmax_ref(values(a).astype(np.float64)).astype(np.float32), NMSE_SOFTMAX)


@pytest.mark.parametrize("mask_type", [F16, F32])
@pytest.mark.parametrize("max_bias", [0.0, 8.0])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_soft_max_ext(mask_type: GGMLType, max_bias: float, with_sinks: bool) -> None:
    c = OpCase()
    n_kv, n_q, n_head = 20, 6, 6
    a = c.tensor(F32, n_kv, n_q, n_head, 2, lo=-3, hi=3)
    m = c.rng.uniform(-2, 0, size=(1, 1, 8, n_kv)).astype(np.float32)  # mask.ne1 (8) >= n_q
    m[..., 3, 10:] = -np.inf  # a causal-like block
    mask = c.tensor(mask_type, n_kv, 8, data=m)
    scale = 0.37
    out = B.soft_max_ext(c.ctx, a, mask, scale, max_bias)
    sinks_v = None
    if with_sinks:
        sinks = c.tensor(F32, n_head, lo=-1, hi=2)
        B.soft_max_add_sinks(out, sinks)
        sinks_v = values(sinks).astype(np.float64).reshape(1, n_head, 1, 1)
    got = c.compute(out)
    slope = _alibi(n_head, max_bias).reshape(1, n_head, 1, 1)
    w = values(a).astype(np.float64) * np.float32(scale) + slope * values(mask).astype(np.float64)[:, :, :n_q, :]
    assert_close(got, _softmax_ref(w, sinks_v).astype(np.float32), NMSE_SOFTMAX)


def test_soft_max_mask_broadcast_over_heads() -> None:
    """mask.ne2 = 2 divides 4 heads: head h uses mask plane h % 2."""
    c = OpCase()
    a = c.tensor(F32, 9, 3, 4)
    mask = c.tensor(F32, 9, 3, 2, lo=-3, hi=0)
    got = c.compute(B.soft_max_ext(c.ctx, a, mask, 1.0, 0.0))
    mv = values(mask).astype(np.float64)
    w = values(a).astype(np.float64) + np.concatenate([mv, mv], axis=1)
    assert_close(got, _softmax_ref(w).astype(np.float32), NMSE_SOFTMAX)


# ------------------------------------------------------------------------------------------ rope


@pytest.mark.parametrize("ty", [F32, F16])
@pytest.mark.parametrize("mode", [0, B.GGML_ROPE_TYPE_NEOX], ids=["normal", "neox"])
@pytest.mark.parametrize("n_dims", [32, 24])  # 24 < head_dim: the tail is copied
def test_rope(mode: int, n_dims: int, ty: GGMLType) -> None:
    c = OpCase()
    a = c.tensor(ty, 32, 4, 7)  # head_dim, n_head, n_tokens
    pos = np.array([0, 1, 2, 5, 17, 63, 150])
    p = c.ints(I32, 7, data=pos)
    got = c.compute(B.rope_ext(c.ctx, a, p, None, n_dims, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0))
    ref = rope_ref(values(a), pos, n_dims, mode != 0).astype(np.float32)
    assert_close(got, round_f16(ref) if ty == F16 else ref)


def test_rope_yarn_and_freq_factors() -> None:
    c = OpCase()
    a = c.tensor(F32, 64, 2, 5)
    pos = np.array([3, 40, 100, 200, 511])
    p = c.ints(I32, 5, data=pos)
    ff = c.tensor(F32, 32, lo=1.0, hi=4.0)
    n_ctx_orig, base, fs, ext, attn, bf, bs = 256, 10000.0, 0.25, 1.0, 1.0, 32.0, 1.0
    out = B.rope_ext(c.ctx, a, p, ff, 64, B.GGML_ROPE_TYPE_NEOX, n_ctx_orig, base, fs, ext, attn, bf, bs)
    got = c.compute(out)
    corr = B.rope_yarn_corr_dims(64, n_ctx_orig, base, bf, bs)
    ref = rope_ref(values(a), pos, 64, True, base, fs, ext, attn, corr, values(ff).reshape(-1).astype(np.float64))
    assert_close(got, ref.astype(np.float32))


def test_rope_theta_is_a_cumulative_float32_product() -> None:
    """At position 8000 ggml's repeated float32 multiplication differs from exact powers; we follow ggml."""
    c = OpCase()
    a = c.tensor(F32, 128, 1, 1)
    pos = np.array([8000])
    got = c.compute(B.rope(c.ctx, a, c.ints(I32, 1, data=pos), 128, B.GGML_ROPE_TYPE_NEOX))
    theta_scale = np.float32(10000.0) ** np.float32(-2.0 / 128)
    th = np.float32(8000.0)
    thetas = []
    for _ in range(64):
        thetas.append(th)
        th = np.float32(th * theta_scale)
    thetas = np.array(thetas, dtype=np.float64)
    x = values(a).astype(np.float64)[0, 0, 0]
    x0, x1 = x[:64], x[64:]
    ref = np.concatenate([x0 * np.cos(thetas) - x1 * np.sin(thetas), x0 * np.sin(thetas) + x1 * np.cos(thetas)])
    assert np.abs(got.reshape(-1) - ref).max() < 2e-5
    exact = rope_ref(values(a), pos, 128, True).reshape(-1)
    assert np.abs(got.reshape(-1) - exact).max() > 1e-4  # exact powers would be measurably off


# ------------------------------------------------------------------------------- flash attention


def _attn_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, scale: float,
              max_bias: float, softcap: float, sinks: np.ndarray | None) -> np.ndarray:
    """q (b, H, N, D), k (b, Hk, M, D), v (b, Hv, M, Dv) -> (b, N, H, Dv) in float64."""
    H, Hk, Hv = q.shape[1], k.shape[1], v.shape[1]
    kk = np.repeat(k, H // Hk, axis=1)
    vv = np.repeat(v, H // Hv, axis=1)
    s = np.matmul(q, np.swapaxes(kk, -1, -2)) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if mask is not None:
        s = s + _alibi(H, max_bias).reshape(1, H, 1, 1) * mask
    sk = None if sinks is None else sinks.reshape(1, H, 1, 1)
    p = _softmax_ref(s, sk)
    return np.matmul(p, vv).transpose(0, 2, 1, 3)


@pytest.mark.parametrize(
    ("kv_type", "n_q", "softcap", "max_bias", "with_sinks"),
    [
        (F16, 1, 0.0, 0.0, False),
        (F16, 7, 0.0, 0.0, True),
        (F32, 7, 30.0, 0.0, False),
        (F16, 70, 0.0, 8.0, False),  # >= 64 queries: ggml's tiled path (Q stays F32)
        (GGMLType.Q8_0, 3, 0.0, 0.0, False),
    ],
)
def test_flash_attn_ext(kv_type: GGMLType, n_q: int, softcap: float, max_bias: float, with_sinks: bool) -> None:
    c = OpCase()
    d, n_kv, H, Hk = 64, 40, 4, 2
    q = c.tensor(F32, d, n_q, H)
    k = c.tensor(kv_type, d, n_kv, Hk)
    v = c.tensor(kv_type, d, n_kv, Hk)
    m = np.zeros((1, 1, n_q, n_kv), dtype=np.float32)
    for i in range(n_q):  # causal mask over a 30-token history
        m[0, 0, i, 30 + i + 1 :] = -np.inf
    mask = c.tensor(F16, n_kv, n_q, data=m)
    scale = 1.0 / math.sqrt(d)
    out = B.flash_attn_ext(c.ctx, q, k, v, mask, scale, max_bias, softcap)
    sinks_v = None
    if with_sinks:
        sinks = c.tensor(F32, H)
        B.flash_attn_ext_add_sinks(out, sinks)
        sinks_v = values(sinks).astype(np.float64)
    got = c.compute(out)
    assert out.ne == [d, H, n_q, 1]
    f64 = np.float64
    ref = _attn_ref(values(q).astype(f64), values(k).astype(f64), values(v).astype(f64),
                    values(mask).astype(f64), scale, max_bias, softcap, sinks_v)
    assert_close(got, ref.astype(np.float32), NMSE_MATMUL)


def test_flash_attn_ext_permuted_q_and_fully_masked_row() -> None:
    """Q as a permuted view (as llama.cpp passes it); a row masked everywhere yields zeros like ggml."""
    c = OpCase()
    d, n_q, H, n_kv = 32, 3, 2, 8
    qbase = c.tensor(F32, d, H, n_q)  # [D, heads, tokens] -> permute to [D, tokens, heads]
    q = B.permute(c.ctx, qbase, 0, 2, 1, 3)
    k = c.tensor(F16, d, n_kv, H)
    v = c.tensor(F16, d, n_kv, H)
    m = np.zeros((1, 1, n_q, n_kv), dtype=np.float32)
    m[0, 0, 1, :] = -np.inf
    mask = c.tensor(F16, n_kv, n_q, data=m)
    got = c.compute(B.flash_attn_ext(c.ctx, q, k, v, mask, 0.2, 0.0, 0.0))
    assert (got[0, 1] == 0).all()
    f64 = np.float64
    ref = _attn_ref(values(q).astype(f64), values(k).astype(f64), values(v).astype(f64), None, 0.2, 0.0, 0.0, None)
    keep = [0, 2]
    assert_close(got[:, keep], ref[:, keep].astype(np.float32), NMSE_MATMUL)


def _mrope_ref(x: np.ndarray, pos: np.ndarray, n_dims: int, sections: list[int], mode: int,
               base: float = 10000.0) -> np.ndarray:
    """Multi-section RoPE in float64: each pair takes the angle of the t/h/w/e position stream its
    sector selects; VISION restarts the frequency ladder at each section and rotates (x_i, x_{i+n_dims})."""
    n_tok = x.shape[1]
    streams = pos.reshape(4, n_tok).astype(np.float64)
    s0, s1, s2, _ = sections
    total = sum(sections)
    vision = mode == B.GGML_ROPE_TYPE_VISION
    n_pairs = n_dims if vision else n_dims // 2
    theta = np.zeros((n_tok, n_pairs))
    for i in range(n_pairs):
        sector = i % total
        if mode == B.GGML_ROPE_TYPE_IMROPE:
            if sector % 3 == 1 and sector < 3 * s1:
                k = 1
            elif sector % 3 == 2 and sector < 3 * s2:
                k = 2
            elif sector % 3 == 0 and sector < 3 * s0:
                k = 0
            else:
                k = 3
        else:
            k = 0 if sector < s0 else 1 if sector < s0 + s1 else 2 if sector < s0 + s1 + s2 else 3
        start = [0, s0, s0 + s1, s0 + s1 + s2][k] if vision else 0
        # vision restarts each section's ladder; the others count the exponent from pair 0
        exponent = (i - (i // total) * total - start) if vision else i
        theta[:, i] = streams[k] * base ** (-2.0 * exponent / n_dims)
    cos, sin = np.cos(theta)[None, :, None, :], np.sin(theta)[None, :, None, :]
    y = x.astype(np.float64).copy()
    off = n_dims if vision else n_dims // 2
    x0, x1 = y[..., :off].copy(), y[..., off : 2 * off].copy()
    y[..., :off] = x0 * cos - x1 * sin
    y[..., off : 2 * off] = x0 * sin + x1 * cos
    return y


@pytest.mark.parametrize(
    ("mode", "sections", "head_dim", "n_dims"),
    [
        (B.GGML_ROPE_TYPE_MROPE, [4, 6, 6, 0], 32, 32),
        (B.GGML_ROPE_TYPE_IMROPE, [4, 6, 6, 0], 32, 32),
        (B.GGML_ROPE_TYPE_VISION, [8, 8, 0, 0], 32, 16),
    ],
    ids=["mrope", "imrope", "vision"],
)
def test_rope_multi_sections(mode: int, sections: list[int], head_dim: int, n_dims: int) -> None:
    c = OpCase()
    n_tok = 5
    a = c.tensor(F32, head_dim, 2, n_tok)
    pos = c.rng.integers(0, 50, size=4 * n_tok)
    p = c.ints(I32, 4 * n_tok, data=pos)
    out = B.rope_multi(c.ctx, a, p, None, n_dims, sections, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)
    got = c.compute(out)
    assert_close(got, _mrope_ref(values(a), pos, n_dims, sections, mode).astype(np.float32))


def test_lightning_indexer() -> None:
    c = OpCase()
    n_embd, n_head, n_tok, n_kv = 8, 3, 4, 6
    q = c.tensor(F32, n_embd, n_head, n_tok)
    k = c.tensor(F16, n_embd, 1, n_kv)
    w = c.tensor(F32, n_head, n_tok)
    m = c.tensor(F16, n_kv, n_tok, lo=-1, hi=0)
    out = B.lightning_indexer(c.ctx, q, k, w, m)
    got = c.compute(out)[0, 0]
    qv, kv = values(q)[0].astype(np.float64), values(k)[0, :, 0].astype(np.float64)
    wv, mv = values(w)[0, 0].astype(np.float64), values(m)[0, 0].astype(np.float64)
    ref = np.zeros((n_tok, n_kv))
    for t in range(n_tok):
        for ik in range(n_kv):
            ref[t, ik] = sum(max(qv[t, h] @ kv[ik], 0.0) * wv[t, h] for h in range(n_head)) + mv[t, ik]
    assert_close(got, ref.astype(np.float32))
