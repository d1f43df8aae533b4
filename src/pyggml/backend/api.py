"""ggml-backend's flat C API, named without the ``ggml_`` prefix.

These wrappers are where ggml puts its argument checks (ggml-backend.cpp): a tensor without a
buffer, without data, or an ``offset + size`` past ``ggml_nbytes`` is refused here, with an
exception naming the tensor, instead of ggml's assert. The interface classes behind them only
move bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .. import memory
from ..tensor import NoDataError, are_same_layout
from .base import Backend, Buffer, BufferType, BufferUsage, Device, DeviceProps, DeviceType, Event, GGMLStatus, Registry
from .errors import BackendError, BufferNotSetError, LayoutMismatchError, TensorBoundsError
from .multi_buffer import (
    backend_buffer_is_multi_buffer,
    backend_multi_buffer_alloc_buffer,
    backend_multi_buffer_set_usage,
)

if TYPE_CHECKING:
    from ..graph import Graph
    from ..tensor import Tensor

__all__ = [
    "backend_buffer_is_multi_buffer",
    "backend_multi_buffer_alloc_buffer",
    "backend_multi_buffer_set_usage",
]


# ------------------------------------------------------------------ buffer type
def backend_buft_name(buft: BufferType) -> str:
    return buft.name()


def backend_buft_alloc_buffer(buft: BufferType, size: int) -> Buffer:
    return buft.alloc_buffer(int(size))


def backend_buft_get_alignment(buft: BufferType) -> int:
    return buft.get_alignment()


def backend_buft_get_max_size(buft: BufferType) -> int:
    return buft.get_max_size()


def backend_buft_get_alloc_size(buft: BufferType, tensor: Tensor) -> int:
    size = buft.get_alloc_size(tensor)
    if size < tensor.nbytes():
        raise BackendError(f"buffer type {buft.name()!r} reports {size} bytes for {tensor.name!r}, "
                           f"less than its {tensor.nbytes()} bytes")
    return size


def backend_buft_is_host(buft: BufferType) -> bool:
    return buft.is_host()


def backend_buft_get_device(buft: BufferType) -> Device | None:
    return buft.device


# ------------------------------------------------------------------ buffer
def backend_buffer_name(buffer: Buffer) -> str:
    return buffer.name()


def backend_buffer_free(buffer: Buffer | None) -> None:
    if buffer is not None:
        buffer.free()


def backend_buffer_get_size(buffer: Buffer) -> int:
    return buffer.size


def backend_buffer_get_base(buffer: Buffer) -> int | None:
    """NULL (None) for a zero-size buffer, as in ggml; otherwise the base address."""
    if buffer.size == 0:
        return None
    base = buffer.get_base()
    if base is None:
        raise BackendError(f"backend buffer {buffer.name()!r} has no base address")
    return base


def backend_buffer_init_tensor(buffer: Buffer, tensor: Tensor) -> GGMLStatus:
    return buffer.init_tensor(tensor)


def backend_buffer_clear(buffer: Buffer, value: int) -> None:
    if buffer.size == 0:
        return
    buffer.clear(int(value) & 0xFF)


def backend_buffer_get_alignment(buffer: Buffer) -> int:
    return buffer.get_alignment()


def backend_buffer_get_max_size(buffer: Buffer) -> int:
    return buffer.get_max_size()


def backend_buffer_get_alloc_size(buffer: Buffer, tensor: Tensor) -> int:
    return backend_buft_get_alloc_size(buffer.buft, tensor)


def backend_buffer_is_host(buffer: Buffer) -> bool:
    return buffer.is_host()


def backend_buffer_set_usage(buffer: Buffer, usage: BufferUsage | int) -> None:
    """Sets the usage; a multi-buffer passes it on to its parts (its set_usage does that)."""
    buffer.set_usage(usage)


def backend_buffer_get_usage(buffer: Buffer) -> BufferUsage:
    return buffer.usage


def backend_buffer_get_type(buffer: Buffer) -> BufferType:
    return buffer.buft


def backend_buffer_reset(buffer: Buffer) -> None:
    buffer.reset()


def backend_buffer_copy_tensor(src: Tensor, dst: Tensor) -> bool:
    dst_buf = _buffer_of(dst, "copy into")
    return dst_buf.cpy_tensor(src, dst)


# ------------------------------------------------------------------ tensor data
def _buffer_of(tensor: Tensor, what: str) -> Buffer:
    buf = tensor.view_src.buffer if tensor.view_src is not None else tensor.buffer
    if buf is None:
        raise BufferNotSetError(f"cannot {what} tensor {tensor.name!r}: tensor buffer not set")
    return buf


def _check_range(tensor: Tensor, offset: int, size: int, what: str) -> Buffer:
    buf = _buffer_of(tensor, what)
    if tensor.data is None:
        raise NoDataError(f"cannot {what} tensor {tensor.name!r}: tensor not allocated")
    if offset < 0 or size < 0:
        raise TensorBoundsError(f"cannot {what} tensor {tensor.name!r}: negative offset {offset} or size {size}")
    if offset + size > tensor.nbytes():
        raise TensorBoundsError(f"cannot {what} tensor {tensor.name!r}: offset {offset} + size {size} "
                                f"is past its {tensor.nbytes()} bytes (tensor {what} out of bounds)")
    return buf


def _as_bytes(data: Any) -> np.ndarray:
    """A flat uint8 view of any bytes-like or numpy input (no copy when already contiguous)."""
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)


def _as_writable_bytes(data: Any) -> np.ndarray:
    if isinstance(data, np.ndarray):
        if not data.flags.c_contiguous:
            raise BackendError("the destination array must be C-contiguous")
        flat = data.reshape(-1).view(np.uint8)
    else:
        flat = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    if not flat.flags.writeable:
        raise BackendError("the destination for tensor data must be writable")
    return flat


def backend_tensor_set(tensor: Tensor, data: Any, offset: int = 0, size: int | None = None) -> None:
    """ggml_backend_tensor_set: write ``size`` bytes of ``data`` into the tensor at ``offset``.

    ``size`` defaults to all of ``data``; a size of 0 does nothing, even for an unallocated
    tensor, exactly as in ggml.
    """
    src = _as_bytes(data)
    size = src.size if size is None else int(size)
    if size == 0:
        return
    buf = _check_range(tensor, offset, size, "write")
    if src.size < size:
        raise TensorBoundsError(f"cannot write tensor {tensor.name!r}: {size} bytes requested but the "
                                f"source holds only {src.size}")
    buf.set_tensor(tensor, src[:size], offset, size)


def backend_tensor_get(tensor: Tensor, data: Any = None, offset: int = 0, size: int | None = None) -> np.ndarray:
    """ggml_backend_tensor_get: read ``size`` bytes at ``offset`` (default: the whole tensor).

    With ``data`` given the bytes land there (it must be writable and large enough); without,
    a new uint8 array is returned. Either way the destination is returned.
    """
    if size is None:
        size = tensor.nbytes() - offset
    size = int(size)
    out = np.empty(size, dtype=np.uint8) if data is None else _as_writable_bytes(data)
    if size == 0:
        return out if data is None else data
    buf = _check_range(tensor, offset, size, "read")
    if out.size < size:
        raise TensorBoundsError(f"cannot read tensor {tensor.name!r}: destination holds {out.size} bytes, "
                                f"{size} requested")
    buf.get_tensor(tensor, out[:size], offset, size)
    return out if data is None else data


def backend_tensor_memset(tensor: Tensor, value: int, offset: int = 0, size: int | None = None) -> None:
    """ggml_backend_tensor_memset."""
    size = tensor.nbytes() - offset if size is None else int(size)
    if size == 0:
        return
    buf = _check_range(tensor, offset, size, "write")
    buf.memset_tensor(tensor, int(value) & 0xFF, offset, size)


def backend_tensor_alloc(buffer: Buffer, tensor: Tensor, addr: int | None) -> GGMLStatus:
    """ggml_backend_tensor_alloc: place a fresh tensor at ``addr`` inside ``buffer``."""
    if tensor.buffer is not None:
        raise BackendError(f"tensor {tensor.name!r} already has a buffer")
    if tensor.data is not None:
        raise BackendError(f"tensor {tensor.name!r} already has data")
    if tensor.view_src is not None:
        raise BackendError(f"tensor {tensor.name!r} is a view; use backend_view_init")
    base = backend_buffer_get_base(buffer)
    size = backend_buffer_get_alloc_size(buffer, tensor)
    if base is None:
        if addr is not None or size > 0:
            raise BackendError(f"cannot place tensor {tensor.name!r} ({size} bytes) in an empty buffer")
    elif addr is None or addr < base or addr + size > base + buffer.size:
        where = "None" if addr is None else f"offset {addr - base}"
        raise BackendError(f"tensor {tensor.name!r} ({size} bytes) at {where} does not fit in buffer "
                           f"{buffer.name()!r} of {buffer.size} bytes")
    tensor.buffer = buffer
    tensor.data = addr
    return buffer.init_tensor(tensor)


def backend_view_init(tensor: Tensor) -> GGMLStatus:
    """ggml_backend_view_init: a view takes its source's buffer and data + view_offs."""
    if tensor.buffer is not None:
        raise BackendError(f"view {tensor.name!r} already has a buffer")
    vs = tensor.view_src
    if vs is None:
        raise BackendError(f"tensor {tensor.name!r} is not a view")
    if vs.buffer is None:
        raise BufferNotSetError(f"view {tensor.name!r}: its source {vs.name!r} has no buffer")
    if vs.data is None:
        raise NoDataError(f"view {tensor.name!r}: its source {vs.name!r} is not allocated")
    tensor.buffer = vs.buffer
    tensor.data = vs.data + tensor.view_offs
    return vs.buffer.init_tensor(tensor)


