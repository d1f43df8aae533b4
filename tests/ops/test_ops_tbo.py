"""Regressions found by running llama.cpp's test-backend-ops against ``pyggml rpc-server``.

Each test names the test-backend-ops case shape it comes from; references are plain numpy loops.
"""

from __future__ import annotations

import numpy as np

from helpers.opcheck import OpCase, assert_close, values
from pyggml.ops import builders as B
from pyggml.types import GGMLType

F32, F16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.I32




def test_conv_transpose_2d_batched() -> None:
    # CONV_TRANSPOSE_2D(ne_input=[10,10,9,2],ne_kernel=[3,3,1,9],stride=2): every batch, not just the first
    c = OpCase()
    kern = c.tensor(F32, 2, 3, 2, 3)  # [KW, KH, OC, IC]
    src = c.tensor(F32, 4, 3, 3, 2)  # [W, H, IC, N]
    st = 2
    ow, oh = (4 - 1) * st + 2, (3 - 1) * st + 3
    got = c.compute(B.conv_transpose_2d_p0(c.ctx, kern, src, st))
    w, x = values(kern).astype(np.float64), values(src).astype(np.float64)
    ref = np.zeros((2, 2, oh, ow))
    for n in range(2):
        for y in range(3):
            for xx in range(4):
                for ky in range(3):
                    for kx in range(2):
                        ref[n, :, y * st + ky, xx * st + kx] += (w[:, :, ky, kx] * x[n, :, y, xx][:, None]).sum(axis=0)
    assert_close(got, ref.astype(np.float32))


def test_dsv4_hc_pre_gated_and_scaled() -> None:
    # DSV4_HC_PRE(n_embd=128,n_hc=2,n_tokens=17,gated=1): ggml_dsv4_hc_pre_gated(x, gate, scale)
    c = OpCase()
    n_embd, hc, n_tok, scale = 5, 3, 2, 0.75
    x = c.tensor(F32, n_embd, hc, n_tok)
    gate = c.tensor(F32, n_embd, hc, n_tok, lo=-3, hi=3)
    got = c.compute(B.dsv4_hc_pre_gated(c.ctx, x, gate, scale))
    xv, gv = values(x)[0].astype(np.float64), values(gate)[0].astype(np.float64)
    ref = scale * (xv / (1.0 + np.exp(-gv))).sum(axis=1)  # (T, n_embd)
    assert_close(got[0, 0], ref.astype(np.float32))
    # ungated keeps the op_params scale too (ggml_dsv4_hc_pre stores 1.0; any value is honoured)
    w = c.tensor(F32, hc, n_tok)
    ungated = B.dsv4_hc_pre(c.ctx, x, w)
    ungated.set_op_params_f32(0, 2.0)
    got = c.compute(ungated)
    ref = 2.0 * np.einsum("the,th->te", xv, values(w)[0, 0].astype(np.float64))
    assert_close(got[0, 0], ref.astype(np.float32))


def test_dsv4_hc_post_without_comb_is_identity_mixing() -> None:
    # DSV4_HC_POST(n_embd=31,n_tokens=17,identity=1,gated=0): src3 (comb) is NULL
    c = OpCase()
    n_embd, hc, n_tok = 6, 4, 3
    y = c.tensor(F32, n_embd, n_tok)
    res = c.tensor(F32, n_embd, hc, n_tok)
    post = c.tensor(F32, hc, n_tok)
    got = c.compute(B.dsv4_hc_post(c.ctx, y, res, post, None))
    yv, rv = values(y)[0, 0].astype(np.float64), values(res)[0].astype(np.float64)
    pv = values(post)[0, 0].astype(np.float64)
    ref = yv[:, None, :] * pv[:, :, None] + rv
    assert_close(got[0], ref.astype(np.float32))


def test_cpy_f32_to_iq4_nl_uses_the_cpu_from_float() -> None:
    # CPY(type_src=f32,type_dst=iq4_nl,ne_src=[256,4,4,4]): ggml-cpu's IQ4_NL from_float is
    # quantize_row_iq4_nl_ref (no scale search), not ggml_quantize_chunk's searched scale
    from pyggml import quants
    from pyggml.quants.iq4 import quantize_iq4_nl_ref

    c = OpCase()
    src = c.tensor(F32, 256, 4)
    dst = c.ctx.new_tensor(GGMLType.IQ4_NL, 256, 4)
    out = B.cpy(c.ctx, src, dst)
    c.compute(out)
    x = values(src)[0, 0]
    got = np.array(out.view4()).reshape(4, -1)
    want = quantize_iq4_nl_ref(x)
    assert not np.array_equal(want, quants.quantize(x, GGMLType.IQ4_NL))  # the case tells them apart
    assert np.array_equal(got, want)


def test_im2col_3d_with_fewer_channels_than_ic_is_empty() -> None:
    # IM2COL_3D(ne_input=[20,20,10,3],IC=3,v=1): the view has ne3 = 1 < IC, so N = 0 and dst is empty
    c = OpCase()
    kern = c.tensor(F32, 3, 3, 3, 3)
    img = c.tensor(F32, 6, 6, 5, 1)
    out = B.im2col_3d(c.ctx, kern, img, 3, 1, 1, 1, 0, 0, 0, 1, 1, 1, F32)
    assert out.ne == [3 * 3 * 3 * 3, 4, 4, 0]
    assert c.compute(out).size == 0


