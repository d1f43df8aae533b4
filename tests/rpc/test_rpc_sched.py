"""Two RPC servers and the CPU under the scheduler: a graph split across both servers computes
what the CPU alone computes, and re-running it sends GRAPH_RECOMPUTE to each server."""

from __future__ import annotations

import numpy as np

import pyggml as g
from helpers.backend_run import run_graph, upload_inputs
from helpers.rpc_util import running_server
from pyggml.backend import api
from pyggml.backend.cpu.backend import backend_cpu_init
from pyggml.context import Context
from pyggml.graph import new_graph
from pyggml.rpc.client import parse_rpc_servers
from pyggml.rpc.protocol import Cmd
from pyggml.sched import backend_sched_graph_compute, backend_sched_new
from pyggml.types import GGMLType as T


def test_graph_split_over_two_servers_equals_cpu() -> None:
    rng = np.random.default_rng(3)
    w0v, w1v, xv = rng.standard_normal((32, 64)), rng.standard_normal((16, 32)), rng.standard_normal((3, 64))
    with running_server() as s1, running_server() as s2:
        d1, d2 = parse_rpc_servers(f"{s1.endpoint},{s2.endpoint}", register=False)
        b1, b2 = d1.init_backend(), d2.init_backend()
        _, w0 = upload_inputs(b1, {"w0": (T.Q8_0, [64, 32], w0v)})
        _, w1 = upload_inputs(b2, {"w1": (T.F32, [32, 16], w1v)})
        ctx = Context(1 << 20, no_alloc=True)
        x = ctx.new_tensor(T.F32, 64, 3)
        x.set_input()
        y = g.mul_mat(ctx, w1["w1"], g.relu(ctx, g.mul_mat(ctx, w0["w0"], x)))
        y.set_output()
        gf = new_graph(ctx)
        gf.build_forward_expand(y)
        sched = backend_sched_new([b1, b2, backend_cpu_init()], None, 2048, False, True)
        assert sched.alloc_graph(gf)
        api.backend_tensor_set(x, xv.astype(np.float32))
        backend_sched_graph_compute(sched, gf)
        remote = np.frombuffer(api.backend_tensor_get(y), np.float32).reshape(1, 1, 3, 16)
        assert s1.command_counts[Cmd.GRAPH_COMPUTE] == 1 and s2.command_counts[Cmd.GRAPH_COMPUTE] == 1
        backend_sched_graph_compute(sched, gf)
        again = np.frombuffer(api.backend_tensor_get(y), np.float32).reshape(1, 1, 3, 16)  # also the sync point
        assert s1.command_counts[Cmd.GRAPH_RECOMPUTE] == 1 and s2.command_counts[Cmd.GRAPH_RECOMPUTE] == 1
    local = run_graph(backend_cpu_init(), {"w0": (T.Q8_0, [64, 32], w0v), "w1": (T.F32, [32, 16], w1v),
                                           "x": (T.F32, [64, 3], xv)},
                      lambda c, t: g.mul_mat(c, t["w1"], g.relu(c, g.mul_mat(c, t["w0"], t["x"]))))
    np.testing.assert_array_equal(remote, local)
    np.testing.assert_array_equal(again, local)
