"""The scheduler with a test backend that shares the CPU's buffer type but runs only some ops
(as ggml's BLAS backend does): upgrades to it, ops it must leave to the CPU, and ROPE and
FLASH_ATTN_EXT not being pulled by their small weight-like sources."""

from __future__ import annotations

import numpy as np

import pyggml as g
from helpers.backend_run import read
from helpers.data import normal_f32
from helpers.opcheck import NMSE_MATMUL, assert_close
from helpers.sched_world import World, plugin_module, reference
from pyggml import sched as S
from pyggml.backend.cpu.backend import backend_cpu_init
from pyggml.ops.enums import Op
from pyggml.types import GGMLType as T

rng = np.random.default_rng(11)
_r = normal_f32(rng)


def _subset(ops: frozenset[Op] = frozenset({Op.MUL_MAT, Op.ADD, Op.MUL})):
    return plugin_module().SubsetDevice(None, "SUBSET", ops).init_backend()


def test_upgrade_to_higher_priority_backend_with_same_buffer_type() -> None:
    sub, cpu = _subset(), backend_cpu_init()
    weights = {"emb": (T.F32, [16, 10], _r(10, 16))}
    inputs = {"ids": (T.I32, [3], np.array([4, 0, 9]))}

    def build(ctx, t):
        a = g.get_rows(ctx, t["emb"], t["ids"]).set_name("a")  # SUBSET has no GET_ROWS
        b = g.add(ctx, a, a).set_name("b")
        return g.scale(ctx, b, 0.5).set_name("c")

    world = World(weights, {"emb": cpu})
    sched = S.backend_sched_new([sub, cpu], None, 64, False, True)
    gf, _, out = world.build(sched, build, inputs)
    place = {n.name: (sched.get_tensor_backend(n).name(), sched.cause(n)) for n in gf.nodes}
    assert place == {"a": ("CPU", "1.wgt0"), "b": ("SUBSET", "3.upg"), "c": ("CPU", "2.sup")}
    # same memory for both: three splits and not a single copy
    assert [(sched.backends[s.backend_id].name(), len(s.inputs)) for s in sched.splits] == [
        ("CPU", 0), ("SUBSET", 0), ("CPU", 0)]
    assert sched.graph_compute(gf) == 0
    assert sub.computed == ["b"]
    assert_close(read(out), reference(weights, build, inputs))


def test_weights_in_host_memory_pull_to_the_first_capable_backend() -> None:
    sub, cpu = _subset(), backend_cpu_init()
    weights = {"w": (T.Q8_0, [64, 8], _r(8, 64))}
    inputs = {"x": (T.F32, [64, 3], _r(3, 64))}

    def build(ctx, t):
        h = g.mul_mat(ctx, t["w"], t["x"]).set_name("h")
        return g.unary(ctx, h, g.UnaryOp.SILU).set_name("o")

    world = World(weights, {"w": cpu})
    sched = S.backend_sched_new([sub, cpu], None, 64, False, True)
    gf, _, out = world.build(sched, build, inputs)
    h, o = gf.nodes
    assert (sched.get_tensor_backend(h), sched.cause(h)) == (sub, "1.wgt0")
    # SUBSET cannot run SILU: the GPU expansion skips it and pass 3 picks the backend with most inputs
    assert (sched.get_tensor_backend(o), sched.cause(o)) == (cpu, "3.best")
    assert sched.graph_compute(gf) == 0
    assert_close(read(out), reference(weights, build, inputs), NMSE_MATMUL)


def test_rope_and_flash_attn_are_not_pulled_by_weights() -> None:
    sub = _subset(frozenset({Op.ROPE, Op.FLASH_ATTN_EXT, Op.MUL_MAT}))
    cpu = backend_cpu_init()
    weights = {"ff": (T.F32, [8], 1.0 + rng.random(8).astype(np.float32)), "sinks": (T.F32, [2], _r(2))}
    inputs = {"q": (T.F32, [16, 2, 2], _r(2, 2, 16)), "k": (T.F16, [16, 4, 2], _r(2, 4, 16)),
              "v": (T.F16, [16, 4, 2], _r(2, 4, 16)), "pos": (T.I32, [2], np.array([3, 4]))}

    def build(ctx, t):
        qr = g.rope_ext(ctx, t["q"], t["pos"], t["ff"], 16, 2, 512, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0).set_name("qr")
        q = g.permute(ctx, qr, 0, 2, 1, 3)
        fa = g.flash_attn_ext(ctx, q, t["k"], t["v"], None, 0.25, 0.0, 0.0).set_name("fa")
        g.flash_attn_ext_add_sinks(fa, t["sinks"])
        return fa

    world = World(weights, {"ff": cpu, "sinks": cpu})
    sched = S.backend_sched_new([sub, cpu], None, 64, False, True)
    gf, _, out = world.build(sched, build, inputs)
    nodes = {n.name: n for n in gf.nodes}
    # with the weight rule they would be "1.wgt2" and "1.wgt4"; instead pass 3 places them
    assert sched.cause(nodes["qr"]) == "3.best" and sched.cause(nodes["fa"]) == "3.best"
    assert sched.get_tensor_backend(nodes["fa"]) is sub
    assert sched.graph_compute(gf) == 0
    assert_close(read(out), reference(weights, build, inputs), NMSE_MATMUL)
