"""IQ3_XXS and IQ3_S: tables, bit-exactness against ggml, ggml's test-quantize-fns checks, edge cases."""

from __future__ import annotations

from importlib import resources

import numpy as np
import pytest

from helpers.data import load_json, load_npz
from pyggml.quants import QuantError, QuantRowError, chunks, dequantize, get_codec, quantize
from pyggml.quants.iq3 import (
    IQ3XXS_LEVELS,
    grid_from_kgrid,
    iq3_tables,
    ksigns_iq2xs,
    load_table,
)
from pyggml.types import GGMLType

TYPES = ["iq3_xxs", "iq3_s"]


def _pack_u32(grid: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(grid, dtype=np.uint8).view("<u4").reshape(-1)


# ------------------------------------------------------------------------------------------------
# tables
# ------------------------------------------------------------------------------------------------


def test_kgrid_256_builds_iq3xxs_grid() -> None:
    built = grid_from_kgrid(load_table("iq3_kgrid_256.txt"), IQ3XXS_LEVELS)
    stored = load_table("iq3xxs_grid.txt")
    assert stored.shape == (256,)
    np.testing.assert_array_equal(_pack_u32(built), stored)


def test_kgrid_512_builds_iq3s_grid() -> None:
    built = grid_from_kgrid(load_table("iq3_kgrid_512.txt"), 2 * np.arange(8) + 1)
    stored = load_table("iq3s_grid.txt")
    assert stored.shape == (512,)
    np.testing.assert_array_equal(_pack_u32(built), stored)


def test_ksigns_match_ggml_table() -> None:
    # ggml-common.h's ksigns_iq2xs, as stored for the IQ2 codecs
    stored = np.load(resources.files("pyggml.quants") / "data" / "ksigns_iq2xs.npy")
    np.testing.assert_array_equal(ksigns_iq2xs(), stored.astype(np.uint8))


@pytest.mark.parametrize(("grid_size", "nwant"), [(256, 2), (512, 3)])
def test_neighbour_lists(grid_size: int, nwant: int) -> None:
    """Every off-grid point lists exactly the grid points at its nwant smallest distances, nearest first."""
    t = iq3_tables(grid_size)
    assert t.grid.shape == (grid_size, 4)
    on = np.flatnonzero(t.kmap >= 0)
    assert on.size == grid_size
    # on-grid points map to the grid entry with the same coordinates
    coords = grid_from_kgrid(on, 2 * np.arange(8) + 1)
    np.testing.assert_array_equal(t.grid[t.kmap[on]], coords)
    rng = np.random.default_rng(7)
    off = rng.choice(np.flatnonzero(t.kmap < 0), 200, replace=False)
    for point in off:
        start = -int(t.kmap[point]) - 1
        n = int(t.neighbours[start])
        listed = [int(v) for v in t.neighbours[start + 1 : start + 1 + n]]
        pos = [2 * ((int(point) >> (3 * i)) & 7) + 1 for i in range(4)]
        d2 = [sum((int(g[i]) - pos[i]) ** 2 for i in range(4)) for g in t.grid]
        wanted_d = sorted(set(d2))[:nwant]
        expected = sorted((d, j) for j, d in enumerate(d2) if d in wanted_d)
        assert listed == [j for _, j in expected]
    # the lists tile the neighbour array with no gaps
    starts = np.sort(-t.kmap[t.kmap < 0] - 1)
    assert starts[0] == 0
    assert starts[-1] + 1 + t.neighbours[starts[-1]] == t.neighbours.size


def test_codec_traits() -> None:
    for ty, size in ((GGMLType.IQ3_XXS, 98), (GGMLType.IQ3_S, 110)):
        codec = get_codec(ty)
        assert codec.block_dtype.itemsize == size
        assert codec.vec_dot_type == GGMLType.Q8_K
        assert not codec.requires_imatrix


# ------------------------------------------------------------------------------------------------
# bit-exactness against ggml's vectors
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TYPES)
def test_reference_vectors(name: str) -> None:
    arrays = load_json("quant", "index.json")["types"][name]["arrays"]
    ref = load_npz("quant", f"{name}.npz")
    assert {"q", "q_imatrix", "deq", "deq_imatrix"} <= set(arrays)
    np.testing.assert_array_equal(quantize(ref["x"], name), ref["q"])
    np.testing.assert_array_equal(quantize(ref["x"], name, ref["imatrix"]), ref["q_imatrix"])
    for q_key, deq_key in (("q", "deq"), ("q_imatrix", "deq_imatrix")):
        got = dequantize(ref[q_key], name)
        np.testing.assert_array_equal(got.view(np.uint32), ref[deq_key].view(np.uint32))


