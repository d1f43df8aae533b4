"""K-quants (Q2_K..Q6_K, Q8_K) and IQ4_NL/IQ4_XS beyond the reference bytes.

test_quants_reference.py checks these types bit for bit against ggml's own output. Here:
ggml's test-quantize-fns error thresholds, Q8_K's round trip, and properties the
quantizers guarantee by construction (each value ends on the level nearest to it given the
block's stored scales), checked on hypothesis-generated blocks.
"""

from __future__ import annotations

import gguf.quants
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pyggml.quants import QuantError, chunks, dequantize, get_codec, quantize
from pyggml.quants.iq4 import KVALUES_IQ4NL, quantize_iq4_nl_ref
from pyggml.quants.kquants import quantize_q8_K
from pyggml.types import QK_K, GGMLType

# test-quantize-fns.cpp: (total error, dot product error) thresholds per type
THRESHOLDS = {
    GGMLType.Q2_K: (0.0075, 0.04),
    GGMLType.Q3_K: (0.0040, 0.02),
    GGMLType.Q4_K: (0.002, 0.02),
    GGMLType.Q5_K: (0.002, 0.02),
    GGMLType.Q6_K: (0.002, 0.02),
    GGMLType.IQ4_NL: (0.002, 0.02),
    GGMLType.IQ4_XS: (0.002, 0.02),
}
TYPES = list(THRESHOLDS)


def _synthetic(offset: float, n: int = 32 * 128) -> np.ndarray:
    """test-quantize-fns' data: 0.1 + 2*cos(i + offset), computed in double, stored as float."""
    return (0.1 + 2 * np.cos(np.arange(n) + offset)).astype(np.float32)[None, :]


@pytest.mark.parametrize("use_imatrix", [False, True], ids=["ref", "imatrix"])
@pytest.mark.parametrize("ty", TYPES, ids=lambda t: t.type_name)
def test_quantize_fns_thresholds(ty: GGMLType, use_imatrix: bool) -> None:
    x1, x2 = _synthetic(0.0), _synthetic(1.0)
    n = x1.size
    imatrix = np.ones(n, np.float32) if use_imatrix else None
    y1 = dequantize(quantize(x1, ty, imatrix), ty).astype(np.float64)
    total = np.sqrt(np.sum((y1 - x1) ** 2)) / n  # ggml divides by n, not sqrt(n)
    vdt = get_codec(ty).vec_dot_type
    y2 = dequantize(quantize(x2, vdt), vdt).astype(np.float64)
    dot_err = abs(np.sum(y1 * y2) - np.sum(x1.astype(np.float64) * x2)) / n
    max_total, max_dot = THRESHOLDS[ty]
    assert total < max_total
    assert dot_err < max_dot


def test_iq4_nl_from_float_ref_thresholds() -> None:
    """ggml-cpu's IQ4_NL from_float is quantize_row_iq4_nl_ref (no scale search): it is what
    test-quantize-fns actually measures for IQ4_NL, and it must differ from the chunk path."""
    x1, x2 = _synthetic(0.0), _synthetic(1.0)
    q = quantize_iq4_nl_ref(x1)
    assert q.shape == quantize(x1, GGMLType.IQ4_NL).shape
    assert not np.array_equal(q, quantize(x1, GGMLType.IQ4_NL))
    y1 = dequantize(q, GGMLType.IQ4_NL).astype(np.float64)
    y2 = dequantize(quantize(x2, GGMLType.Q8_0), GGMLType.Q8_0).astype(np.float64)
    assert np.sqrt(np.sum((y1 - x1) ** 2)) / x1.size < 0.002
    assert abs(np.sum(y1 * y2) - np.sum(x1.astype(np.float64) * x2)) / x1.size < 0.02
    with pytest.raises(QuantError, match="32"):
        quantize_iq4_nl_ref(np.zeros((1, 48), np.float32))


def test_vec_dot_types() -> None:
    for ty in TYPES:
        want = GGMLType.Q8_0 if ty == GGMLType.IQ4_NL else GGMLType.Q8_K
        assert get_codec(ty).vec_dot_type == want


# --------------------------------------------------------------------------- Q8_K


def _q8_K_fields(q: np.ndarray) -> np.ndarray:
    return q.reshape(-1, 292).view(get_codec(GGMLType.Q8_K).block_dtype)[:, 0]


