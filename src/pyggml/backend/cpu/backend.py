"""The CPU backend behind ggml-backend's interfaces: host buffers, the CPU stream, device and registry.

Host buffers are numpy ``uint8`` arrays registered in :mod:`pyggml.memory`, so a tensor's
``data`` is a real address and kernels read and write the bytes the allocator planned.
``cpu_buffer_from_ptr`` wraps memory someone else owns (a mmap'd GGUF file) without copying.
The op kernels live in :mod:`pyggml.backend.cpu.compute`; this module only dispatches to them.
"""

from __future__ import annotations

import inspect
import platform
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import memory
from ..base import (
    Backend,
    Buffer,
    BufferType,
    Device,
    DeviceCaps,
    DeviceProps,
    DeviceType,
    GGMLStatus,
    Registry,
)
from ..errors import AllocationError, BackendError, NotSupportedError
from ..host import system_memory

if TYPE_CHECKING:
    from ...graph import Graph
    from ...tensor import Tensor

#: TENSOR_ALIGNMENT in ggml-impl.h: the CPU buffer type's alignment
TENSOR_ALIGNMENT = 32
#: GGML_DEFAULT_N_THREADS
GGML_DEFAULT_N_THREADS = 4
#: ggml_backend_cpu_guid
CPU_GUID = bytes([0xAA, 0x67, 0xC7, 0x43, 0x96, 0xE6, 0xA3, 0x8A, 0xE3, 0xAF, 0xEA, 0x92, 0x36, 0xBC, 0xFC, 0x89])
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


# --------------------------------------------------------------------------------------- backend
class CPUBackend(Backend):
    """The CPU stream: synchronous, computes graphs with the numpy/numba kernels."""

    def __init__(self, device: Device | None, n_threads: int = GGML_DEFAULT_N_THREADS) -> None:
        super().__init__(device, CPU_GUID)
        self.n_threads = n_threads
        self.abort_callback: Callable[[Any], bool] | None = None
        self.abort_callback_data: Any = None

    def name(self) -> str:
        return "CPU"

    def set_n_threads(self, n_threads: int) -> None:
        if n_threads < 1:
            raise BackendError(f"n_threads must be >= 1, got {n_threads}")
        self.n_threads = int(n_threads)

    def set_abort_callback(self, callback: Callable[[Any], bool] | None, data: Any = None) -> None:
        self.abort_callback = callback
        self.abort_callback_data = data

    def graph_compute(self, graph: Graph) -> GGMLStatus:
        from . import compute  # the kernels import heavy modules; load them on first use

        kwargs: dict[str, Any] = {}
        if self.abort_callback is not None and "abort_callback" in inspect.signature(compute.graph_compute).parameters:
            kwargs["abort_callback"] = lambda: self.abort_callback(self.abort_callback_data)
        result = compute.graph_compute(graph, self.n_threads, **kwargs)
        return GGMLStatus.SUCCESS if result is None else GGMLStatus(int(result))


def backend_cpu_init() -> CPUBackend:
    """ggml_backend_cpu_init."""
    return CPUBackend(_cpu_device, GGML_DEFAULT_N_THREADS)


def backend_is_cpu(backend: Backend | None) -> bool:
    return backend is not None and backend.guid == CPU_GUID


def backend_cpu_set_n_threads(backend: Backend, n_threads: int) -> None:
    if not isinstance(backend, CPUBackend):
        raise BackendError(f"{backend!r} is not a CPU backend")
    backend.set_n_threads(n_threads)


def backend_cpu_set_abort_callback(backend: Backend, callback: Callable[[Any], bool] | None,
                                   data: Any = None) -> None:
    if not isinstance(backend, CPUBackend):
        raise BackendError(f"{backend!r} is not a CPU backend")
    backend.set_abort_callback(callback, data)


# --------------------------------------------------------------------------------------- device
def _cpu_description() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "CPU"


class CPUDevice(Device):
    def name(self) -> str:
        return "CPU"

    def description(self) -> str:
        return _cpu_description()

    def memory(self) -> tuple[int, int]:
        return system_memory()

    def type(self) -> DeviceType:
        return DeviceType.CPU

    def props(self) -> DeviceProps:
        free, total = self.memory()
        caps = DeviceCaps(async_=False, host_buffer=False, buffer_from_host_ptr=True, events=False)
        return DeviceProps(self.name(), self.description(), free, total, self.type(), None, caps)

    def init_backend(self, params: str | None = None) -> Backend:
        return CPUBackend(self, GGML_DEFAULT_N_THREADS)

    def get_buffer_type(self) -> BufferType:
        return _cpu_buft

    def buffer_from_host_ptr(self, ptr: int, size: int, max_tensor_size: int) -> Buffer:
        return cpu_buffer_from_ptr(ptr, size)

    def supports_op(self, op: Tensor) -> bool:
        try:
            from . import compute  # deferred: the kernels load numba
        except ImportError:
            return True
        check = getattr(compute, "supports_op", None)
        return True if check is None else bool(check(op))

    def supports_buft(self, buft: BufferType) -> bool:
        return buft.is_host() or buft in _extra_bufts(self)


class CPURegistry(Registry):
    def name(self) -> str:
        return "CPU"

    def get_proc_address(self, name: str) -> Any:
        return _PROCS.get(name)


def _get_features() -> list[tuple[str, str]]:
    """ggml_backend_get_features: what the kernels were built with (here: the Python stack)."""
    feats = [("NUMPY", np.__version__)]
    try:
        import numba  # deferred: heavy, and only this report asks for it

        feats.append(("NUMBA", numba.__version__))
    except ImportError:
        pass
    return feats


def _extra_bufts(device: Device) -> list[BufferType]:
    """ggml_backend_dev_get_extra_bufts: CPU_REPACK where this CPU has repacked kernels."""
    from . import repack  # deferred: it asks the compiled kernels what this CPU runs

    buft = repack.repack_buffer_type()
    return [buft] if repack.available() else []


_PROCS: dict[str, Any] = {
    "ggml_backend_set_n_threads": backend_cpu_set_n_threads,
    "ggml_backend_set_abort_callback": backend_cpu_set_abort_callback,
    "ggml_backend_dev_get_extra_bufts": _extra_bufts,
    "ggml_backend_get_features": _get_features,
}

_cpu_reg = CPURegistry()
_cpu_device = CPUDevice(_cpu_reg)
_cpu_reg._devices.append(_cpu_device)
_cpu_buft.device = _cpu_device
_cpu_mapped_buft.device = _cpu_device


def backend_cpu_reg() -> CPURegistry:
    """ggml_backend_cpu_reg."""
    return _cpu_reg
