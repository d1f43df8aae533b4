"""The scheduler with a GPU-like device with memory of its own (TWIN, or torch; see conftest) and the CPU:
placements, causes and splits derived by hand from ggml's five passes, and results equal to a
CPU-only run."""

from __future__ import annotations

import numpy as np
import pytest

import pyggml as g
from helpers.data import normal_f32
from helpers.opcheck import NMSE_MATMUL, NMSE_SOFTMAX, assert_close
from helpers.sched_world import World, reference
from pyggml import sched as S
from pyggml.backend.cpu.backend import backend_cpu_init
from pyggml.types import GGMLType as T

rng = np.random.default_rng(7)
_r = normal_f32(rng)


@pytest.fixture
def backends(second):
    return second, backend_cpu_init()


def _split_summary(sched: S.BackendSched) -> list[tuple[str, list[str]]]:
    return [(sched.backends[s.backend_id].name(), [t.name for t in s.inputs]) for s in sched.splits]


def test_weights_pull_ops_and_gpu_expands(backends) -> None:
    tb, cpu = backends
    weights = {"w_gpu": (T.Q4_0, [64, 16], _r(16, 64)), "w_cpu": (T.F32, [16, 8], _r(8, 16))}
    inputs = {"x": (T.F32, [64, 4], _r(4, 64))}

    def build(ctx, t):
        x0 = g.scale(ctx, t["x"], 0.5).set_name("x0")
        h = g.mul_mat(ctx, t["w_gpu"], x0).set_name("h")
        h2 = g.unary(ctx, h, g.UnaryOp.SILU).set_name("h2")
        o = g.mul_mat(ctx, t["w_cpu"], h2).set_name("o")
        return g.add(ctx, o, o).set_name("o2")

    world = World(weights, {"w_gpu": tb, "w_cpu": cpu})
    sched = S.backend_sched_new([tb, cpu], None, 256, False, True)
    gf, ts, out = world.build(sched, build, inputs)
    nodes = {n.name: n for n in gf.nodes}
    place = {name: (sched.get_tensor_backend(n).name(), sched.cause(n)) for name, n in nodes.items()}
    assert place == {
        "x0": (tb.name(), "2.sup"),  # GPU expansion upwards from h
        "h": (tb.name(), "1.wgt0"),  # the weight pulls the op
        "h2": (tb.name(), "2.sup"),  # GPU expansion downwards
        "o": ("CPU", "1.wgt0"),
        "o2": ("CPU", "2.sup"),  # the rest expansion from a CPU node
    }
    assert sched.get_tensor_backend(ts["x"]) is cpu and sched.cause(ts["x"]) == "1.inp"
    assert S.backend_sched_get_n_splits(sched) == 2
    assert _split_summary(sched) == [(tb.name(), ["x"]), ("CPU", ["h2"])]
    # the consumer now reads the copy in its split's memory
    assert nodes["x0"].src[0].name == f"{tb.name()}#x#0"
    assert S.backend_sched_get_buffer_size(sched, tb) > 0 and S.backend_sched_get_buffer_size(sched, cpu) > 0
    assert sched.graph_compute(gf) == 0
    from helpers.backend_run import read

    assert_close(read(out), reference(weights, build, inputs), NMSE_MATMUL)


def test_rope_is_not_pulled_by_its_freq_factors(backends) -> None:
    tb, cpu = backends
    weights = {"ff": (T.F32, [8], 1.0 + rng.random(8).astype(np.float32))}
    inputs = {"x": (T.F32, [16, 2, 3], _r(3, 2, 16)), "pos": (T.I32, [3], np.array([0, 3, 4]))}

    def build(ctx, t):
        y = g.scale(ctx, t["x"], 2.0).set_name("y")
        return g.rope_ext(ctx, y, t["pos"], t["ff"], 16, 2, 512, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0).set_name("r")

    world = World(weights, {"ff": tb})
    sched = S.backend_sched_new([tb, cpu], None, 256, False, True)
    gf, _, out = world.build(sched, build, inputs)
    r = gf.nodes[-1]
    # without the ROPE exception this would be (tb, "1.wgt2")
    assert (sched.get_tensor_backend(r), sched.cause(r)) == (cpu, "3.best")
    assert _split_summary(sched) == [("CPU", ["ff"])]
    assert sched.graph_compute(gf) == 0
    from helpers.backend_run import read

    assert_close(read(out), reference(weights, build, inputs))


