"""ggml's test-quantize-fns checks for the float, legacy and "other" types, plus edge cases.

test-quantize-fns quantizes x[i] = 0.1 + 2*cos(i + offset) (n = 4096) and requires:
* total error  sqrt(sum (deq(q(x)) - x)^2) / n  below a per-type threshold;
* dot error    |deq(q(x1)) . deq(q_vdt(x2)) - x1 . x2| / n  below another, where q_vdt is the
  type's vec_dot_type quantizer (Q8_0, Q8_1, Q8_K, or F16/BF16 for the float types).
The edge cases pin down rounding choices the reference data happens not to exercise.
"""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from pyggml.quants import QuantError, dequantize, get_codec, quantize
from pyggml.quants.fp import fp16_bits_to_fp32, fp32_to_fp16_bits
from pyggml.quants.fp4 import KVALUES_FP4
from pyggml.quants.legacy import quantize_q8_0_activations, quantize_q8_1_activations
from pyggml.types import GGMLType

N = 32 * 128
#: the types whose quantizer takes a different, importance-weighted path when given an imatrix
WEIGHTED = [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1]
MINE = [
    GGMLType.F16, GGMLType.BF16, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1,
    GGMLType.Q8_0, GGMLType.Q8_1, GGMLType.TQ1_0, GGMLType.TQ2_0, GGMLType.MXFP4, GGMLType.NVFP4,
    GGMLType.Q1_0, GGMLType.Q2_0,
]  # fmt: skip

# (total-error threshold, dot-product threshold), test-quantize-fns.cpp
THRESHOLDS: dict[GGMLType, tuple[float, float]] = {
    GGMLType.F16: (0.002, 0.02),
    GGMLType.BF16: (0.002, 0.02),
    GGMLType.Q4_0: (0.002, 0.02),
    GGMLType.Q4_1: (0.002, 0.02),
    GGMLType.Q5_0: (0.002, 0.02),
    GGMLType.Q5_1: (0.002, 0.02),
    GGMLType.Q8_0: (0.002, 0.02),
    GGMLType.MXFP4: (0.002, 0.02),
    GGMLType.NVFP4: (0.0030, 0.03),
    GGMLType.TQ1_0: (0.01, 0.15),
    GGMLType.TQ2_0: (0.01, 0.15),
    GGMLType.Q2_0: (0.01, 0.15),
    GGMLType.Q1_0: (0.025, 0.40),
}


def _synthetic(offset: float) -> np.ndarray:
    return (0.1 + 2 * np.cos(np.arange(N, dtype=np.float64) + offset)).astype(np.float32)[None, :]


def _round_trip(x: np.ndarray, ty: GGMLType) -> np.ndarray:
    codec = get_codec(ty)
    # q8_K is not in ggml_quantize_chunk; its codec's row quantizer is what ggml-cpu uses
    q = codec.quantize_rows(x, None) if ty == GGMLType.Q8_K else quantize(x, ty)
    return dequantize(q, ty)


@pytest.mark.parametrize("ty", list(THRESHOLDS), ids=lambda t: t.type_name)
def test_total_error(ty: GGMLType) -> None:
    x = _synthetic(0.0)
    err = np.sqrt(np.sum((_round_trip(x, ty).astype(np.float64) - x) ** 2)) / N
    assert err < THRESHOLDS[ty][0]


@pytest.mark.parametrize("ty", list(THRESHOLDS), ids=lambda t: t.type_name)
def test_dot_product_error(ty: GGMLType) -> None:
    x1, x2 = _synthetic(0.0), _synthetic(1.0)
    vdt = get_codec(ty).vec_dot_type
    got = np.dot(_round_trip(x1, ty)[0].astype(np.float64), _round_trip(x2, vdt)[0])
    exact = np.dot(x1[0].astype(np.float64), x2[0])
    assert abs(got - exact) / N < THRESHOLDS[ty][1]


def test_vec_dot_types() -> None:
    """ggml-cpu's type_traits_cpu vec_dot_type for each of these weights."""
    expected = {
        GGMLType.F16: GGMLType.F16,
        GGMLType.BF16: GGMLType.BF16,
        GGMLType.Q4_0: GGMLType.Q8_0,
        GGMLType.Q4_1: GGMLType.Q8_1,
        GGMLType.Q5_0: GGMLType.Q8_0,
        GGMLType.Q5_1: GGMLType.Q8_1,
        GGMLType.Q8_0: GGMLType.Q8_0,
        GGMLType.MXFP4: GGMLType.Q8_0,
        GGMLType.NVFP4: GGMLType.Q8_0,
        GGMLType.Q1_0: GGMLType.Q8_0,
        GGMLType.Q2_0: GGMLType.Q8_0,
        GGMLType.TQ1_0: GGMLType.Q8_K,
        GGMLType.TQ2_0: GGMLType.Q8_K,
    }
    for ty, vdt in expected.items():
        assert get_codec(ty).vec_dot_type == vdt, ty.type_name


