"""TWIN: a second, GPU-like device in pure Python for the scheduler tests (no torch needed).

test-backend-ops checks a backend against a second one; the scheduler tests need the same: a
device with memory of its own, ops it lacks, events, and an appetite for big batches, so that
placements, splits and copies between memories really happen. TWIN is that device, built on the
CPU kernels:

- its buffer type "TWIN" is not host memory (``is_host`` is False), so the scheduler must copy
  every tensor that crosses between TWIN and the CPU;
- that separation is enforced, not just declared. A TWIN buffer keeps its bytes in a private
  array; the addresses its tensors get point into a second array, a window that holds those bytes
  only while TWIN itself computes (copied in before, back after) and 0xFF bytes (NaN) otherwise.
  The window counts as host memory, and is known to :mod:`pyggml.memory`, only meanwhile too. So
  a CPU kernel that reads a TWIN tensor fails (``NoDataError``, ``MemoryAccessError``) or, if it
  reads the raw address as the compiled kernels do, gets NaN, much as a CPU reading device memory
  would fault or read garbage; bytes move only through set/get and the scheduler's copies;
- it runs the ops a small GPU backend would (the torch backend's set): not HARDSWISH, not a
  soft_max with attention sinks, which the scheduler must leave to the CPU;
- it asks for matrix products of 32 or more rows whose weights sit in host memory (``offload_op``),
  and has events (plain markers: it is synchronous).
"""

from __future__ import annotations

import weakref

import numpy as np

from pyggml import memory
from pyggml.backend.base import (
    Backend,
    Buffer,
    BufferType,
    Device,
    DeviceCaps,
    DeviceProps,
    DeviceType,
    Event,
    GGMLStatus,
    Registry,
)
from pyggml.backend.errors import AllocationError, BackendError
from pyggml.graph import Graph
from pyggml.ops.enums import EMPTY_OPS, Op, UnaryOp
from pyggml.tensor import Tensor, TensorFlag

TWIN_GUID = b"pyggml-twin-test"
#: tensor data alignment in TWIN buffers (as a GPU buffer type's, larger than the CPU's 32)
TWIN_ALIGNMENT = 128
#: what the window holds while TWIN is not computing: every float type reads it as NaN
POISON = 0xFF
#: the ops TWIN has kernels for; anything else stays on the CPU
TWIN_OPS = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.SCALE, Op.RMS_NORM, Op.UNARY, Op.GLU, Op.CPY, Op.DUP,
                      Op.CONT, Op.GET_ROWS, Op.SET_ROWS, Op.MUL_MAT, Op.MUL_MAT_ID, Op.SOFT_MAX, Op.ROPE})
#: the unary ops TWIN lacks (the CPU is the only backend with them)
TWIN_MISSING_UNARY = frozenset({UnaryOp.HARDSWISH})


class TwinBuffer(Buffer):
    """One block of TWIN memory: ``store`` holds the bytes, ``window`` is where the tensors' addresses
    point (the bytes only while TWIN computes, POISON otherwise); host code goes through set/get."""

    def __init__(self, buft: TwinBufferType, size: int) -> None:
        super().__init__(buft, size)
        try:
            self.store: np.ndarray | None = np.zeros(size, dtype=np.uint8)
            self.window = memory.aligned_empty(size, TWIN_ALIGNMENT)
        except MemoryError as e:
            raise AllocationError(f"failed to allocate TWIN buffer of size {size}") from e
        self.window[:] = POISON
        self._base = memory.address_of(self.window)
        buft.live.add(self)

    def _array(self) -> np.ndarray:
        if self.store is None:
            raise BackendError(f"buffer {self.name()!r} has been freed")
        return self.store

    def open_window(self) -> None:
        """Put the bytes where the tensors' addresses point, reachable from host code (TWIN computes)."""
        self.window[:] = self._array()
        memory.register(self.window)

    def close_window(self) -> None:
        """Keep what TWIN's kernels wrote, then make the addresses unreachable again."""
        memory.unregister(self.window)
        if self.store is not None:
            self.store[:] = self.window
        self.window[:] = POISON

    def get_base(self) -> int | None:
        self._array()
        return self._base

    def is_host(self) -> bool:
        """True only while TWIN computes (so its CPU kernels may read the memory), as the type's is False."""
        return self.buft.computing

    def _bytes(self, tensor: Tensor, offset: int, size: int) -> np.ndarray:
        if tensor.data is None:
            raise BackendError(f"tensor {tensor.name!r} is not allocated")
        start = tensor.data - self._base + offset
        return self._array()[start : start + size]

    def memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        self._bytes(tensor, offset, size)[:] = value

    def set_tensor(self, tensor: Tensor, data: np.ndarray, offset: int, size: int) -> None:
        self._bytes(tensor, offset, size)[:] = data[:size]

    def get_tensor(self, tensor: Tensor, data: np.ndarray, offset: int, size: int) -> None:
        data[:size] = self._bytes(tensor, offset, size)

    def cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        """TWIN to TWIN inside the device; anything else takes ggml's fallback through the host."""
        src_buf = src.view_src.buffer if src.view_src is not None else src.buffer
        if not isinstance(src_buf, TwinBuffer):
            return False
        n = src.nbytes()
        self._bytes(dst, 0, n)[:] = src_buf._bytes(src, 0, n)
        return True

    def clear(self, value: int) -> None:
        self._array()[:] = value

    def free(self) -> None:
        self.store = None
        super().free()


