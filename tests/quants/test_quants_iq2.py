"""IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M: tables, API contract and ggml's quantize-fns checks.

Bit-exactness against ggml's own output is checked for every type by test_quants_reference.py;
this file checks what that cannot see: the tables the quantizers search, the error handling,
and the error levels of ggml's tests/test-quantize-fns.cpp.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pyggml.quants as Q
from pyggml.quants import chunks, iq2_tables
from pyggml.types import GGMLType

TYPES = [GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S, GGMLType.IQ1_S, GGMLType.IQ1_M]
TABLE_TYPES = [GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S, GGMLType.IQ1_S]
GRID_SIZE = {GGMLType.IQ2_XXS: 256, GGMLType.IQ2_XS: 512, GGMLType.IQ2_S: 1024, GGMLType.IQ1_S: 2048}
NWANT = {GGMLType.IQ2_XXS: 2, GGMLType.IQ2_XS: 2, GGMLType.IQ2_S: 1, GGMLType.IQ1_S: 3}


def _imatrix_for(ty: GGMLType, n: int) -> np.ndarray | None:
    return np.ones(n, dtype=np.float32) if Q.requires_imatrix(ty) else None


# ---------------------------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ty", TABLE_TYPES, ids=lambda t: t.type_name)
def test_kgrid_list_is_sorted_and_two_bit(ty: GGMLType) -> None:
    kgrid = iq2_tables.load_kgrid(iq2_tables.kgrid_file(ty)).astype(np.int64)
    assert kgrid.shape == (GRID_SIZE[ty],)
    assert (np.diff(kgrid) > 0).all()
    levels = (kgrid[:, None] >> (2 * np.arange(8))) & 3
    assert levels.max() == 2  # a coordinate level of 3 is never on a grid


@pytest.mark.parametrize("ty", TYPES, ids=lambda t: t.type_name)
def test_grid_built_from_kgrid_equals_common_grid(ty: GGMLType) -> None:
    """iq2xs_init_impl's grid (2l+1 per coordinate) and ggml-common.h's grid list the same points."""
    built = iq2_tables.unpack_kgrid(iq2_tables.load_kgrid(iq2_tables.kgrid_file(ty))).astype(np.int64)
    assert set(np.unique(built)) == {1, 3, 5}
    if ty in (GGMLType.IQ1_S, GGMLType.IQ1_M):
        expected = (built - 3) // 2  # levels 0,1,2 are the values -1, 0, 1
    else:
        expected = np.array([0, 8, 0, 25, 0, 43])[built]  # levels 0,1,2 are magnitudes 8, 25, 43
    np.testing.assert_array_equal(iq2_tables.common_grid_bytes(ty).astype(np.int64), expected)


def test_common_grids_match_ggml_common_h_entries() -> None:
    """A few entries copied by hand from ggml-common.h guard the byte order of the .npy files."""
    head = [0x0808080808080808, 0x080808080808082B, 0x0808080808081919, 0x0808080808082B08]
    for ty in (GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S):
        assert [int(v) for v in iq2_tables.common_grid_u64(ty)[:4]] == head
    assert int(iq2_tables.common_grid_u64(GGMLType.IQ2_S)[-2]) == 0x2B2B2B2B2B082B08
    assert int(iq2_tables.common_grid_u64(GGMLType.IQ2_S)[-1]) == 0x2B2B2B2B2B2B2B2B
    iq1_head = [
        0xFFFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFF01, 0xFFFFFFFFFFFF0000, 0xFFFFFFFFFFFF01FF,
        0xFFFFFFFFFFFF0101, 0xFFFFFFFFFF00FF00, 0xFFFFFFFFFF000000, 0xFFFFFFFFFF01FFFF,
        0xFFFFFFFFFF01FF01, 0xFFFFFFFFFF0101FF, 0xFFFFFFFFFF010101, 0xFFFFFFFF00FF0000,
        0xFFFFFFFF0000FF00, 0xFFFFFFFF000000FF, 0xFFFFFFFF00000001, 0xFFFFFFFF00010000,
    ]  # fmt: skip
    assert [int(v) for v in iq2_tables.common_grid_u64(GGMLType.IQ1_S)[:16]] == iq1_head
    assert iq2_tables.common_grid_u64(GGMLType.IQ1_M) is iq2_tables.common_grid_u64(GGMLType.IQ1_M)


def test_ksigns_are_seven_bits_plus_parity() -> None:
    ks = iq2_tables.ksigns_iq2xs().astype(np.int64)
    assert ks.shape == (128,)
    np.testing.assert_array_equal(ks & 127, np.arange(128))
    popcount = np.array([bin(int(v)).count("1") for v in ks])
    assert (popcount % 2 == 0).all()


def _brute_force_neighbours(grid: np.ndarray, point: int, nwant: int) -> list[int]:
    pos = 2 * ((point >> (2 * np.arange(8))) & 3) + 1
    d2 = ((grid.astype(np.int64) - pos) ** 2).sum(axis=1)
    levels = np.unique(d2)[:nwant]
    order = np.lexsort((np.arange(len(d2)), d2))  # by distance, then by index: ggml's qsort order
    return [int(j) for j in order if d2[j] <= levels[-1]]


@pytest.mark.parametrize("ty", TABLE_TYPES, ids=lambda t: t.type_name)
def test_quant_tables_map_and_neighbours(ty: GGMLType) -> None:
    tables = iq2_tables.quant_tables(ty)
    n = GRID_SIZE[ty]
    assert tables.grid.shape == (n, 8)
    on_grid = np.flatnonzero(tables.kmap >= 0)
    assert on_grid.size == n
    np.testing.assert_array_equal(np.sort(tables.kmap[on_grid]), np.arange(n))
    kgrid = iq2_tables.load_kgrid(iq2_tables.kgrid_file(ty)).astype(np.int64)
    np.testing.assert_array_equal(tables.kmap[kgrid], np.arange(n))
    off_grid = np.flatnonzero(tables.kmap < 0)
    rng = np.random.default_rng(int(ty))
    for point in [0xAAAB, 3, *rng.choice(off_grid, 40, replace=False)]:
        if tables.kmap[point] >= 0:
            continue
        start = -int(tables.kmap[point]) - 1
        count = int(tables.neighbours[start])
        got = [int(v) for v in tables.neighbours[start + 1 : start + 1 + count]]
        assert got == _brute_force_neighbours(tables.grid, int(point), NWANT[ty])


def test_iq1_m_shares_iq1_s_tables() -> None:
    assert iq2_tables.quant_tables(GGMLType.IQ1_M) is iq2_tables.quant_tables(GGMLType.IQ1_S)


# ---------------------------------------------------------------------------------------------
# API contract and errors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ty", TYPES, ids=lambda t: t.type_name)
def test_requires_imatrix_and_vec_dot_type(ty: GGMLType) -> None:
    assert Q.requires_imatrix(ty) is (ty in (GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ1_S))
    assert Q.get_codec(ty).vec_dot_type == GGMLType.Q8_K


@pytest.mark.parametrize("ty", [GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ1_S], ids=lambda t: t.type_name)
def test_missing_imatrix_is_refused(ty: GGMLType) -> None:
    x = np.ones((1, 256), dtype=np.float32)
    with pytest.raises(Q.QuantError, match="imatrix"):
        Q.quantize(x, ty)
    with pytest.raises(Q.QuantError, match="imatrix"):
        Q.get_codec(ty).quantize_rows(x, None)


@pytest.mark.parametrize("ty", TYPES, ids=lambda t: t.type_name)
def test_bad_input_is_refused(ty: GGMLType) -> None:
    imatrix = np.ones(256, dtype=np.float32)
    x = np.zeros((2, 256), dtype=np.float32)
    x[1, 7] = np.nan
    with pytest.raises(Q.QuantError, match="non-finite"):
        Q.quantize(x, ty, imatrix)
    with pytest.raises(Q.QuantError, match="multiple"):
        Q.quantize(np.zeros((1, 128), dtype=np.float32), ty, imatrix[:128])
    bad = imatrix.copy()
    bad[3] = -1.0
    with pytest.raises(Q.QuantError, match="non-negative"):
        Q.get_codec(ty).quantize_rows(np.ones((1, 256), dtype=np.float32), bad)
    with pytest.raises(Q.QuantError, match="imatrix"):
        Q.get_codec(ty).quantize_rows(np.ones((1, 256), dtype=np.float32), imatrix[:255])
    with pytest.raises(Q.QuantError):
        Q.dequantize(np.zeros((1, ty.type_size + 1), dtype=np.uint8), ty)


@pytest.mark.parametrize("ty", TYPES, ids=lambda t: t.type_name)
def test_zero_rows_and_zero_blocks(ty: GGMLType) -> None:
    imatrix = _imatrix_for(ty, 512)
    q = Q.quantize(np.zeros((0, 512), dtype=np.float32), ty, imatrix)
    assert q.shape == (0, 2 * ty.type_size)
    assert Q.dequantize(q, ty).shape == (0, 512)
    q = Q.quantize(np.zeros((1, 512), dtype=np.float32), ty, imatrix)
    assert not q.any()  # an all-zero block quantizes to all-zero bytes, scale included
    assert not Q.dequantize(q, ty).any()


def test_rows_cut_over_threads_give_the_same_bytes() -> None:
    """BlockCodec hands each thread a range of rows (chunks.for_row_chunks): any cut, the same bytes."""
    ty = GGMLType.IQ2_S
    x = np.random.default_rng(7).standard_normal((5, 512), dtype=np.float32)
    with chunks.using_threads(1):
        one = Q.quantize(x, ty)
    with chunks.using_threads(3):
        three = Q.quantize(x, ty)
    np.testing.assert_array_equal(one, three)
    rows = [Q.quantize(x[r : r + 1], ty) for r in range(5)]
    np.testing.assert_array_equal(np.concatenate(rows), one)


# ---------------------------------------------------------------------------------------------
# ggml's tests/test-quantize-fns.cpp
# ---------------------------------------------------------------------------------------------
# ggml's test runs a type only when the CPU backend has a ``from_float`` for it, and none of
# these five has one (IQ2_S's is commented out, the others are NULL), so ggml never applies its
# thresholds here. ggml's own quantizer - bit-identical to ours - misses some of them; there we
# bound the error a little above what ggml reaches, and say so.
# (type: (total error bound, ggml's; dot error bound, ggml's))
QFNS_BOUNDS = {
    GGMLType.IQ2_XXS: (0.0085, 0.002, 0.055, 0.04),
    GGMLType.IQ2_XS: (0.0075, 0.002, 0.04, 0.04),
    GGMLType.IQ2_S: (0.0075, 0.0075, 0.04, 0.04),
    GGMLType.IQ1_S: (0.011, 0.002, 0.02, 0.02),
    GGMLType.IQ1_M: (0.014, 0.002, 0.19, 0.02),
}
TEST_SIZE = 32 * 128


def _qfns_data(offset: float) -> np.ndarray:
    return (0.1 + 2 * np.cos(np.arange(TEST_SIZE, dtype=np.float64) + offset)).astype(np.float32)


@pytest.mark.parametrize("ty", TYPES, ids=lambda t: t.type_name)
def test_quantize_fns_total_error(ty: GGMLType) -> None:
    x = _qfns_data(0.0)
    y = Q.dequantize(Q.quantize(x[None], ty, _imatrix_for(ty, TEST_SIZE)), ty)[0]
    err = np.sqrt(np.sum((y.astype(np.float64) - x) ** 2)) / TEST_SIZE  # array_rmse divides by n
    assert err < QFNS_BOUNDS[ty][0]


@pytest.mark.parametrize("ty", TYPES, ids=lambda t: t.type_name)
def test_quantize_fns_dot_product_error(ty: GGMLType) -> None:
    x1, x2 = _qfns_data(0.0), _qfns_data(1.0)
    a = Q.dequantize(Q.quantize(x1[None], ty, _imatrix_for(ty, TEST_SIZE)), ty)[0]
    b = Q.dequantize(Q.quantize(x2[None], GGMLType.Q8_K), GGMLType.Q8_K)[0]  # vec_dot_type
    exact = np.dot(x1.astype(np.float64), x2.astype(np.float64))
    err = abs(np.dot(a.astype(np.float64), b.astype(np.float64)) - exact) / TEST_SIZE
    assert err < QFNS_BOUNDS[ty][2]


# ---------------------------------------------------------------------------------------------
# robustness: odd but finite inputs never trip the kernels' "ggml would abort" paths
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ty", TYPES, ids=lambda t: t.type_name)
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    log_scale=st.floats(-12.0, 3.0),  # larger values overflow the fp16 scale (to inf, as in ggml)
    shape=st.sampled_from(["normal", "sparse", "ties", "one-sided", "ramp"]),
    imatrix_kind=st.sampled_from(["ones", "random", "zeros"]),
)
def test_odd_inputs_quantize_cleanly(ty: GGMLType, seed: int, log_scale: float, shape: str, imatrix_kind: str) -> None:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 256))
    if shape == "sparse":
        x *= rng.random((2, 256)) < 0.05
    elif shape == "ties":
        x = np.round(x * 2) / 2
    elif shape == "one-sided":
        x = np.abs(x)
    elif shape == "ramp":
        x = np.broadcast_to(np.linspace(-1, 1, 256), (2, 256))
    x = (x * 10.0**log_scale).astype(np.float32)
    imatrix = {
        "ones": np.ones(256),
        "random": rng.uniform(0, 3, 256),
        "zeros": np.zeros(256),
    }[imatrix_kind].astype(np.float32)
    q = Q.quantize(x, ty, imatrix)
    y = Q.dequantize(q, ty)
    assert y.shape == x.shape
    assert np.isfinite(y).all()
    # the reconstruction never exceeds the input's range by more than the coarsest grid step
    assert np.abs(y).max() <= 8 * np.abs(x).max() + 1e-30