# ---------------------------------------------------------------------------------------------
# rounding and edge cases
# ---------------------------------------------------------------------------------------------


def _fp16_at(q: np.ndarray, offset: int) -> float:
    return float(fp16_bits_to_fp32(q[0, offset : offset + 2].copy().view("<u2"))[0])


def test_q4_0_signed_max_and_clamp() -> None:
    # the largest magnitude is negative: d = -4/-8 = 0.5; +4 maps to 16.5 -> 16 -> clamped to 15
    x = np.zeros((1, 32), np.float32)
    x[0, 0], x[0, 1], x[0, 2] = -4.0, 4.0, 1.0
    q = quantize(x, GGMLType.Q4_0)
    assert _fp16_at(q, 0) == 0.5
    levels = np.concatenate([q[0, 2:] & 15, q[0, 2:] >> 4])
    assert levels[0] == 0 and levels[1] == 15 and levels[2] == 10 and levels[3] == 8
    np.testing.assert_array_equal(dequantize(q, GGMLType.Q4_0)[0, :3], [-4.0, 3.5, 1.0])


def test_q4_0_first_of_equal_magnitudes_wins() -> None:
    x = np.zeros((1, 32), np.float32)
    x[0, 3], x[0, 7] = 2.0, -2.0
    assert _fp16_at(quantize(x, GGMLType.Q4_0), 0) == -0.25
    x[0, 3], x[0, 7] = -2.0, 2.0
    assert _fp16_at(quantize(x, GGMLType.Q4_0), 0) == 0.25


def test_q8_0_rounds_half_away_from_zero() -> None:
    # amax 127 gives d = 1 exactly; roundf sends 2.5 to 3 and -2.5 to -3 (rint would give 2, -2)
    x = np.zeros((1, 32), np.float32)
    x[0, :4] = [127.0, 2.5, -2.5, 0.5]
    q = quantize(x, GGMLType.Q8_0)
    np.testing.assert_array_equal(q[0, 2:6].view(np.int8), [127, 3, -3, 1])


def test_q8_1_sum_field_and_dequantize() -> None:
    x = _synthetic(0.5)[:, :256]
    q = quantize(x, GGMLType.Q8_1)
    blocks = q.reshape(-1, 36)
    d = fp16_bits_to_fp32(blocks[:, 0:2].copy().view("<u2")[:, 0])
    s = fp16_bits_to_fp32(blocks[:, 2:4].copy().view("<u2")[:, 0])
    qs = blocks[:, 4:].view(np.int8).astype(np.float32)
    # s is fp16(d_unrounded * sum q): within an fp16 rounding of d_rounded * sum q
    np.testing.assert_allclose(s, d * qs.sum(axis=1), rtol=2e-3)
    back = dequantize(q, GGMLType.Q8_1)
    np.testing.assert_array_equal(back, (qs * d[:, None]).reshape(1, -1))
    # half a step, plus 127 times the fp16 rounding of d (q was computed with the unrounded d)
    assert np.max(np.abs(back - x)) <= np.max(d) * (0.5 + 127 * 2.0**-11)


@pytest.mark.parametrize(
    "ty",
    [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.Q8_1,
     GGMLType.TQ1_0, GGMLType.TQ2_0, GGMLType.MXFP4, GGMLType.NVFP4, GGMLType.Q1_0, GGMLType.Q2_0],
    ids=lambda t: t.type_name,
)  # fmt: skip
def test_zero_rows_quantize_to_zero(ty: GGMLType) -> None:
    x = np.zeros((2, 256), np.float32)
    for imatrix in (None, np.ones(256, np.float32)):
        q = quantize(x, ty, imatrix)
        if ty != GGMLType.Q8_1:
            back = dequantize(q, ty)
            assert np.all(back == 0), ty.type_name