def test_unsupported_op_goes_where_its_inputs_are(backends) -> None:
    tb, cpu = backends
    weights = {"w": (T.F16, [32, 16], _r(16, 32))}
    inputs = {"x": (T.F32, [32, 6], _r(6, 32)), "sinks": (T.F32, [1], _r(1))}

    def build(ctx, t):
        h = g.mul_mat(ctx, t["w"], t["x"]).set_name("h")
        s = g.soft_max_ext(ctx, h, None, 0.25, 0.0).set_name("s")
        g.soft_max_add_sinks(s, t["sinks"])  # the second device has no sinks: CPU only
        return g.scale(ctx, s, 3.0).set_name("o")

    world = World(weights, {"w": tb})
    sched = S.backend_sched_new([tb, cpu], None, 256, False, True)
    gf, _, out = world.build(sched, build, inputs)
    nodes = {n.name: n for n in gf.nodes}
    assert (sched.get_tensor_backend(nodes["s"]), sched.cause(nodes["s"])) == (cpu, "3.best")
    assert sched.cause(nodes["o"]) == "2.sup" and sched.get_tensor_backend(nodes["o"]) is tb
    assert _split_summary(sched) == [(tb.name(), ["x"]), ("CPU", ["h"]), (tb.name(), ["s"])]
    assert sched.graph_compute(gf) == 0
    from helpers.backend_run import read

    assert_close(read(out), reference(weights, build, inputs), NMSE_SOFTMAX)


@pytest.mark.parametrize(("op_offload", "n_tokens", "expected"), [
    (True, 32, ("2nd", "1.off")),  # big batch, host weights: the GPU asks for it
    (False, 32, ("CPU", "1.wgt0")),
    (True, 4, ("CPU", "1.wgt0")),  # too small for the device to want it
])
def test_op_offload(backends, op_offload: bool, n_tokens: int, expected: tuple[str, str]) -> None:
    tb, cpu = backends
    weights = {"w": (T.F32, [16, 8], _r(8, 16))}
    inputs = {"x": (T.F32, [16, n_tokens], _r(n_tokens, 16))}

    def build(ctx, t):
        return g.mul_mat(ctx, t["w"], t["x"]).set_name("mm")

    world = World(weights, {"w": cpu})
    sched = S.backend_sched_new([tb, cpu], None, 256, False, op_offload)
    gf, _, out = world.build(sched, build, inputs)
    mm = gf.nodes[-1]
    assert (sched.get_tensor_backend(mm), sched.cause(mm)) == ({"2nd": tb, "CPU": cpu}[expected[0]], expected[1])
    assert sched.graph_compute(gf) == 0
    from helpers.backend_run import read

    assert_close(read(out), reference(weights, build, inputs), NMSE_MATMUL)


def test_user_assignment_is_kept(backends) -> None:
    tb, cpu = backends
    weights = {"w": (T.F32, [16, 8], _r(8, 16))}
    inputs = {"x": (T.F32, [16, 2], _r(2, 16))}
    made: dict = {}

    def build(ctx, t):
        made["h"] = g.mul_mat(ctx, t["w"], t["x"]).set_name("h")
        return g.scale(ctx, made["h"], 2.0).set_name("o")

    def pin(sched, ts):
        S.backend_sched_set_tensor_backend(sched, made["h"], cpu)

    world = World(weights, {"w": tb})
    sched = S.backend_sched_new([tb, cpu], None, 256, False, True)
    gf, _, out = world.build(sched, build, inputs, before_alloc=pin)
    h = made["h"]
    assert (S.backend_sched_get_tensor_backend(sched, h), sched.cause(h)) == (cpu, "usr")
    assert _split_summary(sched) == [("CPU", ["w"])]  # the weight is copied to the CPU split
    assert sched.graph_compute(gf) == 0
    from helpers.backend_run import read

    assert_close(read(out), reference(weights, build, inputs), NMSE_MATMUL)


def test_debug_table(backends, monkeypatch, capsys) -> None:
    tb, cpu = backends
    monkeypatch.setenv("GGML_SCHED_DEBUG", "1")
    weights = {"w": (T.F32, [16, 8], _r(8, 16))}
    world = World(weights, {"w": tb})
    sched = S.backend_sched_new([tb, cpu], None, 256, False, True)
    world.build(sched, lambda ctx, t: g.mul_mat(ctx, t["w"], t["x"]).set_name("mm"),
                {"x": (T.F32, [16, 2], _r(2, 16))})
    err = capsys.readouterr().err
    name, short = tb.name(), f"{tb.name()[:5]:>5}"  # the table shows 5 characters of a backend's name
    assert f"## SPLIT #0: {name} # 1 inputs: [x (   0K)]" in err
    assert f"node #  0 (   MUL_MAT):                   mm (   0K) [{short}   1.wgt0]" in err
    assert f"{name}#x#0 (   0K) [{short}    4.cpy]" in err