def _host_bytes(tensor: Tensor) -> np.ndarray:
    assert tensor.data is not None
    return memory.region_view(tensor.data, tensor.nbytes())


def backend_tensor_copy(src: Tensor, dst: Tensor) -> None:
    """ggml_backend_tensor_copy: host side first, then the buffer's own copy, then a bounce."""
    if not are_same_layout(src, dst):
        raise LayoutMismatchError(f"cannot copy tensors with different layouts: {src.name!r} "
                                  f"({src.type.name} ne={src.ne} nb={src.nb}) -> {dst.name!r} "
                                  f"({dst.type.name} ne={dst.ne} nb={dst.nb})")
    if src is dst:
        return
    src_buf = _buffer_of(src, "copy from")
    dst_buf = _buffer_of(dst, "copy into")
    nbytes = src.nbytes()
    if src_buf.is_host():
        if src.data is None:
            raise NoDataError(f"cannot copy from tensor {src.name!r}: tensor not allocated")
        backend_tensor_set(dst, _host_bytes(src), 0, nbytes)
    elif dst_buf.is_host():
        if dst.data is None:
            raise NoDataError(f"cannot copy into tensor {dst.name!r}: tensor not allocated")
        backend_tensor_get(src, _host_bytes(dst), 0, nbytes)
    elif not dst_buf.cpy_tensor(src, dst):
        tmp = backend_tensor_get(src, None, 0, nbytes)
        backend_tensor_set(dst, tmp, 0, nbytes)


