"""Every ggml type against ggml's own bytes (tests/data/quant, made with llama.cpp 0c1e570).

For each type in index.json: quantize(x) == q, quantize(x, imatrix) == q_imatrix, and
dequantize of both equals ggml's to_float output, bit for bit (floats compared as uint32 so
-0.0 and NaN payloads count). Types ggml cannot quantize without an imatrix must refuse to.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.data import load_json, load_npz
from pyggml import quants
from pyggml.quants import QuantError, get_codec, requires_imatrix
from pyggml.types import GGMLType, type_from_name

INDEX = load_json("quant", "index.json")
TYPES = sorted(INDEX["types"], key=lambda name: INDEX["types"][name]["id"])


def _types_with(array: str) -> list[str]:
    return [n for n in TYPES if array in INDEX["types"][n]["arrays"]]


def _assert_bytes_equal(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == np.uint8 and got.shape == want.shape, (got.dtype, got.shape, want.shape)
    if not np.array_equal(got, want):
        bad = np.argwhere(got != want)
        r, c = bad[0]
        raise AssertionError(f"{len(bad)} bytes differ; first at row {r} byte {c}: {got[r, c]} != {want[r, c]}")


def _assert_floats_equal(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == np.float32 and got.shape == want.shape, (got.dtype, got.shape, want.shape)
    g, w = got.view(np.uint32), want.view(np.uint32)
    if not np.array_equal(g, w):
        bad = np.argwhere(g != w)
        r, c = bad[0]
        raise AssertionError(f"{len(bad)} values differ; first at [{r}, {c}]: {got[r, c]!r} != {want[r, c]!r}")


def test_index_matches_type_table() -> None:
    for name, info in INDEX["types"].items():
        ty = type_from_name(name)
        assert int(ty) == info["id"]
        assert ty.blck_size == info["blck_size"]
        assert ty.type_size == info["type_size"]


@pytest.mark.parametrize("name", TYPES)
def test_codec_block_layout(name: str) -> None:
    codec = get_codec(type_from_name(name))
    assert codec.block_dtype is not None
    assert codec.block_dtype.itemsize == INDEX["types"][name]["type_size"]


@pytest.mark.parametrize("name", _types_with("q"))
def test_quantize(name: str) -> None:
    d = load_npz("quant", f"{name}.npz")
    ty = type_from_name(name)
    _assert_bytes_equal(quants.quantize(d["x"], ty), d["q"])


@pytest.mark.parametrize("name", _types_with("q_imatrix"))
def test_quantize_imatrix(name: str) -> None:
    d = load_npz("quant", f"{name}.npz")
    ty = type_from_name(name)
    _assert_bytes_equal(quants.quantize(d["x"], ty, d["imatrix"]), d["q_imatrix"])


@pytest.mark.parametrize("name", _types_with("deq"))
def test_dequantize(name: str) -> None:
    d = load_npz("quant", f"{name}.npz")
    _assert_floats_equal(quants.dequantize(d["q"], type_from_name(name)), d["deq"])


@pytest.mark.parametrize("name", _types_with("deq_imatrix"))
def test_dequantize_imatrix(name: str) -> None:
    d = load_npz("quant", f"{name}.npz")
    _assert_floats_equal(quants.dequantize(d["q_imatrix"], type_from_name(name)), d["deq_imatrix"])


@pytest.mark.parametrize("name", [n for n in TYPES if {"q", "q_imatrix"} & set(INDEX["types"][n]["arrays"])])
def test_reference_bytes_validate(name: str) -> None:
    """ggml's own output passes validate_row_data (except q8_1, which ggml never validates)."""
    d = load_npz("quant", f"{name}.npz")
    q = d["q"] if "q" in d else d["q_imatrix"]
    expected = type_from_name(name) != GGMLType.Q8_1
    assert quants.validate_row_data(type_from_name(name), q) is expected


@pytest.mark.parametrize("name", TYPES)
def test_requires_imatrix(name: str) -> None:
    ty = type_from_name(name)
    needs = INDEX["types"][name]["requires_imatrix"]
    assert requires_imatrix(ty) is needs
    if needs:
        x = load_npz("quant", f"{name}.npz")["x"]
        with pytest.raises(QuantError, match="importance matrix"):
            quants.quantize(x, ty)


def test_q8_K_round_trip() -> None:
    """ggml has no q8_K entry in ggml_quantize_chunk (so there are no reference bytes), but the
    codec's row quantizer (quantize_row_q8_K_ref) must round-trip to within half a step, with
    bsums equal to the sums of each 16 levels."""
    x = load_npz("quant", "q8_K.npz")["x"]
    codec = get_codec(GGMLType.Q8_K)
    q = codec.quantize_rows(np.ascontiguousarray(x), None)
    assert q.shape == (x.shape[0], GGMLType.Q8_K.row_size(x.shape[1]))
    back = quants.dequantize(q, GGMLType.Q8_K)
    blocks = q.reshape(x.shape[0], -1, 292)
    d = np.ascontiguousarray(blocks[..., :4]).view("<f4")[..., 0]
    qs = blocks[..., 4:260].view(np.int8).astype(np.int32)
    bsums = np.ascontiguousarray(blocks[..., 260:]).view("<i2")
    np.testing.assert_array_equal(bsums, qs.reshape(*qs.shape[:2], 16, 16).sum(axis=-1))
    step = np.repeat(np.abs(d), 256, axis=1)
    err = np.abs(back - x)
    assert np.all(err <= 0.5 * step * (1 + 1e-5) + 1e-30)
