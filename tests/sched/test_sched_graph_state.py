"""Saved graph states (BackendSched.save_graph_state / restore_graph_state): several graphs, each split over
a GPU-like device and the CPU with copied split inputs, allocated once and run again in turn; a state whose
compute buffers were replaced since is refused."""

from __future__ import annotations

import numpy as np
import pytest

import pyggml as g
from helpers.backend_run import read, to_bytes
from helpers.data import normal_f32
from helpers.opcheck import NMSE_MATMUL, assert_close
from helpers.sched_world import World, reference
from pyggml import sched as S
from pyggml.backend import api
from pyggml.backend.cpu.backend import backend_cpu_init
from pyggml.types import GGMLType as T

rng = np.random.default_rng(7)
_r = normal_f32(rng)

WEIGHTS = {"w1": (T.Q4_K, [256, 32], _r(32, 256)), "w2": (T.F32, [32, 16], _r(16, 32)),
           "w3": (T.F16, [16, 8], _r(8, 16))}


def build(ctx, t):
    """device -> CPU -> device: three splits, each with inputs copied from the previous one."""
    h = g.rms_norm(ctx, g.mul_mat(ctx, t["w1"], t["x"]), 1e-6).set_name("hn")
    o = g.unary(ctx, g.mul_mat(ctx, t["w2"], h), g.UnaryOp.HARDSWISH).set_name("os")  # CPU only
    return g.add(ctx, g.mul_mat(ctx, t["w3"], g.scale(ctx, o, 0.5)), t["bias"]).set_name("out")


def _inputs(n: int) -> dict:
    return {"x": (T.F32, [256, n], _r(n, 256)), "bias": (T.F32, [8, n], _r(n, 8))}


def _set(ts: dict, inputs: dict) -> None:
    for name, (ty, ne, values) in inputs.items():
        api.backend_tensor_set(ts[name], to_bytes(ty, values, ne[0]))


def test_saved_graphs_run_again_in_turn(second) -> None:
    cpu = backend_cpu_init()
    world = World(WEIGHTS, {"w1": second, "w2": cpu, "w3": second})
    sched = S.backend_sched_new([second, cpu], None, 256, False, True)
    graphs = {}
    for n in (5, 2):  # the larger first, so the second fits the buffers the first sized
        inputs = _inputs(n)
        gf, ts, out = world.build(sched, build, inputs)
        assert sched.graph_compute(gf) == 0
        assert_close(read(out), reference(WEIGHTS, build, inputs), NMSE_MATMUL)
        assert [len(s.inputs) for s in sched.splits][1:] != [0, 0]  # splits with copied inputs
        graphs[n] = (gf, ts, out, sched.save_graph_state())
    assert graphs[5][3].alloc_generation == graphs[2][3].alloc_generation
    for n in (5, 2, 5, 2):
        gf, ts, out, state = graphs[n]
        assert sched.restore_graph_state(state)
        assert sched.graph is state.graph_copy and sched.is_alloc
        inputs = _inputs(n)
        _set(ts, inputs)
        assert sched.graph_compute(gf) == 0
        assert_close(read(out), reference(WEIGHTS, build, inputs), NMSE_MATMUL)
        # a reset (as before building another graph) leaves the saved placements alone
        sched.reset()
        assert state.assign.get(gf.nodes[-1]) == sched.backend_id(second)
        assert sched.assign.get(gf.nodes[-1]) == -1


def test_a_state_placed_in_replaced_buffers_is_refused(second) -> None:
    cpu = backend_cpu_init()
    world = World(WEIGHTS, {"w1": second, "w2": cpu, "w3": second})
    sched = S.backend_sched_new([second, cpu], None, 256, False, True)
    world.build(sched, build, _inputs(2))
    small = sched.save_graph_state()
    generation = sched.galloc.generation
    world.build(sched, build, _inputs(40))  # needs larger compute buffers: they are replaced
    assert sched.galloc.generation > generation
    current = sched.graph
    assert not sched.restore_graph_state(small)
    assert sched.graph is current  # refused: the scheduler still holds the graph it allocated last
    sched.reset()
    with pytest.raises(S.SchedError, match="no graph is allocated"):
        sched.save_graph_state()
