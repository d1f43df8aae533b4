"""GGUF reader: maps the file, applies every check ggml's ``gguf_init_from_reader`` applies, in
ggml's order, and exposes tensor data as zero-copy numpy views of the mapping.

Check codes (M1, K3, D2 ...) are those of ggml-internals.md section 3.4 and name the check in
every error. Two deliberate differences from ggml, both stricter:

* D4: a data section that runs past the end of the file is rejected at open. ggml only notices
  when it reads the whole blob (``no_alloc=false``, check C2, which also wants the padding after
  the last tensor); with ``no_alloc`` it never does. D4 names the first tensor that runs past
  the end, else it is the final padding that is missing, as C2 would find.
* T5 uses exact integers. ggml multiplies the dimensions in int64 first, which can wrap to 0
  (e.g. ne = 2^32, 2^32) and skip the check.

Nothing is allocated from a count in the file before the count is checked against the bytes
left, so a hostile header cannot make the reader allocate more than the file's size.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from array import array
from pathlib import Path
from typing import Any

import numpy as np

from ..types import GGML_TYPE_COUNT, GGMLType
from .constants import (
    GGML_MAX_DIMS,
    GGML_MAX_NAME,
    GGUF_KEY_GENERAL_ALIGNMENT,
    GGUF_MAGIC,
    GGUF_MAX_ARRAY_ELEMENTS,
    GGUF_MAX_STRING_LENGTH,
    GGUF_VERSION,
    INT64_MAX,
    MAX_N_KV,
    MAX_N_TENSORS,
    SIZE_MAX,
    GGUFValueType,
)
from .context import GGUFContext
from .errors import GGUFError
from .records import GGUFKV, StringArray, TensorInfo, decode_str

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")

# scalar decoders for the fixed-size value types
_SCALAR = {t: struct.Struct("<" + fmt) for t, fmt in [
    (GGUFValueType.UINT8, "B"), (GGUFValueType.INT8, "b"), (GGUFValueType.UINT16, "H"),
    (GGUFValueType.INT16, "h"), (GGUFValueType.UINT32, "I"), (GGUFValueType.INT32, "i"),
    (GGUFValueType.FLOAT32, "f"), (GGUFValueType.BOOL, "b"), (GGUFValueType.UINT64, "Q"),
    (GGUFValueType.INT64, "q"), (GGUFValueType.FLOAT64, "d"),
]}  # fmt: skip

_VALID_VALUE_TYPES = frozenset(t for t in GGUFValueType if t != GGUFValueType.ARRAY)


def _pad(x: int, n: int) -> int:
    return (x + n - 1) // n * n


Source = str | os.PathLike[str] | bytes | bytearray | memoryview


class GGUFReader(GGUFContext):
    """An open, validated GGUF file (ggml's ``gguf_init_from_file``).

    ``source`` is a path (mapped, never copied) or a bytes-like buffer (``gguf_init_from_buffer``).
    Raises :class:`GGUFError` naming the failed check, the key or tensor and the byte offset.
    """

    def __init__(self, source: Source) -> None:
        super().__init__()
        self.path: Path | None = None
        self._mmap: mmap.mmap | None = None
        self._closed = False
        if isinstance(source, bytes | bytearray | memoryview):
            self._buf: Any = memoryview(source).cast("B")
        else:
            self.path = Path(source)
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                # mmap cannot map an empty file; an empty buffer fails the magic check all the same
                if size:
                    self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._buf = self._mmap if self._mmap is not None else b""
        self.file_size: int = len(self._buf)
        self.data_offset = 0
        self.data_size = 0
        self._pos = 0
        # where each pair begins and each tensor's offset field is, for errors found later
        self._kv_starts: list[int] = []
        self._offset_fields: list[int] = []
        try:
            self._parse()
        except BaseException as e:
            self.close()
            if isinstance(e, GGUFError) and self.path is not None:
                e.args = (f"{self.path}: {e.args[0]}",)
            raise

    # ---- resource handling ------------------------------------------------------------

    def close(self) -> None:
        """Unmap the file. Views handed out keep the mapping alive until they are dropped."""
        self._closed = True
        if self._mmap is not None:
            # while views (arrays, string arrays) still use the mapping, it stays until they go
            with contextlib.suppress(BufferError):
                self._mmap.close()
            self._mmap = None

    def __repr__(self) -> str:
        src = str(self.path) if self.path is not None else f"<{self.file_size} bytes>"
        return f"GGUFReader({src!r}, version={self.version}, n_kv={self.n_kv}, n_tensors={self.n_tensors})"

    def __enter__(self) -> GGUFReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- primitives: each names its check and what it was reading ---------------------

    def _fail(self, check: str, msg: str, offset: int | None = None, **names: str | None) -> GGUFError:
        return GGUFError(msg, check=check, offset=self._pos if offset is None else offset, **names)

    def _need(self, n: int, check: str, what: str, **names: str | None) -> int:
        pos = self._pos
        if n > self.file_size - pos:
            raise self._fail(check, f"{what}: needs {n} bytes but only {self.file_size - pos} remain", pos, **names)
        self._pos = pos + n
        return pos

    def _unpack(self, s: struct.Struct, check: str, what: str, **names: str | None) -> Any:
        return s.unpack_from(self._buf, self._need(s.size, check, what, **names))[0]

    def _string(self, check: str, what: str, **names: str | None) -> bytes:
        start = self._pos
        n = self._unpack(_U64, check, f"length of {what}", **names)
        if n > GGUF_MAX_STRING_LENGTH:
            raise self._fail(
                check, f"{what} has length {n}, more than the maximum {GGUF_MAX_STRING_LENGTH}", start, **names
            )
        remain = self.file_size - self._pos
        if n > remain:
            raise self._fail(check, f"{what} has length {n} but only {remain} bytes remain in the file", start, **names)
        pos = self._pos
        self._pos = pos + n
        return bytes(self._buf[pos : pos + n])

    # ---- the parse, in ggml's order ------------------------------------------------------

    def _parse(self) -> None:
        self._header()
        n_tensors, n_kv = self._counts()
        for i in range(n_kv):
            self._read_kv(i)
        self._alignment()
        for i in range(n_tensors):
            self._read_tensor_info(i)
        self._data_section()

    def _header(self) -> None:
        if self.file_size < 4:
            raise self._fail("M1", f"the file has {self.file_size} bytes, fewer than the 4 of the magic", 0)
        magic = bytes(self._buf[0:4])
        if magic != GGUF_MAGIC:
            raise self._fail("M2", f"magic is {magic!r}, expected {GGUF_MAGIC!r}", 0)
        self._pos = 4
        v = self._unpack(_U32, "V1", "version")
        if v == 0:
            raise self._fail("V2", "version is 0", 4)
        if v & 0xFFFF == 0:
            raise self._fail("V3", f"version {v:#x} is extremely large: is the file in the other byte order?", 4)
        if v == 1:
            raise self._fail("V4", "the file is GGUF version 1", 4)
        if v > GGUF_VERSION:
            raise self._fail("V5", f"version {v}, but only versions up to {GGUF_VERSION} are supported", 4)
        self.version = v

    def _counts(self) -> tuple[int, int]:
        n_tensors = self._unpack(_I64, "H1", "tensor count")
        if not 0 <= n_tensors <= MAX_N_TENSORS:
            raise self._fail("H1", f"tensor count is {n_tensors}, must be in [0, {MAX_N_TENSORS}]", 8)
        n_kv = self._unpack(_I64, "H2", "key-value count")
        if not 0 <= n_kv <= MAX_N_KV:
            raise self._fail("H2", f"key-value count is {n_kv}, must be in [0, {MAX_N_KV}]", 16)
        return n_tensors, n_kv

    def _read_kv(self, i: int) -> None:
        start = self._pos
        raw_key = self._string("K1", f"key {i}")
        if not raw_key:
            raise self._fail("K2", f"key {i} is empty", start)
        key = decode_str(raw_key)
        if key in self._kv:
            raise self._fail("K3", f"key {key!r} (pair {i}) repeats pair {self._kv.find(key)}", start, key=key)
        type_pos = self._pos
        vtype = self._unpack(_I32, "K4", f"value type of key {key!r}", key=key)
        is_array = vtype == GGUFValueType.ARRAY
        n = 1
        if is_array:
            type_pos = self._pos
            vtype = self._unpack(_I32, "K4", f"element type of array {key!r}", key=key)
            n = self._unpack(_U64, "K4", f"element count of array {key!r}", key=key)
        if vtype not in _VALID_VALUE_TYPES:
            what = "array element type" if is_array else "value type"
            raise self._fail("K5", f"key {key!r} has invalid {what} {vtype}", type_pos, key=key)
        vt = GGUFValueType(vtype)
        raw: bytes | None = None
        if is_array:
            value: Any = self._read_array(vt, n, key)
        elif vt == GGUFValueType.STRING:
            value = decode_str(self._string("K6", f"value of key {key!r}", key=key))
        else:
            s = _SCALAR[vt]
            pos = self._need(s.size, "K6", f"{vt.type_name} value of key {key!r}", key=key)
            raw = bytes(self._buf[pos : pos + s.size])
            value = s.unpack(raw)[0]
            if vt == GGUFValueType.BOOL:
                value, raw = value != 0, None
        self._kv.append(GGUFKV(key, vt, is_array, value, raw))
        self._kv_starts.append(start)

    def _read_array(self, vt: GGUFValueType, n: int, key: str) -> Any:
        start = self._pos
        if n > GGUF_MAX_ARRAY_ELEMENTS:
            raise self._fail(
                "K6",
                f"array {key!r} has {n} elements, more than the maximum {GGUF_MAX_ARRAY_ELEMENTS}",
                start,
                key=key,
            )
        remain = self.file_size - start
        # strings need at least their 8-byte length each
        per = 8 if vt == GGUFValueType.STRING else vt.size
        if n * per > remain:
            raise self._fail(
                "K6",
                f"array {key!r} of {n} {vt.type_name} needs at least {n * per} bytes, only {remain} remain",
                start,
                key=key,
            )
        if vt == GGUFValueType.STRING:
            return self._read_str_array(n, key)
        dt = vt.np_dtype
        self._pos = start + n * per
        if n == 0:
            arr = np.empty(0, dtype=bool if vt == GGUFValueType.BOOL else dt)
        else:
            arr = np.frombuffer(self._buf, dtype=dt, count=n, offset=start)
            if vt == GGUFValueType.BOOL:
                arr = arr != 0
        arr.flags.writeable = False
        return arr

    def _read_str_array(self, n: int, key: str) -> StringArray:
        # The hot loop of a vocabulary: only lengths are read here; StringArray decodes on access.
        buf, end, pos = self._buf, self.file_size, self._pos
        unpack = _U64.unpack_from
        limit = GGUF_MAX_STRING_LENGTH
        starts = array("q", [0]) * (n + 1)
        for i in range(n):
            if end - pos < 8:
                raise self._fail("K6", f"failed to read the length of string {i} of array {key!r}", pos, key=key)
            ln = unpack(buf, pos)[0]
            pos += 8
            if ln > limit or ln > end - pos:
                raise self._fail(
                    "K6",
                    f"string {i} of array {key!r} has length {ln} but only {end - pos} bytes remain"
                    if ln <= limit
                    else f"string {i} of array {key!r} has length {ln}, more than the maximum {limit}",
                    pos - 8,
                    key=key,
                )
            starts[i] = pos
            pos += ln
        starts[n] = pos + 8
        self._pos = pos
        # a memoryview, not the mapping itself: it pins the mapping for as long as the array lives
        return StringArray(memoryview(buf), starts)

    def _alignment(self) -> None:
        i = self._kv.find(GGUF_KEY_GENERAL_ALIGNMENT)
        if i < 0:
            return
        kv, at = self._kv[i], self._kv_starts[i]
        if kv.kv_type != GGUFValueType.UINT32:
            raise self._fail("A1", f"key {kv.key!r} must be of type u32 but is {kv.kv_type.type_name}", at, key=kv.key)
        a = kv.value
        if a == 0 or a & (a - 1):
            raise self._fail("A2", f"alignment {a} is not a power of 2", at, key=kv.key)
        self.alignment = a

    def _read_tensor_info(self, i: int) -> None:
        start = self._pos
        raw = self._string("T1", f"name of tensor {i}")
        if len(raw) >= GGML_MAX_NAME:
            raise self._fail(
                "T1", f"name of tensor {i} has {len(raw)} bytes, must be fewer than {GGML_MAX_NAME}", start
            )
        # ggml keeps names as C strings: whatever follows a NUL is lost, and master's duplicate
        # check compares the truncated names (older ggml compared whole strings)
        name = decode_str(raw.split(b"\0", 1)[0])
        if name in self._tensors:
            raise self._fail(
                "T2", f"tensor {i} is named {name!r} like tensor {self._tensors.find(name)}", start, tensor=name
            )
        dims_pos = self._pos
        n_dims = self._unpack(_U32, "T3", f"dimension count of tensor {name!r}", tensor=name)
        if n_dims > GGML_MAX_DIMS:
            raise self._fail(
                "T3", f"tensor {name!r} has {n_dims} dimensions, more than {GGML_MAX_DIMS}", dims_pos, tensor=name
            )
        ne = [1, 1, 1, 1]
        for j in range(n_dims):
            pos = self._pos
            ne[j] = self._unpack(_I64, "T4", f"dimension {j} of tensor {name!r}", tensor=name)
            if ne[j] < 0:
                raise self._fail("T4", f"tensor {name!r} dimension {j} is {ne[j]} < 0", pos, tensor=name)
        if all(d > 0 for d in ne) and (
            INT64_MAX // ne[1] <= ne[0]
            or INT64_MAX // ne[2] <= ne[0] * ne[1]
            or INT64_MAX // ne[3] <= ne[0] * ne[1] * ne[2]
        ):
            raise self._fail(
                "T5",
                f"tensor {name!r} with shape {tuple(ne)} has {INT64_MAX} or more elements",
                dims_pos,
                tensor=name,
            )
        type_pos = self._pos
        t = self._unpack(_I32, "T6", f"type of tensor {name!r}", tensor=name)
        if not 0 <= t < GGML_TYPE_COUNT:
            raise self._fail(
                "T6",
                f"tensor {name!r} has invalid ggml type {t}, must be in [0, {GGML_TYPE_COUNT})",
                type_pos,
                tensor=name,
            )
        ty = GGMLType(t)
        blck, tsize = ty.blck_size, ty.type_size
        if blck == 0:
            raise self._fail(
                "T7", f"tensor {name!r} has type {t} ({ty.type_name}), which was removed", type_pos, tensor=name
            )
        if ne[0] % blck:
            raise self._fail(
                "T7",
                f"tensor {name!r} of type {ty.type_name} has {ne[0]} elements per row, not a multiple "
                f"of the block size {blck}",
                type_pos,
                tensor=name,
            )
        nelements = ne[0] * ne[1] * ne[2] * ne[3]
        if nelements // blck > SIZE_MAX // tsize:
            raise self._fail(
                "T8",
                f"tensor {name!r} with shape {tuple(ne)} has more than {SIZE_MAX} bytes",
                type_pos,
                tensor=name,
            )
        self._offset_fields.append(self._pos)
        offset = self._unpack(_U64, "T9", f"data offset of tensor {name!r}", tensor=name)
        nbytes = nelements // blck * tsize
        self._tensors.append(TensorInfo(name, ty, (ne[0], ne[1], ne[2], ne[3]), n_dims, offset, nbytes))

    def _data_section(self) -> None:
        if self._tensors:
            data_start = _pad(self._pos, self.alignment)
            if data_start > self.file_size:
                raise self._fail(
                    "D1",
                    f"the data section would start at byte {data_start}, past the end of the file "
                    f"({self.file_size} bytes)",
                )
            self._pos = data_start
        self.data_offset = self._pos
        size = 0
        for ti, field_at in zip(self._tensors, self._offset_fields, strict=True):
            if ti.offset != size:
                raise self._fail(
                    "D2", f"tensor {ti.name!r} has offset {ti.offset}, expected {size}", field_at, tensor=ti.name
                )
            padded = _pad(ti.nbytes, self.alignment)
            if SIZE_MAX - size < padded:
                raise self._fail(
                    "D3",
                    f"tensor {ti.name!r}: cannot add its {padded} bytes to the {size} before it",
                    field_at,
                    tensor=ti.name,
                )
            size += padded
        self.data_size = size
        for ti in self._tensors:
            end = self.data_offset + ti.offset + ti.nbytes
            if end > self.file_size:
                raise self._fail(
                    "D4",
                    f"tensor {ti.name!r} data ends at byte {end}, past the end of the file ({self.file_size} bytes)",
                    self.data_offset + ti.offset,
                    tensor=ti.name,
                )
        # as ggml's blob read (C2): the padding after the last tensor must be there too
        end = self.data_offset + size
        if end > self.file_size:
            last = self._tensors[-1].name
            raise self._fail(
                "D4",
                f"the data section, padded to {self.alignment} bytes after tensor {last!r}, ends at "
                f"byte {end}, past the end of the file ({self.file_size} bytes)",
                self.file_size,
                tensor=last,
            )

    # ---- tensor data: zero-copy views ------------------------------------------------------

    def tensor_file_offset(self, name: str | int) -> int:
        """Absolute file offset of a tensor's data."""
        return self.data_offset + self.tensor_info(name).offset

    def tensor_bytes(self, name: str | int) -> np.ndarray:
        """A tensor's data as a flat, read-only uint8 view of the file."""
        ti = self.tensor_info(name)
        if self._closed:
            raise GGUFError(f"cannot read tensor {ti.name!r}: the file is closed", tensor=ti.name)
        return np.frombuffer(self._buf, dtype=np.uint8, count=ti.nbytes, offset=self.data_offset + ti.offset)

    def data_section(self) -> np.ndarray:
        """The whole data section (every tensor with its padding) as a read-only uint8 view."""
        if self._closed:
            raise GGUFError("cannot read the data section: the file is closed")
        return np.frombuffer(self._buf, dtype=np.uint8, count=self.data_size, offset=self.data_offset)

    def tensor_rows(self, name: str | int) -> np.ndarray:
        """A tensor's data as read-only uint8 rows (nrows, bytes per row): what ``quants.dequantize`` takes."""
        ti = self.tensor_info(name)
        return self.tensor_bytes(ti.name).reshape(ti.nrows, ti.row_nbytes)

    def tensor_data(self, name: str | int) -> np.ndarray:
        """A tensor's data as a read-only numpy view shaped like the tensor (numpy order).

        Plain types get their element dtype (BF16 as raw uint16 bits); block-quantized types
        get uint8 with the last axis in bytes per row.
        """
        ti = self.tensor_info(name)
        raw = self.tensor_bytes(ti.name)
        dt = ti.type.traits.np_dtype
        if dt is None and ti.type == GGMLType.BF16:
            dt = np.dtype("<u2")
        if dt is not None:
            return raw.view(dt).reshape(ti.shape)
        return raw.reshape((*ti.shape[:-1], ti.row_nbytes))