def backend_tensor_copy_async(backend_src: Backend, backend_dst: Backend, src: Tensor, dst: Tensor) -> None:
    """ggml_backend_tensor_copy_async: the destination backend's async copy, else sync + copy."""
    if not are_same_layout(src, dst):
        raise LayoutMismatchError(f"cannot copy tensors with different layouts: {src.name!r} -> {dst.name!r}")
    if src is dst:
        return
    if backend_dst.cpy_tensor_async(backend_src, src, dst):
        return
    backend_src.synchronize()
    backend_dst.synchronize()
    backend_tensor_copy(src, dst)


# ------------------------------------------------------------------ backend (stream)
def backend_guid(backend: Backend | None) -> bytes | None:
    return None if backend is None else backend.guid


def backend_name(backend: Backend | None) -> str:
    return "NULL" if backend is None else backend.name()


def backend_free(backend: Backend | None) -> None:
    if backend is not None:
        backend.free()


def backend_get_default_buffer_type(backend: Backend) -> BufferType:
    return backend.get_default_buffer_type()


def backend_alloc_buffer(backend: Backend, size: int) -> Buffer:
    return backend_buft_alloc_buffer(backend.get_default_buffer_type(), size)


def backend_get_alignment(backend: Backend) -> int:
    return backend.get_default_buffer_type().get_alignment()


def backend_get_max_size(backend: Backend) -> int:
    return backend.get_default_buffer_type().get_max_size()


def backend_tensor_set_async(backend: Backend, tensor: Tensor, data: Any, offset: int = 0,
                             size: int | None = None) -> None:
    src = _as_bytes(data)
    size = src.size if size is None else int(size)
    if tensor.data is None:
        raise NoDataError(f"cannot write tensor {tensor.name!r}: tensor not allocated")
    if offset + size > tensor.nbytes():
        raise TensorBoundsError(f"cannot write tensor {tensor.name!r}: offset {offset} + size {size} "
                                f"is past its {tensor.nbytes()} bytes (tensor write out of bounds)")
    if backend.set_tensor_async is None:  # ggml: a backend without the async setter is written synchronously
        backend_tensor_set(tensor, src, offset, size)
    else:
        backend.set_tensor_async(tensor, src, offset, size)


