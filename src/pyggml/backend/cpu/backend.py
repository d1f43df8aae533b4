"""The CPU backend behind ggml-backend's interfaces: the CPU stream, device and registry (ggml-cpu.cpp).

The host buffers are buffer.py's, CPU_REPACK is repack_buffer.py's. The op kernels live behind
:mod:`pyggml.backend.cpu.compute`; this module only dispatches to them.
"""

from __future__ import annotations

import inspect
import platform
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

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
from ..errors import BackendError
from ..host import system_memory
from . import repack_buffer
from .buffer import (  # noqa: F401  (re-exported: the CPU backend's public names, as ggml-cpu.h has them)
    TENSOR_ALIGNMENT,
    CPUBuffer,
    CPUBufferType,
    CPUMappedBufferType,
    _cpu_buft,
    _cpu_mapped_buft,
    backend_cpu_buffer_from_ptr,
    backend_cpu_buffer_type,
    cpu_buffer_from_ptr,
)

if TYPE_CHECKING:
    from ...graph import Graph
    from ...tensor import Tensor

#: GGML_DEFAULT_N_THREADS
GGML_DEFAULT_N_THREADS = 4
#: ggml_backend_cpu_guid
CPU_GUID = bytes([0xAA, 0x67, 0xC7, 0x43, 0x96, 0xE6, 0xA3, 0x8A, 0xE3, 0xAF, 0xEA, 0x92, 0x36, 0xBC, 0xFC, 0x89])


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
    return [_repack_buft] if repack_buffer.available() else []


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
_repack_buft = repack_buffer.repack_buffer_type()
_repack_buft.device = _cpu_device


def backend_cpu_reg() -> CPURegistry:
    """ggml_backend_cpu_reg."""
    return _cpu_reg
