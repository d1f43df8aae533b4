"""Property tests of the graph allocator on random graphs.

Each drawn recipe is built twice: once planned by gallocr (tensors share memory), once with every
tensor in its own memory (backend_alloc_ctx_tensors). Checked:
(a) tensors whose lifetimes overlap never share bytes, except an in-place op over its parent;
(b) INPUT and leaf tensors keep their memory from before the first node to their last use, OUTPUT
    tensors to the end (both are part of the lifetimes in (a));
(c) the computed OUTPUT tensors are bit-identical to the own-memory computation;
(d) the planned size never exceeds the sum of all tensor sizes, and a chain of in-place ops costs
    exactly one tensor.
Lifetimes are derived from the graph alone, independently of the allocator's own bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyggml.alloc import INPLACE_OPS, backend_alloc_ctx_tensors_from_buft, gallocr_new, gallocr_new_n
from pyggml.alloc.dyn_tallocr import round_up
from pyggml.backend import api
from pyggml.backend.cpu.backend import CPUBufferType, backend_cpu_buffer_type, backend_cpu_init
from pyggml.context import Context
from pyggml.graph import Graph
from pyggml.ops import builders as B
from pyggml.tensor import Tensor, TensorFlag, can_repeat
from pyggml.types import GGMLType

F32 = GGMLType.F32
ALIGN = 32

UNARY: dict[str, tuple[Callable, Callable]] = {
    "sqr": (B.sqr, B.sqr_inplace),
    "neg": (B.neg, B.neg_inplace),
    "tanh": (B.tanh, B.tanh_inplace),
    "scale": (lambda c, a: B.scale(c, a, 0.5), lambda c, a: B.scale_inplace(c, a, 0.5)),
    "rms_norm": (lambda c, a: B.rms_norm(c, a, 1e-5), lambda c, a: B.rms_norm_inplace(c, a, 1e-5)),
    "soft_max": (B.soft_max, B.soft_max_inplace),
}
BINARY: dict[str, tuple[Callable, Callable]] = {
    "add": (B.add, B.add_inplace),
    "sub": (B.sub, B.sub_inplace),
    "mul": (B.mul, B.mul_inplace),
}
KINDS = [*UNARY, *BINARY, "mul_mat", "transpose", "permute", "reshape", "row"]

step_st = st.tuples(st.sampled_from(KINDS), st.integers(0, 99), st.integers(0, 99), st.booleans(),
                    st.integers(0, 3))


@st.composite
def recipes(draw: st.DrawFn) -> dict:
    k, m = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    n_leafs = draw(st.integers(1, 3))
    leafs = [(draw(st.booleans()), draw(st.booleans())) for _ in range(n_leafs)]  # (transposed shape, INPUT)
    steps = draw(st.lists(step_st, min_size=1, max_size=14))
    return {"k": k, "m": m, "leafs": leafs, "steps": steps, "seed": draw(st.integers(0, 2**31))}


def mark_output(t: Tensor, outputs: list[Tensor]) -> None:
    """OUTPUT on a view does not protect its source in ggml (the source is freed or reused in place
    once the view's consumers are done), so a view output needs its source flagged too."""
    for x in (t.view_src, t):
        if x is not None and not (x.flags & TensorFlag.OUTPUT):
            x.set_output()
            outputs.append(x)


def build(recipe: dict) -> tuple[Context, Graph, list[Tensor], list[Tensor]]:
    """Build the recipe's graph in a fresh no_alloc context; returns (ctx, graph, leafs, outputs)."""
    ctx = Context(1 << 20, no_alloc=True)
    k, m = recipe["k"], recipe["m"]
    pool: list[Tensor] = []
    leafs: list[Tensor] = []
    for i, (transposed, is_input) in enumerate(recipe["leafs"]):
        t = ctx.new_tensor(F32, *((m, k) if transposed else (k, m))).set_name(f"in{i}")
        if is_input:
            t.set_input()
        pool.append(t)
        leafs.append(t)
    outputs: list[Tensor] = []
    for n, (kind, i, j, inplace, out) in enumerate(recipe["steps"]):
        a = pool[i % len(pool)]
        if kind in UNARY:
            r = UNARY[kind][inplace](ctx, a)
        elif kind in BINARY:
            cands = [t for t in pool if can_repeat(t, a)]
            r = BINARY[kind][inplace](ctx, a, cands[j % len(cands)])
        elif kind == "mul_mat":
            cands = [t for t in pool if t.ne[0] == a.ne[0]]
            r = B.mul_mat(ctx, a, cands[j % len(cands)])
        elif kind == "transpose":
            r = B.cont(ctx, B.transpose(ctx, a))
        elif kind == "permute":
            r = B.cont(ctx, B.permute(ctx, a, 1, 0, 2, 3))
        elif kind == "reshape":
            r = B.reshape_2d(ctx, a, a.ne[1], a.ne[0])
        else:  # one row of a, as a view, broadcast-added to a tensor of the same row length
            row = B.view_1d(ctx, a, a.ne[0], (j % a.ne[1]) * a.nb[1])
            cands = [t for t in pool if t.ne[0] == a.ne[0]]
            r = B.add(ctx, cands[i % len(cands)], row)
        r.name = f"s{n}_{kind}"
        if out == 0:
            mark_output(r, outputs)
        pool.append(r)
    if not (pool[-1].flags & TensorFlag.OUTPUT):
        mark_output(pool[-1], outputs)
    g = Graph()
    for t in outputs:
        g.build_forward_expand(t)
    return ctx, g, leafs, outputs


def lifetimes(g: Graph) -> dict[int, tuple[int, int]]:
    """(first, last) node index of every non-view tensor's memory use, from the graph alone."""
    n = g.n_nodes
    last_use: dict[int, int] = {}
    for i, node in enumerate(g.nodes):
        for s in node.src:
            if s is not None:
                last_use[id(s)] = max(last_use.get(id(s), -1), i)
    for node in g.nodes:  # a view keeps its source alive until the view's last consumer
        if node.view_src is not None:
            vs = id(node.view_src)
            last_use[vs] = max(last_use.get(vs, -1), last_use.get(id(node), n - 1))
    spans: dict[int, tuple[int, int]] = {}
    for i, t in enumerate(g.nodes):
        if t.view_src is None:
            first = -1 if t.flags & TensorFlag.INPUT else i
            last = n - 1 if t.flags & TensorFlag.OUTPUT else last_use.get(id(t), n - 1)
            spans[id(t)] = (first, last)
    for t in g.leafs:
        last = n - 1 if t.flags & TensorFlag.OUTPUT else last_use.get(id(t), n - 1)
        spans[id(t)] = (-1, last)
    return spans


def check_no_live_overlap(g: Graph) -> None:
    spans = lifetimes(g)
    index = {id(t): i for i, t in enumerate(g.nodes)}
    tensors = [t for t in [*g.leafs, *g.nodes] if t.view_src is None]
    for x in range(len(tensors)):
        for y in range(x + 1, len(tensors)):
            t1, t2 = tensors[x], tensors[y]
            if t1.nbytes() == 0 or t2.nbytes() == 0:
                continue
            if t1.data + t1.nbytes() <= t2.data or t2.data + t2.nbytes() <= t1.data:
                continue  # disjoint memory
            (f1, l1), (f2, l2) = spans[id(t1)], spans[id(t2)]
            if l1 < f2 or l2 < f1:
                continue  # disjoint lifetimes
            # the one legal overlap: t2 computed in place over its parent t1 at t1's last use
            inplace = (f2 == l1 and index.get(id(t2)) == f2 and t2.op in INPLACE_OPS
                       and any(s is t1 for s in t2.src) and t1.data == t2.data)
            assert inplace, f"{t1.name} [{f1},{l1}] and {t2.name} [{f2},{l2}] overlap in memory"


def fill_inputs(g: Graph, leafs: list[Tensor], seed: int) -> None:
    """Random values for the leafs the graph uses (unused ones have no memory under gallocr)."""
    rng = np.random.default_rng(seed)
    for t in leafs:
        values = rng.uniform(-1, 1, t.nelements()).astype(np.float32)
        if g.contains(t):
            api.backend_tensor_set(t, values)


class CappedCPU(CPUBufferType):
    """CPU memory with a small max buffer size, so plans spread over several chunks."""

    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap

    def get_max_size(self) -> int:
        return self.cap


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recipes(), st.sampled_from([None, 64, 160, 512, "multi"]))
def test_random_graphs_plan_safely_and_compute_identically(recipe, cap):
    cpu = backend_cpu_init()
    _, g, leafs, outputs = build(recipe)
    if cap == "multi":  # two buffer types, each node and leaf sent to one at random (as the scheduler does)
        ga = gallocr_new_n([backend_cpu_buffer_type(), CPUBufferType()])
        rng = np.random.default_rng(recipe["seed"])
        assert ga.reserve_n(g, rng.integers(0, 2, g.n_nodes).tolist(), rng.integers(0, 2, g.n_leafs).tolist())
    else:
        ga = gallocr_new(backend_cpu_buffer_type() if cap is None else CappedCPU(cap))
    assert ga.alloc_graph(g)
    tensors = [t for t in [*g.leafs, *g.nodes] if t.view_src is None]
    assert all(t.data is not None for t in [*g.leafs, *g.nodes])
    # (a) + (b)
    check_no_live_overlap(g)
    # (d) never more than every tensor in its own slot
    planned = sum(ga.get_buffer_size(i) for i in range(ga.n_buffers))
    assert planned <= sum(round_up(t.nbytes(), ALIGN) for t in tensors)
    # (c) bit-identical to the same graph with every tensor in its own memory
    ref_ctx, ref_g, ref_leafs, ref_outputs = build(recipe)
    ref_buf = backend_alloc_ctx_tensors_from_buft(ref_ctx, backend_cpu_buffer_type())
    assert ref_buf is not None
    fill_inputs(g, leafs, recipe["seed"])
    fill_inputs(ref_g, ref_leafs, recipe["seed"])
    api.backend_graph_compute(cpu, g)
    api.backend_graph_compute(cpu, ref_g)
    for got, want in zip(outputs, ref_outputs, strict=True):
        assert got.name == want.name
        assert np.array_equal(api.backend_tensor_get(got), api.backend_tensor_get(want)), got.name


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 64), st.lists(st.sampled_from(sorted(UNARY)), min_size=1, max_size=12), st.booleans())
def test_inplace_chain_costs_exactly_one_tensor(n, chain, leaf_is_input):
    ctx = Context(1 << 16, no_alloc=True)
    x = ctx.new_tensor(F32, n, 2)
    if leaf_is_input:
        x.set_input()
    y = x
    for name in chain:
        y = UNARY[name][0](ctx, y)
    g = Graph()
    g.build_forward_expand(y)
    ga = gallocr_new(backend_cpu_buffer_type())
    assert ga.reserve(g)
    assert ga.get_buffer_size(0) == round_up(x.nbytes(), ALIGN)


@settings(max_examples=25, deadline=None)
@given(recipes())
def test_replanning_a_rebuilt_graph_is_deterministic(recipe):
    # the planner is a pure function of the graph: two builds plan the same offsets and size
    sizes, layouts = [], []
    for _ in range(2):
        _, g, _, _ = build(recipe)
        ga = gallocr_new(backend_cpu_buffer_type())
        ga.reserve(g)
        sizes.append(ga.get_buffer_size(0))
        layouts.append([(r.name, r.chunk, r.offset, r.first, r.last) for r in ga.plan().records])
    assert sizes[0] == sizes[1] and layouts[0] == layouts[1]
