"""MUL_MAT, OUT_PROD and GET_ROWS against float references, for float and every quantized weight type.

The quantized cases run over every codec registered in pyggml.quants that can quantize and that
ggml uses as a weight type, so new codecs are covered as they appear.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.opcheck import NMSE_MATMUL, OpCase, assert_close, round_to, values
from pyggml import quants
from pyggml.backend.cpu.ops import mat_q as qmatmul
from pyggml.backend.cpu.quants.actquant import fake_quant
from pyggml.ops import builders as B
from pyggml.quants import CODECS
from pyggml.types import GGMLType

F32, F16, BF16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32

#: ggml's weight types with a registered, quantizing codec (Q8_1/Q8_K are activation-only in ggml)
_ACTIVATION_ONLY = (GGMLType.Q8_1, GGMLType.Q8_K)
QUANT_TYPES = sorted(
    (t for t, codec in CODECS.items() if t.is_quantized and codec.can_quantize and t not in _ACTIVATION_ONLY),
    key=int,
)


def _matmul_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """dst[i3, i2, n, m] = sum_k a[i3 / r3, i2 / r2, m, k] * b[i3, i2, n, k] in float64."""
    r3, r2 = b.shape[0] // a.shape[0], b.shape[1] // a.shape[1]
    a = np.repeat(np.repeat(a.astype(np.float64), r3, axis=0), r2, axis=1)
    return np.matmul(b.astype(np.float64), np.swapaxes(a, -1, -2)).astype(np.float32)


@pytest.mark.parametrize("ta", [F32, F16, BF16])
@pytest.mark.parametrize("n", [1, 7])
def test_mul_mat_float(ta: GGMLType, n: int) -> None:
    c = OpCase()
    a = c.tensor(ta, 64, 24, 2, 1)
    b = c.tensor(F32, 64, n, 4, 3)  # broadcast: 2 weight planes over 4, 1 over 3
    got = c.compute(B.mul_mat(c.ctx, a, b))
    assert_close(got, _matmul_ref(values(a), values(b)), NMSE_MATMUL)


def test_mul_mat_f16_rounds_activations_like_ggml() -> None:
    """With F16 weights ggml rounds src1 to fp16 first; the result must track that, not f32 src1."""
    c = OpCase()
    a = c.tensor(F16, 128, 8)
    b = c.tensor(F32, 128, 3)
    got = c.compute(B.mul_mat(c.ctx, a, b))
    ref16 = _matmul_ref(values(a), round_to(values(b), F16))
    assert np.abs(got - ref16).max() < 1e-5
    ref32 = _matmul_ref(values(a), values(b))
    assert np.abs(got - ref32).max() > np.abs(got - ref16).max()


def test_mul_mat_non_contiguous_src1() -> None:
    """src1 as a permuted view (the KQ product of attention) and as a transposed view."""
    c = OpCase()
    a = c.tensor(F32, 32, 10, 3)
    base = c.tensor(F32, 32, 3, 5)  # [k, heads, tokens]
    b = B.permute(c.ctx, base, 0, 2, 1, 3)  # [k, tokens, heads]
    got = c.compute(B.mul_mat(c.ctx, a, b))
    assert_close(got, _matmul_ref(values(a), values(b)), NMSE_MATMUL)
    bt_base = c.tensor(F32, 6, 32)
    bt = B.transpose(c.ctx, bt_base)  # [32, 6], column-major
    a2 = c.tensor(F32, 32, 9)
    got = c.compute(B.mul_mat(c.ctx, a2, bt))
    assert_close(got, _matmul_ref(values(a2), values(bt)), NMSE_MATMUL)


def test_mul_mat_large_weight_is_tiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """More weight rows than one dequantization tile: every tile must land in its columns."""
    from pyggml.backend.cpu.ops import mat as kernels_mat

    monkeypatch.setattr(kernels_mat, "_TILE_FLOATS", 64 * 20)  # 20-row tiles
    c = OpCase()
    a = c.tensor(GGMLType.Q8_0, 64, 150, 2)
    b = c.tensor(F32, 64, 3, 4)
    got = c.compute(B.mul_mat(c.ctx, a, b))
    assert_close(got, _matmul_ref(values(a), values(b)), NMSE_MATMUL)


@pytest.mark.parametrize("n", [1, 5], ids=["mat_vec", "mat_mat"])
@pytest.mark.parametrize("qt", QUANT_TYPES, ids=lambda t: t.type_name)
def test_mul_mat_quantized(qt: GGMLType, n: int) -> None:
    c = OpCase(seed=int(qt))
    a = c.tensor(qt, 256, 16, 2)
    b = c.tensor(F32, 256, n, 2)
    got = c.compute(B.mul_mat(c.ctx, a, b))
    assert_close(got, _matmul_ref(values(a), values(b)), NMSE_MATMUL)


@pytest.mark.parametrize("qt", QUANT_TYPES, ids=lambda t: t.type_name)
def test_get_rows_quantized(qt: GGMLType) -> None:
    c = OpCase(seed=100 + int(qt))
    a = c.tensor(qt, 256, 10)
    idx = np.array([3, 0, 9, 3, 5])
    ids = c.ints(I32, 5, data=idx)
    got = c.compute(B.get_rows(c.ctx, a, ids))
    assert_close(got, values(a)[:, :, idx, :])


@pytest.mark.parametrize("ty", [F32, F16, BF16, I32])
def test_get_rows_float_and_i32(ty: GGMLType) -> None:
    c = OpCase()
    if ty == I32:
        a = c.ints(I32, 6, 4, 2, data=np.arange(48))
    else:
        a = c.tensor(ty, 6, 4, 2)
    idx = np.array([[1, 3, 3], [0, 2, 1]])  # per plane (b.ne1 == a.ne2)
    ids = c.ints(I32, 3, 2, data=idx)
    out = B.get_rows(c.ctx, a, ids)
    got = c.compute(out)
    va = values(a)
    ref = np.stack([va[0, p, idx[p]] for p in range(2)])[None]
    if ty == I32:
        assert out.type == I32 and (got == ref).all()
    else:
        assert_close(got, ref)


def test_get_rows_out_of_range_raises() -> None:
    from pyggml.errors import PyGGMLError

    c = OpCase()
    a = c.tensor(F32, 4, 3)
    ids = c.ints(I32, 2, data=np.array([0, 3]))
    with pytest.raises(PyGGMLError, match="row index 3 out of range"):
        c.compute(B.get_rows(c.ctx, a, ids))


@pytest.mark.parametrize("ta", [F32, F16, GGMLType.Q8_0])
def test_out_prod(ta: GGMLType) -> None:
    c = OpCase()
    a = c.tensor(ta, 32, 6, 2)
    b = c.tensor(F32, 5, 6, 4)  # dst [32, 5, 4]; a's 2 planes broadcast over 4
    got = c.compute(B.out_prod(c.ctx, a, b))
    va = np.repeat(values(a).astype(np.float64), 2, axis=1)
    ref = np.matmul(np.swapaxes(values(b).astype(np.float64), -1, -2), va)
    assert_close(got, ref.astype(np.float32), NMSE_MATMUL)


def test_conv_via_im2col_and_mul_mat() -> None:
    """ggml's conv_2d (IM2COL + MUL_MAT + permute + cont) against a direct convolution."""
    c = OpCase()
    kern = c.tensor(F32, 3, 3, 2, 4)  # [KW, KH, IC, OC]
    img = c.tensor(F32, 8, 7, 2, 1)  # [W, H, IC, N]
    got = c.compute(B.conv_2d(c.ctx, kern, img, 1, 1, 1, 1, 1, 1))
    k = values(kern).astype(np.float64)  # (OC, IC, KH, KW)
    x = np.pad(values(img)[0].astype(np.float64), ((0, 0), (1, 1), (1, 1)))
    ref = np.zeros((1, 4, 7, 8))
    for oc in range(4):
        for oy in range(7):
            for ox in range(8):
                ref[0, oc, oy, ox] = (k[oc] * x[:, oy : oy + 3, ox : ox + 3]).sum()
    assert_close(got, ref.astype(np.float32), NMSE_MATMUL)


