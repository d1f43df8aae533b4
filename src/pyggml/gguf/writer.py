"""GGUF writer: metadata and tensors in, a version-3 GGUF file out, laid out as ggml's
``gguf_write_out`` lays it out (offsets packed in order, every tensor padded to the alignment).

The file is written to a temporary file next to the target and renamed over it only once
complete, so a failure never leaves a truncated file under the target's name. Tensor data
may be given lazily (a callable, or an iterable of chunks) and is pulled one tensor at a
time while writing, so a file larger than memory can be written.
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..types import GGMLType, GGMLTypeError, as_type
from .constants import (
    GGML_MAX_DIMS,
    GGML_MAX_NAME,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_KEY_GENERAL_ALIGNMENT,
    GGUF_MAGIC,
    GGUF_VERSION,
    INT_RANGES,
    GGUFValueType,
)
from .context import GGUFContext
from .errors import GGUFError, GGUFTypeError
from .reader import GGUFReader
from .records import GGUFKV, StringArray, TensorInfo, encode_str, ggml_n_dims
from .tempfiles import temp_beside

#: tensor data: an array or bytes now, or a callable returning them / an iterable of chunks later
TensorSource = np.ndarray | bytes | bytearray | memoryview | Callable[[], Any] | Iterable[Any]

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_CHUNK = 64 << 20

# numpy dtypes that name a plain ggml tensor type (what gguf-py's add_tensor accepts)
_DTYPE_TO_GGML = {
    np.dtype(np.float32): GGMLType.F32,
    np.dtype(np.float16): GGMLType.F16,
    np.dtype(np.float64): GGMLType.F64,
    np.dtype(np.int8): GGMLType.I8,
    np.dtype(np.int16): GGMLType.I16,
    np.dtype(np.int32): GGMLType.I32,
    np.dtype(np.int64): GGMLType.I64,
}

# numpy scalar/array kinds to GGUF value types
_DTYPE_TO_GGUF = {
    np.dtype(np.uint8): GGUFValueType.UINT8,
    np.dtype(np.int8): GGUFValueType.INT8,
    np.dtype(np.uint16): GGUFValueType.UINT16,
    np.dtype(np.int16): GGUFValueType.INT16,
    np.dtype(np.uint32): GGUFValueType.UINT32,
    np.dtype(np.int32): GGUFValueType.INT32,
    np.dtype(np.float32): GGUFValueType.FLOAT32,
    np.dtype(np.bool_): GGUFValueType.BOOL,
    np.dtype(np.uint64): GGUFValueType.UINT64,
    np.dtype(np.int64): GGUFValueType.INT64,
    np.dtype(np.float64): GGUFValueType.FLOAT64,
}


_NP_DTYPE_OF = {t: t.np_dtype for t in GGUFValueType if t.is_fixed_size}


def _pad(x: int, n: int) -> int:
    return (x + n - 1) // n * n


def _enc_str(s: str | bytes) -> bytes:
    b = s if isinstance(s, bytes) else encode_str(s)
    return _U64.pack(len(b)) + b


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ---- values: inference, checking, encoding ------------------------------------------------

# a Python int becomes the first of these that holds it (gguf-py's default is int32)
_INT_WIDENING = (GGUFValueType.INT32, GGUFValueType.INT64, GGUFValueType.UINT64)


def _infer_scalar_type(v: Any) -> GGUFValueType:
    if isinstance(v, np.generic):
        t = _DTYPE_TO_GGUF.get(v.dtype)
        if t is None:
            raise GGUFTypeError(f"no GGUF type for numpy {v.dtype}")
        return t
    if isinstance(v, bool):
        return GGUFValueType.BOOL
    if isinstance(v, int):
        for t in _INT_WIDENING:
            lo, hi = INT_RANGES[t]
            if lo <= v <= hi:
                return t
        raise GGUFTypeError(f"integer {v} does not fit any GGUF integer type")
    if isinstance(v, float):
        return GGUFValueType.FLOAT32
    if isinstance(v, str):
        return GGUFValueType.STRING
    raise GGUFTypeError(f"no GGUF type for a value of Python type {type(v).__name__}")


def _infer_array_type(values: Any) -> GGUFValueType:
    if isinstance(values, StringArray):
        return GGUFValueType.STRING
    if isinstance(values, np.ndarray):
        t = _DTYPE_TO_GGUF.get(values.dtype)
        if t is None and values.dtype.kind in "US":
            return GGUFValueType.STRING
        if t is None:
            raise GGUFTypeError(f"no GGUF array type for numpy {values.dtype}")
        return t
    if len(values) == 0:
        raise GGUFTypeError("an empty array needs an explicit element type")
    types = {_infer_scalar_type(v) for v in values}
    if len(types) == 1:
        return types.pop()
    if types <= set(_INT_WIDENING):
        return max(types, key=_INT_WIDENING.index)  # the widest wins
    if types <= {GGUFValueType.INT32, GGUFValueType.INT64, GGUFValueType.FLOAT32}:
        return GGUFValueType.FLOAT32
    raise GGUFTypeError(f"array mixes element types {sorted(t.type_name for t in types)}")


def _check_text(what: str, s: str | bytes) -> None:
    """Fail now, not halfway through writing, on text UTF-8 cannot carry (lone surrogates)."""
    if isinstance(s, str):
        try:
            encode_str(s)
        except UnicodeEncodeError as e:
            raise GGUFError(f"{what}: {s!r} cannot be encoded as UTF-8 ({e.reason})") from None


def _check_scalar(key: str, v: Any, t: GGUFValueType) -> Any:
    """The value as stored for type ``t``, or GGUFTypeError naming the key and the problem."""
    if t == GGUFValueType.STRING:
        if not isinstance(v, str | bytes):
            raise GGUFTypeError(f"key {key!r}: {type(v).__name__} value for a str", key=key)
        _check_text(f"value of key {key!r}", v)
        return v
    if t == GGUFValueType.BOOL:
        if not isinstance(v, bool | np.bool_):
            raise GGUFTypeError(f"key {key!r}: {type(v).__name__} value for a bool", key=key)
        return bool(v)
    if t in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        if isinstance(v, bool | np.bool_) or not isinstance(v, int | float | np.integer | np.floating):
            raise GGUFTypeError(f"key {key!r}: {type(v).__name__} value for a {t.type_name}", key=key)
        return v
    if isinstance(v, bool | np.bool_) or not isinstance(v, int | np.integer):
        raise GGUFTypeError(f"key {key!r}: {type(v).__name__} value for a {t.type_name}", key=key)
    lo, hi = INT_RANGES[t]
    if not lo <= int(v) <= hi:
        raise GGUFTypeError(f"key {key!r}: {v} is out of range for {t.type_name} [{lo}, {hi}]", key=key)
    return int(v)


def _check_array(key: str, values: Any, t: GGUFValueType) -> Any:
    if t == GGUFValueType.ARRAY:
        raise GGUFTypeError(f"key {key!r}: GGUF has no arrays of arrays", key=key)
    if t == GGUFValueType.STRING:
        if isinstance(values, StringArray):
            return values
        out = list(values.tolist() if isinstance(values, np.ndarray) else values)
        for v in out:
            if not isinstance(v, str | bytes):
                raise GGUFTypeError(f"key {key!r}: {type(v).__name__} element in a str array", key=key)
            _check_text(f"element of array {key!r}", v)
        return out
    if not isinstance(values, np.ndarray):
        # check each Python value: numpy's own conversion would turn big ints into floats
        vals = [_check_scalar(key, v, t) for v in values]
        out = np.array(vals, dtype=bool if t == GGUFValueType.BOOL else t.np_dtype).reshape(-1)
        out.flags.writeable = False
        return out
    if values.ndim != 1:
        raise GGUFTypeError(f"key {key!r}: arrays must be 1-d, got shape {values.shape}", key=key)
    kind = values.dtype.kind
    if t == GGUFValueType.BOOL:
        ok = kind == "b"
    elif t in INT_RANGES:
        ok = kind in "iu"
        if ok and values.size:
            lo, hi = INT_RANGES[t]
            if int(values.min()) < lo or int(values.max()) > hi:
                raise GGUFTypeError(f"key {key!r}: elements out of range for {t.type_name} [{lo}, {hi}]", key=key)
    else:
        ok = kind in "iuf"
    if not ok and values.size:
        raise GGUFTypeError(f"key {key!r}: {values.dtype} elements for a {t.type_name} array", key=key)
    out = values.astype(bool if t == GGUFValueType.BOOL else t.np_dtype)
    out.flags.writeable = False
    return out


def encode_kv(kv: GGUFKV) -> list[bytes | memoryview]:
    """The bytes of one pair as ggml writes it (key, type tag(s), value)."""
    parts: list[bytes | memoryview] = [_enc_str(kv.key)]
    t, v = kv.type, kv.value
    if kv.is_array:
        parts.append(_I32.pack(GGUFValueType.ARRAY) + _I32.pack(t) + _U64.pack(len(v)))
        if t == GGUFValueType.STRING:
            if isinstance(v, StringArray):
                parts.append(v.encoded())
            else:
                parts.append(b"".join(_enc_str(s) for s in v))
        elif t == GGUFValueType.BOOL:
            parts.append(np.asarray(v, dtype=np.bool_).astype(np.uint8).tobytes())
        else:
            parts.append(np.ascontiguousarray(v, dtype=t.np_dtype).tobytes())
        return parts
    parts.append(_I32.pack(t))
    if t == GGUFValueType.STRING:
        parts.append(_enc_str(v))
    elif t == GGUFValueType.BOOL:
        parts.append(b"\x01" if v else b"\x00")
    elif kv.raw is not None:
        parts.append(kv.raw)
    else:
        parts.append(np.array(v).astype(t.np_dtype).tobytes())
    return parts


# ---- the writer ----------------------------------------------------------------------------


class GGUFWriter(GGUFContext):
    """A GGUF file under construction (ggml's ``gguf_init_empty`` + ``gguf_set_*`` + ``gguf_add_tensor``).

    Setting a key that exists removes it and appends the new pair, as ggml does. Setting
    ``general.alignment`` (a u32 power of 2) sets the alignment used for the data section.
    """

    def __init__(self, version: int = GGUF_VERSION) -> None:
        super().__init__()
        self.version = version
        self._data: list[Any] = []  # the source of each tensor's data, parallel to _tensors

    @classmethod
    def from_context(cls, src: GGUFContext) -> GGUFWriter:
        """A writer holding a copy of ``src``'s metadata and tensors (data read lazily from a reader).

        Writing it reproduces a file that ggml or gguf-py wrote, byte for byte.
        """
        w = cls(version=src.version)
        for kv in src.kvs():
            w.set_kv(kv)
        for i, ti in enumerate(src.tensors):
            if isinstance(src, GGUFReader):
                source: Any = _ReaderData(src, ti.name)
            elif isinstance(src, GGUFWriter):
                source = src._data[i]
            else:
                raise GGUFError(f"cannot copy tensor data from a {type(src).__name__}")
            w.add_tensor(ti.name, source, type=ti.type, ne=ti.ne, n_dims=ti.n_dims)
        return w

    # ---- metadata setters ---------------------------------------------------------------

    def remove_key(self, key: str) -> int:
        """``gguf_remove_key``: the id the key had, or -1."""
        i = self._kv.remove(key)
        if i >= 0 and key == GGUF_KEY_GENERAL_ALIGNMENT:
            self._set_alignment(GGUF_DEFAULT_ALIGNMENT)
        return i

    def set_kv(self, kv: GGUFKV) -> None:
        """Append a pair record as is (removing an existing pair of that key)."""
        if not isinstance(kv.key, str) or not kv.key or "\0" in kv.key:
            raise GGUFError(f"metadata keys must be non-empty strings without NUL, got {kv.key!r}")
        _check_text("metadata key", kv.key)
        if kv.key == GGUF_KEY_GENERAL_ALIGNMENT:
            if kv.kv_type != GGUFValueType.UINT32:
                raise GGUFTypeError(
                    f"{GGUF_KEY_GENERAL_ALIGNMENT} must be of type u32, not {kv.kv_type.type_name}", key=kv.key
                )
            a = int(kv.value)
            if a <= 0 or a & (a - 1):
                raise GGUFError(f"{GGUF_KEY_GENERAL_ALIGNMENT} must be a power of 2, got {a}", key=kv.key)
        self.remove_key(kv.key)
        self._kv.append(kv)
        if kv.key == GGUF_KEY_GENERAL_ALIGNMENT:
            self._set_alignment(int(kv.value))

    def set_val(self, key: str, value: Any, vtype: GGUFValueType | None = None) -> None:
        """Set a scalar (type inferred when not given: bool, int32/int64/uint64, float32, str)."""
        t = _infer_scalar_type(value) if vtype is None else GGUFValueType(vtype)
        if t == GGUFValueType.ARRAY:
            raise GGUFTypeError(f"key {key!r}: use set_arr for arrays", key=key)
        raw = None
        if isinstance(value, np.generic) and t != GGUFValueType.BOOL and value.dtype == _NP_DTYPE_OF.get(t):
            raw = value.tobytes()  # keeps exact bits (NaN payloads)
        v = _check_scalar(key, value, t)
        if t == GGUFValueType.STRING and isinstance(v, bytes):
            v = v.decode("utf-8", "surrogateescape")
        elif t in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
            v = float(v)
        self.set_kv(GGUFKV(key, t, False, v, raw))

    def set_arr(self, key: str, values: Any, elem_type: GGUFValueType | None = None) -> None:
        """Set an array (``gguf_set_arr_data`` / ``gguf_set_arr_str``); element type inferred when not given."""
        t = _infer_array_type(values) if elem_type is None else GGUFValueType(elem_type)
        self.set_kv(GGUFKV(key, t, True, _check_array(key, values, t)))

    def set_u8(self, key: str, v: int) -> None:
        self.set_val(key, v, GGUFValueType.UINT8)

    def set_i8(self, key: str, v: int) -> None:
        self.set_val(key, v, GGUFValueType.INT8)

    def set_u16(self, key: str, v: int) -> None:
        self.set_val(key, v, GGUFValueType.UINT16)

    def set_i16(self, key: str, v: int) -> None:
        self.set_val(key, v, GGUFValueType.INT16)

    def set_u32(self, key: str, v: int) -> None:
        self.set_val(key, v, GGUFValueType.UINT32)

    def set_i32(self, key: str, v: int) -> None:
        self.set_val(key, v, GGUFValueType.INT32)

    def set_u64(self, key: str, v: int) -> None:
        self.set_val(key, v, GGUFValueType.UINT64)

    def set_i64(self, key: str, v: int) -> None:
        self.set_val(key, v, GGUFValueType.INT64)

    def set_f32(self, key: str, v: float) -> None:
        self.set_val(key, v, GGUFValueType.FLOAT32)

    def set_f64(self, key: str, v: float) -> None:
        self.set_val(key, v, GGUFValueType.FLOAT64)

    def set_bool(self, key: str, v: bool) -> None:
        self.set_val(key, v, GGUFValueType.BOOL)

    def set_str(self, key: str, v: str) -> None:
        self.set_val(key, v, GGUFValueType.STRING)

    def _set_alignment(self, a: int) -> None:
        self.alignment = a
        self._relayout(0)

    def _relayout(self, start: int) -> None:
        """Recompute offsets from tensor ``start`` on (ggml's rule: each follows the padded previous)."""
        for i in range(start, len(self._tensors)):
            prev = self._tensors[i - 1] if i else None
            off = prev.offset + _pad(prev.nbytes, self.alignment) if prev else 0
            ti = self._tensors[i]
            if ti.offset != off:
                self._tensors[i] = TensorInfo(ti.name, ti.type, ti.ne, ti.n_dims, off, ti.nbytes)

    # ---- tensors ------------------------------------------------------------------------

    def add_tensor(
        self,
        name: str,
        data: TensorSource,
        *,
        type: GGMLType | int | str | None = None,
        ne: Sequence[int] | None = None,
        n_dims: int | None = None,
    ) -> TensorInfo:
        """Add a tensor (``gguf_add_tensor``).

        ``data`` is a numpy array (its dtype gives the type for F32/F16/F64/I8/I16/I32/I64; raw
        quantized rows are uint8 with ``type=``, the last axis in bytes), bytes, or, for data
        produced while writing, a callable returning an array/bytes or an iterable of byte
        chunks; lazy data needs ``type`` and ``ne``. ``ne`` is in ggml order. ``n_dims``
        defaults to ggml's (trailing 1-dims dropped).
        """
        if not isinstance(name, str):
            raise GGUFTypeError(f"tensor names are strings, got {_type_name(name)}")
        _check_text("tensor name", name)
        if len(encode_str(name)) >= GGML_MAX_NAME:
            raise GGUFError(
                f"tensor name {name!r} has {len(encode_str(name))} bytes, must be fewer than {GGML_MAX_NAME}",
                tensor=name,
            )
        if name in self._tensors:
            raise GGUFError(f"duplicate tensor name {name!r}", tensor=name)
        if "\0" in name:  # ggml names are C strings: a reader would cut the name here
            raise GGUFError(f"tensor name {name!r} contains a NUL character", tensor=name)
        if isinstance(data, np.generic):
            data = np.asarray(data)
        ty, shape = self._type_and_ne(name, data, type, ne)
        if n_dims is None:
            n_dims = ggml_n_dims(shape)
        if not 0 <= n_dims <= GGML_MAX_DIMS or any(d != 1 for d in shape[n_dims:]):
            raise GGUFError(f"tensor {name!r}: n_dims={n_dims} does not fit ne={list(shape)}", tensor=name)
        nbytes = ty.row_size(shape[0]) * shape[1] * shape[2] * shape[3]
        nbytes_given = _eager_nbytes(data)
        if nbytes_given is not None and nbytes_given != nbytes:
            raise GGUFError(
                f"tensor {name!r}: {nbytes_given} bytes of data for a {ty.type_name} tensor of ne="
                f"{list(shape)}, which needs {nbytes}",
                tensor=name,
            )
        prev = self._tensors[-1] if self._tensors else None
        offset = prev.offset + _pad(prev.nbytes, self.alignment) if prev else 0
        ti = TensorInfo(name, ty, shape, n_dims, offset, nbytes)
        self._tensors.append(ti)
        self._data.append(data)
        return ti

    def _type_and_ne(
        self, name: str, data: Any, type: Any, ne: Sequence[int] | None
    ) -> tuple[GGMLType, tuple[int, int, int, int]]:
        try:
            ty = None if type is None else as_type(type)
        except GGMLTypeError as e:
            raise GGUFError(f"tensor {name!r}: {e}", tensor=name) from None
        if isinstance(data, np.ndarray):
            if ty is None:
                ty = _DTYPE_TO_GGML.get(data.dtype.newbyteorder("="))
                if ty is None:
                    raise GGUFTypeError(
                        f"tensor {name!r}: no ggml type for numpy {data.dtype}; pass type= for raw bytes",
                        tensor=name,
                    )
            if ne is None:
                shape = list(reversed(data.shape)) or [1]
                if ty.blck_size > 1 or data.dtype.itemsize != ty.type_size:
                    # raw rows: the last numpy axis counts bytes
                    if data.dtype != np.uint8:
                        raise GGUFTypeError(
                            f"tensor {name!r}: {ty.type_name} data must be raw uint8 rows, not {data.dtype}",
                            tensor=name,
                        )
                    if shape[0] % ty.type_size:
                        raise GGUFError(
                            f"tensor {name!r}: a row of {shape[0]} bytes is not whole {ty.type_name} blocks",
                            tensor=name,
                        )
                    shape[0] = shape[0] // ty.type_size * ty.blck_size
                ne = shape
        if ty is None or ne is None:
            raise GGUFError(f"tensor {name!r}: give type= and ne= for data that is not a numpy array", tensor=name)
        ne = [int(d) for d in ne]
        if not 1 <= len(ne) <= GGML_MAX_DIMS or any(d < 0 for d in ne):
            raise GGUFError(f"tensor {name!r}: ne must be 1 to 4 non-negative sizes, got {ne}", tensor=name)
        if ne[0] % ty.blck_size:
            raise GGUFError(
                f"tensor {name!r}: ne0={ne[0]} is not a multiple of the {ty.type_name} block size {ty.blck_size}",
                tensor=name,
            )
        ne += [1] * (GGML_MAX_DIMS - len(ne))
        return ty, (ne[0], ne[1], ne[2], ne[3])

    # ---- output ---------------------------------------------------------------------------

    def meta_bytes(self) -> bytes:
        """``gguf_get_meta_data``: header, pairs, tensor infos and the padding after them."""
        parts: list[bytes | memoryview] = [
            GGUF_MAGIC,
            _U32.pack(self.version),
            _I64.pack(len(self._tensors)),
            _I64.pack(len(self._kv)),
        ]
        for kv in self._kv:
            parts.extend(encode_kv(kv))
        for ti in self._tensors:
            parts.append(_enc_str(ti.name) + _U32.pack(ti.n_dims))
            parts.append(b"".join(_I64.pack(d) for d in ti.ne[: ti.n_dims]))
            parts.append(_I32.pack(ti.type) + _U64.pack(ti.offset))
        meta = b"".join(parts)
        return meta + bytes(_pad(len(meta), self.alignment) - len(meta))

    def write(self, path: str | os.PathLike[str], *, only_meta: bool = False, fsync: bool = True) -> Path:
        """Write the file (``gguf_write_to_file``), atomically: a temporary file renamed into place."""
        target = Path(path)
        fd, tmp = temp_beside(target)  # removes what a killed writer of this target left
        try:
            with os.fdopen(fd, "wb") as f:
                self.write_to(f, only_meta=only_meta)
                f.flush()
                if fsync:
                    os.fsync(f.fileno())
            os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return target

    def write_to(self, f: IO[bytes], *, only_meta: bool = False) -> None:
        """Stream the file to an open binary file object, one tensor's data at a time."""
        meta = self.meta_bytes()
        f.write(meta)
        if only_meta:
            return
        for ti, source in zip(self._tensors, self._data, strict=True):
            n = 0
            for chunk in _chunks(source, ti):
                f.write(chunk)
                n += len(chunk)
                if n > ti.nbytes:
                    break
            if n != ti.nbytes:
                raise GGUFError(
                    f"tensor {ti.name!r}: its data source gave {'more than ' if n > ti.nbytes else ''}{n} "
                    f"bytes, expected {ti.nbytes}",
                    tensor=ti.name,
                )
            f.write(bytes(_pad(ti.nbytes, self.alignment) - ti.nbytes))

    def to_bytes(self) -> bytes:
        """The whole file in memory (``gguf_write_to_buf``), for small files and tests."""
        buf = io.BytesIO()
        self.write_to(buf)
        return buf.getvalue()


class _ReaderData:
    """Tensor data to copy from an open reader, fetched only when written."""

    __slots__ = ("name", "reader")

    def __init__(self, reader: Any, name: str) -> None:
        self.reader, self.name = reader, name

    def __call__(self) -> np.ndarray:
        return self.reader.tensor_bytes(self.name)


def _type_name(x: object) -> str:
    return type(x).__name__


def _eager_nbytes(data: Any) -> int | None:
    if isinstance(data, np.ndarray):
        return data.nbytes
    if isinstance(data, bytes | bytearray):
        return len(data)
    if isinstance(data, memoryview):
        return data.nbytes
    return None


def _as_bytes(x: Any, ti: TensorInfo) -> memoryview:
    if isinstance(x, np.ndarray):
        if x.dtype.byteorder == ">":
            x = x.astype(x.dtype.newbyteorder("<"))
        return memoryview(np.ascontiguousarray(x).reshape(-1).view(np.uint8))
    if isinstance(x, bytes | bytearray | memoryview):
        return memoryview(x).cast("B")
    raise GGUFTypeError(
        f"tensor {ti.name!r}: data chunks must be numpy arrays or bytes, got {_type_name(x)}", tensor=ti.name
    )


def _chunks(source: Any, ti: TensorInfo) -> Iterable[memoryview]:
    if callable(source) and not isinstance(source, np.ndarray):
        source = source()
    if isinstance(source, np.ndarray | bytes | bytearray | memoryview):
        mv = _as_bytes(source, ti)
        for i in range(0, len(mv), _CHUNK):
            yield mv[i : i + _CHUNK]
        return
    if not isinstance(source, Iterable):
        raise GGUFTypeError(f"tensor {ti.name!r}: cannot write data of type {_type_name(source)}", tensor=ti.name)
    for chunk in source:
        yield _as_bytes(chunk, ti)
