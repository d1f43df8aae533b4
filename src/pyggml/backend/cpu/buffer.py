"""The CPU's host buffers: numpy ``uint8`` arrays registered in :mod:`pyggml.memory`, so a tensor's
``data`` is a real address and kernels read and write the bytes the allocator planned.
``cpu_buffer_from_ptr`` wraps memory someone else owns (a mmap'd GGUF file) without copying.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ... import memory
from ..base import Buffer, BufferType
from ..errors import AllocationError, BackendError, NotSupportedError

if TYPE_CHECKING:
    from ...tensor import Tensor

#: TENSOR_ALIGNMENT in ggml-impl.h: the CPU buffer type's alignment
TENSOR_ALIGNMENT = 32
#: ggml_aligned_malloc's alignment; buffers start on it so the 32-byte base needs no padding
_MALLOC_ALIGN = 64


# --------------------------------------------------------------------------------------- buffers
class CPUBuffer(Buffer):
    """Host memory: either owned (a fresh array) or borrowed (``cpu_buffer_from_ptr``)."""

    def __init__(self, buft: BufferType, mem: np.ndarray, owned: bool, keepalive: np.ndarray | None = None) -> None:
        super().__init__(buft, mem.nbytes)
        self._mem: np.ndarray | None = mem
        self._owned = owned
        # a borrowed slice does not keep the registered array (and so its registration) alive
        self._keepalive = keepalive
        self._base = memory.address_of(mem)

    @property
    def array(self) -> np.ndarray:
        """The buffer's bytes as a numpy uint8 array (a view: writes go through)."""
        if self._mem is None:
            raise BackendError(f"buffer {self.name()!r} has been freed")
        return self._mem

    def get_base(self) -> int | None:
        if self._mem is None:
            raise BackendError(f"buffer {self.name()!r} has been freed")
        # ggml_backend_cpu_buffer_get_base pads the malloc pointer up to TENSOR_ALIGNMENT
        return (self._base + TENSOR_ALIGNMENT - 1) & ~(TENSOR_ALIGNMENT - 1)

    def memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        memory.region_view(tensor.data + offset, size)[:] = value

    def set_tensor(self, tensor: Tensor, data: np.ndarray, offset: int, size: int) -> None:
        memory.region_view(tensor.data + offset, size)[:] = data[:size]

    def get_tensor(self, tensor: Tensor, data: np.ndarray, offset: int, size: int) -> None:
        data[:size] = memory.region_view(tensor.data + offset, size)

    def cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        src_buf = src.view_src.buffer if src.view_src is not None else src.buffer
        if src_buf is None or not src_buf.is_host():
            return False
        n = src.nbytes()
        memory.region_view(dst.data, n)[:] = memory.region_view(src.data, n)
        return True

    def clear(self, value: int) -> None:
        self.array[:] = value

    def free(self) -> None:
        if self._mem is not None and self._owned:
            memory.unregister(self._mem)
        self._mem = None
        self._keepalive = None
        super().free()


class CPUBufferType(BufferType):
    """The "CPU" buffer type: 32-byte aligned host memory."""

    def name(self) -> str:
        return "CPU"

    def _alloc_buffer(self, size: int) -> Buffer:
        if size < 0:
            raise BackendError(f"cannot allocate a buffer of {size} bytes")
        try:
            mem = memory.aligned_empty(size, _MALLOC_ALIGN)
        except MemoryError as e:
            raise AllocationError(f"failed to allocate CPU buffer of size {size}") from e
        memory.register(mem)
        return CPUBuffer(self, mem, owned=True)

    def get_alignment(self) -> int:
        return TENSOR_ALIGNMENT

    def is_host(self) -> bool:
        return True


class CPUMappedBufferType(BufferType):
    """"CPU_Mapped": the type of buffers that wrap foreign host memory; it cannot allocate."""

    def name(self) -> str:
        return "CPU_Mapped"

    def _alloc_buffer(self, size: int) -> Buffer:
        raise NotSupportedError("the CPU_Mapped buffer type only wraps existing memory (cpu_buffer_from_ptr)")

    def get_alignment(self) -> int:
        return TENSOR_ALIGNMENT

    def is_host(self) -> bool:
        return True


_cpu_buft = CPUBufferType()
_cpu_mapped_buft = CPUMappedBufferType()


def backend_cpu_buffer_type() -> CPUBufferType:
    """ggml_backend_cpu_buffer_type: the one CPU buffer type (identity matters to the allocator)."""
    return _cpu_buft


def cpu_buffer_from_ptr(ptr: int | np.ndarray, size: int | None = None) -> CPUBuffer:
    """ggml_backend_cpu_buffer_from_ptr: a "CPU_Mapped" buffer over existing host memory, no copy.

    ``ptr`` is an address inside memory registered with :mod:`pyggml.memory` (or a uint8 array,
    which is registered if needed). It must be 32-byte aligned, as ggml asserts.
    """
    if isinstance(ptr, np.ndarray):
        arr = ptr
        if size is None:
            size = arr.nbytes
        try:
            memory.find_region(memory.address_of(arr), arr.nbytes)
        except memory.MemoryAccessError:
            memory.register(arr)
        ptr = memory.address_of(arr)
    if size is None:
        raise BackendError("cpu_buffer_from_ptr needs a size when given an address")
    if ptr % TENSOR_ALIGNMENT:
        raise BackendError(f"buffer pointer must be aligned: 0x{ptr:x} is not a multiple of {TENSOR_ALIGNMENT}")
    try:
        region, off = memory.find_region(ptr, size)
    except memory.MemoryAccessError as e:
        raise BackendError(f"0x{ptr:x}+{size} is not host memory known to pyggml; "
                           "register the array with pyggml.memory.register first") from e
    return CPUBuffer(_cpu_mapped_buft, region[off : off + size], owned=False, keepalive=region)


backend_cpu_buffer_from_ptr = cpu_buffer_from_ptr