def test_q8_K_round_trip_and_bsums() -> None:
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((3, 2 * QK_K)) * [[1e-3], [1.0], [300.0]]).astype(np.float32)
    x[1, 256:] = 0  # an all-zero block
    q = quantize(x, GGMLType.Q8_K)
    blk = _q8_K_fields(q)
    y = dequantize(q, GGMLType.Q8_K)
    d = np.repeat(np.abs(blk["d"]), QK_K).reshape(x.shape)
    assert np.all(np.abs(y - x) <= 0.5001 * d)
    assert np.array_equal(blk["bsums"], blk["qs"].reshape(-1, 16, 16).sum(axis=2))
    assert blk["d"][3] == 0 and not blk["qs"][3].any() and not blk["bsums"][3].any()
    # the largest-magnitude value of a block maps to -127
    first = np.abs(x.reshape(-1, QK_K)).argmax(axis=1)
    assert np.all(blk["qs"][[0, 1, 2, 4, 5], first[[0, 1, 2, 4, 5]]] == -127)


@settings(max_examples=40, deadline=None)
@given(
    vals=hnp.arrays(np.float32, (2, QK_K), elements=st.floats(-1, 1, width=32, allow_subnormal=False)),
    scale=st.sampled_from([1e-3, 1.0, 1e3]),
)
def test_q8_K_requantize_is_stable(vals: np.ndarray, scale: float) -> None:
    """Requantizing Q8_K's own output reproduces it: every level comes back exactly, up to
    one sign per block (when an earlier value of the opposite sign also reached +-127, it
    becomes the new "max"), and the dequantized values move by at most a few ulp."""
    x = (vals * np.float32(scale)).astype(np.float32)
    q = quantize(x, GGMLType.Q8_K)
    y = dequantize(q, GGMLType.Q8_K)
    q2 = quantize(y, GGMLType.Q8_K)
    a, b = _q8_K_fields(q), _q8_K_fields(q2)
    live = np.abs(x.reshape(-1, QK_K)).max(axis=1) >= 1e-30  # no float32 overflow of -127/max
    for k in np.flatnonzero(live):
        sign = 1 if np.array_equal(a["qs"][k], b["qs"][k]) else -1
        assert np.array_equal(a["qs"][k].astype(int) * sign, b["qs"][k].astype(int))
    y2 = dequantize(q2, GGMLType.Q8_K).reshape(-1, QK_K)
    yb = y.reshape(-1, QK_K)
    assert np.allclose(y2[live], yb[live], rtol=5e-7, atol=0)


def test_q8_K_nan_never_sets_the_scale() -> None:
    """ggml's max search uses a strict ``ax > amax``, so NaNs are skipped: an all-NaN block is
    an all-zero block, and a NaN next to a real maximum leaves that maximum's scale."""
    x = np.full((1, 2 * QK_K), np.nan, np.float32)
    x[0, QK_K + 3] = 2.0
    blk = _q8_K_fields(quantize(x, GGMLType.Q8_K))
    assert blk["d"][0] == 0 and not blk["qs"][0].any()
    assert blk["d"][1] == np.float32(1.0) / (np.float32(-127.0) / np.float32(2.0))
    assert blk["qs"][1][3] == -127


def test_q8_K_matches_function() -> None:
    x = np.linspace(-3, 5, 2 * QK_K, dtype=np.float32)[None]
    assert np.array_equal(quantize(x, GGMLType.Q8_K), quantize_q8_K(x))


# --------------------------------------------------------------------------- tables, errors


def test_kvalues_iq4nl_match_gguf_package() -> None:
    assert KVALUES_IQ4NL.dtype == np.int8
    assert tuple(int(v) for v in KVALUES_IQ4NL) == tuple(gguf.quants.IQ4_NL.kvalues)
    assert np.all(np.diff(KVALUES_IQ4NL.astype(int)) > 0)


@pytest.mark.parametrize("ty", [*TYPES, GGMLType.Q8_K], ids=lambda t: t.type_name)
def test_bad_input_raises(ty: GGMLType) -> None:
    x = np.zeros((2, QK_K), np.float32)
    with pytest.raises(QuantError, match="multiple"):
        quantize(np.zeros((1, QK_K + 16), np.float32), ty)
    with pytest.raises(QuantError, match="imatrix"):
        quantize(x, ty, np.ones(QK_K - 1, np.float32))
    with pytest.raises(QuantError, match="float32"):
        quantize(x.astype(np.float64), ty)
    with pytest.raises(QuantError):
        dequantize(np.zeros((1, ty.type_size + 1), np.uint8), ty)


