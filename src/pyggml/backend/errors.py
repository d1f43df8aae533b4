"""Exceptions of the backend and allocator layers.

Where ggml asserts or aborts (a write past a tensor's end, a buffer without room), pyggml
raises one of these instead, so a caller's mistake never takes the process down.
"""

from __future__ import annotations

from ..errors import PyGGMLError


class BackendError(PyGGMLError, RuntimeError):
    """A backend, buffer or device was used in a way ggml does not allow."""


class BufferNotSetError(BackendError):
    """The tensor (or its view source) has no backend buffer: ggml's "tensor buffer not set"."""


class TensorBoundsError(BackendError, IndexError):
    """offset + size runs past the tensor's ggml_nbytes: ggml's "tensor read/write out of bounds"."""


class LayoutMismatchError(BackendError, ValueError):
    """A copy between tensors whose type, ne or nb differ."""


class NotSupportedError(BackendError, NotImplementedError):
    """An optional interface function this backend, buffer or device does not implement."""


class AllocationError(PyGGMLError, MemoryError):
    """A buffer could not hold a tensor, or an allocator ran out of room or free-block slots."""
