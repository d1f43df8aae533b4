"""Malformed GGUF files: each must raise GGUFError naming the right check, nothing else.

The corpus covers every check of ggml's gguf_init_from_reader (ggml-internals.md 3.4) plus
D4; a hypothesis fuzzer mutates a valid file at random. Peak memory is watched with
tracemalloc, so a reader that trusted a count from the file would fail here.
"""

from __future__ import annotations

import struct
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.gguf_build import (
    ARR,
    BOOL,
    F64,
    STR,
    U8,
    U32,
    U64,
    G,
    T,
    array,
    gstr,
    scalar,
    small_valid,
)
from pyggml.errors import PyGGMLError
from pyggml.gguf import CHECKS, GGUFError, GGUFReader

VALID = small_valid().build()
# parsing a small file costs a few KiB of Python objects whatever its contents
OVERHEAD = 256 * 1024


def parse(data: bytes) -> GGUFReader:
    return GGUFReader(data)


def expect(data: bytes, check: str) -> GGUFError:
    with pytest.raises(GGUFError) as ei:
        parse(data)
    e = ei.value
    assert e.check == check, str(e)
    assert f"[{check}]" in str(e) and CHECKS[check] in str(e)
    assert e.offset is not None and f"at byte {e.offset}" in str(e)
    return e


def with_kv(*kvs: tuple[str | bytes, bytes]) -> bytes:
    return G(kvs=list(kvs)).build()


def with_tensors(*ts: T, **kw: object) -> bytes:
    return G(tensors=list(ts), **kw).build()  # type: ignore[arg-type]


def test_valid_file_parses() -> None:
    r = parse(VALID)
    assert r.n_kv == 16 and r.n_tensors == 3
    assert r.get_u64("a.u64") == 2**63 + 5
    assert list(r["a.strs"]) == ["x", "", "héllo"]
    assert isinstance(GGUFError("x"), PyGGMLError)


# ---- header -----------------------------------------------------------------------------


def test_every_truncation_point_fails() -> None:
    for n in range(len(VALID)):
        with pytest.raises(GGUFError):
            parse(VALID[:n])


def test_truncations_name_the_failed_field() -> None:
    assert expect(VALID[:3], "M1").offset == 0
    expect(VALID[:6], "V1")
    expect(VALID[:10], "H1")
    expect(VALID[:20], "H2")
    expect(VALID[:30], "K1")
    # cut the final padding only: ggml's blob read (C2) would fail, so does D4
    expect(VALID[:-1], "D4")


def test_empty_file(tmp_path) -> None:
    p = tmp_path / "empty.gguf"
    p.write_bytes(b"")
    with pytest.raises(GGUFError, match=r"\[M1\]") as ei:
        GGUFReader(p)
    assert str(p) in str(ei.value)


def test_bad_magic() -> None:
    e = expect(b"GGML" + VALID[4:], "M2")
    assert "GGML" in str(e)


@pytest.mark.parametrize(("version", "check"), [(0, "V2"), (1, "V4"), (4, "V5"), (3 << 24, "V3"), (2 << 24, "V3")])
def test_bad_versions(version: int, check: str) -> None:
    expect(G(version=version).build(), check)


def test_version_2_is_accepted() -> None:
    assert parse(G(version=2).build()).version == 2


@pytest.mark.parametrize("n", [-1, 2**62, 2**63 - 1])
def test_tensor_count_out_of_range(n: int) -> None:
    expect(G(n_tensors=n).build(), "H1")


@pytest.mark.parametrize("n", [-1, -(2**63), 2**61])
def test_kv_count_out_of_range(n: int) -> None:
    expect(G(n_kv=n).build(), "H2")


def test_huge_counts_within_ggml_limits_fail_on_reading_not_allocating() -> None:
    tracemalloc.start()
    try:
        expect(G(n_kv=10**15).build(), "K1")
        expect(G(n_tensors=10**15).build(), "T1")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < OVERHEAD


# ---- key-value pairs ------------------------------------------------------------------------


def test_key_checks() -> None:
    expect(with_kv(("", scalar(U8, 1))), "K2")
    e = expect(with_kv(("k", scalar(U8, 1)), ("j", scalar(U8, 1)), ("k", scalar(U8, 2))), "K3")
    assert e.key == "k" and "'k'" in str(e)
    # key length over ggml's maximum, and over what the file holds
    expect(G(n_kv=1).build() + gstr(b"", 2**30 + 1), "K1")
    expect(G(n_kv=1).build() + gstr(b"abc", 100), "K1")


@pytest.mark.parametrize("vtype", [ARR, 13, -1, 2**31 - 1])
def test_invalid_value_types(vtype: int) -> None:
    # a scalar tagged ARRAY reads an element type: nested ARRAY, out of range both fail K5
    if vtype == ARR:
        data = with_kv(("k", struct.pack("<iiQ", ARR, ARR, 1) + struct.pack("<iiQ", U8, U8, 0)))
    else:
        data = with_kv(("k", struct.pack("<i", vtype) + b"\0" * 8))
    e = expect(data, "K5")
    assert e.key == "k"


