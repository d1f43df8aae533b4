"""The torch backend's stream, device, events and registry.

One device per torch device found: "TORCH_CPU" always (an ACCEL-type device, so
``backend_init_best`` never prefers it to the real CPU backend), "TORCH_CUDA<i>" per CUDA GPU and
"TORCH_MPS" on Apple silicon (GPU-type). Work is queued on torch's current stream, so on CUDA
``graph_compute`` returns before the kernels finish and events really order the scheduler's
copies; on the cpu device everything is synchronous and events are plain markers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ...ops.enums import Op
from ...tensor import TensorFlag
from ..base import (
    Backend,
    BufferType,
    Device,
    DeviceCaps,
    DeviceProps,
    DeviceType,
    Event,
    GGMLStatus,
    Registry,
)
from ..errors import BackendError
from ..host import system_memory
from . import kernels
from .buffer import TorchBuffer, TorchBufferType

if TYPE_CHECKING:
    from ...graph import Graph
    from ...tensor import Tensor

TORCH_GUID = bytes([0x70, 0x79, 0x67, 0x67, 0x6D, 0x6C, 0x2D, 0x74, 0x6F, 0x72, 0x63, 0x68, 0x00, 0x00, 0x00, 0x01])


class TorchEvent(Event):
    """A CUDA event on cuda devices; on other devices work is synchronous and a flag suffices."""

    def __init__(self, device: TorchDevice) -> None:
        super().__init__(device)
        self.cuda_event = torch.cuda.Event() if device.torch_device.type == "cuda" else None


class TorchBackend(Backend):
    def __init__(self, device: TorchDevice) -> None:
        super().__init__(device, TORCH_GUID)
        self.tdev = device

    def name(self) -> str:
        return self.tdev.name()

    def synchronize(self) -> None:
        td = self.tdev.torch_device
        if td.type == "cuda":
            torch.cuda.synchronize(td)
        elif td.type == "mps":
            torch.mps.synchronize()

    def cpy_tensor_async(self, backend_src: Backend, src: Tensor, dst: Tensor) -> bool:
        """Device-to-device copies between torch buffers; anything else takes ggml's fallback."""
        dst_buf = dst.view_src.buffer if dst.view_src is not None else dst.buffer
        if not isinstance(dst_buf, TorchBuffer):
            return False
        return dst_buf.cpy_tensor(src, dst)

    def graph_compute(self, graph: Graph) -> GGMLStatus:
        for node in graph.nodes:
            if node.flags & TensorFlag.COMPUTE:
                kernels.compute_node(node)
        return GGMLStatus.SUCCESS

    def supports_events(self) -> bool:
        return True

    def event_record(self, event: Event) -> None:
        ev = _as_torch_event(event)
        if ev.cuda_event is not None:
            ev.cuda_event.record()
        ev.recorded = True

    def event_wait(self, event: Event) -> None:
        ev = _as_torch_event(event)
        if ev.cuda_event is not None and ev.recorded:
            torch.cuda.current_stream(self.tdev.torch_device).wait_event(ev.cuda_event)


def _as_torch_event(event: Event) -> TorchEvent:
    if not isinstance(event, TorchEvent):
        raise BackendError(f"{event!r} is not an event of a torch device")
    return event


class TorchDevice(Device):
    def __init__(self, reg: Registry, torch_device: torch.device, name: str, dev_type: DeviceType) -> None:
        super().__init__(reg)
        self.torch_device = torch_device
        self._name = name
        self._type = dev_type
        self.buft = TorchBufferType(self, torch_device, name)

    def name(self) -> str:
        return self._name

    def description(self) -> str:
        if self.torch_device.type == "cuda":
            return f"torch {torch.__version__} on {torch.cuda.get_device_name(self.torch_device)}"
        return f"torch {torch.__version__} on device {self.torch_device.type}"

    def memory(self) -> tuple[int, int]:
        if self.torch_device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.torch_device)
            return int(free), int(total)
        return system_memory()

    def type(self) -> DeviceType:
        return self._type

    def props(self) -> DeviceProps:
        free, total = self.memory()
        caps = DeviceCaps(async_=self.torch_device.type == "cuda", host_buffer=False,
                          buffer_from_host_ptr=False, events=True)
        return DeviceProps(self.name(), self.description(), free, total, self.type(), str(self.torch_device), caps)

    def init_backend(self, params: str | None = None) -> Backend:
        return TorchBackend(self)

    def get_buffer_type(self) -> BufferType:
        return self.buft

    def supports_op(self, op: Tensor) -> bool:
        return kernels.supports_op(op)

    def supports_buft(self, buft: BufferType) -> bool:
        return buft is self.buft

    def offload_op(self, op: Tensor) -> bool:
        """Like ggml's GPU backends: take big batched matrix products whose weights sit in host
        memory (32 tokens or more), where the upload pays for itself."""
        if op.op == Op.MUL_MAT:
            return op.ne[1] >= 32
        return op.op == Op.MUL_MAT_ID and op.ne[2] >= 32

    def event_new(self) -> Event | None:
        return TorchEvent(self)

    def event_synchronize(self, event: Event) -> None:
        ev = _as_torch_event(event)
        if ev.cuda_event is not None and ev.recorded:
            ev.cuda_event.synchronize()


class TorchRegistry(Registry):
    def name(self) -> str:
        return "Torch"

    def devices(self) -> list[Device]:
        if not self._devices:
            found: list[Device] = []
            if torch.cuda.is_available():
                for i in range(torch.cuda.device_count()):
                    found.append(TorchDevice(self, torch.device("cuda", i), f"TORCH_CUDA{i}", DeviceType.GPU))
            mps = getattr(torch.backends, "mps", None)
            if mps is not None and mps.is_available():
                found.append(TorchDevice(self, torch.device("mps"), "TORCH_MPS", DeviceType.GPU))
            found.append(TorchDevice(self, torch.device("cpu"), "TORCH_CPU", DeviceType.ACCEL))
            self._devices = found
        return self._devices

    def get_proc_address(self, name: str) -> Any:
        if name == "ggml_backend_get_features":
            return lambda: [("TORCH", torch.__version__)]
        return None


_reg: TorchRegistry | None = None


def backend_torch_reg() -> TorchRegistry:
    """The torch registry (one per process, as ggml's static registries)."""
    global _reg
    if _reg is None:
        _reg = TorchRegistry()
    return _reg


def backend_torch_init(device: str = "cpu") -> TorchBackend:
    """A torch backend on ``device``: "cpu", "cuda", "cuda:1" or "mps"."""
    td = torch.device(device)
    for dev in backend_torch_reg().devices():
        assert isinstance(dev, TorchDevice)
        if dev.torch_device.type == td.type and (td.index is None or dev.torch_device.index in (td.index, None)):
            return TorchBackend(dev)
    raise BackendError(f"no torch device {device!r} is available (found: "
                       f"{', '.join(d.name() for d in backend_torch_reg().devices())})")


def backend_is_torch(backend: Backend | None) -> bool:
    return backend is not None and backend.guid == TORCH_GUID
