"""ggml's context: an arena that holds tensor metadata and (unless no_alloc) tensor data.

Memory accounting follows ``ggml_new_object`` (ggml.c): every object costs
``GGML_OBJECT_SIZE`` plus its size padded to ``GGML_MEM_ALIGN``; a tensor's object is
``GGML_TENSOR_SIZE`` plus its data (when the context allocates data). So a context sized the
way llama.cpp sizes its contexts (``tensor_overhead() * n``) fits the same tensors here.
Where ggml aborts on a full context, pyggml raises ContextFullError.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from . import memory
from .errors import ContextFullError, ShapeError
from .tensor import GGML_MAX_DIMS, GGML_MEM_ALIGN, GGML_OBJECT_SIZE, GGML_TENSOR_SIZE, Tensor, ggml_pad
from .types import GGMLType, as_type


def tensor_overhead() -> int:
    """ggml_tensor_overhead: context bytes one tensor's metadata costs."""
    return GGML_OBJECT_SIZE + GGML_TENSOR_SIZE


class Context:
    """``ggml_context``: ``Context(mem_size, no_alloc=False)``."""

    def __init__(self, mem_size: int = 16 * 1024 * 1024, mem_buffer: np.ndarray | None = None,
                 no_alloc: bool = False) -> None:
        if mem_size < 0:
            raise ValueError("mem_size must be >= 0")
        self.mem_size = ggml_pad(int(mem_size), GGML_MEM_ALIGN)
        self.no_alloc = no_alloc
        self._mem: np.ndarray | None = None
        if mem_buffer is not None:
            if mem_buffer.dtype != np.uint8 or mem_buffer.nbytes < self.mem_size:
                raise ValueError("mem_buffer must be a uint8 array of at least mem_size bytes")
            self._mem = mem_buffer
        elif not no_alloc:
            # Metadata lives in Python objects; the arena holds tensor data at the offsets
            # ggml would use, so addresses and accounting match ggml's layout.
            self._mem = memory.aligned_empty(self.mem_size, 64)
        self._base = memory.register(self._mem) if self._mem is not None else 0
        self._end = 0  # ggml: objects_end->offs + objects_end->size
        self._tensors: list[Tensor] = []
        self.n_objects = 0

    # ------------------------------------------------------------------ arena
    def new_object(self, size: int) -> int:
        """ggml_new_object: reserve ``size`` bytes after an object header; returns the offset."""
        size_needed = ggml_pad(size, GGML_MEM_ALIGN)
        cur_end = self._end
        if cur_end + size_needed + GGML_OBJECT_SIZE > self.mem_size:
            raise ContextFullError(
                "not enough space in the context's memory pool "
                f"(needed {cur_end + size_needed + GGML_OBJECT_SIZE}, available {self.mem_size})"
            )
        offs = cur_end + GGML_OBJECT_SIZE
        self._end = offs + size_needed
        self.n_objects += 1
        return offs

    def used_mem(self) -> int:
        """ggml_used_mem."""
        return self._end

    def get_mem_size(self) -> int:
        return self.mem_size

    def get_no_alloc(self) -> bool:
        return self.no_alloc

    def set_no_alloc(self, no_alloc: bool) -> None:
        if not no_alloc and self._mem is None:
            self._mem = memory.aligned_empty(self.mem_size, 64)
            self._base = memory.register(self._mem)
        self.no_alloc = no_alloc

    def get_max_tensor_size(self) -> int:
        return max((t.nbytes() for t in self._tensors), default=0)

    def reset(self) -> None:
        """ggml_reset: forget every tensor; the arena is reused from the start."""
        self._end = 0
        self.n_objects = 0
        self._tensors.clear()

    def free(self) -> None:
        """ggml_free: release the arena. Tensors of this context must not be used afterwards."""
        self.reset()
        if self._mem is not None:
            memory.unregister(self._mem)
        self._mem = None

    # ------------------------------------------------------------------ tensors
    def new_tensor_impl(self, type: GGMLType | int | str, ne: list[int] | tuple[int, ...],
                        view_src: Tensor | None = None, view_offs: int = 0) -> Tensor:
        """ggml_new_tensor_impl: the one place tensors are created."""
        ty = as_type(type)
        ne = [int(n) for n in ne]
        if not 1 <= len(ne) <= GGML_MAX_DIMS:
            raise ShapeError(f"a tensor has 1 to {GGML_MAX_DIMS} dimensions, got {len(ne)}")
        if any(n < 0 for n in ne):
            raise ShapeError(f"negative dimension in ne={ne}")
        if ne[0] % ty.blck_size:
            raise ShapeError(f"ne[0]={ne[0]} is not a multiple of the {ty.type_name} block size {ty.blck_size}")
        if view_src is not None and view_src.view_src is not None:
            view_offs += view_src.view_offs
            view_src = view_src.view_src
        data_size = ty.row_size(ne[0])
        for n in ne[1:]:
            data_size *= n
        if view_src is not None and data_size and data_size + view_offs > view_src.nbytes():
            raise ShapeError(
                f"view of {data_size} bytes at offset {view_offs} exceeds its source "
                f"{view_src.name!r} ({view_src.nbytes()} bytes)"
            )
        data = None
        if view_src is not None and view_src.data is not None:
            data = view_src.data + view_offs
        alloc = view_src is None and not self.no_alloc
        offs = self.new_object(GGML_TENSOR_SIZE + (data_size if alloc else 0))
        if alloc:
            data = self._base + offs + GGML_TENSOR_SIZE
        t = Tensor(self, ty, ne, view_src, view_offs, data)
        if view_src is not None:
            t.buffer = view_src.buffer
        self._tensors.append(t)
        return t

    def new_tensor(self, type: GGMLType | int | str, *ne: int) -> Tensor:
        """``ctx.new_tensor(GGMLType.F32, 4, 3)`` is ggml_new_tensor_2d(ctx, F32, 4, 3)."""
        if len(ne) == 1 and isinstance(ne[0], list | tuple):
            ne = tuple(ne[0])
        return self.new_tensor_impl(type, list(ne))

    def dup_tensor(self, src: Tensor) -> Tensor:
        """ggml_dup_tensor: a new tensor with src's type and shape (not its data)."""
        return self.new_tensor_impl(src.type, src.ne)

    def view_tensor(self, src: Tensor) -> Tensor:
        """ggml_view_tensor: a view of all of src with src's strides, named "<src> (view)"."""
        t = self.new_tensor_impl(src.type, src.ne, src, 0)
        t.name = _suffixed(src.name, " (view)")
        t.nb = list(src.nb)
        return t

    def tensors(self) -> Iterator[Tensor]:
        """ggml_get_first_tensor / ggml_get_next_tensor, as an iterator."""
        return iter(list(self._tensors))

    __iter__ = tensors

    def __len__(self) -> int:
        return len(self._tensors)

    def get_tensor(self, name: str) -> Tensor | None:
        """ggml_get_tensor: the first tensor with this name, or None."""
        for t in self._tensors:
            if t.name == name:
                return t
        return None

    def get_first_tensor(self) -> Tensor | None:
        return self._tensors[0] if self._tensors else None

    def get_next_tensor(self, t: Tensor) -> Tensor | None:
        i = self._tensors.index(t)
        return self._tensors[i + 1] if i + 1 < len(self._tensors) else None

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()


