"""The CPU's extra buffer type "CPU_REPACK" (ggml-cpu's extra_buffer_type in repack.cpp): a weight set here is
stored in repack.py's interleaved layout, for the compiled tile kernels of quants/repacked.py.

A tensor stored here is repacked by ``set_tensor`` (whole tensors only, as in ggml) and read back unpacked
by ``get_tensor``, so saving or inspecting a loaded model still sees the GGUF bytes. Which weights come
here is the model loader's choice (llama.cpp's test op: a weight whose MUL_MAT this buffer type supports),
and ``--no-repack`` turns it off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ... import memory
from ...ops.enums import Op
from ...types import GGMLType
from ..base import BufferType
from ..errors import AllocationError, NotSupportedError
from .buffer import _MALLOC_ALIGN, TENSOR_ALIGNMENT, CPUBuffer
from .repack import ROW_MULTIPLE, repack, repacked_nbytes, unpack

if TYPE_CHECKING:
    from ...tensor import Tensor


def _has_layout(t: Tensor) -> bool:
    """Whether this CPU's kernels have a repacked layout for weight ``t`` (type, 2-D, rows)."""
    from .quants import repacked  # the kernels decide what this CPU runs

    return (t.type in repacked.TYPES and t.ne[2] == 1 and t.ne[3] == 1 and t.ne[1] % ROW_MULTIPLE == 0
            and t.ne[0] % t.type.blck_size == 0)


def repackable(t: Tensor) -> bool:
    """Whether weight ``t`` can be repacked now: a layout, and the compiled kernels on (not PYGGML_JIT=0). A run
    that defers missing kernels (jit.deferring) repacks a type only once its kernel is compiled: its nodes run
    the Python kernels meanwhile, which read the plain layout; the kernel compiles in the background for the
    next run."""
    from .jit import deferring, missing
    from .quants import repacked
    from .traits import traits

    return (_has_layout(t) and repacked.enabled()
            and not (deferring() and missing([traits(t.type).repacked])))


def in_repack_buffer(t: Tensor | None) -> bool:
    """Whether ``t`` (or the tensor it views) lives in a CPU_REPACK buffer."""
    if t is None:
        return False
    base = t.view_src if t.view_src is not None else t
    return base.buffer is not None and isinstance(base.buffer.buft, CPURepackBufferType)


def is_repacked(t: Tensor | None) -> bool:
    """Whether ``t``'s bytes are in a repacked layout (it lives in a CPU_REPACK buffer and has a layout)."""
    return in_repack_buffer(t) and _has_layout(t.view_src if t.view_src is not None else t)


def supports_op(op: Tensor) -> bool:
    """The ops the repacked kernels compute (ggml's extra_buffer_type::supports_op): MUL_MAT of a whole
    repacked 2-D weight by F32 rows into a contiguous F32 result, without the Hadamard hint. The weight may
    also be in no buffer yet (llama.cpp's placement test op)."""
    a, b = op.src[0], op.src[1]
    return (op.op == Op.MUL_MAT and a is not None and b is not None and a.view_src is None and repackable(a)
            and b.type == GGMLType.F32 and b.nb[0] == 4 and op.type == GGMLType.F32 and op.is_contiguous()
            and op.get_op_params_i32(1) == 0 and a.ne[0] == b.ne[0])


def check_op(op: Tensor) -> None:
    """Raise when ``op`` reads a repacked tensor and is not an op the repacked kernels compute (any other
    kernel would read the interleaved bytes as if they were the tensor's)."""
    if any(is_repacked(s) for s in op.src if s is not None) and not supports_op(op):
        names = ", ".join(repr(s.name) for s in op.src if is_repacked(s))
        raise NotSupportedError(f"{op.op.name} node {op.name!r} reads the repacked weight {names} (CPU_REPACK "
                                "buffer), which only a MUL_MAT by F32 rows into a contiguous F32 result can read "
                                "with the compiled kernels on; load the model with repacking off (--no-repack, "
                                "Model(..., use_extra_bufts=False))")


class CPURepackBuffer(CPUBuffer):
    """Host memory whose weights are stored repacked: written whole, read back in GGUF layout."""

    def _check_whole(self, tensor: Tensor, offset: int, size: int, what: str) -> None:
        if offset != 0 or size != tensor.nbytes():
            raise NotSupportedError(f"CPU_REPACK tensor {tensor.name!r}: {what} must cover the whole tensor "
                                    f"({tensor.nbytes()} bytes), not {size} bytes at offset {offset}")

    def set_tensor(self, tensor: Tensor, data: np.ndarray, offset: int, size: int) -> None:
        if not _has_layout(tensor):
            super().set_tensor(tensor, data, offset, size)
            return
        self._check_whole(tensor, offset, size, "set_tensor")
        n = repacked_nbytes(tensor.type, tensor.ne[0], tensor.ne[1])
        repack(tensor.type, np.asarray(data[:size], np.uint8), tensor.ne[0], tensor.ne[1],
               out=memory.region_view(tensor.data, n))

    def get_tensor(self, tensor: Tensor, data: np.ndarray, offset: int, size: int) -> None:
        if not _has_layout(tensor):
            super().get_tensor(tensor, data, offset, size)
            return
        n = repacked_nbytes(tensor.type, tensor.ne[0], tensor.ne[1])
        raw = unpack(tensor.type, memory.region_view(tensor.data, n), tensor.ne[0], tensor.ne[1])
        data[:size] = raw[offset : offset + size]

    def memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        if _has_layout(tensor):
            raise NotSupportedError(f"CPU_REPACK tensor {tensor.name!r}: memset is not supported (set it whole)")
        super().memset_tensor(tensor, value, offset, size)

    def cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        return False  # the scheduler bounces through get/set, which repack


class CPURepackBufferType(BufferType):
    """"CPU_REPACK": not host memory to other backends (its bytes are not the tensors' layout), as in ggml."""

    def name(self) -> str:
        return "CPU_REPACK"

    def _alloc_buffer(self, size: int) -> CPURepackBuffer:
        try:
            mem = memory.aligned_empty(size, _MALLOC_ALIGN)
        except (MemoryError, ValueError) as e:
            raise AllocationError(f"failed to allocate CPU_REPACK buffer of size {size}") from e
        memory.register(mem)
        return CPURepackBuffer(self, mem, owned=True)

    def get_alignment(self) -> int:
        return TENSOR_ALIGNMENT

    def get_alloc_size(self, tensor: Tensor) -> int:
        if _has_layout(tensor):
            return repacked_nbytes(tensor.type, tensor.ne[0], tensor.ne[1])
        return tensor.nbytes()

    def is_host(self) -> bool:
        return False

    def supports_op(self, op: Tensor) -> bool:
        return supports_op(op)


def available() -> bool:
    """Whether this CPU has any repacked kernel and the compiled kernels are on."""
    from .quants import repacked

    return bool(repacked.TYPES) and repacked.enabled()


_repack_buft = CPURepackBufferType()


def repack_buffer_type() -> CPURepackBufferType:
    """The one CPU_REPACK buffer type (ggml_backend_cpu_repack_buffer_type); backend.py, above this module,
    makes the CPU device its device."""
    return _repack_buft


__all__ = [
    "CPURepackBuffer",
    "CPURepackBufferType",
    "available",
    "check_op",
    "is_repacked",
    "repack_buffer_type",
    "repackable",
    "supports_op",
]
