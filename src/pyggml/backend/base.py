"""ggml-backend's interfaces: buffer types, buffers, backends (streams), events, devices, registries.

ggml expresses these as C vtables (ggml-backend-impl.h) with optional function pointers and
defaults supplied by the wrappers in ggml-backend.cpp. Here each is an abstract class whose
optional methods already carry ggml's default behaviour, so a backend overrides only what it
actually implements. The flat ``backend_*`` functions in :mod:`pyggml.backend.api` add ggml's
argument checks on top and are what callers should use.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from .errors import NotSupportedError

if TYPE_CHECKING:
    from ..graph import Graph
    from ..tensor import Tensor

#: SIZE_MAX on a 64-bit machine: ggml's "no limit" for buffer sizes
SIZE_MAX = (1 << 64) - 1


class GGMLStatus(IntEnum):
    """enum ggml_status (ggml.h)."""

    ALLOC_FAILED = -2
    FAILED = -1
    SUCCESS = 0
    ABORTED = 1


class BufferUsage(IntEnum):
    """enum ggml_backend_buffer_usage: the scheduler treats WEIGHTS buffers specially."""

    ANY = 0
    WEIGHTS = 1
    COMPUTE = 2


class DeviceType(IntEnum):
    """enum ggml_backend_dev_type."""

    CPU = 0
    GPU = 1
    IGPU = 2
    ACCEL = 3
    META = 4


# --------------------------------------------------------------------------------------- buffer type
class BufferType(ABC):
    """ggml_backend_buffer_type: a kind of memory (host RAM, a GPU's VRAM, ...) and how to get it.

    Identity matters: ggml compares buffer types by pointer (the graph allocator shares one
    allocator among equal bufts), so a backend should hand out one instance per kind of memory.
    """

    def __init__(self, device: Device | None = None) -> None:
        self.device = device

    @abstractmethod
    def name(self) -> str:
        """get_name."""

    def alloc_buffer(self, size: int) -> Buffer:
        """ggml_backend_buft_alloc_buffer: a zero-size request gives a dummy buffer, as in ggml,
        so callers need no special case for empty graphs."""
        if size == 0:
            return DummyBuffer(self)
        return self._alloc_buffer(size)

    @abstractmethod
    def _alloc_buffer(self, size: int) -> Buffer:
        """The iface's alloc_buffer, called for size > 0 only."""

    @abstractmethod
    def get_alignment(self) -> int:
        """Alignment of tensor data in bytes (a power of two)."""

    def get_max_size(self) -> int:
        """Largest single buffer this type can allocate; ggml's default is SIZE_MAX."""
        return SIZE_MAX

    def get_alloc_size(self, tensor: Tensor) -> int:
        """Bytes a tensor needs here; backends that pad rows override this (default ggml_nbytes)."""
        return tensor.nbytes()

    def is_host(self) -> bool:
        """Whether the memory is directly addressable host memory (default False as in ggml)."""
        return False

    def get_device(self) -> Device | None:
        return self.device

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name()!r}>"


