"""mathf.v_expf, one lane of ggml's AVX2 ``ggml_v_expf``, against that function's own outputs."""

from __future__ import annotations

import numba
import numpy as np

from helpers.data import load_json
from pyggml.backend.cpu.jit.mathf import v_expf


@numba.njit
def _apply(x: np.ndarray) -> np.ndarray:
    y = np.empty_like(x)
    for i in range(x.size):
        y[i] = v_expf(x[i])
    return y


def test_v_expf_gives_ggml_v_expf_bits() -> None:
    """Normal range, the scaled range past |n| > 126 (gradual underflow, overflow to inf), zeros and a tiny
    input: every output bit for bit as ggml's vector function on an AVX2+FMA build."""
    ref = load_json("ggml_v_expf.json")
    x = np.array(ref["x_bits"], dtype=np.uint32).view(np.float32)
    want = np.array(ref["exp_bits"], dtype=np.uint32)
    np.testing.assert_array_equal(_apply(x).view(np.uint32), want)


def test_v_expf_is_close_to_exp() -> None:
    x = np.linspace(-80, 80, 100001).astype(np.float32)
    ref = np.exp(x.astype(np.float64))
    ulp = np.abs(_apply(x) - ref) / np.spacing(ref.astype(np.float32)).astype(np.float64)
    assert ulp.max() < 2.0


def test_v_expf_saturates_infinities_and_keeps_nan() -> None:
    """|n| > 192 takes ggml's saturated value (s1*s1: +0 below, +inf above), the masked scores of softmax."""
    y = _apply(np.array([-np.inf, np.inf, np.nan, -200.0, 200.0], dtype=np.float32))
    assert y[0] == 0.0 and not np.signbit(y[0])
    assert y[1] == np.inf and np.isnan(y[2])
    assert y[3] == 0.0 and y[4] == np.inf
