"""ggml's multi-buffer: several buffers of one type presented as one.

``backend_alloc_ctx_tensors_from_buft`` needs it when a context's tensors exceed the buffer
type's max size: the tensors live in the parts, the multi-buffer only owns them, so freeing,
clearing or changing the usage reaches every part.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .base import Buffer, BufferUsage
from .errors import BackendError, NotSupportedError

if TYPE_CHECKING:
    from ..tensor import Tensor


class MultiBuffer(Buffer):
    """A buffer made of ``parts``; its size is their sum and its type the first part's."""

    def __init__(self, parts: list[Buffer]) -> None:
        if not parts:
            raise BackendError("a multi-buffer needs at least one buffer")
        super().__init__(parts[0].buft, sum(p.size for p in parts))
        self.parts = list(parts)

    def get_base(self) -> int | None:
        raise NotSupportedError("a multi-buffer has no single base address; use its parts")

    def set_tensor(self, tensor: Tensor, data: np.ndarray, offset: int, size: int) -> None:
        raise NotSupportedError("tensors live in a multi-buffer's parts, not in the multi-buffer")

    def get_tensor(self, tensor: Tensor, data: np.ndarray, offset: int, size: int) -> None:
        raise NotSupportedError("tensors live in a multi-buffer's parts, not in the multi-buffer")

    def clear(self, value: int) -> None:
        for part in self.parts:
            if part.size:
                part.clear(value)

    def set_usage(self, usage: BufferUsage | int) -> None:
        super().set_usage(usage)
        for part in self.parts:
            part.set_usage(usage)

    def free(self) -> None:
        if not self.freed:
            for part in self.parts:
                part.free()
        super().free()


def backend_multi_buffer_alloc_buffer(buffers: list[Buffer]) -> MultiBuffer:
    """ggml_backend_multi_buffer_alloc_buffer."""
    return MultiBuffer(buffers)


def backend_buffer_is_multi_buffer(buffer: Buffer) -> bool:
    return isinstance(buffer, MultiBuffer)


def backend_multi_buffer_set_usage(buffer: Buffer, usage: BufferUsage | int) -> None:
    if not isinstance(buffer, MultiBuffer):
        raise BackendError(f"{buffer!r} is not a multi-buffer")
    buffer.set_usage(usage)
