"""Property tests: random small graphs with weights on random backends (TWIN, a subset backend
sharing host memory, the CPU) compute what a CPU-only run computes, and every split only reads
tensors its backend can reach."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pyggml as g
from helpers.backend_run import read
from helpers.opcheck import NMSE_MATMUL, assert_close
from helpers.sched_world import World, plugin_module, reference
from helpers.twin import twin_init
from pyggml import sched as S
from pyggml.backend.cpu.backend import backend_cpu_init
from pyggml.ops.enums import VIEW_OPS, Op
from pyggml.types import GGMLType as T

N = 16
STEPS = ["mm", "add", "mul", "scale", "silu", "hardswish", "softmax"]


def _build(steps: list[tuple[str, int]]):
    def build(ctx, t):
        cur = [t["x"]]
        for k, (kind, pick) in enumerate(steps):
            a = cur[pick % len(cur)]
            b = cur[-1]
            if kind == "mm":
                r = g.mul_mat(ctx, t[f"w{k}"], a)
            elif kind == "add":
                r = g.add(ctx, a, b)
            elif kind == "mul":
                r = g.mul(ctx, a, b)
            elif kind == "scale":
                r = g.scale(ctx, a, 0.5)
            elif kind == "silu":
                r = g.unary(ctx, a, g.UnaryOp.SILU)
            elif kind == "hardswish":  # the CPU is the only backend with it
                r = g.unary(ctx, a, g.UnaryOp.HARDSWISH)
            else:
                r = g.soft_max_ext(ctx, a, None, 0.3, 0.0)
            cur.append(r.set_name(f"n{k}"))
        return cur[-1]

    return build


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.tuples(st.sampled_from(STEPS), st.integers(0, 7)), min_size=1, max_size=8),
       places=st.lists(st.integers(0, 2), min_size=8, max_size=8),
       seed=st.integers(0, 1000), with_subset=st.booleans())
def test_random_graphs_split_correctly(steps, places, seed, with_subset) -> None:
    rng = np.random.default_rng(seed)
    tb, cpu = twin_init(), backend_cpu_init()
    sub = plugin_module().SubsetDevice(None, "SUBSET", frozenset({Op.MUL_MAT, Op.ADD})).init_backend()
    backends = [tb, sub, cpu] if with_subset else [tb, cpu]
    weights = {f"w{k}": (T.F16 if k % 2 else T.F32, [N, N], rng.standard_normal((N, N)).astype(np.float32))
               for k, (kind, _) in enumerate(steps) if kind == "mm"}
    placement = {name: (tb, cpu, cpu)[places[int(name[1:]) % 8]] for name in weights}
    inputs = {"x": (T.F32, [N, 3], rng.standard_normal((3, N)).astype(np.float32))}
    build = _build(steps)

    world = World(weights, placement)
    sched = S.backend_sched_new(backends, None, 128, False, True)
    gf, _, out = world.build(sched, build, inputs)

    for split in sched.splits:
        backend = sched.backends[split.backend_id]
        copies = {id(sched.tensor_copy(t, split.backend_id, 0)) for t in split.inputs}
        for node in split.graph.nodes:
            if node.op in VIEW_OPS:
                continue
            assert sched.get_tensor_backend(node) is backend
            assert backend.supports_op(node)
            for src in node.src:
                if src is None:
                    continue
                # read where it lives, or through this split's copy of it
                assert id(src) in copies or sched.assigner.buffer_supported(src, split.backend_id), \
                    f"{node.name} on {backend.name()} reads {src.name} it cannot reach"
    for a, b in zip(sched.splits, sched.splits[1:], strict=False):
        assert a.i_end == b.i_start
    assert sched.graph_compute(gf) == 0
    assert_close(read(out), reference(weights, build, inputs), NMSE_MATMUL)