# --------------------------------------------------------------------------------------- buffer
class Buffer(ABC):
    """ggml_backend_buffer: one contiguous block of memory of a buffer type.

    Tensor offsets and sizes passed to the data methods are already validated by
    :mod:`pyggml.backend.api`; implementations only move bytes.
    """

    def __init__(self, buft: BufferType, size: int) -> None:
        self.buft = buft
        self.size = int(size)
        self.usage = BufferUsage.ANY
        self.freed = False

    # -- identity / sizes
    def name(self) -> str:
        """ggml_backend_buffer_name: the name of the buffer's type."""
        return self.buft.name()

    def get_type(self) -> BufferType:
        return self.buft

    def get_size(self) -> int:
        return self.size

    def get_alignment(self) -> int:
        return self.buft.get_alignment()

    def get_max_size(self) -> int:
        return self.buft.get_max_size()

    def get_alloc_size(self, tensor: Tensor) -> int:
        return self.buft.get_alloc_size(tensor)

    def is_host(self) -> bool:
        return self.buft.is_host()

    def set_usage(self, usage: BufferUsage | int) -> None:
        self.usage = BufferUsage(usage)

    def get_usage(self) -> BufferUsage:
        return self.usage

    # -- memory
    @abstractmethod
    def get_base(self) -> int | None:
        """Address of the first byte (None only for a zero-size buffer, as ggml returns NULL)."""

    def init_tensor(self, tensor: Tensor) -> GGMLStatus:
        """Called when a tensor is placed in this buffer; most backends need nothing."""
        return GGMLStatus.SUCCESS

    def memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        """Optional in ggml; api.backend_tensor_memset reports the absence clearly."""
        raise NotSupportedError(f"memset not implemented by backend buffer {self.name()!r}")

    @abstractmethod
    def set_tensor(self, tensor: Tensor, data: np.ndarray, offset: int, size: int) -> None:
        """Copy ``size`` bytes of the uint8 array ``data`` to the tensor's bytes at ``offset``."""

    @abstractmethod
    def get_tensor(self, tensor: Tensor, data: np.ndarray, offset: int, size: int) -> None:
        """Copy ``size`` bytes at ``offset`` of the tensor into the uint8 array ``data``."""

    def cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        """Copy src into dst (dst lives in this buffer); False means "not supported, bounce"."""
        return False

    @abstractmethod
    def clear(self, value: int) -> None:
        """Fill the whole buffer with the byte ``value``."""

    def reset(self) -> None:
        """Optional: forget per-tensor state before the allocator re-places tensors."""
        return None

    def free(self) -> None:
        """ggml_backend_buffer_free: release the memory. Safe to call twice."""
        self.freed = True

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name()!r} size={self.size} usage={self.usage.name}>"


class DummyBuffer(Buffer):
    """The zero-size buffer ggml hands out for ``alloc_buffer(0)``: no base, nothing to copy."""

    def __init__(self, buft: BufferType) -> None:
        super().__init__(buft, 0)

    def get_base(self) -> int | None:
        return None

    def set_tensor(self, tensor: Tensor, data: np.ndarray, offset: int, size: int) -> None:
        raise NotSupportedError("a zero-size buffer holds no tensor data")

    def get_tensor(self, tensor: Tensor, data: np.ndarray, offset: int, size: int) -> None:
        raise NotSupportedError("a zero-size buffer holds no tensor data")

    def clear(self, value: int) -> None:
        pass


# --------------------------------------------------------------------------------------- event
class Event:
    """ggml_backend_event: a marker recorded on a backend's stream; devices that support events
    subclass this. ``recorded`` lets synchronous backends answer queries honestly."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.recorded = False


# --------------------------------------------------------------------------------------- backend
class Backend(ABC):
    """ggml_backend: an execution stream on a device.

    The async methods default to ggml's fallbacks (synchronize, then a blocking copy), so a
    synchronous backend implements only graph_compute.
    """

    def __init__(self, device: Device | None, guid: bytes | None = None) -> None:
        self.device = device
        self.guid = guid if guid is not None else uuid.uuid4().bytes
        self.freed = False

    @abstractmethod
    def name(self) -> str:
        """get_name."""

    def get_device(self) -> Device | None:
        return self.device

    def get_default_buffer_type(self) -> BufferType:
        """ggml_backend_get_default_buffer_type: the device's buffer type."""
        if self.device is None:
            raise NotSupportedError(f"backend {self.name()!r} has no device")
        return self.device.get_buffer_type()

    def free(self) -> None:
        self.freed = True

    #: ggml_backend_i's set_tensor_async / get_tensor_async, ``(tensor, data, offset, size) -> None``: optional, as
    #: in ggml (NULL there); a backend without them is written and read synchronously by api.py's
    #: backend_tensor_set_async / backend_tensor_get_async
    set_tensor_async: Callable[[Tensor, np.ndarray, int, int], None] | None = None
    get_tensor_async: Callable[[Tensor, np.ndarray, int, int], None] | None = None

    def cpy_tensor_async(self, backend_src: Backend, src: Tensor, dst: Tensor) -> bool:
        """Copy src (on backend_src) to dst (on this backend) asynchronously; False = unsupported."""
        return False

    def synchronize(self) -> None:
        """Wait for queued work; a synchronous backend has none."""
        return None

    @abstractmethod
    def graph_compute(self, graph: Graph) -> GGMLStatus:
        """Compute every node of the graph (may return before completion on async backends)."""

    def supports_events(self) -> bool:
        return False

    def event_record(self, event: Event) -> None:
        raise NotSupportedError(f"backend {self.name()!r} does not support events")

    def event_wait(self, event: Event) -> None:
        raise NotSupportedError(f"backend {self.name()!r} does not support events")

    def graph_optimize(self, graph: Graph) -> None:
        """Optional hook the scheduler calls on each split before computing it."""
        return None

    def supports_op(self, op: Tensor) -> bool:
        return self.device is not None and self.device.supports_op(op)

    def supports_buft(self, buft: BufferType) -> bool:
        return self.device is not None and self.device.supports_buft(buft)

    def offload_op(self, op: Tensor) -> bool:
        return self.device is not None and self.device.offload_op(op)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name()!r}>"


