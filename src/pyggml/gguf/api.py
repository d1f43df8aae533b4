"""ggml's flat ``gguf_*`` functions (gguf.h), over GGUFReader/GGUFWriter.

Where ggml returns NULL or asserts, these raise GGUFError (or its GGUFKeyError/GGUFTypeError
subclasses) with a message naming the problem. A reader and a writer both serve as ``ctx``.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..types import GGMLType
from .constants import GGUFValueType, gguf_type_name, gguf_type_size
from .context import GGUFContext
from .errors import GGUFKeyError
from .reader import GGUFReader
from .records import StringArray
from .writer import GGUFWriter


def gguf_init_empty() -> GGUFWriter:
    return GGUFWriter()


def gguf_init_from_file(fname: str | os.PathLike[str], params: Any = None) -> GGUFReader:
    """Open and validate a file. ``params`` is accepted for ggml's signature; tensor data is always mapped."""
    return GGUFReader(fname)


def gguf_init_from_buffer(data: bytes | bytearray | memoryview, params: Any = None) -> GGUFReader:
    return GGUFReader(data)


def gguf_free(ctx: GGUFContext) -> None:
    if isinstance(ctx, GGUFReader):
        ctx.close()


def gguf_get_version(ctx: GGUFContext) -> int:
    return ctx.version


def gguf_get_alignment(ctx: GGUFContext) -> int:
    return ctx.alignment


def gguf_get_data_offset(ctx: GGUFReader) -> int:
    return ctx.data_offset


def gguf_get_n_kv(ctx: GGUFContext) -> int:
    return ctx.n_kv


def gguf_find_key(ctx: GGUFContext, key: str) -> int:
    return ctx.find_key(key)


def gguf_get_key(ctx: GGUFContext, key_id: int) -> str:
    return ctx.kv(key_id).key


def gguf_get_kv_type(ctx: GGUFContext, key_id: int) -> GGUFValueType:
    return ctx.kv(key_id).kv_type


def gguf_get_arr_type(ctx: GGUFContext, key_id: int) -> GGUFValueType:
    return ctx._array(key_id).type


def gguf_get_arr_n(ctx: GGUFContext, key_id: int) -> int:
    return ctx._array(key_id).n


def gguf_get_arr_data(ctx: GGUFContext, key_id: int) -> np.ndarray:
    return ctx.get_arr(key_id)


def gguf_get_arr_str(ctx: GGUFContext, key_id: int, i: int) -> str:
    arr = ctx.get_arr_str(key_id)
    if not 0 <= i < len(arr):
        raise GGUFKeyError(f"index {i} out of range for array {ctx.kv(key_id).key!r} of {len(arr)}")
    return arr[i]


def gguf_get_val_u8(ctx: GGUFContext, key_id: int) -> int:
    return ctx.get_u8(key_id)


def gguf_get_val_i8(ctx: GGUFContext, key_id: int) -> int:
    return ctx.get_i8(key_id)


def gguf_get_val_u16(ctx: GGUFContext, key_id: int) -> int:
    return ctx.get_u16(key_id)


def gguf_get_val_i16(ctx: GGUFContext, key_id: int) -> int:
    return ctx.get_i16(key_id)


def gguf_get_val_u32(ctx: GGUFContext, key_id: int) -> int:
    return ctx.get_u32(key_id)


def gguf_get_val_i32(ctx: GGUFContext, key_id: int) -> int:
    return ctx.get_i32(key_id)


def gguf_get_val_f32(ctx: GGUFContext, key_id: int) -> float:
    return ctx.get_f32(key_id)


def gguf_get_val_u64(ctx: GGUFContext, key_id: int) -> int:
    return ctx.get_u64(key_id)


def gguf_get_val_i64(ctx: GGUFContext, key_id: int) -> int:
    return ctx.get_i64(key_id)


def gguf_get_val_f64(ctx: GGUFContext, key_id: int) -> float:
    return ctx.get_f64(key_id)


def gguf_get_val_bool(ctx: GGUFContext, key_id: int) -> bool:
    return ctx.get_bool(key_id)


def gguf_get_val_str(ctx: GGUFContext, key_id: int) -> str:
    return ctx.get_str(key_id)


def gguf_get_n_tensors(ctx: GGUFContext) -> int:
    return ctx.n_tensors


def gguf_find_tensor(ctx: GGUFContext, name: str) -> int:
    return ctx.find_tensor(name)


def gguf_get_tensor_offset(ctx: GGUFContext, tensor_id: int) -> int:
    return ctx.tensor_info(tensor_id).offset


def gguf_get_tensor_name(ctx: GGUFContext, tensor_id: int) -> str:
    return ctx.tensor_info(tensor_id).name


def gguf_get_tensor_type(ctx: GGUFContext, tensor_id: int) -> GGMLType:
    return ctx.tensor_info(tensor_id).type


