"""A test-only backend that runs a chosen subset of ops on host memory, like ggml's BLAS backend.

It shares the CPU buffer type (so the scheduler can upgrade CPU nodes to it, "3.upg") and
computes with the CPU kernels, but only the ops it declares: everything else must be placed
elsewhere by the scheduler. Installed tests discover it through its ``pyggml.backends`` entry point.
"""

from __future__ import annotations

from pyggml.backend.base import Backend, BufferType, Device, DeviceType, GGMLStatus, Registry
from pyggml.backend.cpu.backend import backend_cpu_buffer_type
from pyggml.graph import Graph
from pyggml.ops.enums import EMPTY_OPS, Op
from pyggml.tensor import Tensor, TensorFlag

#: ops the default device supports
DEFAULT_OPS = frozenset({Op.MUL_MAT, Op.ADD, Op.MUL})


class SubsetBackend(Backend):
    def __init__(self, device: SubsetDevice) -> None:
        super().__init__(device)
        self.sdev = device
        self.computed: list[str] = []

    def name(self) -> str:
        return self.sdev.name()

    def graph_compute(self, graph: Graph) -> GGMLStatus:
        from pyggml.backend.cpu.compute import compute_forward

        for node in graph.nodes:
            if node.op in EMPTY_OPS or not node.flags & TensorFlag.COMPUTE:
                continue
            if not self.sdev.supports_op(node):
                raise RuntimeError(f"{self.name()} was given op {node.op.name} it does not support")
            compute_forward(node, 1)
            self.computed.append(node.name)
        return GGMLStatus.SUCCESS


class SubsetDevice(Device):
    def __init__(self, reg: Registry | None, name: str = "SUBSET", ops: frozenset[Op] = DEFAULT_OPS,
                 offload: bool = False) -> None:
        super().__init__(reg)
        self._name = name
        self.ops = ops
        self.offload = offload

    def name(self) -> str:
        return self._name

    def description(self) -> str:
        return f"test backend running {', '.join(sorted(op.name for op in self.ops))} on host memory"

    def memory(self) -> tuple[int, int]:
        return 0, 0

    def type(self) -> DeviceType:
        return DeviceType.ACCEL

    def init_backend(self, params: str | None = None) -> Backend:
        return SubsetBackend(self)

    def get_buffer_type(self) -> BufferType:
        return backend_cpu_buffer_type()

    def supports_op(self, op: Tensor) -> bool:
        return op.op in EMPTY_OPS or op.op in self.ops

    def supports_buft(self, buft: BufferType) -> bool:
        return buft.is_host()

    def offload_op(self, op: Tensor) -> bool:
        return self.offload and op.op in self.ops


class SubsetRegistry(Registry):
    def __init__(self) -> None:
        self._devices: list[Device] = [SubsetDevice(self)]

    def name(self) -> str:
        return "SubsetTest"

    def devices(self) -> list[Device]:
        return self._devices


_reg: SubsetRegistry | None = None


def backend_reg() -> SubsetRegistry:
    """The entry point: ggml_backend_init of this backend."""
    global _reg
    if _reg is None:
        _reg = SubsetRegistry()
    return _reg