def test_scale_bf16() -> None:
    # SCALE(type=bf16,ne=[10,10,10,10],scale=2.000000,bias=1.000000): ggml-cpu has a BF16 scale
    from helpers.opcheck import round_bf16

    c = OpCase()
    a = c.tensor(GGMLType.BF16, 10, 3, 2)
    got = c.compute(B.scale_bias(c.ctx, a, 2.0, 1.0))
    assert np.array_equal(got, round_bf16(values(a) * np.float32(2.0) + np.float32(1.0)))


def test_rope_offset_window() -> None:
    # ROPE_BACK(...,mode=40,...,n_offs=32): ggml_rope_set_offset stores n_offs in op_params[15];
    # only dims [n_offs, n_offs + n_dims) rotate, the rest are copied
    from helpers.opcheck import rope_ref

    c = OpCase()
    a = c.tensor(F32, 64, 3, 5)  # head_dim, n_head, n_tokens
    pos = np.array([0, 3, 9, 20, 41])
    p = c.ints(I32, 5, data=pos)
    n_dims, n_offs = 24, 32
    for mode in (0, B.GGML_ROPE_TYPE_NEOX):
        out = B.rope_set_offset(B.rope_ext(c.ctx, a, p, None, n_dims, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0),
                                n_offs)
        got = c.compute(out)
        x = values(a)
        ref = x.astype(np.float64)
        ref[..., n_offs : n_offs + n_dims] = rope_ref(x[..., n_offs : n_offs + n_dims], pos, n_dims, mode != 0)
        assert_close(got, ref.astype(np.float32))
    # the backward rope (inverse rotation) honours the same window: back(rope(x)) == x, for IMROPE too
    pos4 = c.ints(I32, 20, data=np.arange(20) % 7)
    fwd = B.rope_multi(c.ctx, a, pos4, None, n_dims, [8, 8, 8, 0], B.GGML_ROPE_TYPE_IMROPE, 0, 10000.0, 1.0, 0.0,
                       1.0, 0.0, 0.0)
    B.rope_set_offset(fwd, n_offs)
    back = B.rope_multi_back(c.ctx, fwd, pos4, None, n_dims, [8, 8, 8, 0], B.GGML_ROPE_TYPE_IMROPE, 0, 10000.0, 1.0,
                             0.0, 1.0, 0.0, 0.0)
    B.rope_set_offset(back, n_offs)
    assert_close(c.compute(back), values(a))