def test_reserve_sizes_buffers_for_later_graphs(backends) -> None:
    tb, cpu = backends
    weights = {"w": (T.F32, [16, 8], _r(8, 16))}
    inputs = {"x": (T.F32, [16, 4], _r(4, 16))}

    def build(ctx, t):
        return g.add(ctx, g.mul_mat(ctx, t["w"], t["x"]), g.mul_mat(ctx, t["w"], t["x"]))

    def measure_graph(world):
        ctx = g.Context(1 << 20, no_alloc=True)
        ts = dict(world.tensors)
        ts["x"] = ctx.new_tensor(T.F32, 16, 4).set_name("x")
        ts["x"].set_input()
        gf = g.new_graph(ctx)
        gf.build_forward_expand(build(ctx, ts))
        return gf

    world = World(weights, {"w": tb})
    planned = S.backend_sched_reserve_size(S.backend_sched_new([tb, cpu], None, 256, False, True),
                                           measure_graph(world))
    sched = S.backend_sched_new([tb, cpu], None, 256, False, True)
    assert S.backend_sched_reserve(sched, measure_graph(world))
    sizes = [S.backend_sched_get_buffer_size(sched, b) for b in (tb, cpu)]
    assert sizes == planned and sizes[0] > 0
    buffers = sched.galloc.get_buffers(0)
    gf, _, out = world.build(sched, build, inputs)
    assert sched.galloc.get_buffers(0) == buffers  # the reserved buffers were big enough
    assert sched.graph_compute(gf) == 0
    from helpers.backend_run import read

    assert_close(read(out), reference(weights, build, inputs), NMSE_MATMUL)


def test_constructor_checks(backends) -> None:
    tb, cpu = backends
    with pytest.raises(S.SchedError, match="last backend"):
        S.backend_sched_new([cpu, tb])
    with pytest.raises(S.SchedError, match="1 to 16"):
        S.backend_sched_new([])
    with pytest.raises(S.SchedError, match="does not support buffer type"):
        S.backend_sched_new([tb, cpu], [cpu.get_default_buffer_type(), None])
    sched = S.backend_sched_new([tb, cpu], None, 16, True, True)
    assert S.backend_sched_get_n_copies(sched) == 4 and S.backend_sched_get_n_backends(sched) == 2
    assert S.backend_sched_get_buffer_type(sched, tb) is tb.get_default_buffer_type()
    with pytest.raises(S.SchedError, match="not one of this scheduler"):
        S.backend_sched_get_buffer_size(sched, backend_cpu_init())


def test_preallocated_tensor_nobody_can_run(backends) -> None:
    tb, cpu = backends
    weights = {"a": (T.F32, [8, 2], _r(2, 8))}
    world = World(weights, {"a": tb})
    sched = S.backend_sched_new([cpu], None, 64, False, True)  # nobody here can use the second device's memory
    with pytest.raises(S.SchedAssignError, match="pre-allocated tensor"):
        world.build(sched, lambda ctx, t: g.scale(ctx, t["a"], 2.0), {})


def test_debug_realloc(backends, monkeypatch) -> None:
    tb, cpu = backends
    weights = {"w": (T.F32, [16, 8], _r(8, 16))}
    inputs = {"x": (T.F32, [16, 2], _r(2, 16))}

    def build(ctx, t):
        return g.mul_mat(ctx, t["w"], t["x"])

    world = World(weights, {"w": tb})
    monkeypatch.setenv("GGML_SCHED_DEBUG_REALLOC", "1")  # only re-plans the graph size does not explain
    sched = S.backend_sched_new([tb, cpu], None, 64, False, True)
    for _ in range(3):  # the first plan is expected, the same graph again needs none
        gf, _, _ = world.build(sched, build, inputs)
        assert sched.graph_compute(gf) == 0
    monkeypatch.setenv("GGML_SCHED_DEBUG_REALLOC", "2")  # any re-plan
    with pytest.raises(S.SchedError, match="unexpected graph reallocation"):
        world.build(S.backend_sched_new([tb, cpu], None, 64, False, True), build, inputs)
