"""An ordered, name-indexed list of records: how a GGUF file holds its metadata pairs and its tensor infos."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from .errors import GGUFKeyError
from .records import GGUFKV, TensorInfo

_Item = TypeVar("_Item", GGUFKV, TensorInfo)


class Catalog(Generic[_Item]):
    """Records in file order with an index by name: a GGUF file's metadata pairs, or its tensor infos.

    The list and the index change together here only, so an id is always a record's position and
    a name finds the record with it (the reader refuses a repeated name before appending)."""

    def __init__(self, name_of: Callable[[_Item], str], what: str, missing: Callable[[str], GGUFKeyError]) -> None:
        self._items: list[_Item] = []
        self._index: dict[str, int] = {}
        self._name_of, self._what, self._missing = name_of, what, missing

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[_Item]:
        return iter(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __getitem__(self, i: int) -> _Item:
        """The record at position ``i`` (negative positions count from the end, as in a list)."""
        return self._items[i]

    def __setitem__(self, i: int, item: _Item) -> None:
        """Replace the record at ``i`` by one of the same name (the writer's re-laid-out tensor infos)."""
        if self._name_of(item) != self._name_of(self._items[i]):
            raise ValueError(f"{self._what} {i} is {self._name_of(self._items[i])!r}, not {self._name_of(item)!r}")
        self._items[i] = item

    def find(self, name: str) -> int:
        """The id of the record named ``name``, or -1 (``gguf_find_key`` / ``gguf_find_tensor``)."""
        return self._index.get(name, -1)

    def get(self, ref: str | int) -> _Item:
        """The record named ``ref`` (``missing(ref)`` raised when absent) or with id ``ref`` (checked
        against the range, as ggml's ``gguf_get_*`` asserts)."""
        if isinstance(ref, str):
            i = self._index.get(ref)
            if i is None:
                raise self._missing(ref)
            return self._items[i]
        if not 0 <= ref < len(self._items):
            raise GGUFKeyError(f"{self._what} id {ref} out of range [0, {len(self._items)})")
        return self._items[ref]

    def append(self, item: _Item) -> None:
        self._index[self._name_of(item)] = len(self._items)
        self._items.append(item)

    def remove(self, name: str) -> int:
        """Drop the record named ``name``; the id it had, or -1. Later records move up one id."""
        i = self._index.pop(name, -1)
        if i >= 0:
            del self._items[i]
            self._index = {self._name_of(r): j for j, r in enumerate(self._items)}
        return i
