"""ggml's linear tensor allocator (``ggml_tallocr``): tensors one after another in one buffer.

Used for weights and other tensors that live as long as their buffer, where planning lifetimes
would gain nothing. ggml aborts when the buffer is full; pyggml raises AllocationError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..backend import api
from ..backend.base import Buffer, GGMLStatus
from ..backend.errors import AllocationError
from .dyn_tallocr import round_up

if TYPE_CHECKING:
    from ..tensor import Tensor


@dataclass
class Tallocr:
    """struct ggml_tallocr: the buffer, its base, the alignment and the next free offset."""

    buffer: Buffer
    base: int | None
    alignment: int
    offset: int

    def alloc(self, tensor: Tensor) -> GGMLStatus:
        return tallocr_alloc(self, tensor)


def tallocr_new(buffer: Buffer) -> Tallocr:
    """ggml_tallocr_new: start at the first aligned address of the buffer."""
    base = api.backend_buffer_get_base(buffer)
    align = api.backend_buffer_get_alignment(buffer)
    if align <= 0 or align & (align - 1):
        raise AllocationError(f"buffer {buffer.name()!r} reports alignment {align}, not a power of two")
    start = 0 if base is None else (-base) % align
    return Tallocr(buffer, base, align, start)


def tallocr_alloc(talloc: Tallocr, tensor: Tensor) -> GGMLStatus:
    """ggml_tallocr_alloc: place the tensor at the current offset and advance past it."""
    size = round_up(api.backend_buffer_get_alloc_size(talloc.buffer, tensor), talloc.alignment)
    buf_size = api.backend_buffer_get_size(talloc.buffer)
    if talloc.offset + size > buf_size:
        raise AllocationError(f"not enough space in the buffer to allocate {tensor.name!r} "
                              f"(needed {size}, available {buf_size - talloc.offset})")
    base = api.backend_buffer_get_base(talloc.buffer)
    addr = None if base is None else base + talloc.offset
    talloc.offset += size
    return api.backend_tensor_alloc(talloc.buffer, tensor, addr)