def test_array_of_invalid_element_type() -> None:
    expect(with_kv(("k", struct.pack("<iiQ", ARR, 42, 0))), "K5")


def test_value_reads() -> None:
    expect(G(n_kv=1).build() + gstr("k") + struct.pack("<i", U32) + b"\0\0", "K6")
    expect(with_kv(("k", struct.pack("<i", STR) + gstr(b"", 2**30 + 1))), "K6")
    expect(with_kv(("k", struct.pack("<i", STR) + gstr(b"ab", 3))), "K6")


@pytest.mark.parametrize(
    ("elem", "count"),
    [(U8, 2**30 + 1), (U64, 2**40), (U8, 2**64 - 1), (STR, 2**30), (STR, 1000), (F64, 500), (BOOL, 10**9)],
)
def test_oversized_arrays(elem: int, count: int) -> None:
    tracemalloc.start()
    try:
        e = expect(with_kv(("arr", array(elem, [], count=count))), "K6")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert e.key == "arr"
    assert peak < OVERHEAD


def test_string_inside_array_too_long() -> None:
    body = struct.pack("<iiQ", ARR, STR, 2) + gstr("ok") + gstr(b"x", 2**30 + 1)
    e = expect(with_kv(("arr", body)), "K6")
    assert "string 1" in str(e)
    body = struct.pack("<iiQ", ARR, STR, 2) + gstr("ok") + gstr(b"x", 40)
    expect(with_kv(("arr", body)), "K6")


def test_alignment_checks() -> None:
    expect(with_kv(("general.alignment", scalar(U64, 32))), "A1")
    expect(with_kv(("general.alignment", array(U32, [32]))), "A1")
    expect(with_kv(("general.alignment", scalar(STR, "32"))), "A1")
    for bad in (0, 3, 48, 2**32 - 1):
        e = expect(with_kv(("x", scalar(U8, 1)), ("general.alignment", scalar(U32, bad))), "A2")
        assert str(bad) in str(e) and e.key == "general.alignment"
        assert e.offset == 24 + 8 + 1 + 4 + 1  # where the pair starts


# ---- tensor infos -------------------------------------------------------------------------


def test_tensor_name_length() -> None:
    ok = parse(with_tensors(T("n" * 63, [4], nbytes=16)))
    assert ok.tensors[0].name == "n" * 63
    expect(with_tensors(T("n" * 64, [4], nbytes=16)), "T1")
    expect(with_tensors(T("n" * 1000, [4], nbytes=16)), "T1")


def test_duplicate_tensor_names() -> None:
    e = expect(with_tensors(T("a", [4], nbytes=16), T("b", [4], nbytes=16), T("a", [4], nbytes=16)), "T2")
    assert e.tensor == "a"
    # names are C strings in ggml: what follows a NUL does not count (ggml master compares the
    # truncated names; the older copy the test data came from compared whole strings and let it pass)
    expect(with_tensors(T("a", [4], nbytes=16), T(b"a\0b", [4], nbytes=16)), "T2")


def test_dimension_checks() -> None:
    expect(with_tensors(T("t", [1, 1, 1, 1, 1], nbytes=4)), "T3")
    expect(with_tensors(T("t", [4], nbytes=16, n_dims=2**32 - 1)), "T3")
    e = expect(with_tensors(T("t", [4, -1], nbytes=16)), "T4")
    assert e.tensor == "t" and "dimension 1" in str(e)
    expect(with_tensors(T("t", [-(2**63)], nbytes=16)), "T4")


@pytest.mark.parametrize(
    "ne",
    [[2**32, 2**32], [2**63 - 1, 1], [3, 2**62], [1, 1, 2**40, 2**30], [2**20, 2**20, 2**20, 2**10]],
)
def test_element_count_overflow(ne: list[int]) -> None:
    expect(with_tensors(T("t", ne, nbytes=0)), "T5")


def test_zero_sized_tensors_skip_the_overflow_check() -> None:
    r = parse(with_tensors(T("t", [0, 2**62, 2**62], nbytes=0)))
    assert r.tensors[0].nbytes == 0


@pytest.mark.parametrize(
    ("ty", "check"), [(43, "T6"), (-1, "T6"), (1000, "T6"), (4, "T7"), (5, "T7"), (31, "T7"), (38, "T7")]
)
def test_bad_tensor_types(ty: int, check: str) -> None:
    e = expect(with_tensors(T("t", [256], type=ty, nbytes=0)), check)
    assert "'t'" in str(e)


