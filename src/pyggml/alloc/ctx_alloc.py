"""Allocate every tensor of a ``no_alloc`` context in backend buffers (ggml_backend_alloc_ctx_tensors*).

This is how weights get their memory: tensors are laid out in context order with a linear
allocator, and a new buffer is started whenever the next tensor would push the current one past
the buffer type's max size, so a model larger than one allocation still loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..backend import api
from ..backend.base import Backend, Buffer, BufferType
from ..backend.errors import BackendError
from ..backend.multi_buffer import MultiBuffer
from .dyn_tallocr import round_up
from .tallocr import tallocr_alloc, tallocr_new

if TYPE_CHECKING:
    from ..context import Context
    from ..tensor import Tensor


def _alloc_tensor_range(tensors: list[Tensor], buft: BufferType, size: int, buffers: list[Buffer]) -> None:
    try:
        buffer = api.backend_buft_alloc_buffer(buft, size)
    except Exception:
        for b in buffers:
            b.free()
        raise
    buffers.append(buffer)
    talloc = tallocr_new(buffer)
    try:
        for t in tensors:
            if t.data is None:
                if t.view_src is None:
                    tallocr_alloc(talloc, t)
                elif t.buffer is None:
                    api.backend_view_init(t)
            elif t.view_src is not None and t.buffer is None:
                api.backend_view_init(t)  # a view of a tensor that was allocated elsewhere
    except Exception:
        for b in buffers:
            b.free()
        raise


def _alloc_ctx_tensors_impl(ctx: Context, buft: BufferType, no_alloc: bool) -> tuple[Buffer | None, int]:
    if not ctx.get_no_alloc():
        raise BackendError("backend_alloc_ctx_tensors needs a context created with no_alloc=True")
    alignment = api.backend_buft_get_alignment(buft)
    max_size = api.backend_buft_get_max_size(buft)
    tensors = list(ctx.tensors())
    buffers: list[Buffer] = []
    total = 0
    cur_size = 0
    first = 0
    for k, t in enumerate(tensors):
        this_size = 0
        if t.data is None and t.view_src is None:
            this_size = round_up(api.backend_buft_get_alloc_size(buft, t), alignment)
        if cur_size > 0 and cur_size + this_size > max_size:
            if not no_alloc:
                _alloc_tensor_range(tensors[first:k], buft, cur_size, buffers)
            first = k
            total += cur_size
            cur_size = this_size
        else:
            cur_size += this_size
    if cur_size > 0:
        total += cur_size
        if not no_alloc:
            _alloc_tensor_range(tensors[first:], buft, cur_size, buffers)
    if no_alloc or not buffers:
        return None, total
    return (buffers[0] if len(buffers) == 1 else MultiBuffer(buffers)), total


def backend_alloc_ctx_tensors_from_buft_size(ctx: Context, buft: BufferType) -> int:
    """Bytes ``backend_alloc_ctx_tensors_from_buft`` would allocate (all buffers together)."""
    return _alloc_ctx_tensors_impl(ctx, buft, no_alloc=True)[1]


def backend_alloc_ctx_tensors_from_buft(ctx: Context, buft: BufferType) -> Buffer | None:
    """Give every unallocated tensor of the context memory of ``buft``; views are initialised.

    Returns one buffer, a multi-buffer when the tensors needed several, or None when every
    tensor already had memory (as ggml does).
    """
    return _alloc_ctx_tensors_impl(ctx, buft, no_alloc=False)[0]


def backend_alloc_ctx_tensors(ctx: Context, backend: Backend) -> Buffer | None:
    return backend_alloc_ctx_tensors_from_buft(ctx, backend.get_default_buffer_type())
