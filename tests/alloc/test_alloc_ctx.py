"""ggml_tallocr and ggml_backend_alloc_ctx_tensors*: weights laid out linearly, split at the max size."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml.alloc import (
    backend_alloc_ctx_tensors,
    backend_alloc_ctx_tensors_from_buft,
    backend_alloc_ctx_tensors_from_buft_size,
    tallocr_alloc,
    tallocr_new,
)
from pyggml.backend import api
from pyggml.backend.cpu.backend import CPUBufferType, backend_cpu_buffer_type, backend_cpu_init
from pyggml.backend.errors import AllocationError, BackendError
from pyggml.backend.multi_buffer import MultiBuffer
from pyggml.context import Context
from pyggml.types import GGMLType

F32 = GGMLType.F32


class SmallCPU(CPUBufferType):
    """CPU memory whose buffers may not exceed 256 bytes."""

    def get_max_size(self) -> int:
        return 256


def test_tallocr_places_tensors_back_to_back_aligned():
    buf = backend_cpu_buffer_type().alloc_buffer(128)
    base = api.backend_buffer_get_base(buf)
    talloc = tallocr_new(buf)
    ctx = Context(1 << 16, no_alloc=True)
    a, b, c = ctx.new_tensor(F32, 3), ctx.new_tensor(F32, 8), ctx.new_tensor(F32, 16)
    tallocr_alloc(talloc, a)  # 12 B -> a 32-byte slot
    talloc.alloc(b)  # 32 B
    assert (a.data - base, b.data - base, talloc.offset) == (0, 32, 64)
    tallocr_alloc(talloc, c)  # 64 B: exactly fills the buffer
    assert c.data - base == 64 and talloc.offset == 128


def test_tallocr_error_reports_sizes():
    buf = backend_cpu_buffer_type().alloc_buffer(64)
    talloc = tallocr_new(buf)
    ctx = Context(1 << 16, no_alloc=True)
    big = ctx.new_tensor(F32, 17).set_name("big")
    with pytest.raises(AllocationError, match=r"'big' \(needed 96, available 64\)"):
        tallocr_alloc(talloc, big)


def test_alloc_ctx_tensors_in_one_buffer_with_views():
    ctx = Context(1 << 16, no_alloc=True)
    a = ctx.new_tensor(F32, 5)  # 20 -> 32
    b = ctx.new_tensor(F32, 4, 4)  # 64
    v = ctx.new_tensor_impl(F32, [4], b, 16)  # a view of b's second row
    c = ctx.new_tensor(GGMLType.F16, 3)  # 6 -> 32
    assert backend_alloc_ctx_tensors_from_buft_size(ctx, backend_cpu_buffer_type()) == 128
    buf = backend_alloc_ctx_tensors(ctx, backend_cpu_init())
    base = api.backend_buffer_get_base(buf)
    assert buf.size == 128 and [t.data - base for t in (a, b, v, c)] == [0, 32, 48, 96]
    assert v.buffer is buf
    api.backend_tensor_set(b, np.arange(16, dtype=np.float32))
    assert list(v.numpy()) == [4, 5, 6, 7]
    # everything has memory now: nothing more to allocate, ggml returns NULL
    assert backend_alloc_ctx_tensors_from_buft(ctx, backend_cpu_buffer_type()) is None


def test_alloc_ctx_tensors_split_at_max_size():
    ctx = Context(1 << 16, no_alloc=True)
    ts = [ctx.new_tensor(F32, n) for n in (24, 24, 10, 50, 70)]  # 96, 96, 40->64, 200->224, 280->288
    buft = SmallCPU()
    # running sums with a 256 cap: 96+96=192, +64=256 (fits exactly), +224 -> new buffer,
    # +288 -> new buffer (a tensor bigger than the cap still gets its own buffer)
    assert backend_alloc_ctx_tensors_from_buft_size(ctx, buft) == 256 + 224 + 288
    mb = backend_alloc_ctx_tensors_from_buft(ctx, buft)
    assert isinstance(mb, MultiBuffer)
    assert [p.size for p in mb.parts] == [256, 224, 288] and mb.size == 768
    assert [t.buffer is mb.parts[i] for t, i in zip(ts, (0, 0, 0, 1, 2), strict=True)] == [True] * 5
    assert ts[2].data - api.backend_buffer_get_base(mb.parts[0]) == 192


def test_alloc_ctx_tensors_needs_a_no_alloc_context():
    ctx = Context(1 << 16)
    ctx.new_tensor(F32, 4)
    with pytest.raises(BackendError, match="no_alloc"):
        backend_alloc_ctx_tensors_from_buft(ctx, backend_cpu_buffer_type())


def test_empty_context_allocates_nothing():
    ctx = Context(1 << 16, no_alloc=True)
    assert backend_alloc_ctx_tensors_from_buft(ctx, backend_cpu_buffer_type()) is None
    assert backend_alloc_ctx_tensors_from_buft_size(ctx, backend_cpu_buffer_type()) == 0