def gguf_get_tensor_ne(ctx: GGUFContext, tensor_id: int) -> tuple[int, int, int, int]:
    return ctx.tensor_info(tensor_id).ne


def gguf_get_tensor_size(ctx: GGUFContext, tensor_id: int) -> int:
    return ctx.tensor_info(tensor_id).nbytes


def gguf_remove_key(ctx: GGUFWriter, key: str) -> int:
    return ctx.remove_key(key)


def gguf_set_val_u8(ctx: GGUFWriter, key: str, val: int) -> None:
    ctx.set_u8(key, val)


def gguf_set_val_i8(ctx: GGUFWriter, key: str, val: int) -> None:
    ctx.set_i8(key, val)


def gguf_set_val_u16(ctx: GGUFWriter, key: str, val: int) -> None:
    ctx.set_u16(key, val)


def gguf_set_val_i16(ctx: GGUFWriter, key: str, val: int) -> None:
    ctx.set_i16(key, val)


def gguf_set_val_u32(ctx: GGUFWriter, key: str, val: int) -> None:
    ctx.set_u32(key, val)


def gguf_set_val_i32(ctx: GGUFWriter, key: str, val: int) -> None:
    ctx.set_i32(key, val)


def gguf_set_val_f32(ctx: GGUFWriter, key: str, val: float) -> None:
    ctx.set_f32(key, val)


def gguf_set_val_u64(ctx: GGUFWriter, key: str, val: int) -> None:
    ctx.set_u64(key, val)


def gguf_set_val_i64(ctx: GGUFWriter, key: str, val: int) -> None:
    ctx.set_i64(key, val)


def gguf_set_val_f64(ctx: GGUFWriter, key: str, val: float) -> None:
    ctx.set_f64(key, val)


def gguf_set_val_bool(ctx: GGUFWriter, key: str, val: bool) -> None:
    ctx.set_bool(key, val)


def gguf_set_val_str(ctx: GGUFWriter, key: str, val: str) -> None:
    ctx.set_str(key, val)


def gguf_set_arr_data(ctx: GGUFWriter, key: str, type: GGUFValueType, data: Any) -> None:
    ctx.set_arr(key, data, type)


def gguf_set_arr_str(ctx: GGUFWriter, key: str, data: list[str] | StringArray) -> None:
    ctx.set_arr(key, data, GGUFValueType.STRING)


def gguf_set_kv(ctx: GGUFWriter, src: GGUFContext) -> None:
    """Copy every pair of ``src`` into ``ctx`` (replacing pairs of the same key)."""
    for kv in src.kvs():
        ctx.set_kv(kv)


def gguf_write_to_file(ctx: GGUFWriter, fname: str | os.PathLike[str], only_meta: bool = False) -> bool:
    ctx.write(fname, only_meta=only_meta)
    return True


def gguf_get_meta_size(ctx: GGUFWriter) -> int:
    return len(ctx.meta_bytes())


def gguf_get_meta_data(ctx: GGUFWriter) -> bytes:
    return ctx.meta_bytes()


__all__ = [
    "gguf_find_key",
    "gguf_find_tensor",
    "gguf_free",
    "gguf_get_alignment",
    "gguf_get_arr_data",
    "gguf_get_arr_n",
    "gguf_get_arr_str",
    "gguf_get_arr_type",
    "gguf_get_data_offset",
    "gguf_get_key",
    "gguf_get_kv_type",
    "gguf_get_meta_data",
    "gguf_get_meta_size",
    "gguf_get_n_kv",
    "gguf_get_n_tensors",
    "gguf_get_tensor_name",
    "gguf_get_tensor_ne",
    "gguf_get_tensor_offset",
    "gguf_get_tensor_size",
    "gguf_get_tensor_type",
    "gguf_get_val_bool",
    "gguf_get_val_f32",
    "gguf_get_val_f64",
    "gguf_get_val_i8",
    "gguf_get_val_i16",
    "gguf_get_val_i32",
    "gguf_get_val_i64",
    "gguf_get_val_str",
    "gguf_get_val_u8",
    "gguf_get_val_u16",
    "gguf_get_val_u32",
    "gguf_get_val_u64",
    "gguf_get_version",
    "gguf_init_empty",
    "gguf_init_from_buffer",
    "gguf_init_from_file",
    "gguf_remove_key",
    "gguf_set_arr_data",
    "gguf_set_arr_str",
    "gguf_set_kv",
    "gguf_set_val_bool",
    "gguf_set_val_f32",
    "gguf_set_val_f64",
    "gguf_set_val_i8",
    "gguf_set_val_i16",
    "gguf_set_val_i32",
    "gguf_set_val_i64",
    "gguf_set_val_str",
    "gguf_set_val_u8",
    "gguf_set_val_u16",
    "gguf_set_val_u32",
    "gguf_set_val_u64",
    "gguf_type_name",
    "gguf_type_size",
    "gguf_write_to_file",
]
