"""pyggml's RPC client backend against pyggml's RPC server on 127.0.0.1: naming, the command
choices llama.cpp's client makes, and graphs computed remotely equal to local results."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import pyggml as g
from helpers.backend_run import Inputs, run_graph, upload_inputs
from helpers.rpc_util import running_server, wait_idle
from pyggml.backend import api
from pyggml.backend.base import BufferUsage, DeviceType
from pyggml.backend.cpu.backend import backend_cpu_init
from pyggml.backend.errors import AllocationError
from pyggml.context import Context
from pyggml.graph import new_graph
from pyggml.rpc.client import parse_rpc_servers, rpc_add_server
from pyggml.rpc.protocol import RPC_GUID, Cmd, RPCError, fnv1a_64
from pyggml.types import GGMLType as T

RNG = np.random.default_rng(7)


@pytest.fixture(scope="module")
def server():
    with running_server(2) as srv:
        yield srv


@pytest.fixture(scope="module")
def rpc_backend(server):
    return rpc_add_server(server.endpoint)[0].init_backend()


# ------------------------------------------------------------------ devices and names
def test_devices_are_named_like_llama_cpp(server) -> None:
    devs = rpc_add_server(server.endpoint)
    assert len(devs) == 2
    n0 = int(devs[0].name()[3:])
    assert [d.name() for d in devs] == [f"RPC{n0}", f"RPC{n0 + 1}"]
    assert all(d.description() == server.endpoint for d in devs)
    assert rpc_add_server(server.endpoint) == devs  # the same devices, not new ones
    assert devs[1].type() == DeviceType.GPU and devs[1].props().caps.async_
    buft = devs[1].get_buffer_type()
    assert buft.name() == f"RPC1[{server.endpoint}]" and buft.get_alignment() == 32
    assert devs[1].supports_buft(buft) and not devs[0].supports_buft(buft)
    assert not devs[0].supports_buft(backend_cpu_init().get_default_buffer_type())
    backend = devs[1].init_backend()
    assert backend.name() == f"RPC1[{server.endpoint}]" and backend.guid == RPC_GUID
    free, total = devs[0].memory()
    assert 0 < free <= total
    with running_server() as other:  # a second server continues the process-wide numbering
        more = parse_rpc_servers(f"{other.endpoint}", register=False)
        assert next(d.name() for d in more) != devs[0].name()
        assert int(more[0].name()[3:]) > n0 + 1


def test_bad_endpoints_raise() -> None:
    with pytest.raises(RPCError, match="parse endpoint"):
        rpc_add_server("no-port")
    with running_server() as srv:
        port = srv.port
    with pytest.raises(RPCError, match="failed to connect"):
        rpc_add_server(f"127.0.0.1:{port}")
    with pytest.raises(RPCError, match="no RPC servers"):
        parse_rpc_servers(" , ")


def test_allocation_failure_and_buffers_freed_on_drop() -> None:
    with running_server(memory_limit=1 << 20) as srv:
        dev = rpc_add_server(srv.endpoint)[0]
        buft = dev.get_buffer_type()
        with pytest.raises(AllocationError, match="could not allocate"):
            buft.alloc_buffer(2 << 20)
        bufs = [buft.alloc_buffer(1000) for _ in range(3)]
        assert srv.live_buffers == 3
        bufs[0].free()
        assert dev.memory() == ((1 << 20) - 2000, 1 << 20)  # FREE_BUFFER has no reply: this syncs
        assert srv.live_buffers == 2
        served = srv.clients_served
        conn = bufs[1].conn
        conn.sock.close()  # the client vanishes without freeing: the server frees for it
        wait_idle(srv, served)
        assert srv.live_buffers == 0 and srv.allocated == 0
        del bufs, conn
        gc.collect()


# ------------------------------------------------------------------ remote == local
def _compare(backend, inputs: Inputs, build) -> None:
    remote = run_graph(backend, inputs, build)
    local = run_graph(backend_cpu_init(), inputs, build)
    assert remote.shape == local.shape
    np.testing.assert_array_equal(remote, local)  # the same kernels on both sides: bit-identical
    assert np.isfinite(local).all() and np.abs(local).sum() > 0


def test_elementwise(rpc_backend) -> None:
    inputs = {"a": (T.F32, [16, 3], RNG.standard_normal((3, 16))), "b": (T.F32, [16, 1], RNG.standard_normal((1, 16)))}
    _compare(rpc_backend, inputs, lambda ctx, t: g.mul(ctx, g.add(ctx, t["a"], t["b"]), g.silu(ctx, t["a"])))


@pytest.mark.parametrize("wtype", [T.Q4_K, T.Q8_0, T.F16])
def test_matmul_with_quantized_weight(rpc_backend, wtype) -> None:
    inputs = {"w": (wtype, [256, 24], RNG.standard_normal((24, 256))),
              "x": (T.F32, [256, 5], RNG.standard_normal((5, 256)))}
    _compare(rpc_backend, inputs, lambda ctx, t: g.mul_mat(ctx, t["w"], t["x"]))


def test_rope(rpc_backend) -> None:
    inputs = {"x": (T.F32, [64, 4, 6], RNG.standard_normal((6, 4, 64))), "pos": (T.I32, [6], np.arange(6) * 3)}
    _compare(rpc_backend, inputs, lambda ctx, t: g.rope_ext(ctx, t["x"], t["pos"], None, 64, 2, 4096, 10000.0, 1.0,
                                                             0.0, 1.0, 32.0, 1.0))


def test_softmax_with_mask_and_views(rpc_backend) -> None:
    mask = np.triu(np.full((8, 8), -np.inf), 1)
    inputs = {"s": (T.F32, [8, 8, 2], RNG.standard_normal((2, 8, 8))), "m": (T.F32, [8, 8], mask),
              "x": (T.F32, [8, 4, 3], RNG.standard_normal((3, 4, 8)))}

    def build(ctx, t):
        sm = g.soft_max_ext(ctx, t["s"], t["m"], 0.125, 0.0)
        xt = g.cont(ctx, g.permute(ctx, t["x"], 1, 0, 2, 3))  # a view, then a copy: views travel as views
        return g.add(ctx, g.sum_rows(ctx, sm), g.sum_rows(ctx, g.view_3d(ctx, xt, 1, 2, 2, xt.nb[1], xt.nb[2], 0)))

    _compare(rpc_backend, inputs, build)


def test_norm_and_get_rows(rpc_backend) -> None:
    inputs = {"e": (T.Q8_0, [64, 10], RNG.standard_normal((10, 64))), "ids": (T.I32, [4], np.array([3, 0, 9, 3])),
              "w": (T.F32, [64], RNG.standard_normal(64))}
    _compare(rpc_backend, inputs, lambda ctx, t: g.mul(ctx, g.rms_norm(ctx, g.get_rows(ctx, t["e"], t["ids"]), 1e-6),
                                                       t["w"]))


# ------------------------------------------------------------------ what goes on the wire
def test_same_graph_again_is_a_recompute(server, rpc_backend) -> None:
    inputs = {"a": (T.F32, [8], np.arange(8.0)), "b": (T.F32, [8], np.ones(8))}
    _, t = upload_inputs(rpc_backend, inputs, BufferUsage.COMPUTE)
    ctx = Context(1 << 20, no_alloc=True)
    out = g.add(ctx, t["a"], t["b"])
    gf = new_graph(ctx)
    gf.build_forward_expand(out)
    from pyggml.alloc import gallocr_alloc_graph, gallocr_new

    galloc = gallocr_new(rpc_backend.get_default_buffer_type())
    assert gallocr_alloc_graph(galloc, gf)
    counts = server.command_counts
    c0, r0 = counts[Cmd.GRAPH_COMPUTE], counts[Cmd.GRAPH_RECOMPUTE]
    api.backend_graph_compute(rpc_backend, gf)
    assert np.frombuffer(api.backend_tensor_get(out), np.float32).tolist() == list(np.arange(8.0) + 1)
    api.backend_tensor_set(t["b"], np.full(8, 10, np.float32))
    api.backend_graph_compute(rpc_backend, gf)
    assert np.frombuffer(api.backend_tensor_get(out), np.float32).tolist() == list(np.arange(8.0) + 10)
    assert (counts[Cmd.GRAPH_COMPUTE] - c0, counts[Cmd.GRAPH_RECOMPUTE] - r0) == (1, 1)


def test_big_weights_go_through_the_hash_cache(tmp_path) -> None:
    n = (10 << 20) // 4 + 256  # just over the 10 MiB threshold
    values = RNG.standard_normal(n).astype(np.float32)
    with running_server(cache_dir=tmp_path) as srv:
        dev = rpc_add_server(srv.endpoint)[0]
        for attempt in range(2):
            ctx = Context(1 << 16, no_alloc=True)
            w = ctx.new_tensor(T.F32, n)
            from pyggml.alloc import backend_alloc_ctx_tensors_from_buft

            buf = backend_alloc_ctx_tensors_from_buft(ctx, dev.get_buffer_type())
            buf.set_usage(BufferUsage.WEIGHTS)
            sets, hashes = srv.command_counts[Cmd.SET_TENSOR], srv.command_counts[Cmd.SET_TENSOR_HASH]
            api.backend_tensor_set(w, values)
            assert np.array_equal(np.frombuffer(api.backend_tensor_get(w), np.float32), values)
            assert srv.command_counts[Cmd.SET_TENSOR_HASH] - hashes == 1
            assert srv.command_counts[Cmd.SET_TENSOR] - sets == (1 if attempt == 0 else 0)
            buf.free()
        assert [p.name for p in tmp_path.iterdir()] == [f"{fnv1a_64(values.tobytes()):016x}"]
        # compute buffers never hash
        ctx = Context(1 << 16, no_alloc=True)
        w = ctx.new_tensor(T.F32, n)
        buf = backend_alloc_ctx_tensors_from_buft(ctx, dev.get_buffer_type())
        buf.set_usage(BufferUsage.COMPUTE)
        hashes = srv.command_counts[Cmd.SET_TENSOR_HASH]
        api.backend_tensor_set(w, values[::-1].copy())
        api.backend_tensor_get(w, offset=0, size=4)
        assert srv.command_counts[Cmd.SET_TENSOR_HASH] == hashes
        buf.free()


def test_memset_copy_clear_through_the_api(rpc_backend) -> None:
    _, t = upload_inputs(rpc_backend, {"a": (T.F32, [8], np.arange(8.0)), "b": (T.F32, [8], np.zeros(8))})
    assert api.backend_buffer_copy_tensor(t["a"], t["b"])
    assert np.frombuffer(api.backend_tensor_get(t["b"]), np.float32).tolist() == list(np.arange(8.0))
    api.backend_tensor_memset(t["b"], 0, 4, 8)
    assert np.frombuffer(api.backend_tensor_get(t["b"]), np.float32).tolist() == [0, 0, 0, 3, 4, 5, 6, 7]
    t["a"].buffer.clear(0)
    assert not api.backend_tensor_get(t["a"]).any()
