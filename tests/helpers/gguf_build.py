"""Hand-assembled GGUF bytes for the GGUF tests, built field by field with ``struct``.

Independent of pyggml's writer on purpose: malformed files need fields no writer would emit,
and a test of the reader should not trust the writer it is also testing.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)

_FMT = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "b", U64: "Q", I64: "q", F64: "d"}


def pad(x: int, n: int) -> int:
    return (x + n - 1) // n * n


def gstr(s: str | bytes, length: int | None = None) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b) if length is None else length) + b


def scalar(vtype: int, value: object) -> bytes:
    """Type tag + value of a scalar pair."""
    if vtype == STR:
        return struct.pack("<i", STR) + gstr(value)  # type: ignore[arg-type]
    return struct.pack("<i", vtype) + struct.pack("<" + _FMT[vtype], value)


def array(elem: int, values: list, count: int | None = None) -> bytes:
    """Type tags, count and elements of an array pair."""
    head = struct.pack("<iiQ", ARR, elem, len(values) if count is None else count)
    if elem == STR:
        return head + b"".join(gstr(v) for v in values)
    return head + b"".join(struct.pack("<" + _FMT[elem], v) for v in values)


@dataclass
class T:
    """One tensor-table entry; ``offset`` None means the packed offset ggml expects."""

    name: str | bytes
    ne: list[int]
    type: int = 0
    offset: int | None = None
    nbytes: int = 0
    n_dims: int | None = None


@dataclass
class G:
    """A GGUF file to assemble; every field can be set to something invalid."""

    kvs: list[tuple[str | bytes, bytes]] = field(default_factory=list)
    tensors: list[T] = field(default_factory=list)
    version: int = 3
    magic: bytes = b"GGUF"
    n_tensors: int | None = None
    n_kv: int | None = None
    alignment: int = 32
    data: bytes | None = None  # default: tensor bytes 0..255 repeating, each padded

    def build(self) -> bytes:
        out = bytearray(self.magic)
        out += struct.pack("<I", self.version)
        out += struct.pack("<q", len(self.tensors) if self.n_tensors is None else self.n_tensors)
        out += struct.pack("<q", len(self.kvs) if self.n_kv is None else self.n_kv)
        for key, val in self.kvs:
            out += gstr(key) + val
        off = 0
        for t in self.tensors:
            n_dims = len(t.ne) if t.n_dims is None else t.n_dims
            out += gstr(t.name) + struct.pack("<I", n_dims)
            out += b"".join(struct.pack("<q", d) for d in t.ne[:n_dims])
            out += struct.pack("<i", t.type)
            out += struct.pack("<Q", off if t.offset is None else t.offset)
            off += pad(t.nbytes, self.alignment)
        if self.tensors or self.data is not None:
            out += bytes(pad(len(out), self.alignment) - len(out))
        if self.data is not None:
            out += self.data
        else:
            for i, t in enumerate(self.tensors):
                out += bytes((i + j) % 256 for j in range(t.nbytes))
                out += bytes(pad(t.nbytes, self.alignment) - t.nbytes)
        return bytes(out)


def small_valid() -> G:
    """A small file touching every value type, string arrays and three tensor types."""
    return G(
        kvs=[
            ("general.architecture", scalar(STR, "llama")),
            ("a.u8", scalar(U8, 200)),
            ("a.i8", scalar(I8, -5)),
            ("a.u16", scalar(U16, 60000)),
            ("a.i16", scalar(I16, -30000)),
            ("a.u32", scalar(U32, 4_000_000_000)),
            ("a.i32", scalar(I32, -2_000_000_000)),
            ("a.f32", scalar(F32, 0.5)),
            ("a.bool", scalar(BOOL, 1)),
            ("a.u64", scalar(U64, 2**63 + 5)),
            ("a.i64", scalar(I64, -(2**62))),
            ("a.f64", scalar(F64, -1.25)),
            ("a.strs", array(STR, ["x", "", "héllo"])),
            ("a.i32s", array(I32, [1, -2, 3])),
            ("a.bools", array(BOOL, [0, 1, 1])),
            ("general.alignment", scalar(U32, 32)),
        ],
        tensors=[
            T("w", [4, 2], type=0, nbytes=32),  # F32 4x2
            T("h", [3], type=1, nbytes=6),  # F16
            T("q", [32, 2], type=8, nbytes=68),  # Q8_0, two rows of one block
        ],
    )


def assert_same_as_gguf_py(r: object, path: object) -> None:
    """pyggml's reader ``r`` and the ``gguf`` package agree on every pair and tensor of ``path``."""
    import gguf

    gr = gguf.GGUFReader(path)
    fields = {k: f for k, f in gr.fields.items() if not k.startswith("GGUF.")}
    assert list(fields) == r.keys()  # type: ignore[attr-defined]
    assert int(gr.fields["GGUF.version"].contents()) == r.version  # type: ignore[attr-defined]
    for kv in r.kvs():  # type: ignore[attr-defined]
        f = fields[kv.key]
        assert int(f.types[0]) == int(kv.kv_type), kv.key
        if kv.is_array and kv.n:  # gguf-py records no element type for an empty array
            assert int(f.types[-1]) == int(kv.type), kv.key
        want, got = f.contents(), kv.to_python()
        if kv.type in (F32, F64):
            assert np.array_equal(np.asarray(want, dtype=float), np.asarray(got, dtype=float), equal_nan=True)
        else:
            assert want == got, kv.key
    assert [t.name for t in gr.tensors] == [t.name for t in r.tensors]  # type: ignore[attr-defined]
    for gt in gr.tensors:
        ti = r.tensor_info(gt.name)  # type: ignore[attr-defined]
        assert int(gt.tensor_type) == int(ti.type)
        assert [int(d) for d in gt.shape] == list(ti.ne[: len(gt.shape)])
        assert gt.n_bytes == ti.nbytes
        assert gt.data_offset == r.tensor_file_offset(gt.name)  # type: ignore[attr-defined]
        assert np.asarray(gt.data).tobytes() == r.tensor_bytes(gt.name).tobytes()  # type: ignore[attr-defined]


def write_with_gguf_py(path: object) -> None:
    """A file written by the ``gguf`` package: every value kind, a kept 1-dim, raw Q4_K bytes."""
    import gguf

    rng = np.random.default_rng(0)
    gw = gguf.GGUFWriter(path, "llama")
    gw.add_uint32("llama.block_count", 2)
    gw.add_float32("llama.eps", 1e-5)
    gw.add_float64("x.f64", -2.5)
    gw.add_int8("x.i8", -1)
    gw.add_bool("x.bool", False)
    gw.add_string("x.s", "text ∑")
    gw.add_array("x.tokens", ["<s>", "</s>", "héllo", ""])
    gw.add_array("x.ints", [1, 2, 3])
    gw.add_array("x.floats", [0.5, -1.0])
    gw.add_array("x.bools", [True, False])
    gw.add_uint64("x.u64", 2**64 - 2)
    gw.add_tensor("a", rng.standard_normal((4, 32)).astype(np.float32))
    gw.add_tensor("row", np.ones((1, 32), dtype=np.float32))  # n_dims 2 with ne1 = 1: kept
    gw.add_tensor("h", np.arange(6, dtype=np.float16))
    q = rng.integers(0, 256, (2, 144), dtype=np.uint8)
    gw.add_tensor("q", q, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    gw.write_header_to_file()
    gw.write_kv_data_to_file()
    gw.write_tensors_to_file()
    gw.close()
