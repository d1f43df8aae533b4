"""TWIN, the scheduler tests' second device (tests/helpers/twin.py), does what those tests rely on:
it computes what the CPU computes, its memory is unreachable from the host except through the
backend API, and it declines the ops it is meant to lack."""

from __future__ import annotations

import numpy as np
import pytest

import pyggml as g
from helpers.backend_run import read, run_graph, upload_inputs
from helpers.data import normal_f32
from helpers.opcheck import NMSE_MATMUL, assert_close
from helpers.twin import twin_init
from pyggml import memory
from pyggml.backend import api
from pyggml.backend.cpu.backend import backend_cpu_init
from pyggml.context import Context
from pyggml.graph import new_graph
from pyggml.tensor import NoDataError
from pyggml.types import GGMLType as T

_r = normal_f32(np.random.default_rng(5))


def _mlp(ctx, t):
    h = g.mul_mat(ctx, t["w"], t["x"])
    return g.add(ctx, g.unary(ctx, h, g.UnaryOp.SILU), h)


def test_computes_what_the_cpu_computes() -> None:
    inputs = {"w": (T.Q8_0, [64, 16], _r(16, 64)), "x": (T.F32, [64, 5], _r(5, 64))}
    twin = twin_init()
    got = run_graph(twin, inputs, _mlp)
    assert_close(got, run_graph(backend_cpu_init(), inputs, _mlp), NMSE_MATMUL)
    assert len(twin.computed) == 3  # it really ran the nodes (mul_mat, silu, add)


def test_memory_is_not_host_memory() -> None:
    twin = twin_init()
    values = _r(2, 8)
    _, ts = upload_inputs(twin, {"a": (T.F32, [8, 2], values)})
    a = ts["a"]
    assert not a.buffer.is_host() and not a.buffer.get_type().is_host()
    # the backend API moves the bytes ...
    assert np.array_equal(api.backend_tensor_get(a).view(np.float32).reshape(2, 8), values)
    # ... and nothing else reaches them: not the tensor's host view, not the address
    with pytest.raises(NoDataError, match="non-host buffer 'TWIN'"):
        a.view4()
    with pytest.raises(memory.MemoryAccessError):
        memory.region_view(a.data, a.nbytes())


def test_the_cpu_cannot_compute_on_twin_tensors() -> None:
    """A CPU backend handed a graph of TWIN tensors (a scheduler bug that skipped a copy) does not get
    TWIN's values, even right after TWIN computed that graph: the Python kernels fail, the compiled ones
    (which read raw addresses) read NaN."""
    twin = twin_init()
    _, ts = upload_inputs(twin, {"a": (T.F32, [8, 2], _r(2, 8))})
    ctx = Context(1 << 20, no_alloc=True)
    out = g.scale(ctx, ts["a"], 2.0)
    gf = new_graph(ctx)
    gf.build_forward_expand(out)
    from pyggml.alloc import gallocr_alloc_graph, gallocr_new

    assert gallocr_alloc_graph(gallocr_new(twin.get_default_buffer_type()), gf)
    assert api.backend_graph_compute(twin, gf) == 0
    want = read(out)
    assert_close(want, 2.0 * read(ts["a"]))
    try:
        api.backend_graph_compute(backend_cpu_init(), gf)
    except (NoDataError, memory.MemoryAccessError):
        pass
    else:  # the compiled kernel ran on the window: it read NaN and wrote NaN
        start = out.data - out.buffer.get_base()
        assert np.isnan(out.buffer.window[start : start + out.nbytes()].view(np.float32)).all()
    assert np.array_equal(read(out), want)  # and nothing it did reached TWIN's bytes


def test_declines_what_a_small_gpu_backend_lacks() -> None:
    twin = twin_init()
    ctx = Context(1 << 20, no_alloc=True)
    x = ctx.new_tensor(T.F32, 8, 4)
    sinks = ctx.new_tensor(T.F32, 1)  # one per head (ne2)
    hs = g.unary(ctx, x, g.UnaryOp.HARDSWISH)
    sm = g.soft_max_ext(ctx, x, None, 1.0, 0.0)
    sm_sinks = g.soft_max_ext(ctx, x, None, 1.0, 0.0)
    g.soft_max_add_sinks(sm_sinks, sinks)
    assert twin.supports_op(g.unary(ctx, x, g.UnaryOp.SILU)) and twin.supports_op(sm)
    assert not twin.supports_op(hs) and not twin.supports_op(sm_sinks)
    assert not twin.supports_op(g.sum_rows(ctx, x))  # not in its op set at all
    assert not twin.supports_buft(backend_cpu_init().get_default_buffer_type())
    # it takes big batches whose weights sit in host memory, as ggml's GPU backends do
    w = ctx.new_tensor(T.F32, 8, 8)
    assert twin.offload_op(g.mul_mat(ctx, w, ctx.new_tensor(T.F32, 8, 32)))
    assert not twin.offload_op(g.mul_mat(ctx, w, ctx.new_tensor(T.F32, 8, 31)))
