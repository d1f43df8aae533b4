"""RPC overheads on loopback: pyggml client -> pyggml server (in-process thread) or any server.

    python bench/bench_rpc.py                   # starts its own server on a free port
    python bench/bench_rpc.py 127.0.0.1:50052   # or measures against a running server

Prints upload/download throughput (SET_TENSOR / GET_TENSOR), and the time of a chain graph sent
in full (GRAPH_COMPUTE) versus re-run by uid (GRAPH_RECOMPUTE), each followed by a GET_TENSOR of
the output, next to the same graph on the local CPU backend.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import pyggml as g
from pyggml.alloc import backend_alloc_ctx_tensors_from_buft, gallocr_alloc_graph, gallocr_new
from pyggml.backend import api
from pyggml.backend.base import Backend, BufferUsage
from pyggml.backend.cpu.backend import backend_cpu_init
from pyggml.context import Context
from pyggml.graph import new_graph
from pyggml.rpc.client import rpc_add_server
from pyggml.types import GGMLType as T


def best(fn, reps: int = 3) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def transfer(dev) -> None:
    n = 64 << 20
    ctx = Context(1 << 16, no_alloc=True)
    t = ctx.new_tensor(T.F32, n // 4)
    buf = backend_alloc_ctx_tensors_from_buft(ctx, dev.get_buffer_type())
    buf.set_usage(BufferUsage.COMPUTE)
    data = np.random.default_rng(0).standard_normal(n // 4).astype(np.float32)
    up = best(lambda: api.backend_tensor_set(t, data))
    down = best(lambda: api.backend_tensor_get(t))
    print(f"SET_TENSOR 64 MiB: {n / up / 2**20:8.1f} MiB/s   GET_TENSOR 64 MiB: {n / down / 2**20:8.1f} MiB/s")
    buf.free()


def chain(backend: Backend, n_nodes: int) -> tuple[float, float]:
    """(first compute, repeated compute) seconds of an n-node chain of adds/muls on 4096 floats."""
    ctx = Context(1 << 22, no_alloc=True)
    x = ctx.new_tensor(T.F32, 4096)
    w = ctx.new_tensor(T.F32, 4096)
    wbuf = backend_alloc_ctx_tensors_from_buft(ctx, backend.get_default_buffer_type())
    api.backend_tensor_set(x, np.ones(4096, np.float32))
    api.backend_tensor_set(w, np.full(4096, 0.5, np.float32))
    gctx = Context(1 << 22, no_alloc=True)
    y = x
    for i in range(n_nodes):
        y = g.add(gctx, y, w) if i % 2 else g.mul(gctx, y, w)
    gf = new_graph(gctx)
    gf.build_forward_expand(y)
    galloc = gallocr_new(backend.get_default_buffer_type())
    gallocr_alloc_graph(galloc, gf)

    def run() -> None:
        api.backend_graph_compute(backend, gf)
        api.backend_tensor_get(y, offset=0, size=16)

    t0 = time.perf_counter()
    run()
    first = time.perf_counter() - t0
    again = best(run, 5)
    wbuf.free()
    return first, again


def main() -> None:
    server = None
    if len(sys.argv) > 1:
        endpoint = sys.argv[1]
    else:
        from pyggml.rpc.server import RPCServer

        server = RPCServer([backend_cpu_init()], port=0).start()
        endpoint = server.endpoint
    dev = rpc_add_server(endpoint)[0]
    print(f"server {endpoint} ({'in-process' if server else 'external'})")
    transfer(dev)
    rpc, cpu = dev.init_backend(), backend_cpu_init()
    chain(cpu, 8)  # warm the kernels up
    for n in (10, 200):
        f, a = chain(rpc, n)
        _, la = chain(cpu, n)
        print(f"{n:4d}-node graph: RPC first (GRAPH_COMPUTE) {f * 1e3:7.1f} ms, again (GRAPH_RECOMPUTE) "
              f"{a * 1e3:7.1f} ms | local CPU {la * 1e3:7.1f} ms")
    if server is not None:
        server.stop()


if __name__ == "__main__":
    main()