def test_swiglu_clamp() -> None:
    # SWIGLU_CLAMP(type=f32,ne_a=[128,2,2,2],v=0,limit=2.000000): GGML_GLU_OP_SWIGLU_CLAMP (= 6),
    # limit in op_params f32[3]; one operand (halves, optionally swapped) or two
    c = OpCase()
    limit = 2.0
    a = c.tensor(F32, 16, 3, lo=-4, hi=4)
    b = c.tensor(F32, 8, 3, lo=-4, hi=4)
    av = values(a).astype(np.float64)

    def ref(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        x = np.minimum(x, limit)
        return (x / (1.0 + np.exp(-x)) * np.clip(g, -limit, limit)).astype(np.float32)

    for swapped in (0, 1):
        node = B.swiglu_clamp(c.ctx, a, None, limit)
        node.set_op_params_i32(1, swapped)  # ggml has no swiglu_clamp_swapped; the kernel honours the flag
        got = c.compute(node)
        x, g = (av[..., 8:], av[..., :8]) if swapped else (av[..., :8], av[..., 8:])
        assert_close(got, ref(x, g))
    got = c.compute(B.swiglu_clamp(c.ctx, c.tensor(F32, 8, 3, data=av[..., :8].astype(np.float32)), b, limit))
    assert_close(got, ref(av[..., :8], values(b).astype(np.float64)))


def test_ssm_scan_keeps_k_state_snapshots() -> None:
    # SSM_SCAN(...,n_seq_tokens=8,n_seqs=2,...,K=3): dst = [y | K*ns states]; slot 0 the final state,
    # slot k the state after token nt-1-k (Mamba-2: A is {1, n_head})
    c = OpCase()
    d_state, dim, nh, ng, nt, ns, k_slots = 4, 3, 4, 2, 5, 2, 3
    s = c.tensor(F32, d_state, dim, nh, ns)
    x = c.tensor(F32, dim, nh, nt, ns)
    dt = c.tensor(F32, nh, nt, ns)
    a = c.tensor(F32, 1, nh, lo=-1, hi=0)
    b = c.tensor(F32, d_state, ng, nt, ns)
    cc = c.tensor(F32, d_state, ng, nt, ns)
    ids = c.ints(I32, ns, data=np.array([1, 0]))
    n_y = dim * nh * nt * ns
    out = B.ssm_scan(c.ctx, s, x, dt, a, b, cc, ids, k_slots)
    assert out.ne[0] == n_y + k_slots * d_state * dim * nh * ns
    got = c.compute(out).reshape(-1)
    sv, xv, dtv = values(s).astype(np.float64), values(x).astype(np.float64), values(dt)[0].astype(np.float64)
    av, bv, cv = values(a)[0, 0].astype(np.float64), values(b).astype(np.float64), values(cc).astype(np.float64)
    y = np.zeros((ns, nt, nh, dim))
    slots = np.zeros((k_slots, ns, nh, dim, d_state))
    for i3, sid in enumerate([1, 0]):
        st = sv[sid].copy()  # (nh, dim, d_state)
        for t in range(nt):
            sp = np.log1p(np.exp(dtv[i3, t]))  # (nh,)
            g = np.arange(nh) // (nh // ng)
            x_dt = (xv[i3, t] * sp[:, None])[..., None]  # (nh, dim, 1)
            st = st * np.exp(sp * av[:, 0])[:, None, None] + bv[i3, t, g][:, None, :] * x_dt
            y[i3, t] = (st * cv[i3, t, g][:, None, :]).sum(axis=-1)
            if 0 <= nt - 1 - t < k_slots:
                slots[nt - 1 - t, i3] = st
    assert_close(got, np.concatenate([y.reshape(-1), slots.reshape(-1)]).astype(np.float32))


def _antialias_ref(x: np.ndarray, d1: int, d0: int) -> np.ndarray:
    """Per-pixel triangle-filter resampling of the last two axes (pixel centres at +0.5)."""
    s1, s0 = x.shape[-2:]
    out = np.zeros((*x.shape[:-2], d1, d0))
    sf1, sf0 = d1 / s1, d0 / s0
    sup1, sup0 = max(1.0, 1 / sf1), max(1.0, 1 / sf0)
    for i1 in range(d1):
        cy = (i1 + 0.5) / sf1
        for i0 in range(d0):
            cx = (i0 + 0.5) / sf0
            acc, tot = np.zeros(x.shape[:-2]), 0.0
            for sy in range(max(int(cy - sup1 + 0.5), 0), min(int(cy + sup1 + 0.5), s1)):
                wy = max(0.0, 1 - abs((sy - cy + 0.5) / sup1))
                for sx in range(max(int(cx - sup0 + 0.5), 0), min(int(cx + sup0 + 0.5), s0)):
                    w = wy * max(0.0, 1 - abs((sx - cx + 0.5) / sup0))
                    if w > 0:
                        acc += w * x[..., sy, sx]
                        tot += w
            out[..., i1, i0] = acc / tot if tot > 0 else acc
    return out


def test_upscale_bilinear_antialias() -> None:
    # UPSCALE(type=f32,ne=[5,7,11,13],ne_tgt=[2,5,7,11],mode=bilinear|antialias): shrinking widens
    # the triangle filter; growing is plain (normalised) bilinear weights
    c = OpCase()
    a = c.tensor(F32, 7, 5, 2)
    xv = values(a).astype(np.float64)
    for d0, d1 in ((3, 2), (16, 11)):
        out = B.interpolate(c.ctx, a, d0, d1, 2, 1, B.ScaleMode.BILINEAR | B.GGML_SCALE_FLAG_ANTIALIAS)
        assert_close(c.compute(out), _antialias_ref(xv, d1, d0).astype(np.float32))


def test_mul_mat_hadamard_hint_with_f16_src1() -> None:
    # MUL_MAT_HADAMARD(type_a=f32,type_b=f16,m=64,n=1,k=64,...): ggml's FWHT also takes F16 rows

    c = OpCase()
    n = 16
    h = np.array([[1.0]])
    while h.shape[0] < n:  # Sylvester construction
        h = np.block([[h, h], [h, -h]])
    a = c.tensor(F32, n, n, data=(h / np.sqrt(n)).astype(np.float32))
    b = c.tensor(F16, n, 3)
    hinted = B.mul_mat(c.ctx, a, b)
    hinted.set_op_params_i32(1, 1)  # GGML_HINT_SRC0_IS_HADAMARD
    ref = values(b).astype(np.float64) @ h.T / np.sqrt(n)
    assert_close(c.compute(hinted), ref.astype(np.float32))


def test_set_rows_with_no_source_rows_leaves_dst() -> None:
    # SET_ROWS(type_src=f32,type_dst=q8_0,type_idx=i64,ne=[256,5,1,3],nr23=[1,1],r=1,v=1): the views
    # hold r/2 = 0 rows, so nothing is written (quantizing zero rows must not fail)

    c = OpCase()
    dst = c.tensor(GGMLType.Q8_0, 64, 5)
    before = np.array(dst.view4()).copy()
    rows = c.tensor(F32, 64, 2)
    ids = c.ints(GGMLType.I64, 2, data=np.array([1, 3]))
    rows0 = B.view_2d(c.ctx, rows, 64, 0, rows.nb[1], 0)
    ids0 = B.view_1d(c.ctx, ids, 0, 0)
    out = B.set_rows(c.ctx, dst, rows0, ids0)
    c.compute(out)
    assert np.array_equal(np.array(dst.view4()), before)