class TwinBufferType(BufferType):
    """TWIN's device memory: not host memory, so the CPU never reads it in place."""

    def __init__(self, device: Device | None) -> None:
        super().__init__(device)
        self.live: weakref.WeakSet[TwinBuffer] = weakref.WeakSet()
        self.computing = False  # set by TwinBackend.graph_compute while its kernels run

    def name(self) -> str:
        return "TWIN"

    def _alloc_buffer(self, size: int) -> Buffer:
        if size < 0:
            raise BackendError(f"cannot allocate a buffer of {size} bytes")
        return TwinBuffer(self, size)

    def get_alignment(self) -> int:
        return TWIN_ALIGNMENT

    def is_host(self) -> bool:
        return False


class TwinEvent(Event):
    """A marker: TWIN finishes its work before graph_compute returns, so recording is all there is."""


class TwinBackend(Backend):
    """TWIN's stream: the CPU kernels run on TWIN memory, which is reachable only meanwhile."""

    def __init__(self, device: TwinDevice) -> None:
        super().__init__(device, TWIN_GUID)
        self.tdev = device
        self.computed: list[str] = []

    def name(self) -> str:
        return self.tdev.name()

    def graph_compute(self, graph: Graph) -> GGMLStatus:
        from pyggml.backend.cpu.compute import compute_forward

        buft = self.tdev.buft
        buffers = [b for b in list(buft.live) if b.store is not None]
        for b in buffers:
            b.open_window()
        buft.computing = True
        try:
            for node in graph.nodes:
                if node.op in EMPTY_OPS or not node.flags & TensorFlag.COMPUTE:
                    continue
                if not self.tdev.supports_op(node):
                    raise BackendError(f"TWIN was given {node.name!r} (op {node.op.name}) it cannot run")
                compute_forward(node, 1)
                self.computed.append(node.name)
        finally:
            buft.computing = False
            for b in buffers:
                b.close_window()
            _forget_views(graph)
        return GGMLStatus.SUCCESS

    def supports_events(self) -> bool:
        return True

    def event_record(self, event: Event) -> None:
        event.recorded = True

    def event_wait(self, event: Event) -> None:
        return None  # synchronous: the work the event marks is done


def _forget_views(graph: Graph) -> None:
    """Drop the numpy views the kernels cached on the split's tensors (``Tensor.view4`` keeps one per
    layout): a view made while TWIN memory was reachable would let a later CPU read through unchecked."""
    for node in graph.nodes:
        for t in (node, *node.src, node.view_src):
            if t is not None and hasattr(t, "_v4"):
                t._v4 = None


class TwinDevice(Device):
    """The device behind TWIN backends; one per registry, like a GPU."""

    def __init__(self, reg: Registry | None) -> None:
        super().__init__(reg)
        self.buft = TwinBufferType(self)

    def name(self) -> str:
        return "TWIN"

    def description(self) -> str:
        return "test device: the CPU kernels on memory of its own"

    def memory(self) -> tuple[int, int]:
        return 1 << 30, 1 << 30

    def type(self) -> DeviceType:
        return DeviceType.ACCEL

    def props(self) -> DeviceProps:
        free, total = self.memory()
        caps = DeviceCaps(async_=False, host_buffer=False, buffer_from_host_ptr=False, events=True)
        return DeviceProps(self.name(), self.description(), free, total, self.type(), None, caps)

    def init_backend(self, params: str | None = None) -> Backend:
        return TwinBackend(self)

    def get_buffer_type(self) -> BufferType:
        return self.buft

    def supports_op(self, op: Tensor) -> bool:
        if op.op in EMPTY_OPS:
            return True
        if op.op not in TWIN_OPS:
            return False
        if op.op == Op.UNARY:
            return UnaryOp(op.get_op_params_i32(0)) not in TWIN_MISSING_UNARY
        if op.op == Op.SOFT_MAX:
            return op.src[2] is None  # no attention sinks
        return True

    def supports_buft(self, buft: BufferType) -> bool:
        return buft is self.buft

    def offload_op(self, op: Tensor) -> bool:
        """Big batched products whose weights sit in host memory, as ggml's GPU backends take them."""
        if op.op == Op.MUL_MAT:
            return op.ne[1] >= 32
        return op.op == Op.MUL_MAT_ID and op.ne[2] >= 32

    def event_new(self) -> Event | None:
        return TwinEvent(self)

    def event_synchronize(self, event: Event) -> None:
        return None


class TwinRegistry(Registry):
    def __init__(self) -> None:
        super().__init__()
        self._devices = [TwinDevice(self)]

    def name(self) -> str:
        return "Twin"


_reg: TwinRegistry | None = None


def twin_init() -> TwinBackend:
    """A TWIN backend on the one TWIN device."""
    global _reg
    if _reg is None:
        _reg = TwinRegistry()
    dev = _reg.devices()[0]
    assert isinstance(dev, TwinDevice)
    return TwinBackend(dev)