# ------------------------------------------------------------------------------------------------
# ggml's tests/test-quantize-fns.cpp
# ------------------------------------------------------------------------------------------------


def _cos_data(offset: float, n: int = 4096) -> np.ndarray:
    return (0.1 + 2 * np.cos(np.arange(n, dtype=np.float64) + offset)).astype(np.float32)


def _q8_k_roundtrip(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_K_ref then dequantize (the activations side of vec_dot for IQ3)."""
    blocks = x.reshape(-1, 256)
    imax = np.argmax(np.abs(blocks), axis=1)
    vmax = blocks[np.arange(blocks.shape[0]), imax]
    iscale = np.float32(-127.0) / vmax
    q = np.minimum(127, np.rint(iscale[:, None] * blocks)).astype(np.int8)
    d = np.float32(1.0) / iscale
    return (d[:, None] * q.astype(np.float32)).reshape(-1)


@pytest.mark.parametrize(("name", "max_error"), [("iq3_xxs", 0.0050), ("iq3_s", 0.0040)])
def test_quantize_fns_thresholds(name: str, max_error: float) -> None:
    x1 = _cos_data(0.0)
    x2 = _cos_data(1.0)
    n = x1.size
    y1 = dequantize(quantize(x1[None, :], name), name)[0]
    total_error = np.sqrt(np.sum((y1.astype(np.float64) - x1) ** 2)) / n
    assert total_error < max_error

    dot = np.dot(y1.astype(np.float64), _q8_k_roundtrip(x2).astype(np.float64))
    exact = np.dot(x1.astype(np.float64), x2.astype(np.float64))
    assert abs(dot - exact) / n < 0.04


# ------------------------------------------------------------------------------------------------
# edge cases
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TYPES)
def test_zeros(name: str) -> None:
    q = quantize(np.zeros((2, 512), np.float32), name)
    assert not q.any()
    assert not dequantize(q, name).any()


@pytest.mark.parametrize("name", TYPES)
def test_rows_are_independent(name: str) -> None:
    """The parallel row loop gives each row the bytes it gets on its own."""
    x = np.random.default_rng(3).standard_normal((5, 512)).astype(np.float32)
    whole = quantize(x, name)
    for r in range(x.shape[0]):
        np.testing.assert_array_equal(quantize(x[r : r + 1], name), whole[r : r + 1])


def test_iq3_s_zero_subblock_shifts_following_bytes() -> None:
    """ggml does not advance the qs/signs write position past an all-zero sub-block."""
    rng = np.random.default_rng(11)
    a, b = rng.standard_normal((2, 32)).astype(np.float32)
    rest = rng.standard_normal(160).astype(np.float32)
    skipped = np.concatenate([np.zeros(32, np.float32), a, b, rest])[None, :]
    doubled = np.concatenate([a, a, b, rest])[None, :]
    qs_skip, qs_ref = quantize(skipped, "iq3_s")[0], quantize(doubled, "iq3_s")[0]
    # layout: d 0:2, qs 2:66, qh 66:74, signs 74:106, scales 106:110
    assert np.array_equal(qs_skip[2:10], qs_ref[10:18])  # a's indices sit in slot 0
    assert np.array_equal(qs_skip[10:58], qs_ref[18:66])  # the rest follow one slot early
    assert not qs_skip[58:66].any()  # the last slot stays zero
    assert np.array_equal(qs_skip[74:102], qs_ref[78:106])  # signs shift the same way
    assert not qs_skip[102:106].any()
    assert qs_skip[66] == 0  # qh and scales keep the true sub-block position
    assert qs_skip[67:74].tolist() == qs_ref[67:74].tolist()


def test_iq3_xxs_signs_have_even_parity() -> None:
    """Each group of 8 keeps all signs but at most one, the one with least weighted magnitude."""
    x = np.random.default_rng(5).standard_normal((4, 256)).astype(np.float32)
    y = dequantize(quantize(x, "iq3_xxs"), "iq3_xxs")
    neg = (np.signbit(y) != np.signbit(x)).reshape(-1, 8)
    assert neg.sum(axis=1).max() <= 1
    assert np.all((np.signbit(y).reshape(-1, 8).sum(axis=1) % 2) == 0)


@pytest.mark.parametrize("name", TYPES)
def test_imatrix_changes_result(name: str) -> None:
    x = np.random.default_rng(9).standard_normal((2, 256)).astype(np.float32)
    w = np.random.default_rng(10).uniform(0.0, 4.0, 256).astype(np.float32)
    assert not np.array_equal(quantize(x, name), quantize(x, name, w))


@pytest.mark.parametrize("name", TYPES)
def test_nan_subblock_is_rejected(name: str) -> None:
    """A NaN sub-block scale trips ggml's GGML_ASSERT(scale >= 0); we raise instead of aborting."""
    x = np.ones((2, 256), np.float32)
    x[1, 32:64] = np.nan
    with pytest.raises(QuantError, match=name):
        quantize(x, name)


@pytest.mark.parametrize("name", TYPES)
def test_bad_shapes(name: str) -> None:
    with pytest.raises(QuantError):
        quantize(np.zeros((1, 100), np.float32), name)
    with pytest.raises(QuantError):
        quantize(np.zeros((1, 256), np.float32), name, np.ones(128, np.float32))
    with pytest.raises(QuantError):
        dequantize(np.zeros((1, 97), np.uint8), name)


def _hostile_rows() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(21)
    base = rng.standard_normal((2, 256)).astype(np.float32)
    with_inf = base.copy()
    with_inf[0, 3] = np.inf
    return {
        "denormal": base * np.float32(1e-40),
        "tiny": base * np.float32(1e-25),
        "huge": base * np.float32(1e30),
        "inf": with_inf,
    }


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("imatrix", [None, "zeros", "negative"])
def test_hostile_input_gives_bytes_or_quant_error(name: str, imatrix: str | None) -> None:
    """Float edge cases never escape as ZeroDivisionError/SystemError from the numba kernels."""
    w = {None: None, "zeros": np.zeros(256, np.float32), "negative": -np.ones(256, np.float32)}[imatrix]
    for label, x in _hostile_rows().items():
        try:
            q = quantize(x, name, w)
        except QuantError as exc:
            assert name in str(exc), label
            continue
        assert q.shape == (2, {"iq3_xxs": 98, "iq3_s": 110}[name]), label
        assert dequantize(q, name).shape == x.shape


def test_a_row_that_cannot_be_quantized_is_named_across_the_thread_cut() -> None:
    """A float32 overflow in row 6 of 8, the rows cut into two ranges of four for two threads: the error
    names row 6 of the caller's rows (not row 2 of the second range) and the type."""
    x = np.random.default_rng(0).standard_normal((8, 512)).astype(np.float32)
    x[6, 5] = 3e38
    with chunks.using_threads(2), pytest.raises(QuantRowError, match=r"^iq3_xxs: row 6 cannot be quantized") as e:
        quantize(x, GGMLType.IQ3_XXS, np.ones(512, np.float32))
    assert e.value.row == 6
