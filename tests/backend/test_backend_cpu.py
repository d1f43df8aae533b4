"""The CPU backend behind ggml-backend's interfaces: buffers, tensor data checks, devices, registry."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml import memory
from pyggml.backend import api
from pyggml.backend.base import SIZE_MAX, BufferUsage, DeviceType, DummyBuffer, GGMLStatus
from pyggml.backend.cpu.backend import (
    CPU_GUID,
    backend_cpu_buffer_type,
    backend_cpu_init,
    backend_cpu_reg,
    backend_is_cpu,
    cpu_buffer_from_ptr,
)
from pyggml.backend.errors import (
    BackendError,
    BufferNotSetError,
    LayoutMismatchError,
    NotSupportedError,
    TensorBoundsError,
)
from pyggml.backend.multi_buffer import MultiBuffer
from pyggml.context import Context
from pyggml.errors import PyGGMLError
from pyggml.tensor import NoDataError
from pyggml.types import GGMLType

F32 = GGMLType.F32


def placed(ne: tuple[int, ...], buf=None, offset: int = 0):
    """A fresh no_alloc tensor placed at ``offset`` of a (new) CPU buffer."""
    ctx = Context(1 << 16, no_alloc=True)
    t = ctx.new_tensor(F32, *ne)
    if buf is None:
        buf = backend_cpu_buffer_type().alloc_buffer(t.nbytes() + offset)
    api.backend_tensor_alloc(buf, t, api.backend_buffer_get_base(buf) + offset)
    return ctx, t, buf


def test_cpu_buffer_type_traits():
    buft = backend_cpu_buffer_type()
    assert api.backend_buft_name(buft) == "CPU"
    assert api.backend_buft_get_alignment(buft) == 32
    assert api.backend_buft_is_host(buft)
    assert api.backend_buft_get_max_size(buft) == SIZE_MAX
    assert backend_cpu_buffer_type() is buft  # one instance: the allocator compares by identity
    ctx = Context(1 << 16, no_alloc=True)
    t = ctx.new_tensor(F32, 5, 3)
    assert api.backend_buft_get_alloc_size(buft, t) == 60
    assert api.backend_buft_get_device(buft).type() == DeviceType.CPU


@pytest.mark.parametrize("size", [1, 31, 32, 33, 1000, 4097])
def test_buffers_are_32_aligned_host_memory(size):
    buf = api.backend_buft_alloc_buffer(backend_cpu_buffer_type(), size)
    base = api.backend_buffer_get_base(buf)
    assert base % 32 == 0
    assert api.backend_buffer_get_size(buf) == size and api.backend_buffer_is_host(buf)
    assert api.backend_buffer_name(buf) == "CPU" and api.backend_buffer_get_usage(buf) == BufferUsage.ANY
    region, off = memory.find_region(base, size)
    assert region.nbytes - off >= size
    api.backend_buffer_clear(buf, 0xAB)
    assert np.all(memory.region_view(base, size) == 0xAB)
    api.backend_buffer_set_usage(buf, BufferUsage.WEIGHTS)
    assert buf.usage == BufferUsage.WEIGHTS
    api.backend_buffer_free(buf)
    with pytest.raises(memory.MemoryAccessError):
        memory.find_region(base, size)


def test_zero_size_gives_a_dummy_buffer():
    buf = api.backend_buft_alloc_buffer(backend_cpu_buffer_type(), 0)
    assert isinstance(buf, DummyBuffer) and buf.size == 0
    assert api.backend_buffer_get_base(buf) is None
    api.backend_buffer_clear(buf, 1)  # a no-op, as in ggml


def test_tensor_set_get_roundtrip_with_offsets():
    _, t, _ = placed((4, 3))
    data = np.arange(12, dtype=np.float32)
    api.backend_tensor_set(t, data)
    assert np.array_equal(t.numpy(), data.reshape(3, 4))
    api.backend_tensor_set(t, np.array([-1, -2], dtype=np.float32), 8, 8)
    out = api.backend_tensor_get(t).view(np.float32)
    assert list(out[:4]) == [0, 1, -1, -2]
    part = np.zeros(3, dtype=np.float32)
    assert api.backend_tensor_get(t, part, 16, 12) is part
    assert list(part) == [4, 5, 6]
    api.backend_tensor_memset(t, 0, 0, 8)
    assert list(t.numpy().reshape(-1)[:3]) == [0, 0, -1]


def test_tensor_data_bounds_and_state_errors():
    _, t, buf = placed((4,))
    with pytest.raises(TensorBoundsError, match="out of bounds"):
        api.backend_tensor_set(t, np.zeros(4, dtype=np.float32), 4, 16)
    with pytest.raises(TensorBoundsError, match="out of bounds"):
        api.backend_tensor_get(t, None, 8, 12)
    with pytest.raises(TensorBoundsError, match="out of bounds"):
        api.backend_tensor_memset(t, 0, 0, 17)
    with pytest.raises(TensorBoundsError, match="source holds only 4"):
        api.backend_tensor_set(t, b"abcd", 0, 8)
    with pytest.raises(TensorBoundsError, match="negative"):
        api.backend_tensor_set(t, b"abcd", -4, 4)
    with pytest.raises(TensorBoundsError, match="destination holds 4"):
        api.backend_tensor_get(t, np.zeros(1, dtype=np.float32), 0, 16)
    ctx = Context(1 << 16, no_alloc=True)
    u = ctx.new_tensor(F32, 4).set_name("loose")
    with pytest.raises(BufferNotSetError, match=r"'loose'.*buffer not set"):
        api.backend_tensor_set(u, b"\0" * 16)
    api.backend_tensor_set(u, b"", 0, 0)  # size 0 is a no-op, as in ggml
    u.buffer = buf
    with pytest.raises(NoDataError, match="not allocated"):
        api.backend_tensor_get(u)
    # every error is a PyGGMLError
    assert issubclass(TensorBoundsError, PyGGMLError) and issubclass(BufferNotSetError, PyGGMLError)


def test_tensor_alloc_checks():
    buf = backend_cpu_buffer_type().alloc_buffer(64)
    base = api.backend_buffer_get_base(buf)
    ctx = Context(1 << 16, no_alloc=True)
    t = ctx.new_tensor(F32, 8)
    v = ctx.view_tensor(t)  # made before t has memory: no buffer, no data yet
    with pytest.raises(BufferNotSetError, match="has no buffer"):
        api.backend_view_init(v)
    with pytest.raises(BackendError, match="does not fit"):
        api.backend_tensor_alloc(buf, t, base + 48)
    assert api.backend_tensor_alloc(buf, t, base + 32) == GGMLStatus.SUCCESS
    with pytest.raises(BackendError, match="already has a buffer"):
        api.backend_tensor_alloc(buf, t, base)
    with pytest.raises(BackendError, match="is a view"):
        api.backend_tensor_alloc(buf, v, base)
    api.backend_view_init(v)
    assert v.data == t.data and v.buffer is buf


def test_writes_through_a_view_reach_the_source():
    ctx, t, _ = placed((6,))
    v = ctx.new_tensor_impl(F32, [2], t, 8)  # a 2-element view at byte 8
    if v.buffer is None:  # ggml leaves a view's buffer unset until view_init
        api.backend_view_init(v)
    api.backend_tensor_set(v, np.array([7, 9], dtype=np.float32))
    assert list(t.numpy()) == [0, 0, 7, 9, 0, 0]


def test_tensor_copy():
    _, a, _ = placed((4, 2))
    _, b, _ = placed((4, 2))
    api.backend_tensor_set(a, np.arange(8, dtype=np.float32))
    api.backend_tensor_copy(a, b)
    assert np.array_equal(b.numpy(), a.numpy())
    _, c, _ = placed((8,))
    with pytest.raises(LayoutMismatchError, match="different layouts"):
        api.backend_tensor_copy(a, c)
    assert a.buffer.cpy_tensor(a, b)


def test_buffer_from_host_ptr_is_zero_copy():
    arr = memory.aligned_empty(256, 64)
    memory.register(arr)
    addr = memory.address_of(arr)
    buf = cpu_buffer_from_ptr(addr, 256)
    assert api.backend_buffer_name(buf) == "CPU_Mapped" and buf.is_host()
    assert api.backend_buffer_get_base(buf) == addr
    ctx = Context(1 << 16, no_alloc=True)
    t = ctx.new_tensor(F32, 4)
    api.backend_tensor_alloc(buf, t, addr + 64)
    api.backend_tensor_set(t, np.array([1, 2, 3, 4], dtype=np.float32))
    # writing through the tensor changed the original array...
    assert list(arr[64:80].view(np.float32)) == [1, 2, 3, 4]
    # ...and writing the array changes the tensor
    arr[64:68] = np.frombuffer(np.float32(42).tobytes(), dtype=np.uint8)
    assert t.numpy()[0] == 42
    # the device entry point does the same
    dev = api.backend_dev_by_type(DeviceType.CPU)
    assert api.backend_dev_get_props(dev).caps.buffer_from_host_ptr
    buf2 = api.backend_dev_buffer_from_host_ptr(dev, addr, 128, 64)
    assert buf2.name() == "CPU_Mapped" and buf2.size == 128
    buf2.free()
    buf.free()
    # the borrowed memory is still registered and intact
    assert arr[64:68].view(np.float32)[0] == 42 and memory.find_region(addr, 256)


def test_buffer_from_numpy_array_and_bad_pointers():
    arr = memory.aligned_empty(96, 64)
    buf = cpu_buffer_from_ptr(arr)  # registers the array if needed
    assert buf.size == 96
    with pytest.raises(BackendError, match="must be aligned"):
        cpu_buffer_from_ptr(memory.address_of(arr) + 4, 32)
    loose = memory.aligned_empty(64, 64)  # never registered
    with pytest.raises(BackendError, match="register"):
        cpu_buffer_from_ptr(memory.address_of(loose), 64)
    with pytest.raises(NotSupportedError):
        buf.buft.alloc_buffer(10)  # CPU_Mapped only wraps memory


def test_multi_buffer():
    parts = [backend_cpu_buffer_type().alloc_buffer(n) for n in (32, 64)]
    mb = api.backend_multi_buffer_alloc_buffer(parts)
    assert isinstance(mb, MultiBuffer) and api.backend_buffer_is_multi_buffer(mb)
    assert mb.size == 96 and mb.name() == "CPU"
    api.backend_buffer_set_usage(mb, BufferUsage.WEIGHTS)
    assert [p.usage for p in parts] == [BufferUsage.WEIGHTS] * 2
    api.backend_buffer_clear(mb, 7)
    assert all(np.all(p.array == 7) for p in parts)
    with pytest.raises(NotSupportedError):
        mb.get_base()
    mb.free()
    assert all(p.freed for p in parts)


def test_cpu_backend_device_and_registry():
    be = backend_cpu_init()
    assert api.backend_name(be) == "CPU" and backend_is_cpu(be) and api.backend_guid(be) == CPU_GUID
    assert api.backend_get_default_buffer_type(be) is backend_cpu_buffer_type()
    assert api.backend_get_alignment(be) == 32
    reg = backend_cpu_reg()
    assert api.backend_reg_name(reg) == "CPU" and api.backend_reg_dev_count(reg) == 1
    dev = api.backend_reg_dev_get(reg, 0)
    assert api.backend_dev_type(dev) == DeviceType.CPU and api.backend_dev_name(dev) == "CPU"
    free, total = api.backend_dev_memory(dev)
    assert 0 <= free <= total
    assert api.backend_dev_supports_buft(dev, backend_cpu_buffer_type())
    assert api.backend_dev_host_buffer_type(dev) is None and not api.backend_dev_offload_op(dev, None)
    assert api.backend_event_new(dev) is None  # the CPU has no events
    set_n_threads = api.backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads")
    set_n_threads(be, 3)
    assert be.n_threads == 3
    with pytest.raises(BackendError, match="n_threads"):
        set_n_threads(be, 0)
    assert api.backend_reg_get_proc_address(reg, "no_such_function") is None
    feats = dict(api.backend_reg_get_proc_address(reg, "ggml_backend_get_features")())
    assert "NUMPY" in feats
    assert backend_is_cpu(api.backend_init_best())
    assert api.backend_reg_by_name("cpu") is reg and api.backend_dev_by_type(DeviceType.CPU) is dev
    with pytest.raises(IndexError):
        api.backend_reg_dev_get(reg, 1)
    with pytest.raises(NotSupportedError):
        be.event_record(None)


def test_async_fallbacks_are_synchronous_copies():
    _, t, _ = placed((4,))
    be = backend_cpu_init()
    api.backend_tensor_set_async(be, t, np.arange(4, dtype=np.float32))
    out = np.zeros(4, dtype=np.float32)
    api.backend_tensor_get_async(be, t, out)
    api.backend_synchronize(be)
    assert list(out) == [0, 1, 2, 3]
    _, u, _ = placed((4,))
    api.backend_tensor_copy_async(be, be, t, u)
    assert list(u.numpy()) == [0, 1, 2, 3]
    with pytest.raises(TensorBoundsError):
        api.backend_tensor_set_async(be, t, np.zeros(8, dtype=np.float32))


def test_cpu_backend_computes_a_graph_in_planned_memory():
    from pyggml.alloc import gallocr_new
    from pyggml.graph import Graph
    from pyggml.ops import builders as B

    ctx = Context(1 << 16, no_alloc=True)
    a = ctx.new_tensor(F32, 3, 2)
    b = ctx.new_tensor(F32, 3, 2)
    a.set_input()
    b.set_input()
    out = B.scale(ctx, B.add(ctx, B.mul(ctx, a, b), a), 2.0)
    g = Graph()
    g.build_forward_expand(out)
    assert gallocr_new(backend_cpu_buffer_type()).alloc_graph(g)
    av, bv = np.arange(6, dtype=np.float32), np.full(6, 3, dtype=np.float32)
    api.backend_tensor_set(a, av)
    api.backend_tensor_set(b, bv)
    be = backend_cpu_init()
    assert api.backend_graph_compute(be, g) == GGMLStatus.SUCCESS
    assert np.array_equal(api.backend_tensor_get(out).view(np.float32), (av * bv + av) * 2)
