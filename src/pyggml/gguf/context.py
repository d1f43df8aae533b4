"""What a reader and a writer share: the ordered metadata, the tensor table, and the getters.

ggml has one ``gguf_context`` for both directions; pyggml splits the directions into
GGUFReader and GGUFWriter but keeps one set of getters here, so ``gguf_get_*`` works on
either, as it does in ggml.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from .catalog import Catalog
from .constants import GGUF_DEFAULT_ALIGNMENT, GGUF_VERSION, GGUFValueType
from .errors import GGUFKeyError, GGUFTypeError
from .records import GGUFKV, StringArray, TensorInfo

_MISSING: Any = object()


class GGUFContext:
    """Metadata pairs in file order and tensor infos in file order, with ggml-style lookups."""

    def __init__(self) -> None:
        self.version: int = GGUF_VERSION
        self.alignment: int = GGUF_DEFAULT_ALIGNMENT
        self._kv: Catalog[GGUFKV] = Catalog(lambda kv: kv.key, "key",
                                            lambda k: GGUFKeyError(f"no metadata key {k!r}", key=k))
        self._tensors: Catalog[TensorInfo] = Catalog(lambda ti: ti.name, "tensor",
                                                     lambda n: GGUFKeyError(f"no tensor named {n!r}", tensor=n))

    # ---- metadata -------------------------------------------------------------------

    @property
    def n_kv(self) -> int:
        return len(self._kv)

    def keys(self) -> list[str]:
        return [kv.key for kv in self._kv]

    def kvs(self) -> Iterator[GGUFKV]:
        return iter(self._kv)

    def find_key(self, key: str) -> int:
        """``gguf_find_key``: the id of ``key``, or -1."""
        return self._kv.find(key)

    def kv(self, key: str | int) -> GGUFKV:
        """The pair named ``key`` (or with id ``key``); GGUFKeyError if absent."""
        return self._kv.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._kv

    def __getitem__(self, key: str) -> Any:
        return self.kv(key).value

    def get(self, key: str, default: Any = None) -> Any:
        i = self._kv.find(key)
        return default if i < 0 else self._kv[i].value

    @property
    def metadata(self) -> dict[str, Any]:
        """Every pair's value by key, in file order (arrays stay numpy arrays / StringArrays)."""
        return {kv.key: kv.value for kv in self._kv}

    def _absent(self, key: str | int, default: Any) -> bool:
        """Whether a getter given a ``default`` returns it: for a key name that is not there (an id out of
        range is still an error)."""
        return default is not _MISSING and isinstance(key, str) and key not in self._kv

    def _typed(self, key: str | int, vtype: GGUFValueType, default: Any) -> Any:
        if self._absent(key, default):
            return default
        kv = self.kv(key)
        if kv.type != vtype:
            raise GGUFTypeError(
                f"key {kv.key!r} has type {kv.kv_type.type_name}"
                f"{'[' + kv.type.type_name + ']' if kv.is_array else ''}, not {vtype.type_name}",
                key=kv.key,
            )
        if kv.is_array:  # ggml's getters accept a one-element array (they assert get_ne() == 1)
            if len(kv.value) != 1:
                raise GGUFTypeError(f"key {kv.key!r} is an array of {len(kv.value)}, not one value", key=kv.key)
            v = kv.value[0]
            return v.item() if isinstance(v, np.generic) else v
        return kv.value

    def get_u8(self, key: str | int, default: Any = _MISSING) -> int:
        return self._typed(key, GGUFValueType.UINT8, default)

    def get_i8(self, key: str | int, default: Any = _MISSING) -> int:
        return self._typed(key, GGUFValueType.INT8, default)

    def get_u16(self, key: str | int, default: Any = _MISSING) -> int:
        return self._typed(key, GGUFValueType.UINT16, default)

    def get_i16(self, key: str | int, default: Any = _MISSING) -> int:
        return self._typed(key, GGUFValueType.INT16, default)

    def get_u32(self, key: str | int, default: Any = _MISSING) -> int:
        return self._typed(key, GGUFValueType.UINT32, default)

    def get_i32(self, key: str | int, default: Any = _MISSING) -> int:
        return self._typed(key, GGUFValueType.INT32, default)

    def get_u64(self, key: str | int, default: Any = _MISSING) -> int:
        return self._typed(key, GGUFValueType.UINT64, default)

    def get_i64(self, key: str | int, default: Any = _MISSING) -> int:
        return self._typed(key, GGUFValueType.INT64, default)

    def get_f32(self, key: str | int, default: Any = _MISSING) -> float:
        return self._typed(key, GGUFValueType.FLOAT32, default)

    def get_f64(self, key: str | int, default: Any = _MISSING) -> float:
        return self._typed(key, GGUFValueType.FLOAT64, default)

    def get_bool(self, key: str | int, default: Any = _MISSING) -> bool:
        return self._typed(key, GGUFValueType.BOOL, default)

    def get_str(self, key: str | int, default: Any = _MISSING) -> str:
        return self._typed(key, GGUFValueType.STRING, default)

    def get_arr(self, key: str | int, default: Any = _MISSING) -> np.ndarray:
        """A numeric (or bool) array's values as a numpy array (read-only, zero-copy for numbers)."""
        if self._absent(key, default):
            return default
        kv = self._array(key)
        if kv.type == GGUFValueType.STRING:
            raise GGUFTypeError(f"key {kv.key!r} is an array of strings; use get_arr_str", key=kv.key)
        return kv.value

    def get_arr_str(self, key: str | int, default: Any = _MISSING) -> StringArray | list[str]:
        """A string array, decoded lazily item by item."""
        if self._absent(key, default):
            return default
        kv = self._array(key)
        if kv.type != GGUFValueType.STRING:
            raise GGUFTypeError(f"key {kv.key!r} is an array of {kv.type.type_name}, not str", key=kv.key)
        return kv.value

    def _array(self, key: str | int) -> GGUFKV:
        kv = self.kv(key)
        if not kv.is_array:
            raise GGUFTypeError(f"key {kv.key!r} has type {kv.type.type_name}, not an array", key=kv.key)
        return kv

    # ---- tensors --------------------------------------------------------------------

    @property
    def n_tensors(self) -> int:
        return len(self._tensors)

    @property
    def tensors(self) -> list[TensorInfo]:
        return list(self._tensors)

    def find_tensor(self, name: str) -> int:
        """``gguf_find_tensor``: the id of tensor ``name``, or -1."""
        return self._tensors.find(name)

    def tensor_info(self, name: str | int) -> TensorInfo:
        """The info of tensor ``name`` (or with id ``name``); GGUFKeyError if absent."""
        return self._tensors.get(name)