def _suffixed(name: str, suffix: str) -> str:
    """ggml_format_name(t, "%s (view)", name) with snprintf's truncation to 63 bytes."""
    return (name + suffix).encode()[:63].decode(errors="ignore")


def init(mem_size: int = 16 * 1024 * 1024, mem_buffer: np.ndarray | None = None,
         no_alloc: bool = False) -> Context:
    """ggml_init."""
    return Context(mem_size, mem_buffer, no_alloc)


def _new_nd(ctx: Context, type: GGMLType | int | str, *ne: int) -> Tensor:
    return ctx.new_tensor_impl(type, list(ne))


def new_tensor(ctx: Context, type: GGMLType | int | str, n_dims: int, ne: list[int]) -> Tensor:
    """ggml_new_tensor(ctx, type, n_dims, ne)."""
    return ctx.new_tensor_impl(type, list(ne)[:n_dims])


def new_tensor_1d(ctx: Context, type: GGMLType | int | str, ne0: int) -> Tensor:
    return _new_nd(ctx, type, ne0)


def new_tensor_2d(ctx: Context, type: GGMLType | int | str, ne0: int, ne1: int) -> Tensor:
    return _new_nd(ctx, type, ne0, ne1)


def new_tensor_3d(ctx: Context, type: GGMLType | int | str, ne0: int, ne1: int, ne2: int) -> Tensor:
    return _new_nd(ctx, type, ne0, ne1, ne2)


def new_tensor_4d(ctx: Context, type: GGMLType | int | str, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    return _new_nd(ctx, type, ne0, ne1, ne2, ne3)


def new_i32(ctx: Context, value: int) -> Tensor:
    """ggml_new_i32: a 1-element I32 tensor holding value (needs an allocating context)."""
    t = _new_nd(ctx, GGMLType.I32, 1)
    t.set(np.array([value], dtype=np.int32))
    return t


def new_f32(ctx: Context, value: float) -> Tensor:
    """ggml_new_f32: a 1-element F32 tensor holding value (needs an allocating context)."""
    t = _new_nd(ctx, GGMLType.F32, 1)
    t.set(np.array([value], dtype=np.float32))
    return t


def dup_tensor(ctx: Context, src: Tensor) -> Tensor:
    return ctx.dup_tensor(src)


def view_tensor(ctx: Context, src: Tensor) -> Tensor:
    return ctx.view_tensor(src)


def get_tensor(ctx: Context, name: str) -> Tensor | None:
    return ctx.get_tensor(name)