def backend_tensor_get_async(backend: Backend, tensor: Tensor, data: Any, offset: int = 0,
                             size: int | None = None) -> None:
    size = tensor.nbytes() - offset if size is None else int(size)
    if tensor.data is None:
        raise NoDataError(f"cannot read tensor {tensor.name!r}: tensor not allocated")
    if offset + size > tensor.nbytes():
        raise TensorBoundsError(f"cannot read tensor {tensor.name!r}: offset {offset} + size {size} "
                                f"is past its {tensor.nbytes()} bytes (tensor read out of bounds)")
    if backend.get_tensor_async is None:
        backend_tensor_get(tensor, data, offset, size)
    else:
        backend.get_tensor_async(tensor, _as_writable_bytes(data), offset, size)


def backend_synchronize(backend: Backend) -> None:
    backend.synchronize()


def backend_graph_compute_async(backend: Backend, graph: Graph) -> GGMLStatus:
    return backend.graph_compute(graph)


def backend_graph_compute(backend: Backend, graph: Graph) -> GGMLStatus:
    status = backend.graph_compute(graph)
    backend.synchronize()
    return status


def backend_supports_op(backend: Backend, op: Tensor) -> bool:
    return backend.supports_op(op)


def backend_supports_buft(backend: Backend, buft: BufferType) -> bool:
    return backend.supports_buft(buft)


def backend_offload_op(backend: Backend, op: Tensor) -> bool:
    return backend.offload_op(op)


def backend_get_device(backend: Backend) -> Device | None:
    return backend.device


# ------------------------------------------------------------------ events
def backend_event_new(device: Device | None) -> Event | None:
    return None if device is None else device.event_new()


def backend_event_free(event: Event | None) -> None:
    if event is not None:
        event.device.event_free(event)


def backend_event_record(event: Event, backend: Backend) -> None:
    backend.event_record(event)


def backend_event_synchronize(event: Event) -> None:
    event.device.event_synchronize(event)


def backend_event_wait(backend: Backend, event: Event) -> None:
    backend.event_wait(event)


# ------------------------------------------------------------------ device
def backend_dev_name(device: Device) -> str:
    return device.name()


def backend_dev_description(device: Device) -> str:
    return device.description()


def backend_dev_memory(device: Device) -> tuple[int, int]:
    return device.memory()


def backend_dev_type(device: Device) -> DeviceType:
    return device.type()


def backend_dev_get_props(device: Device) -> DeviceProps:
    return device.props()


def backend_dev_backend_reg(device: Device) -> Registry | None:
    return device.reg


def backend_dev_init(device: Device, params: str | None = None) -> Backend:
    return device.init_backend(params)


def backend_dev_buffer_type(device: Device) -> BufferType:
    return device.get_buffer_type()


def backend_dev_host_buffer_type(device: Device) -> BufferType | None:
    return device.get_host_buffer_type()


def backend_dev_buffer_from_host_ptr(device: Device, ptr: int, size: int, max_tensor_size: int) -> Buffer:
    return device.buffer_from_host_ptr(ptr, size, max_tensor_size)


def backend_dev_supports_op(device: Device, op: Tensor) -> bool:
    return device.supports_op(op)


def backend_dev_supports_buft(device: Device, buft: BufferType) -> bool:
    return device.supports_buft(buft)


def backend_dev_offload_op(device: Device, op: Tensor) -> bool:
    return device.offload_op(op)


# ------------------------------------------------------------------ registry
def backend_reg_name(reg: Registry) -> str:
    return reg.name()


def backend_reg_dev_count(reg: Registry) -> int:
    return reg.device_count()


def backend_reg_dev_get(reg: Registry, index: int) -> Device:
    return reg.device(index)


def backend_reg_get_proc_address(reg: Registry, name: str) -> Any:
    return reg.get_proc_address(name)


# ------------------------------------------------------------------ global registry (ggml-backend-reg.cpp)
# One registry for the process lives in registry.py (built-ins plus entry-point plugins).
from .registry import (  # noqa: E402, F401  (re-exported)
    backend_dev_by_name,
    backend_dev_by_type,
    backend_dev_count,
    backend_dev_get,
    backend_device_register,
    backend_devices,
    backend_init_best,
    backend_init_by_name,
    backend_init_by_type,
    backend_load,
    backend_load_all,
    backend_reg_by_name,
    backend_reg_count,
    backend_reg_get,
    backend_register,
    backend_unload,
)

__all__ += [n for n, v in list(globals().items()) if n.startswith("backend_") and callable(v) and n not in __all__]