@pytest.mark.parametrize(
    "ty",
    [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0,
     GGMLType.TQ1_0, GGMLType.TQ2_0, GGMLType.MXFP4, GGMLType.NVFP4, GGMLType.Q1_0, GGMLType.Q2_0],
    ids=lambda t: t.type_name,
)  # fmt: skip
def test_nan_and_inf_stay_in_their_block(ty: GGMLType) -> None:
    """Non-finite input is quantized as ggml does (no error, no crash) and spoils only its block."""
    x = _synthetic(0.0)[:, :512].repeat(2, axis=0)
    clean = quantize(x, ty)
    bad = x.copy()
    bad[1, 3], bad[1, 5] = np.nan, np.inf
    dirty = quantize(bad, ty)
    np.testing.assert_array_equal(dirty[0], clean[0])
    block_bytes = ty.type_size
    np.testing.assert_array_equal(dirty[1, block_bytes:], clean[1, block_bytes:])


@pytest.mark.parametrize("ty", WEIGHTED, ids=lambda t: t.type_name)
def test_imatrix_rows_are_independent(ty: GGMLType) -> None:
    """The weighted quantizers use a per-row sigma2: a row's bytes do not depend on its neighbours."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 128)).astype(np.float32)
    imatrix = rng.uniform(0.1, 3.0, 128).astype(np.float32)
    together = quantize(x, ty, imatrix)
    for r in range(6):
        np.testing.assert_array_equal(quantize(x[r : r + 1], ty, imatrix), together[r : r + 1])


@pytest.mark.parametrize("ty", WEIGHTED, ids=lambda t: t.type_name)
def test_imatrix_lowers_weighted_error(ty: GGMLType) -> None:
    """The point of the imatrix path: less weighted squared error than the reference rounding."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((16, 256)).astype(np.float32)
    imatrix = rng.uniform(0.0, 4.0, 256).astype(np.float32)
    err_ref = np.sum(imatrix * (dequantize(quantize(x, ty), ty) - x) ** 2)
    err_w = np.sum(imatrix * (dequantize(quantize(x, ty, imatrix), ty) - x) ** 2)
    assert err_w < err_ref


def test_q1_0_sign_of_zero() -> None:
    x = np.zeros((1, 128), np.float32)
    x[0, 0], x[0, 1], x[0, 2] = -0.0, -1.0, 3.0
    back = dequantize(quantize(x, GGMLType.Q1_0), GGMLType.Q1_0)[0]
    d = np.float32(np.float16(4.0 / 128))
    np.testing.assert_array_equal(back[:4], [d, -d, d, d])  # x >= 0 holds for -0.0


def test_mxfp4_exponent_and_ties() -> None:
    # amax 6: floor(log2 6) = 2, e = 127 -> scale 2^-1; the codes are doubled E2M1, so the grid
    # is +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}
    x = np.zeros((1, 32), np.float32)
    x[0, :5] = [6.0, 0.25, 0.75, -5.0, 2.5]
    q = quantize(x, GGMLType.MXFP4)
    assert q[0, 0] == 127
    back = dequantize(q, GGMLType.MXFP4)[0]
    # every other value is a tie between two grid points: the lower code index wins
    np.testing.assert_array_equal(back[:5], [6.0, 0.0, 0.5, -4.0, 2.0])


def test_nvfp4_scale_per_sixteen() -> None:
    x = np.zeros((1, 64), np.float32)
    x[0, 0], x[0, 16], x[0, 32], x[0, 48] = 6.0, 12.0, 0.0, 3.0
    q = quantize(x, GGMLType.NVFP4)
    # ue4m3(1.0) = 0x38, ue4m3(2.0) = 0x40, zero -> 0, ue4m3(0.5) = 0x30
    np.testing.assert_array_equal(q[0, :4], [0x38, 0x40, 0x00, 0x30])
    back = dequantize(q, GGMLType.NVFP4)[0]
    assert back[0] == 6.0 and back[16] == 12.0 and back[48] == 3.0


def test_q2_0_codes() -> None:
    x = np.zeros((1, 64), np.float32)
    x[0, :6] = [-2.0, -1.0, -0.5, 0.5, 1.0, 2.0]  # d = 2: x/d rounds (half away) to -1,-1,0,0,1,1
    back = dequantize(quantize(x, GGMLType.Q2_0), GGMLType.Q2_0)[0]
    np.testing.assert_array_equal(back[:6], [-2.0, -2.0, 0.0, 0.0, 2.0, 2.0])


def test_tq_ternary_values() -> None:
    x = np.zeros((1, 256), np.float32)
    x[0, ::3] = 1.5
    x[0, 1::3] = -1.5
    x[0, 7] = 0.74  # rounds to 0
    expected = np.sign(x[0]) * 1.5
    expected[7] = 0.0
    for ty in (GGMLType.TQ1_0, GGMLType.TQ2_0):
        np.testing.assert_array_equal(dequantize(quantize(x, ty), ty)[0], expected)


