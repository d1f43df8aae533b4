"""Writer and reader together, checked against the independent ``gguf`` package both ways."""

from __future__ import annotations

import math
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.gguf_build import assert_same_as_gguf_py, write_with_gguf_py
from pyggml.gguf import GGUFError, GGUFReader, GGUFTypeError, GGUFValueType, GGUFWriter
from pyggml.types import GGMLType

V = GGUFValueType
RNG = np.random.default_rng(0)


def full_writer(alignment: int | None = 64) -> GGUFWriter:
    w = GGUFWriter()
    w.set_str("general.architecture", "llama")
    if alignment is not None:
        w.set_u32("general.alignment", alignment)
    w.set_u8("t.u8", 255)
    w.set_i8("t.i8", -128)
    w.set_u16("t.u16", 65535)
    w.set_i16("t.i16", -32768)
    w.set_u32("t.u32", 2**32 - 1)
    w.set_i32("t.i32", -(2**31))
    w.set_f32("t.f32", 1e-6)
    w.set_bool("t.bool", True)
    w.set_str("t.str", "héllo wörld ✓")
    w.set_u64("t.u64", 2**64 - 1)
    w.set_i64("t.i64", -(2**63))
    w.set_f64("t.f64", math.pi)
    for t in V:
        if t.is_fixed_size and t != V.BOOL:
            info = np.iinfo(t.np_dtype) if t.np_dtype.kind in "iu" else None
            vals = [info.min, 0, info.max] if info else [-1.5, 0.0, float("inf")]
            w.set_arr(f"arr.{t.type_name}", np.array(vals, dtype=t.np_dtype))
    w.set_arr("arr.bool", [True, False, True])
    w.set_arr("arr.str", ["a", "", "ü", "x" * 300])
    w.set_arr("arr.empty", [], V.INT32)
    w.add_tensor("f32", RNG.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", RNG.standard_normal(7).astype(np.float16))
    w.add_tensor("i8", np.arange(-5, 5, dtype=np.int8).reshape(2, 5))
    w.add_tensor("i32", np.arange(6, dtype=np.int32).reshape(1, 2, 3))
    w.add_tensor("i64", np.arange(4, dtype=np.int64))
    w.add_tensor("f64", np.linspace(0, 1, 9).reshape(3, 3))
    w.add_tensor("bf16", np.arange(8, dtype=np.uint16), type=GGMLType.BF16)
    w.add_tensor("q4k", RNG.integers(0, 256, (2, 144), dtype=np.uint8), type=GGMLType.Q4_K)
    w.add_tensor("q80", RNG.integers(0, 256, (3, 2, 68), dtype=np.uint8), type="q8_0")
    return w


def test_pyggml_file_reads_back_with_pyggml_and_gguf(tmp_path: Path) -> None:
    w = full_writer()
    path = w.write(tmp_path / "full.gguf")
    with GGUFReader(path) as r:
        assert r.version == 3 and r.alignment == 64
        assert r.keys() == w.keys()
        for a, b in zip(w.kvs(), r.kvs(), strict=True):
            assert (a.type, a.is_array) == (b.type, b.is_array), a.key
            if a.type in (V.FLOAT32, V.FLOAT64):
                assert np.array_equal(
                    np.asarray(a.to_python(), np.float32 if a.type == V.FLOAT32 else np.float64),
                    np.asarray(b.to_python(), np.float32 if b.type == V.FLOAT32 else np.float64),
                )
            else:
                assert a.to_python() == b.to_python(), a.key
        assert r.tensors == w.tensors
        assert r.data_offset % 64 == 0
        for ti in r.tensors:
            assert ti.offset % 64 == 0
        assert np.array_equal(r.tensor_data("f32"), w._data[0])
        assert r.tensor_data("f32").shape == (3, 5) and r.tensor_info("f32").ne == (5, 3, 1, 1)
        assert r.tensor_data("q80").shape == (3, 2, 68) and r.tensor_info("q80").ne == (64, 2, 3, 1)
        assert r.tensor_rows("q80").shape == (6, 68)
        assert r.tensor_data("bf16").dtype == np.uint16
        assert_same_as_gguf_py(r, path)
        assert path.read_bytes() == w.to_bytes()


def test_tensor_data_is_a_zero_copy_view(tmp_path: Path) -> None:
    path = full_writer().write(tmp_path / "v.gguf")
    r = GGUFReader(path)
    a = r.tensor_data("f32")
    assert not a.flags.writeable and not a.flags.owndata
    assert a.ctypes.data == np.frombuffer(r._buf, np.uint8).ctypes.data + r.tensor_file_offset("f32")
    r.close()  # views outlive close: the mapping stays while they do
    assert a.shape == (3, 5) and np.isfinite(a).all()
    with pytest.raises(GGUFError, match="closed"):
        r.tensor_data("f32")


def test_gguf_py_file_reads_and_rewrites_byte_for_byte(tmp_path: Path) -> None:
    src = tmp_path / "gguf_py.gguf"
    write_with_gguf_py(src)
    r = GGUFReader(src)
    assert_same_as_gguf_py(r, src)
    assert r.tensor_info("row").n_dims == 2
    out = GGUFWriter.from_context(r).write(tmp_path / "again.gguf")
    assert out.read_bytes() == src.read_bytes()


def test_bool_bytes_are_normalised_like_ggml(tmp_path: Path) -> None:
    w = GGUFWriter()
    w.set_bool("b", True)
    raw = bytearray(w.to_bytes())
    value_at = 24 + 8 + 1 + 4  # header, key "b", type tag
    assert raw[value_at] == 1
    raw[value_at] = 7  # ggml reads any nonzero byte as true and writes 1
    r = GGUFReader(bytes(raw))
    assert r.get_bool("b") is True
    assert GGUFWriter.from_context(r).to_bytes() == w.to_bytes()


def test_nan_payloads_survive_a_rewrite() -> None:
    w = GGUFWriter()
    w.set_val("nan", np.array([0x7FC00123], dtype=np.uint32).view(np.float32)[0])
    w.set_arr("nans", np.array([0x7FA00001, 0xFFC00002], dtype=np.uint32).view(np.float32))
    data = w.to_bytes()
    assert GGUFWriter.from_context(GGUFReader(data)).to_bytes() == data
    assert b"\x23\x01\xc0\x7f" in data


def test_set_replaces_and_moves_the_key_to_the_end() -> None:
    w = GGUFWriter()
    w.set_u32("a", 1)
    w.set_u32("b", 2)
    w.set_str("a", "x")
    assert w.keys() == ["b", "a"] and w["a"] == "x"
    assert w.remove_key("b") == 0 and w.remove_key("b") == -1
    assert w.find_key("a") == 0


def test_offsets_follow_ggml(tmp_path: Path) -> None:
    w = GGUFWriter()
    w.add_tensor("a", np.zeros(3, np.float32))
    w.add_tensor("b", np.zeros(20, np.float32))
    w.add_tensor("c", np.zeros(1, np.float32))
    assert [t.offset for t in w.tensors] == [0, 32, 128]
    w.set_u32("general.alignment", 256)  # later alignment re-lays out what came before
    assert [t.offset for t in w.tensors] == [0, 256, 512]
    r = GGUFReader(w.to_bytes())
    assert r.data_offset == len(w.meta_bytes()) and r.data_offset % 256 == 0
    assert r.file_size == r.data_offset + r.data_size == r.data_offset + 768


def test_no_tensors_reader_does_not_pad_but_writer_does() -> None:
    w = GGUFWriter()
    w.set_str("k", "v")
    data = w.to_bytes()
    assert len(data) % 32 == 0
    r = GGUFReader(data)
    assert r.n_tensors == 0 and r.data_offset < len(data)  # ggml: data offset is unpadded here


def test_writer_rejects_bad_input() -> None:
    w = GGUFWriter()
    w.add_tensor("a", np.zeros(4, np.float32))
    with pytest.raises(GGUFError, match="duplicate"):
        w.add_tensor("a", np.zeros(4, np.float32))
    with pytest.raises(GGUFError, match="fewer than 64"):
        w.add_tensor("n" * 64, np.zeros(4, np.float32))
    with pytest.raises(GGUFError, match="block size"):
        w.add_tensor("q", b"\0" * 34, type=GGMLType.Q8_0, ne=[31])
    with pytest.raises(GGUFError, match="needs 34"):
        w.add_tensor("q", b"\0" * 30, type=GGMLType.Q8_0, ne=[32])
    with pytest.raises(GGUFError, match=r"removed|not usable"):
        w.add_tensor("r", b"", type=4, ne=[0])
    with pytest.raises(GGUFTypeError, match="no ggml type"):
        w.add_tensor("u", np.zeros(4, np.uint32))
    with pytest.raises(GGUFError, match="type= and ne="):
        w.add_tensor("lazy", lambda: b"")
    with pytest.raises(GGUFTypeError, match="u32"):
        w.set_u64("general.alignment", 32)
    with pytest.raises(GGUFError, match="power of 2"):
        w.set_u32("general.alignment", 48)
    with pytest.raises(GGUFTypeError, match="out of range"):
        w.set_u8("x", 256)
    with pytest.raises(GGUFTypeError, match="out of range"):
        w.set_arr("x", [1, -1], V.UINT32)
    with pytest.raises(GGUFTypeError, match="arrays of arrays"):
        w.set_arr("x", [[1]], V.ARRAY)
    with pytest.raises(GGUFTypeError, match="bool"):
        w.set_bool("x", 1)
    with pytest.raises(GGUFError, match="non-empty"):
        w.set_u8("", 1)
    with pytest.raises(GGUFError, match="NUL"):
        w.set_u8("a\0b", 1)
    with pytest.raises(GGUFError, match="UTF-8"):
        w.set_str("s", "\ud800")
    with pytest.raises(GGUFError, match="UTF-8"):
        w.set_arr("s", ["ok", "\ud800"])
    with pytest.raises(GGUFError, match="UTF-8"):
        w.set_u8("\ud800", 1)
    with pytest.raises(GGUFError, match="UTF-8"):
        w.add_tensor("\ud800", np.zeros(4, np.float32))
    with pytest.raises(GGUFError, match="NUL"):
        w.add_tensor("a\0b", np.zeros(4, np.float32))
    assert w.keys() == [] and [t.name for t in w.tensors] == ["a"]


def test_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "model.gguf"
    target.write_bytes(b"old contents")

    def boom() -> bytes:
        raise RuntimeError("producer failed")

    w = GGUFWriter()
    w.add_tensor("ok", np.zeros(8, np.float32))
    w.add_tensor("bad", boom, type=GGMLType.F32, ne=[8])
    with pytest.raises(RuntimeError, match="producer failed"):
        w.write(target)
    assert target.read_bytes() == b"old contents"

    w2 = GGUFWriter()
    w2.add_tensor("short", lambda: b"\0" * 8, type=GGMLType.F32, ne=[8])
    with pytest.raises(GGUFError, match="gave 8 bytes, expected 32"):
        w2.write(target)
    assert target.read_bytes() == b"old contents"
    assert sorted(os.listdir(tmp_path)) == ["model.gguf"]  # no temporary left behind


def test_streaming_write_holds_one_chunk_at_a_time(tmp_path: Path) -> None:
    chunk = 1 << 20
    n_chunks = 48  # 48 MiB of tensor data, written from a generator

    def produce(seed: int):
        for i in range(n_chunks):
            yield np.full(chunk // 4, seed + i, dtype=np.float32)

    w = GGUFWriter()
    w.add_tensor("big0", lambda: produce(0), type=GGMLType.F32, ne=[chunk // 4, n_chunks])
    w.add_tensor("big1", lambda: produce(100), type=GGMLType.F32, ne=[chunk // 4, n_chunks])
    tracemalloc.start()
    try:
        path = w.write(tmp_path / "big.gguf", fsync=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * chunk
    r = GGUFReader(path)
    assert r.tensor_data("big1")[5, 0] == 105 and r.tensor_data("big0").shape == (n_chunks, chunk // 4)


# ---- property: random metadata round-trips through both readers -------------------------------

_ints = {
    V.UINT8: st.integers(0, 255),
    V.INT8: st.integers(-128, 127),
    V.UINT16: st.integers(0, 2**16 - 1),
    V.INT16: st.integers(-(2**15), 2**15 - 1),
    V.UINT32: st.integers(0, 2**32 - 1),
    V.INT32: st.integers(-(2**31), 2**31 - 1),
    V.UINT64: st.integers(0, 2**64 - 1),
    V.INT64: st.integers(-(2**63), 2**63 - 1),
}
_values = {
    **_ints,
    V.FLOAT32: st.floats(width=32, allow_nan=False),
    V.FLOAT64: st.floats(allow_nan=False),
    V.BOOL: st.booleans(),
    V.STRING: st.text(max_size=20),
}
_pair = st.sampled_from(sorted(_values)).flatmap(
    lambda t: st.tuples(st.just(t), st.booleans(), st.lists(_values[t], max_size=5))
)


# keys as ggml can hold them: UTF-8 text (gguf-py decodes strictly), no NUL (C strings)
_keys = st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=12)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(_keys, _pair, max_size=8))
def test_random_metadata_round_trips(tmp_path_factory: pytest.TempPathFactory, meta: dict) -> None:
    w = GGUFWriter()
    for key, (t, is_array, vals) in meta.items():
        if key == "general.alignment":
            continue
        if is_array:
            w.set_arr(key, vals, t)
        elif vals:
            w.set_val(key, vals[0], t)
    path = w.write(tmp_path_factory.mktemp("rt") / "m.gguf", fsync=False)
    r = GGUFReader(path)
    assert r.keys() == w.keys()
    for a, b in zip(w.kvs(), r.kvs(), strict=True):
        assert (a.type, a.is_array, a.n) == (b.type, b.is_array, b.n)
        want, got = a.to_python(), b.to_python()
        if a.type == V.FLOAT32:
            want = np.asarray(want, np.float32).tolist()
        assert want == got
    assert_same_as_gguf_py(r, path)
    assert GGUFWriter.from_context(r).to_bytes() == path.read_bytes()


def test_empty_and_scalar_tensors(tmp_path: Path) -> None:
    w = GGUFWriter()
    w.add_tensor("empty", np.zeros((0, 4), np.float32))
    w.add_tensor("scalar", np.float32(3))
    w.add_tensor("q_empty", b"", type="q4_K", ne=[256, 0])
    w.add_tensor("after", np.ones(2, np.float32))
    assert [t.offset for t in w.tensors] == [0, 0, 32, 32]  # zero bytes pad to zero
    path = w.write(tmp_path / "e.gguf")
    r = GGUFReader(path)
    assert r.tensor_data("empty").shape == (0, 4) and r.tensor_info("empty").nbytes == 0
    assert r.tensor_data("scalar").tolist() == [3.0] and r.tensor_info("scalar").n_dims == 1
    assert r.tensor_data("q_empty").shape == (0, 144)
    assert r.tensor_data("after").tolist() == [1.0, 1.0]
    assert_same_as_gguf_py(r, path)


def test_type_inference() -> None:
    w = GGUFWriter()
    w.set_val("i32", 5)
    w.set_val("i64", -(2**40))
    w.set_val("u64", 2**63)
    w.set_val("f", 0.25)
    w.set_val("b", False)
    w.set_val("s", "x")
    w.set_val("np", np.uint16(7))
    w.set_arr("ints", [1, 2**40, 2**63])  # big ints stay exact: never through float
    w.set_arr("mixed", [1, 0.5])
    w.set_arr("strs", np.array(["a", "bc"]))
    types = {kv.key: (kv.type, kv.is_array) for kv in w.kvs()}
    assert types == {
        "i32": (V.INT32, False),
        "i64": (V.INT64, False),
        "u64": (V.UINT64, False),
        "f": (V.FLOAT32, False),
        "b": (V.BOOL, False),
        "s": (V.STRING, False),
        "np": (V.UINT16, False),
        "ints": (V.UINT64, True),
        "mixed": (V.FLOAT32, True),
        "strs": (V.STRING, True),
    }
    r = GGUFReader(w.to_bytes())
    assert r["ints"].tolist() == [1, 2**40, 2**63]
    with pytest.raises(GGUFTypeError, match="does not fit"):
        w.set_val("big", 2**64)
    with pytest.raises(GGUFTypeError, match="empty array"):
        w.set_arr("e", [])
    with pytest.raises(GGUFTypeError, match="mixes"):
        w.set_arr("m", [1, "a"])
