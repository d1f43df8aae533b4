"""The records a GGUF context holds: key-value pairs, string arrays and tensor infos."""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from ..types import GGMLType
from .constants import GGUFValueType

_ENCODING = "utf-8"
# GGUF strings are bytes, not text: undecodable bytes survive a read/write round trip.
_ERRORS = "surrogateescape"


def encode_str(s: str) -> bytes:
    return s.encode(_ENCODING, _ERRORS)


def decode_str(b: bytes | memoryview) -> str:
    return str(b, _ENCODING, _ERRORS)


class StringArray(Sequence[str]):
    """A GGUF string array read lazily from the file.

    A vocabulary has hundreds of thousands of strings; decoding them all on open would
    cost more than the rest of the file. Only the start of each string is kept (8 bytes
    a string, no more than the length prefixes it came from) and items decode on access.
    """

    __slots__ = ("_buf", "_starts")

    def __init__(self, buf: Any, starts: array) -> None:
        # starts[i] is where string i's bytes begin; starts[n] is 8 bytes past the array's end,
        # so string i spans [starts[i], starts[i+1] - 8).
        self._buf = buf
        self._starts = starts

    def __len__(self) -> int:
        return len(self._starts) - 1

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return decode_str(self.raw(i))

    def raw(self, i: int) -> bytes:
        """The bytes of string ``i``, undecoded."""
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"string index {i} out of range for an array of {n}")
        return bytes(self._buf[self._starts[i] : self._starts[i + 1] - 8])

    def __iter__(self) -> Iterator[str]:
        return iter(self.tolist())

    def tolist(self) -> list[str]:
        s = self._starts
        if len(s) <= 1:
            return []
        base = s[0]
        data = np.frombuffer(self._buf, np.uint8, s[-1] - 8 - base, base)
        # One decode of every string at once: the 8 length bytes before each string become one 0xFF byte,
        # which UTF-8 text never holds, and the text is split there. A string holding 0xFF itself gives
        # one piece too many: then each string is decoded on its own.
        at = np.frombuffer(s, np.int64)[1:-1] - base  # where strings 1.. begin
        marks = np.zeros(len(data), np.int8)  # +1 where a length starts, -1 at its last byte
        marks[at - 8] = 1
        marks[at - 1] = -1
        keep = np.cumsum(marks, dtype=np.int8) == 0
        joined = data.copy()
        joined[at - 1] = 0xFF
        pieces = str(joined[keep].tobytes(), _ENCODING, _ERRORS).split("\udcff")
        if len(pieces) == len(s) - 1:
            return pieces
        text = data.tobytes()
        return [str(text[a - base : b - 8 - base], _ENCODING, _ERRORS) for a, b in itertools.pairwise(s)]

    def encoded(self) -> memoryview:
        """The array's strings exactly as stored (each a u64 length and its bytes): a bulk copy for writers."""
        if len(self) == 0:
            return memoryview(b"")
        return memoryview(self._buf)[self._starts[0] - 8 : self._starts[-1] - 8]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        n = len(self)
        head = ", ".join(repr(self[i]) for i in range(min(n, 3)))
        return f"StringArray([{head}{', ...' if n > 3 else ''}], n={n})"


@dataclass(frozen=True, slots=True, eq=False)  # values may be numpy arrays, which have no plain ==
class GGUFKV:
    """One metadata pair, as ggml's ``gguf_kv``: an element type, and whether it is an array.

    ``value`` is a Python scalar (int, float, bool, str), a numpy array (numeric arrays; BOOL
    arrays as numpy bool) or a sequence of str (string arrays). ``raw`` keeps a numeric
    scalar's bytes as read, so a rewrite reproduces them exactly (NaN payloads included).
    """

    key: str
    type: GGUFValueType
    is_array: bool
    value: Any
    raw: bytes | None = None

    @property
    def kv_type(self) -> GGUFValueType:
        """``gguf_get_kv_type``: ARRAY for arrays, else the value's type."""
        return GGUFValueType.ARRAY if self.is_array else self.type

    @property
    def n(self) -> int:
        """Number of elements (``get_ne``): 1 for a scalar."""
        return len(self.value) if self.is_array else 1

    def to_python(self) -> Any:
        """The value as plain Python (lists for arrays), e.g. for JSON."""
        if not self.is_array:
            return self.value
        if isinstance(self.value, np.ndarray):
            return self.value.tolist()
        if isinstance(self.value, StringArray):
            return self.value.tolist()
        return list(self.value)


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """A tensor's entry in the tensor table (ggml's ``gguf_tensor_info``).

    ``ne`` is in ggml order (ne[0] is the row length) and always has 4 entries; ``n_dims``
    is what the file stored, kept so a rewrite reproduces the file. ``offset`` is relative
    to the data section, as ``gguf_get_tensor_offset`` returns it.
    """

    name: str
    type: GGMLType
    ne: tuple[int, int, int, int]
    n_dims: int
    offset: int
    nbytes: int

    @property
    def nelements(self) -> int:
        return self.ne[0] * self.ne[1] * self.ne[2] * self.ne[3]

    @property
    def nb(self) -> tuple[int, int, int, int]:
        """ggml's byte strides of the contiguous tensor."""
        nb0 = self.type.type_size
        nb1 = nb0 * (self.ne[0] // self.type.blck_size)
        nb2 = nb1 * self.ne[1]
        return (nb0, nb1, nb2, nb2 * self.ne[2])

    @property
    def row_nbytes(self) -> int:
        return self.type.type_size * (self.ne[0] // self.type.blck_size)

    @property
    def nrows(self) -> int:
        return self.ne[1] * self.ne[2] * self.ne[3]

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy shape (reversed ``ne``) over the stored dimensions."""
        return tuple(reversed(self.ne[: max(self.n_dims, 1)]))


def ggml_n_dims(ne: Sequence[int]) -> int:
    """``ggml_n_dims``: dimensions up to the last that is not 1 (at least 1)."""
    for i in range(len(ne) - 1, 0, -1):
        if ne[i] != 1:
            return i + 1
    return 1