@settings(max_examples=40, deadline=None)
@given(
    ty=st.sampled_from(MINE),
    n_rows=st.integers(1, 3),
    data=st.data(),
)
def test_any_float32_input_quantizes(ty: GGMLType, n_rows: int, data: st.DataObject) -> None:
    """Arbitrary float32 input (NaN, inf, subnormals, huge values) never raises, with or without
    an imatrix, and the bytes always dequantize to the right shape (Q8_1 has no ggml to_float but
    pyggml's d*q works as well)."""
    n = 256
    flat = data.draw(
        hnp.arrays(np.float32, n_rows * n, elements=st.floats(width=32, allow_nan=True, allow_infinity=True))
    )
    x = flat.reshape(n_rows, n)
    imatrix = data.draw(st.none() | hnp.arrays(np.float32, n, elements=st.floats(0, 100, width=32)))
    with np.errstate(all="ignore"):
        q = quantize(x, ty, imatrix)
        assert q.shape == (n_rows, ty.row_size(n))
        assert dequantize(q, ty).shape == (n_rows, n)


@settings(max_examples=40, deadline=None)
@given(hnp.arrays(np.float32, (2, 64), elements=st.floats(-1e4, 1e4, width=32)))
def test_q8_0_and_q4_0_error_bounds(x: np.ndarray) -> None:
    """Finite input comes back within one quantization step (half a step for Q8_0), allowing for
    the fp16 rounding of d, which the levels were computed without: d's error is at most half an
    fp16 ulp, relative 2^-11 for normal d and absolute 2^-25 for subnormal d."""
    for ty, steps, nmax in ((GGMLType.Q8_0, 0.5, 127), (GGMLType.Q4_0, 1.0, 16)):
        q = quantize(x, ty)
        d = np.abs(fp16_bits_to_fp32(q.reshape(-1, ty.type_size)[:, :2].copy().view("<u2")[:, 0]))
        d_err = np.maximum(d * 2.0**-11, 2.0**-25)
        bound = np.repeat(steps * (d + d_err) + nmax * d_err, 32).reshape(x.shape) + 1e-6
        assert np.all(np.abs(dequantize(q, ty) - x) <= bound)


def test_fp4_code_book() -> None:
    """kvalues_fp4 are twice the E2M1 values: sign bit 3, exponent bits 2-1, mantissa bit 0."""
    assert KVALUES_FP4.dtype == np.int8 and KVALUES_FP4.shape == (16,)
    for code in range(16):
        sign = -1 if code & 8 else 1
        exp, man = (code >> 1) & 3, code & 1
        e2m1 = man * 0.5 if exp == 0 else (1 + man / 2) * 2.0 ** (exp - 1)
        assert KVALUES_FP4[code] == sign * 2 * e2m1, code


def test_q8_activation_quantizers_follow_x86() -> None:
    """ggml-cpu converts matmul activations with id = 127/amax and round-half-even, unlike the
    reference quantizer; the scale bytes are the same, levels differ by at most one."""
    x = np.zeros((1, 64), np.float32)
    x[0, :4] = [127.0, 2.5, -2.5, 3.5]
    q = quantize_q8_0_activations(x)
    np.testing.assert_array_equal(q[0, 2:6].view(np.int8), [127, 2, -2, 4])  # ref: 3, -3, 4
    y = _synthetic(0.3)[:, :1024]
    fast, ref = quantize_q8_0_activations(y), quantize(y, GGMLType.Q8_0)
    fb, rb = fast.reshape(-1, 34), ref.reshape(-1, 34)
    np.testing.assert_array_equal(fb[:, :2], rb[:, :2])
    diff = fb[:, 2:].view(np.int8).astype(int) - rb[:, 2:].view(np.int8).astype(int)
    assert np.abs(diff).max() <= 1
    q1 = quantize_q8_1_activations(y).reshape(-1, 36)
    np.testing.assert_array_equal(q1[:, :2], fb[:, :2])
    np.testing.assert_array_equal(q1[:, 4:], fb[:, 2:])
    sums = q1[:, 4:].view(np.int8).astype(np.float32).sum(axis=1)
    d32 = np.abs(y.reshape(-1, 32)).max(axis=1) / np.float32(127.0)
    np.testing.assert_array_equal(q1[:, 2:4].copy().view("<u2")[:, 0], fp32_to_fp16_bits(d32 * sums))
    with pytest.raises(QuantError, match="multiple of 32"):
        quantize_q8_0_activations(np.zeros((1, 40), np.float32))