FUSED = [GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.IQ4_XS, GGMLType.IQ3_S,
         GGMLType.IQ3_XXS, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K]


@pytest.mark.parametrize("qt", FUSED, ids=lambda t: t.type_name)
def test_fused_matvec_equals_quantized_activation_dot(qt: GGMLType) -> None:
    """The fused decode kernel = ggml's vec_dot: dequantized weight · (activation quantized to the
    vec_dot_type), up to float32 summation order."""
    rng = np.random.default_rng(int(qt))
    x = rng.normal(size=(3, 512)).astype(np.float32)
    w = quants.quantize(rng.normal(size=(24, 512)).astype(np.float32), qt)
    got = qmatmul.mul_mat_q(w, qt, x, None, 2)
    xq = fake_quant(x, quants.get_codec(qt).vec_dot_type).astype(np.float64)
    ref = xq @ quants.dequantize(w, qt).astype(np.float64).T
    assert_close(got, ref.astype(np.float32), max_nmse=1e-11)
    # and it is not the unquantized-activation product (the activation rounding is real)
    plain = x.astype(np.float64) @ quants.dequantize(w, qt).astype(np.float64).T
    assert np.abs(got - plain).max() > np.abs(got - ref).max()


@pytest.mark.parametrize("wt", [F32, F16, GGMLType.Q8_0, GGMLType.Q4_K], ids=lambda t: t.type_name)
@pytest.mark.parametrize("b_rows", [1, 2])  # b.ne1 = 1 broadcasts one row to every used expert
def test_mul_mat_id(wt: GGMLType, b_rows: int) -> None:
    c = OpCase()
    k, m, n_expert, n_used, n_tok = 256, 12, 5, 2, 6
    w = c.tensor(wt, k, m, n_expert)
    b = c.tensor(F32, k, b_rows, n_tok)
    ids = c.rng.integers(0, n_expert, size=(n_tok, n_used))
    ids_t = c.ints(I32, n_used, n_tok, data=ids)
    out = B.mul_mat_id(c.ctx, w, b, ids_t)
    got = c.compute(out)
    vw, vb = values(w)[0].astype(np.float64), values(b)[0].astype(np.float64)
    ref = np.zeros((1, n_tok, n_used, m))
    for t in range(n_tok):
        for e in range(n_used):
            ref[0, t, e] = vw[ids[t, e]] @ vb[t, e % b_rows]
    assert_close(got, ref.astype(np.float32), NMSE_MATMUL)