def test_row_not_a_multiple_of_the_block() -> None:
    e = expect(with_tensors(T("t", [33], type=8, nbytes=0)), "T7")  # Q8_0 blocks of 32
    assert "33" in str(e) and "32" in str(e)
    expect(with_tensors(T("t", [128, 2], type=12, nbytes=0)), "T7")  # Q4_K blocks of 256


def test_byte_size_overflow() -> None:
    ggml_f64 = 28  # 8 bytes an element: 2^61 + 1 of them need more than SIZE_MAX bytes
    expect(with_tensors(T("t", [2**61 + 1], type=ggml_f64, nbytes=0)), "T8")


def test_offset_unreadable() -> None:
    data = with_tensors(T("t", [4], nbytes=16))
    end_of_info = data.index(b"t") + 1 + 4 + 8 + 4
    expect(data[: end_of_info + 3], "T9")


# ---- data section -------------------------------------------------------------------------


def test_seek_past_end_of_data_section() -> None:
    data = with_tensors(T("t", [0], nbytes=0))
    meta_end = data.index(b"t") + 1 + 4 + 8 + 4 + 8
    assert meta_end % 32  # padding needed
    expect(data[:meta_end], "D1")


@pytest.mark.parametrize(
    "offsets",
    [
        [32, 64],  # first not at 0
        [0, 96],  # gap
        [0, 0],  # overlap
        [0, 16],  # overlap, unaligned
        [64, 0],  # wrong order
        [0, 2**64 - 1],
    ],
)
def test_offsets_must_be_packed_in_order(offsets: list[int]) -> None:
    data = with_tensors(T("a", [16], offset=offsets[0], nbytes=64), T("b", [16], offset=offsets[1], nbytes=64))
    e = expect(data, "D2")
    assert e.tensor in ("a", "b") and "expected" in str(e)
    # the reported byte is the offending offset field in the tensor table
    assert struct.unpack_from("<Q", data, e.offset)[0] == offsets[e.tensor == "b"]


def test_running_size_overflow() -> None:
    # two F64 tensors of 2^63 bytes each: each passes T8, their sum does not fit size_t
    f64 = 28
    data = with_tensors(T("a", [2**60], type=f64, nbytes=0), T("b", [2**60], type=f64, offset=2**63, nbytes=0))
    expect(data, "D3")


def test_data_past_end_of_file() -> None:
    # ggml misses this unless it reads the blob; we reject at open and name the tensor
    g = G(tensors=[T("a", [8], nbytes=32), T("b", [1000], nbytes=4000)], data=b"\0" * 40)
    e = expect(g.build(), "D4")
    assert e.tensor == "b"


# ---- fuzzing ----------------------------------------------------------------------------------

mutation = st.one_of(
    st.tuples(st.just("set"), st.integers(0, len(VALID) - 1), st.integers(0, 255)),
    st.tuples(st.just("set8"), st.integers(0, len(VALID) - 8), st.integers(0, 2**64 - 1)),
    st.tuples(st.just("cut"), st.integers(0, len(VALID) - 1), st.integers(0, 0)),
    st.tuples(st.just("del"), st.integers(0, len(VALID) - 1), st.integers(1, 16)),
    st.tuples(st.just("ins"), st.integers(0, len(VALID)), st.integers(0, 255)),
)


def mutate(data: bytes, muts: list[tuple[str, int, int]]) -> bytes:
    b = bytearray(data)
    for op, pos, val in muts:
        pos = min(pos, len(b))
        if op == "set" and pos < len(b):
            b[pos] = val
        elif op == "set8" and pos + 8 <= len(b):
            b[pos : pos + 8] = struct.pack("<Q", val)
        elif op == "cut":
            del b[pos:]
        elif op == "del":
            del b[pos : pos + val]
        elif op == "ins":
            b[pos:pos] = bytes([val])
    return bytes(b)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mutation, min_size=1, max_size=6))
def test_fuzz_mutations_raise_only_gguf_errors(muts: list[tuple[str, int, int]]) -> None:
    data = mutate(VALID, muts)
    tracemalloc.start()
    try:
        try:
            r = parse(data)
        except GGUFError as e:
            assert e.check in CHECKS
        else:
            # what parses must be self-consistent: every tensor inside the file
            for ti in r.tensors:
                assert r.data_offset + ti.offset + ti.nbytes <= len(data)
                assert r.tensor_bytes(ti.name).nbytes == ti.nbytes
            for kv in r.kvs():
                kv.to_python()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < len(data) + OVERHEAD


def test_fuzz_seeds_cover_both_outcomes() -> None:
    # the fuzzer is only meaningful if mutations both break and keep the file
    assert parse(mutate(VALID, [("set", len(VALID) - 1, 7)])).n_tensors == 3
    with pytest.raises(GGUFError):
        parse(mutate(VALID, [("set", 0, 0)]))
