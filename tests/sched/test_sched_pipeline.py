"""Pipeline mode (parallel: GGML_SCHED_MAX_COPIES rotating input copies and events) and the eval
callback protocol, on a GPU-like device (TWIN, or torch; see conftest) + CPU."""

from __future__ import annotations

import numpy as np

import pyggml as g
from helpers.backend_run import from_bytes, read
from helpers.data import normal_f32
from helpers.opcheck import NMSE_MATMUL, assert_close
from helpers.sched_world import World, reference
from pyggml import sched as S
from pyggml.backend import api
from pyggml.backend.cpu.backend import backend_cpu_init
from pyggml.ops.enums import VIEW_OPS
from pyggml.types import GGMLType as T

rng = np.random.default_rng(3)
_r = normal_f32(rng)


WEIGHTS = {"w1": (T.Q4_K, [256, 32], _r(32, 256)), "w2": (T.F32, [32, 16], _r(16, 32)),
           "w3": (T.F16, [16, 8], _r(8, 16))}


def build(ctx, t):
    """device -> CPU -> device: three splits, each with inputs from the previous one."""
    h = g.mul_mat(ctx, t["w1"], t["x"]).set_name("h")
    h = g.rms_norm(ctx, h, 1e-6).set_name("hn")
    o = g.mul_mat(ctx, t["w2"], h).set_name("o")
    o = g.unary(ctx, o, g.UnaryOp.HARDSWISH).set_name("os")  # not on the device: stays on the CPU
    z = g.mul_mat(ctx, t["w3"], g.scale(ctx, o, 0.5).set_name("oz")).set_name("z")
    return g.add(ctx, z, t["bias"]).set_name("out")


def _world(tb):
    cpu = backend_cpu_init()
    return tb, cpu, World(WEIGHTS, {"w1": tb, "w2": cpu, "w3": tb})


def _inputs(n: int) -> dict:
    return {"x": (T.F32, [256, n], _r(n, 256)), "bias": (T.F32, [8, n], _r(n, 8))}


def test_pipeline_parallel_repeated_runs(second) -> None:
    tb, cpu, world = _world(second)
    sched = S.backend_sched_new([tb, cpu], None, 256, True, True)
    assert S.backend_sched_get_n_copies(sched) == 4
    assert all(ev is not None for ev in sched.events[0])  # the device has events
    assert all(ev is None for ev in sched.events[1])  # the CPU has none: synchronize instead
    copies = []
    for run in range(6):
        inputs = _inputs(3)
        gf, _, out = world.build(sched, build, inputs)
        copies.append(sched.cur_copy)
        if run == 0:
            assert [sched.backends[s.backend_id].name() for s in sched.splits] == [tb.name(), "CPU", tb.name()]
            # user inputs get one copy per slot, and so does every split input
            assert len(sched.graph_inputs) == 2
            assert {t.name for t in sched.splits[0].inputs} == {"x"}
        assert S.backend_sched_graph_compute_async(sched, gf) == 0
        S.backend_sched_synchronize(sched)
        assert_close(read(out), reference(WEIGHTS, build, inputs), NMSE_MATMUL)
    assert copies == [0, 1, 2, 3, 0, 1]
    assert all(ev.recorded for ev in sched.events[0])


def test_eval_callback_sees_every_node_once(second) -> None:
    tb, cpu, world = _world(second)
    sched = S.backend_sched_new([tb, cpu], None, 256, False, True)
    inputs = _inputs(2)
    asked: list[str] = []
    seen: dict[str, np.ndarray] = {}

    def cb(t, ask):
        if ask:
            asked.append(t.name)
            return t.op not in VIEW_OPS and t.name in ("hn", "os", "out")
        seen[t.name] = from_bytes(t, api.backend_tensor_get(t))  # works for device and host tensors
        return True

    S.backend_sched_set_eval_callback(sched, cb)
    gf, _, out = world.build(sched, build, inputs)
    assert S.backend_sched_graph_compute(sched, gf) == 0
    assert sorted(asked) == sorted(n.name for n in gf.nodes)  # every node asked, exactly once
    assert set(seen) == {"hn", "os", "out"}
    assert_close(seen["out"], read(out))
    # the observed intermediate equals the same node computed without a callback
    plain = S.backend_sched_new([tb, cpu], None, 256, False, True)
    gf2, _, _ = world.build(plain, build, inputs)
    assert plain.graph_compute(gf2) == 0
    hn = next(n for n in gf2.nodes if n.name == "hn")
    assert_close(seen["hn"], read(hn))


def test_eval_callback_false_stops_the_split_only(second) -> None:
    tb, cpu, world = _world(second)
    sched = S.backend_sched_new([tb, cpu], None, 256, False, True)
    asked: list[str] = []

    def cb(t, ask, user_data):
        if ask:
            asked.append(t.name)
            return t.name == "o"  # first node of the CPU split
        user_data.append(t.name)
        return False  # stop this split

    stopped: list[str] = []
    S.backend_sched_set_eval_callback(sched, cb, stopped)
    gf, _, _ = world.build(sched, build, _inputs(2))
    assert sched.graph_compute(gf) == 0
    cpu_split = [n.name for n in sched.splits[1].graph.nodes]
    assert cpu_split[0] == "o" and "os" in cpu_split
    assert stopped == ["o"]
    assert "os" not in asked  # the rest of the CPU split was skipped ...
    assert "z" in asked and "out" in asked  # ... but the next split still ran


def test_offloaded_moe_weights_copy_only_the_used_experts(second, monkeypatch) -> None:
    tb, cpu = second, backend_cpu_init()
    n_expert, m, k = 8, 16, 64
    weights = {"experts": (T.F32, [k, m, n_expert], _r(n_expert, m, k))}
    ids = np.array([[1, 2], [2, 6], [1, 6]], dtype=np.int32)  # experts 1, 2 and 6 of 8
    inputs = {"x": (T.F32, [k, 1, 3], _r(3, 1, k)), "ids": (T.I32, [2, 3], ids)}
    made: dict = {}

    def build(ctx, t):
        made["moe"] = g.mul_mat_id(ctx, t["experts"], t["x"], t["ids"]).set_name("moe")
        return g.scale(ctx, made["moe"], 2.0).set_name("out")

    uploads: list[tuple[str, int, int]] = []
    def spy(tensor, data, offset, size):
        uploads.append((tensor.name, offset, size))
        api.backend_tensor_set(tensor, data, offset, size)

    monkeypatch.setattr(tb, "set_tensor_async", spy)
    world = World(weights, {"experts": cpu})
    sched = S.backend_sched_new([tb, cpu], None, 64, False, True)
    gf, _, out = world.build(sched, build, inputs,
                             before_alloc=lambda s, ts: S.backend_sched_set_tensor_backend(s, made["moe"], tb))
    assert sched.splits[0].inputs[0].name == "experts"  # host weights copied to the device's split
    assert sched.graph_compute(gf) == 0
    size = k * m * 4  # one expert
    copy = f"{tb.name()}#experts#0"
    assert uploads == [(copy, 1 * size, 2 * size + 512),  # experts 1-2, plus padding
                       (copy, 6 * size, size + 512)]  # expert 6
    assert_close(read(out), reference(weights, build, inputs), NMSE_MATMUL)