def test_add_id() -> None:
    c = OpCase()
    a = c.tensor(F32, 8, 3, 4)
    bias = c.tensor(F32, 8, 5)
    ids = c.rng.integers(0, 5, size=(4, 3))
    out = B.add_id(c.ctx, a, bias, c.ints(I32, 3, 4, data=ids))
    got = c.compute(out)
    assert_close(got, values(a) + values(bias)[0, 0][ids][None])


def test_mul_mat_hadamard_hint_runs_a_walsh_hadamard_transform() -> None:
    c = OpCase()
    n = 32
    h = np.array([[1.0]])
    while h.shape[0] < n:  # Sylvester construction
        h = np.block([[h, h], [h, -h]])
    a = c.tensor(F32, n, n, data=h.astype(np.float32))
    b = c.tensor(F32, n, 5, 2)
    plain = c.compute(B.mul_mat(c.ctx, a, b)).copy()
    hinted = B.mul_mat(c.ctx, a, b)
    hinted.set_op_params_i32(1, 1)  # GGML_HINT_SRC0_IS_HADAMARD
    got = c.compute(hinted)
    ref = (values(b).astype(np.float64) @ h.T) / np.sqrt(n)
    assert_close(got, ref.astype(np.float32))
    assert_close(plain / np.float32(np.sqrt(n)), got, NMSE_MATMUL)  # same product, without the matrix
