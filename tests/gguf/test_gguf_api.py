"""ggml's flat ``gguf_*`` functions and the typed accessors, on a reader and a writer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyggml.gguf as g
from helpers.gguf_build import STR, U32, G, array, scalar, small_valid
from pyggml.gguf import GGUFKeyError, GGUFReader, GGUFTypeError, GGUFValueType, GGUFWriter
from pyggml.types import GGMLType


@pytest.fixture
def ctx(tmp_path: Path) -> GGUFReader:
    p = tmp_path / "s.gguf"
    p.write_bytes(small_valid().build())
    return g.gguf_init_from_file(p)


def test_flat_getters(ctx: GGUFReader) -> None:
    assert g.gguf_get_version(ctx) == 3 and g.gguf_get_alignment(ctx) == 32
    assert g.gguf_get_n_kv(ctx) == 16
    kid = g.gguf_find_key(ctx, "a.u32")
    assert g.gguf_get_key(ctx, kid) == "a.u32"
    assert g.gguf_get_kv_type(ctx, kid) == GGUFValueType.UINT32
    assert g.gguf_get_val_u32(ctx, kid) == 4_000_000_000
    assert g.gguf_get_val_i8(ctx, g.gguf_find_key(ctx, "a.i8")) == -5
    assert g.gguf_get_val_u8(ctx, g.gguf_find_key(ctx, "a.u8")) == 200
    assert g.gguf_get_val_u16(ctx, g.gguf_find_key(ctx, "a.u16")) == 60000
    assert g.gguf_get_val_i16(ctx, g.gguf_find_key(ctx, "a.i16")) == -30000
    assert g.gguf_get_val_i32(ctx, g.gguf_find_key(ctx, "a.i32")) == -2_000_000_000
    assert g.gguf_get_val_f32(ctx, g.gguf_find_key(ctx, "a.f32")) == 0.5
    assert g.gguf_get_val_bool(ctx, g.gguf_find_key(ctx, "a.bool")) is True
    assert g.gguf_get_val_u64(ctx, g.gguf_find_key(ctx, "a.u64")) == 2**63 + 5
    assert g.gguf_get_val_i64(ctx, g.gguf_find_key(ctx, "a.i64")) == -(2**62)
    assert g.gguf_get_val_f64(ctx, g.gguf_find_key(ctx, "a.f64")) == -1.25
    assert g.gguf_get_val_str(ctx, g.gguf_find_key(ctx, "general.architecture")) == "llama"
    sid = g.gguf_find_key(ctx, "a.strs")
    assert g.gguf_get_kv_type(ctx, sid) == GGUFValueType.ARRAY
    assert g.gguf_get_arr_type(ctx, sid) == GGUFValueType.STRING
    assert g.gguf_get_arr_n(ctx, sid) == 3
    assert g.gguf_get_arr_str(ctx, sid, 2) == "héllo"
    iid = g.gguf_find_key(ctx, "a.i32s")
    assert g.gguf_get_arr_data(ctx, iid).tolist() == [1, -2, 3]
    assert g.gguf_get_arr_data(ctx, g.gguf_find_key(ctx, "a.bools")).tolist() == [False, True, True]
    assert g.gguf_find_key(ctx, "nope") == -1
    assert g.gguf_get_n_tensors(ctx) == 3
    tid = g.gguf_find_tensor(ctx, "q")
    assert g.gguf_get_tensor_name(ctx, tid) == "q"
    assert g.gguf_get_tensor_type(ctx, tid) == GGMLType.Q8_0
    assert g.gguf_get_tensor_offset(ctx, tid) == 32 + 32  # w: 32 bytes, h: 6 padded to 32
    assert g.gguf_get_tensor_size(ctx, tid) == 68
    assert g.gguf_get_tensor_ne(ctx, tid) == (32, 2, 1, 1)
    assert g.gguf_find_tensor(ctx, "nope") == -1
    assert g.gguf_get_data_offset(ctx) % 32 == 0
    assert "n_kv=16" in repr(ctx) and "n_tensors=3" in repr(ctx)
    assert g.gguf_type_name(8) == "str" and g.gguf_type_size(12) == 8 and g.gguf_type_name(99) is None
    g.gguf_free(ctx)


def test_getters_reject_misuse(ctx: GGUFReader) -> None:
    kid = g.gguf_find_key(ctx, "a.u32")
    with pytest.raises(GGUFTypeError, match="u32, not i32"):
        g.gguf_get_val_i32(ctx, kid)
    with pytest.raises(GGUFKeyError, match="out of range"):
        g.gguf_get_key(ctx, 16)
    with pytest.raises(GGUFKeyError, match="out of range"):
        g.gguf_get_tensor_name(ctx, -1)
    with pytest.raises(GGUFTypeError, match="not an array"):
        g.gguf_get_arr_n(ctx, kid)
    with pytest.raises(GGUFTypeError, match="array of 3"):
        g.gguf_get_val_i32(ctx, g.gguf_find_key(ctx, "a.i32s"))
    with pytest.raises(GGUFTypeError, match="strings"):
        g.gguf_get_arr_data(ctx, g.gguf_find_key(ctx, "a.strs"))
    with pytest.raises(GGUFKeyError):
        g.gguf_get_arr_str(ctx, g.gguf_find_key(ctx, "a.strs"), 3)
    with pytest.raises(GGUFKeyError, match="no metadata key 'x'"):
        ctx["x"]


def test_typed_accessors_by_name() -> None:
    r = GGUFReader(G(kvs=[("one", array(U32, [7])), ("s", scalar(STR, "v"))]).build())
    assert r.get_u32("one") == 7  # like ggml, a one-element array passes a scalar getter
    assert r.get_u32("missing", 5) == 5 and r.get("missing") is None
    assert r.get_str("s") == "v" and "s" in r and "t" not in r
    assert list(r.metadata) == ["one", "s"]
    with pytest.raises(GGUFTypeError):
        r.get_u64("one")


def test_flat_setters_and_write(tmp_path: Path) -> None:
    w = g.gguf_init_empty()
    g.gguf_set_val_u8(w, "u8", 1)
    g.gguf_set_val_i8(w, "i8", -1)
    g.gguf_set_val_u16(w, "u16", 2)
    g.gguf_set_val_i16(w, "i16", -2)
    g.gguf_set_val_u32(w, "u32", 3)
    g.gguf_set_val_i32(w, "i32", -3)
    g.gguf_set_val_f32(w, "f32", 1.5)
    g.gguf_set_val_u64(w, "u64", 4)
    g.gguf_set_val_i64(w, "i64", -4)
    g.gguf_set_val_f64(w, "f64", 2.5)
    g.gguf_set_val_bool(w, "b", False)
    g.gguf_set_val_str(w, "s", "x")
    g.gguf_set_arr_data(w, "a", GGUFValueType.INT16, [1, 2])
    g.gguf_set_arr_str(w, "as", ["p", "q"])
    assert g.gguf_remove_key(w, "u16") == 2
    w2 = GGUFWriter()
    g.gguf_set_kv(w2, w)
    assert w2.keys() == w.keys()
    meta_size = g.gguf_get_meta_size(w)
    assert meta_size == len(g.gguf_get_meta_data(w)) and meta_size % 32 == 0
    p = tmp_path / "flat.gguf"
    assert g.gguf_write_to_file(w, p)
    r = g.gguf_init_from_file(p)
    assert r.metadata["a"].tolist() == [1, 2] and r.kv("a").type == GGUFValueType.INT16
    assert g.gguf_get_val_f32(r, g.gguf_find_key(r, "f32")) == 1.5
    assert g.gguf_get_arr_str(r, g.gguf_find_key(r, "as"), 1) == "q"
    assert g.gguf_init_from_buffer(p.read_bytes()).keys() == w.keys()


def test_string_array_is_lazy_and_keeps_raw_bytes() -> None:
    raw = b"\xff\xfe bytes"
    r = GGUFReader(G(kvs=[("v", array(STR, ["a", raw, "c"]))]).build())
    v = r["v"]
    assert len(v) == 3 and v[0] == "a" and v[-1] == "c" and v[0:2][0] == "a"
    assert v.raw(1) == raw  # undecodable bytes survive
    assert "StringArray" in repr(v)
    with pytest.raises(IndexError):
        v.raw(3)
    built = G(kvs=[("v", array(STR, ["a", raw, "c"]))]).build()
    out = GGUFWriter.from_context(r).to_bytes()
    assert out[: len(built)] == built and out[len(built) :] == bytes(len(out) - len(built))  # + ggml's padding
    assert v == ["a", raw.decode("utf-8", "surrogateescape"), "c"]


def test_tensor_views_by_type(ctx: GGUFReader) -> None:
    w = ctx.tensor_data("w")
    assert w.dtype == np.float32 and w.shape == (2, 4)
    assert ctx.tensor_data("h").dtype == np.float16
    assert ctx.tensor_data("q").shape == (2, 34) and ctx.tensor_data("q").dtype == np.uint8
    assert ctx.tensor_bytes("w").tobytes() == bytes(range(32))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=40))
def test_string_array_tolist_matches_item_by_item(strings: list[bytes]) -> None:
    """tolist() decodes all strings at once (joined at a 0xFF marker); it must give what indexing gives for
    any bytes: empty strings, invalid UTF-8, 0xFF inside a string, lengths whose bytes are 0xFF (255)."""
    from array import array as _array

    from pyggml.gguf.records import StringArray

    buf = bytearray(b"head")
    starts = _array("q")
    for s in strings:
        buf += len(s).to_bytes(8, "little")
        starts.append(len(buf))
        buf += s
    starts.append(len(buf) + 8)
    arr = StringArray(memoryview(bytes(buf)), starts)
    assert arr.tolist() == [arr[i] for i in range(len(strings))]
    assert [s.encode("utf-8", "surrogateescape") for s in arr.tolist()] == strings