@pytest.mark.parametrize("ty", [*TYPES, GGMLType.Q8_K], ids=lambda t: t.type_name)
def test_empty_and_non_finite(ty: GGMLType) -> None:
    assert quantize(np.zeros((0, QK_K), np.float32), ty).shape == (0, ty.row_size(QK_K))
    assert dequantize(np.zeros((0, ty.type_size), np.uint8), ty).shape == (0, ty.blck_size)
    x = np.linspace(-1, 1, 2 * QK_K, dtype=np.float32)[None].copy()
    x[0, 5], x[0, 300], x[0, 301] = np.nan, np.inf, 3e38  # ggml gives garbage; we must not crash
    for imatrix in (None, np.zeros(2 * QK_K, np.float32), np.full(2 * QK_K, np.inf, np.float32)):
        q = quantize(x, ty, imatrix)
        assert q.shape == (1, ty.row_size(2 * QK_K))
        assert dequantize(q, ty).shape == x.shape


@pytest.mark.parametrize("ty", [*TYPES, GGMLType.Q8_K], ids=lambda t: t.type_name)
def test_parallel_and_serial_paths_agree(ty: GGMLType) -> None:
    """Large inputs run ranges of rows on several threads (chunks.for_row_chunks), small ones on the caller's:
    same bytes, and the thread count is left as it was."""
    threads = chunks.n_threads()
    rng = np.random.default_rng(11)
    x = rng.standard_normal((64, 4096)).astype(np.float32)
    imatrix = rng.uniform(0.5, 2.0, 4096).astype(np.float32)
    with chunks.using_threads(3):
        q = quantize(x, ty, imatrix)
    head = ty.row_size(512)
    for r in (0, 37):
        assert np.array_equal(quantize(x[r : r + 1, :512], ty, imatrix[:512]), q[r : r + 1, :head])
    with chunks.using_threads(1):
        assert np.array_equal(quantize(x, ty, imatrix), q)
    y = dequantize(q, ty)
    for r in (0, 63):
        assert np.array_equal(dequantize(q[r : r + 1], ty).view(np.uint32), y[r : r + 1].view(np.uint32))
    assert chunks.n_threads() == threads


# --------------------------------------------------------------------------- properties

_NMAX = {GGMLType.Q2_K: 3, GGMLType.Q3_K: 7, GGMLType.Q4_K: 15, GGMLType.Q5_K: 31, GGMLType.Q6_K: 63}


