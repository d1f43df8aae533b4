"""Torch device memory as ggml buffers, and torch views of the tensors placed in them.

A buffer is one torch ``uint8`` tensor on the device; its base is that storage's address,
rounded up to the alignment, as a CUDA buffer's base is a device pointer. Nothing on the host
can read that address through pyggml.memory, so every transfer goes through set/get.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from ...types import GGMLType
from ..base import Buffer, BufferType
from ..errors import AllocationError, BackendError

if TYPE_CHECKING:
    from ...tensor import Tensor
    from ..base import Device

#: tensor data alignment in torch buffers (CUDA's buffer types use 128)
TORCH_ALIGNMENT = 128

#: ggml types with a torch element type (quantized types are raw bytes)
TORCH_DTYPES: dict[GGMLType, torch.dtype] = {
    GGMLType.F32: torch.float32,
    GGMLType.F16: torch.float16,
    GGMLType.BF16: torch.bfloat16,
    GGMLType.I8: torch.int8,
    GGMLType.I16: torch.int16,
    GGMLType.I32: torch.int32,
    GGMLType.I64: torch.int64,
    GGMLType.F64: torch.float64,
}


class TorchBuffer(Buffer):
    """One block of device memory; typed views are cached per torch dtype."""

    def __init__(self, buft: TorchBufferType, size: int) -> None:
        super().__init__(buft, size)
        # 16 extra bytes so every typed view of the whole buffer ends on an element boundary
        try:
            self.mem: torch.Tensor | None = torch.empty(size + TORCH_ALIGNMENT + 16, dtype=torch.uint8,
                                                        device=buft.torch_device)
        except (RuntimeError, MemoryError) as e:
            raise AllocationError(f"failed to allocate {buft.name()} buffer of size {size}: {e}") from e
        raw = self.mem.data_ptr()
        self._pad = (-raw) % TORCH_ALIGNMENT
        self._base = raw + self._pad
        self._typed: dict[torch.dtype, torch.Tensor] = {}

    def _mem(self) -> torch.Tensor:
        if self.mem is None:
            raise BackendError(f"buffer {self.name()!r} has been freed")
        return self.mem

    def get_base(self) -> int | None:
        self._mem()
        return self._base

    def byte_offset(self, tensor: Tensor) -> int:
        """Offset of the tensor's first byte within ``mem``."""
        if tensor.data is None:
            raise BackendError(f"tensor {tensor.name!r} is not allocated")
        return tensor.data - self._base + self._pad

    def bytes_of(self, tensor: Tensor, offset: int, size: int) -> torch.Tensor:
        start = self.byte_offset(tensor) + offset
        return self._mem()[start : start + size]

    def typed(self, dtype: torch.dtype) -> torch.Tensor:
        view = self._typed.get(dtype)
        if view is None:
            mem = self._mem()
            itemsize = torch.empty((), dtype=dtype).element_size()
            view = self._typed[dtype] = mem[: mem.numel() // itemsize * itemsize].view(dtype)
        return view

    def memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        self.bytes_of(tensor, offset, size).fill_(value)

    def set_tensor(self, tensor: Tensor, data: np.ndarray, offset: int, size: int) -> None:
        host = np.ascontiguousarray(data[:size])
        if not host.flags.writeable:  # e.g. a view of a read-only mapped model file
            host = host.copy()
        src = torch.from_numpy(host)
        self.bytes_of(tensor, offset, size).copy_(src)

    def get_tensor(self, tensor: Tensor, data: np.ndarray, offset: int, size: int) -> None:
        host = self.bytes_of(tensor, offset, size).cpu()
        data[:size] = host.numpy()

    def cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        """Device-to-device copy when both live in torch buffers (any torch device)."""
        src_buf = src.view_src.buffer if src.view_src is not None else src.buffer
        if not isinstance(src_buf, TorchBuffer):
            return False
        n = src.nbytes()
        self.bytes_of(dst, 0, n).copy_(src_buf.bytes_of(src, 0, n))
        return True

    def clear(self, value: int) -> None:
        self._mem().fill_(value)

    def free(self) -> None:
        self.mem = None
        self._typed.clear()
        super().free()


class TorchBufferType(BufferType):
    """Device memory of one torch device ("TORCH_CPU", "TORCH_CUDA0", ...): not host memory."""

    def __init__(self, device: Device | None, torch_device: torch.device, name: str) -> None:
        super().__init__(device)
        self.torch_device = torch_device
        self._name = name

    def name(self) -> str:
        return self._name

    def _alloc_buffer(self, size: int) -> Buffer:
        if size < 0:
            raise BackendError(f"cannot allocate a buffer of {size} bytes")
        return TorchBuffer(self, size)

    def get_alignment(self) -> int:
        return TORCH_ALIGNMENT

    def is_host(self) -> bool:
        return False


# ---------------------------------------------------------------------- views of tensors
def _buffer_of(t: Tensor) -> TorchBuffer:
    buf = t.view_src.buffer if t.view_src is not None else t.buffer
    if not isinstance(buf, TorchBuffer):
        where = "no buffer" if buf is None else f"buffer {buf.name()!r}"
        raise BackendError(f"tensor {t.name!r} is in {where}, not in torch device memory")
    return buf


def tview(t: Tensor) -> torch.Tensor:
    """The tensor as a strided torch view of shape (ne3, ne2, ne1, ne0): writes go through."""
    dtype = TORCH_DTYPES.get(t.type)
    if dtype is None:
        raise BackendError(f"tensor {t.name!r} of type {t.type.type_name} has no torch element type")
    buf = _buffer_of(t)
    size = t.type.type_size
    off = buf.byte_offset(t)
    if off % size or any(nb % size for nb in t.nb):
        raise BackendError(f"tensor {t.name!r} is not aligned to its {size}-byte elements")
    ne, nb = t.ne, t.nb
    return buf.typed(dtype).as_strided((ne[3], ne[2], ne[1], ne[0]),
                                       (nb[3] // size, nb[2] // size, nb[1] // size, nb[0] // size), off // size)


def raw_rows(t: Tensor) -> torch.Tensor:
    """A block-quantized tensor's rows as uint8, shape (ne3, ne2, ne1, row_bytes)."""
    buf = _buffer_of(t)
    ne, nb = t.ne, t.nb
    return buf._mem().as_strided((ne[3], ne[2], ne[1], t.row_size()), (nb[3], nb[2], nb[1], 1), buf.byte_offset(t))