# --------------------------------------------------------------------------------------- device
@dataclass
class DeviceCaps:
    """struct ggml_backend_dev_caps."""

    async_: bool = False
    host_buffer: bool = False
    buffer_from_host_ptr: bool = False
    events: bool = False


@dataclass
class DeviceProps:
    """struct ggml_backend_dev_props."""

    name: str = ""
    description: str = ""
    memory_free: int = 0
    memory_total: int = 0
    type: DeviceType = DeviceType.CPU
    device_id: str | None = None
    caps: DeviceCaps = field(default_factory=DeviceCaps)


class Device(ABC):
    """ggml_backend_device: one piece of hardware of a registry, and what it can do."""

    def __init__(self, reg: Registry | None = None) -> None:
        self.reg = reg

    @abstractmethod
    def name(self) -> str: ...

    @abstractmethod
    def description(self) -> str: ...

    @abstractmethod
    def memory(self) -> tuple[int, int]:
        """(free, total) bytes."""

    @abstractmethod
    def type(self) -> DeviceType: ...

    def props(self) -> DeviceProps:
        free, total = self.memory()
        return DeviceProps(self.name(), self.description(), free, total, self.type(), None, DeviceCaps())

    def backend_reg(self) -> Registry | None:
        return self.reg

    @abstractmethod
    def init_backend(self, params: str | None = None) -> Backend: ...

    @abstractmethod
    def get_buffer_type(self) -> BufferType: ...

    def get_host_buffer_type(self) -> BufferType | None:
        """A pinned-host buffer type for faster transfers; None when the device has none."""
        return None

    def buffer_from_host_ptr(self, ptr: int, size: int, max_tensor_size: int) -> Buffer:
        raise NotSupportedError(f"device {self.name()!r} cannot wrap host memory")

    @abstractmethod
    def supports_op(self, op: Tensor) -> bool: ...

    @abstractmethod
    def supports_buft(self, buft: BufferType) -> bool: ...

    def offload_op(self, op: Tensor) -> bool:
        """Whether the device wants an op whose weights sit in host memory (default False)."""
        return False

    def event_new(self) -> Event | None:
        """None when the device has no events, exactly as ggml_backend_event_new returns NULL."""
        return None

    def event_free(self, event: Event) -> None:
        event.recorded = False

    def event_synchronize(self, event: Event) -> None:
        raise NotSupportedError(f"device {self.name()!r} does not support events")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name()!r}>"


# --------------------------------------------------------------------------------------- registry
_T = TypeVar("_T")


def nth(entries: Sequence[_T], index: int, owner: str, many: str, one: str) -> _T:
    """ggml's ``*_get(index)``, whose assert becomes an IndexError naming how many there are
    ("registry 'CPU' has 1 devices, no device 3")."""
    if not 0 <= index < len(entries):
        raise IndexError(f"{owner} {len(entries)} {many}, no {one} {index}")
    return entries[index]


class Registry(ABC):
    """ggml_backend_reg: a backend family (CPU, CUDA, RPC, ...) and its devices."""

    api_version = 2  # GGML_BACKEND_API_VERSION

    def __init__(self) -> None:
        self._devices: list[Device] = []

    @abstractmethod
    def name(self) -> str: ...

    def devices(self) -> list[Device]:
        """The devices its backend made at registration (``_devices``); a registry that finds its devices
        only when asked (the torch backend probes CUDA and MPS) overrides this."""
        return self._devices

    def device_count(self) -> int:
        return len(self.devices())

    def device(self, index: int) -> Device:
        return nth(self.devices(), index, f"registry {self.name()!r} has", "devices", "device")

    def get_proc_address(self, name: str) -> Any:
        """A named extension function (e.g. "ggml_backend_set_n_threads"), or None."""
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name()!r}>"