def _sub_block_scales(ty: GGMLType, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Per sub-block (d_sub, m_sub, first level, sub-block size) from the stored bytes, so that
    the levels of a sub-block are d_sub*l - m_sub for l in first..first+nmax."""
    b = q.reshape(-1, ty.type_size).view(get_codec(ty).block_dtype)[:, 0]
    d = b["d"].astype(np.float32)[:, None]
    if ty == GGMLType.Q2_K:
        sc = b["scales"].astype(np.int32)
        dmin = b["dmin"].astype(np.float32)[:, None]
        return d * (sc & 0xF).astype(np.float32), dmin * (sc >> 4).astype(np.float32), 0, 16
    if ty == GGMLType.Q3_K:
        s = b["scales"].astype(np.int32)
        low = np.concatenate([s[:, :8] & 0xF, s[:, :8] >> 4], axis=1)
        high = (s[:, 8 + np.arange(16) % 4] >> (2 * (np.arange(16) // 4))) & 3
        return d * ((low | (high << 4)) - 32).astype(np.float32), np.zeros_like(low, np.float32), -4, 16
    if ty == GGMLType.Q6_K:
        return d * b["scales"].astype(np.float32), np.zeros((len(b), 16), np.float32), -32, 16
    s = b["scales"].astype(np.int32)
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return d * sc.astype(np.float32), b["dmin"].astype(np.float32)[:, None] * mn.astype(np.float32), 0, 32


def _blocks_strategy(width: int):
    values = hnp.arrays(np.float32, (2, width), elements=st.floats(-1, 1, width=32))
    scale = st.sampled_from([1e-3, 0.1, 1.0, 37.0, 1000.0])
    imatrix = st.none() | hnp.arrays(np.float32, width, elements=st.floats(0.0625, 10, width=32))
    return st.tuples(values, scale, imatrix)


@settings(max_examples=25, deadline=None)
@given(data=_blocks_strategy(QK_K), ty=st.sampled_from(list(_NMAX)))
def test_kquant_values_take_nearest_level(data, ty: GGMLType) -> None:
    """Every K-quant ends by re-picking each value's level with its sub-block's stored scale
    (and min), so no other level of that sub-block may be closer (up to float32 rounding)."""
    vals, scale, imatrix = data
    x = (vals * np.float32(scale)).astype(np.float32)
    q = quantize(x, ty, imatrix)
    y = dequantize(q, ty).astype(np.float64).reshape(-1, QK_K)
    dsub, msub, first, size = _sub_block_scales(ty, q)
    d = np.repeat(dsub.astype(np.float64), size, axis=1)
    m = np.repeat(msub.astype(np.float64), size, axis=1)
    xb = x.reshape(-1, QK_K).astype(np.float64)
    levels = np.arange(first, first + _NMAX[ty] + 1, dtype=np.float64)
    best = np.min(np.abs(xb[..., None] - (d[..., None] * levels - m[..., None])), axis=-1)
    err = np.abs(xb - y)
    live = d != 0
    tol = 1e-5 * (np.abs(xb) + np.abs(m) + np.abs(d) * _NMAX[ty])
    assert np.all(err[live] <= best[live] + tol[live])


def _iq4_indices(q: np.ndarray, ty: GGMLType) -> np.ndarray:
    """The 4-bit table index of every value, (n_sub_blocks, 32), read from the bytes."""
    qs = q.reshape(-1, ty.type_size)[:, 2 if ty == GGMLType.IQ4_NL else 8 :].reshape(-1, 16)
    return np.concatenate([qs & 0xF, qs >> 4], axis=1)


@settings(max_examples=25, deadline=None)
@given(data=_blocks_strategy(QK_K), which=st.sampled_from(["iq4_nl", "iq4_xs", "iq4_nl_ref"]))
def test_iq4_values_take_nearest_table_entry(data, which: str) -> None:
    """The searching quantizers pick each index as the table entry nearest to x/scale for the
    final unrounded scale; the stored fp16 scale is within 2**-11 of it, so x/stored_scale is
    near-nearest too. The ref variant keeps the indices of its first fit, x/(max/-127)."""
    vals, scale, imatrix = data
    x = (vals * np.float32(scale)).astype(np.float32)
    ty = GGMLType.IQ4_XS if which == "iq4_xs" else GGMLType.IQ4_NL
    q = quantize_iq4_nl_ref(x) if which == "iq4_nl_ref" else quantize(x, ty, imatrix)
    b = q.reshape(-1, ty.type_size).view(get_codec(ty).block_dtype)[:, 0]
    xb = x.reshape(-1, 32).astype(np.float64)
    d = b["d"].astype(np.float64)
    if ty == GGMLType.IQ4_XS:
        ib = np.arange(8)
        ls = ((b["scales_l"][:, ib // 2] >> (4 * (ib % 2))) & 0xF) | (
            ((b["scales_h"][:, None].astype(np.int32) >> (2 * ib)) & 3) << 4
        )
        d = (d[:, None] * (ls.astype(np.int32) - 32)).reshape(-1)
    # compare only where the fp16 scale is a normal number (relative rounding <= 2**-11)
    live = (np.abs(b["d"].astype(np.float64)).repeat(len(d) // len(b)) >= 1e-4) & (d != 0)
    slack = 2.0**-10
    if which == "iq4_nl_ref":
        first = np.abs(xb).argmax(axis=1)
        d = xb[np.arange(len(xb)), first] / -127.0
        slack = 1e-5
    kv = KVALUES_IQ4NL.astype(np.float64)
    r = xb[live] / d[live, None]
    got = kv[_iq4_indices(q, ty)[live]]
    best = np.min(np.abs(r[..., None] - kv), axis=-1)
    assert np.all(np.abs(r - got) <= best + (np.abs(r) + 1) * slack)
