"""ggml_gallocr on hand-checked graphs: every offset and size is derived from ggml-alloc.c in the comments."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml.alloc import (
    INPLACE_OPS,
    Gallocr,
    backend_alloc_ctx_tensors_from_buft,
    gallocr_alloc_graph,
    gallocr_free,
    gallocr_get_buffer_size,
    gallocr_new,
    gallocr_new_n,
    gallocr_reserve,
    gallocr_reserve_n,
    gallocr_reserve_n_size,
    op_can_inplace,
)
from pyggml.alloc.plan import PlotUnavailableError
from pyggml.backend import api
from pyggml.backend.base import BufferUsage
from pyggml.backend.cpu.backend import CPUBufferType, backend_cpu_buffer_type
from pyggml.backend.errors import AllocationError
from pyggml.context import Context
from pyggml.graph import Graph
from pyggml.ops import builders as B
from pyggml.ops.enums import Op
from pyggml.tensor import Tensor, TensorFlag
from pyggml.types import GGMLType

F32 = GGMLType.F32


def mlp(n_in: int = 8, n_out: int = 6, n_tok: int = 4, output: str | None = None) -> tuple[Graph, dict[str, Tensor]]:
    """x (INPUT) and w, b -> n0 = w@x, n1 = n0 + b, n2 = n1^2, t = n2^T (view), n3 = cont(t), n4 = rms_norm(n3)."""
    ctx = Context(1 << 20, no_alloc=True)
    x = ctx.new_tensor(F32, n_in, n_tok).set_name("x")
    x.set_input()
    w = ctx.new_tensor(F32, n_in, n_out).set_name("w")
    b = ctx.new_tensor(F32, n_out, 1).set_name("b")
    t: dict[str, Tensor] = {"x": x, "w": w, "b": b}
    t["n0"] = B.mul_mat(ctx, w, x)
    t["n1"] = B.add(ctx, t["n0"], b)
    t["n2"] = B.sqr(ctx, t["n1"])
    t["t"] = B.transpose(ctx, t["n2"])
    t["n3"] = B.cont(ctx, t["t"])
    t["n4"] = B.rms_norm(ctx, t["n3"], 1e-6)
    for k in ("n0", "n1", "n2", "t", "n3", "n4"):
        t[k].name = k
    if output:
        t[output].set_output()
    g = Graph()
    g.build_forward_expand(t["n4"])
    return g, t


def offsets(ga: Gallocr, ts: dict[str, Tensor]) -> dict[str, int]:
    base = api.backend_buffer_get_base(ga.get_buffers(0)[0])
    return {k: v.data - base for k, v in ts.items()}


def test_inplace_op_list_is_ggmls():
    expected = {"FILL", "SCALE", "DIAG_MASK_ZERO", "DIAG_MASK_INF", "ADD", "ADD_ID", "ADD1", "SUB", "MUL", "DIV",
                "SQR", "SQRT", "LOG", "UNARY", "ROPE", "ROPE_BACK", "SILU_BACK", "RMS_NORM", "RMS_NORM_BACK",
                "CLAMP", "SOFT_MAX", "SOFT_MAX_BACK"}
    assert {op.name for op in INPLACE_OPS} == expected
    assert op_can_inplace(Op.ADD) and not op_can_inplace(Op.MUL_MAT) and not op_can_inplace(Op.CPY)


def test_mlp_plan_matches_ggml_by_hand():
    g, ts = mlp()
    assert [t.name for t in g.leafs] == ["w", "x", "b"]
    assert [t.name for t in g.nodes] == ["n0", "n1", "n2", "t", "n3", "n4"]
    ga = gallocr_new(backend_cpu_buffer_type())
    assert gallocr_reserve(ga, g)
    # alignment 32. Leafs first: w 192 B at 0; x 128 B on the last block (grows) at 192; b 24->32 B at 320.
    # n0 (MUL_MAT, 96 B): only the tail block exists -> 352, high-water 448. w and x lose their last
    #   consumer: free w -> block (0,192); free x (192..320) extends it -> (0,320).
    # n1 = add(n0, b): ADD may reuse n0 (one child, no views, same layout) -> 352; b is freed: (0,352).
    # n2 = sqr(n1): in place again -> 352.  t = transpose(n2) is a view: no memory, n2 now has a view.
    # n3 = cont(t) (96 B): inner block (0,352) fits -> 0. t's last consumer frees n2 (352..448),
    #   which joins the (96,256) block and the tail.
    # n4 = rms_norm(n3): in place over n3 -> 0.   Peak: 448.
    assert gallocr_get_buffer_size(ga, 0) == 448
    assert gallocr_alloc_graph(ga, g)
    assert offsets(ga, ts) == {"w": 0, "x": 192, "b": 320, "n0": 352, "n1": 352, "n2": 352, "t": 352,
                               "n3": 0, "n4": 0}
    # the view is initialised, not allocated: same buffer, its source's data
    assert ts["t"].buffer is ts["n2"].buffer and ts["t"].data == ts["n2"].data
    assert ga.get_buffers(0)[0].usage == BufferUsage.COMPUTE


def test_mlp_plan_records_and_live_ranges():
    g, _ = mlp()
    ga = gallocr_new(backend_cpu_buffer_type())
    ga.reserve(g)
    plan = ga.plan()
    got = {r.name: (r.offset, r.size, r.first, r.last, r.inplace_of) for r in plan.records}
    assert got == {
        "w": (0, 192, -1, 0, None), "x": (192, 128, -1, 0, None), "b": (320, 24, -1, 1, None),
        "n0": (352, 96, 0, 1, None), "n1": (352, 96, 1, 2, "n0"), "n2": (352, 96, 2, 4, "n1"),
        "n3": (0, 96, 4, 5, None), "n4": (0, 96, 5, 5, "n3"),
    }
    assert plan.peak(0) == 448
    assert {r.name for r in plan.live_at(4)} == {"n2", "n3"}
    table = plan.table()
    assert "inplace of n0" in table and "peak 448 bytes" in table and str(plan) == table


def test_output_is_never_reused_nor_freed():
    # n1 OUTPUT: n2 may not take it in place. n2 (96 B) best-fits the inner block (0,352) -> 0.
    # n3 (96 B) then best-fits the inner (96,256) -> 96; freeing n2 (0..96) touches no block and is
    # inserted first. n4 reuses n3 -> 96. The peak is unchanged: 448.
    g, ts = mlp(output="n1")
    ga = gallocr_new(backend_cpu_buffer_type())
    assert ga.alloc_graph(g)
    assert ga.get_buffer_size(0) == 448
    off = offsets(ga, ts)
    assert (off["n1"], off["n2"], off["n3"], off["n4"]) == (352, 0, 96, 96)
    assert ga.plan().records[[r.name for r in ga.plan().records].index("n1")].last == len(g.nodes) - 1


def test_tensors_with_data_are_left_alone():
    # w lives in its own weight buffer. Plan: leafs w (external, skipped), x 128 B at 0.
    # n0 = w@x (96 B) on the tail at 128 (peak 224); x is freed -> (0,128). n1 = scale(n0) in place -> 128.
    # n2 = add(n1, n1): n1 has two children, no reuse; 96 B best-fit into (0,128) -> 0. n1 is freed
    # (128..224), extending (96,32) up to the tail. Peak 224.
    wctx = Context(1 << 16, no_alloc=True)
    w = wctx.new_tensor(F32, 8, 6).set_name("w")
    wbuf = backend_alloc_ctx_tensors_from_buft(wctx, backend_cpu_buffer_type())
    wbuf.set_usage(BufferUsage.WEIGHTS)
    w_data = w.data
    ctx = Context(1 << 16, no_alloc=True)
    x = ctx.new_tensor(F32, 8, 4).set_name("x")
    x.set_input()
    n0 = B.mul_mat(ctx, w, x)
    n1 = B.scale(ctx, n0, 2.0)
    n2 = B.add(ctx, n1, n1)
    g = Graph()
    g.build_forward_expand(n2)
    ga = gallocr_new(backend_cpu_buffer_type())
    assert ga.alloc_graph(g)
    assert ga.get_buffer_size(0) == 224
    base = api.backend_buffer_get_base(ga.get_buffers(0)[0])
    assert [t.data - base for t in (x, n0, n1, n2)] == [0, 128, 128, 0]
    assert w.data == w_data and w.buffer is wbuf
    assert "w" not in {r.name for r in ga.plan().records}


def test_inplace_chain_costs_one_tensor():
    ctx = Context(1 << 16, no_alloc=True)
    x = ctx.new_tensor(F32, 10).set_name("x")  # 40 B -> one 64-byte slot
    x.set_input()
    y = x
    for f in (B.sqr, B.sqrt, B.neg, B.relu, lambda c, a: B.scale(c, a, 3.0), lambda c, a: B.rms_norm(c, a, 1e-5)):
        y = f(ctx, y)
    g = Graph()
    g.build_forward_expand(y)
    ga = gallocr_new(backend_cpu_buffer_type())
    ga.alloc_graph(g)
    assert ga.get_buffer_size(0) == 64
    assert len({t.data for t in g.nodes} | {x.data}) == 1


def test_builder_inplace_variants_are_views_and_keep_their_source():
    # sqr_inplace(a) is a view of a with op SQR: it gets no memory; a gets n_views=1.
    # a = x + x (32 B at 32 after x at 0); v = sqr_inplace(a) (view); c = cont? -> dup(v): 32 B.
    # a is freed only after v's last consumer (dup at index 2), so dup cannot land on a:
    # x is freed after a (index 0) -> dup best-fits the inner block (0,32) -> 0.
    ctx = Context(1 << 16, no_alloc=True)
    x = ctx.new_tensor(F32, 8).set_name("x")
    x.set_input()
    a = B.add(ctx, x, x)
    v = B.sqr_inplace(ctx, a)
    d = B.dup(ctx, v)
    g = Graph()
    g.build_forward_expand(d)
    ga = gallocr_new(backend_cpu_buffer_type())
    ga.alloc_graph(g)
    base = api.backend_buffer_get_base(ga.get_buffers(0)[0])
    assert [t.data - base for t in (x, a, v, d)] == [0, 32, 32, 0]
    assert ga.get_buffer_size(0) == 64


def test_needs_realloc_conditions():
    g, _ = mlp(n_tok=4)
    ga = gallocr_new(backend_cpu_buffer_type())
    assert ga.needs_realloc(g)  # nothing planned yet: 0 nodes planned, 6 in the graph
    ga.reserve(g)
    assert not ga.needs_realloc(g)
    # the same graph rebuilt with fewer tokens fits the old plan: reused, buffer untouched
    old = ga.get_buffers(0)[0]
    small, _ = mlp(n_tok=2)
    assert not ga.needs_realloc(small)
    assert ga.alloc_graph(small) and ga.get_buffers(0)[0] is old and ga.get_buffer_size(0) == 448
    # more tokens: n0 grows past its planned 96 bytes -> automatic re-reserve with one buffer
    big, bt = mlp(n_tok=8)
    assert ga.needs_realloc(big)
    assert ga.alloc_graph(big) and ga.get_buffer_size(0) > 448
    assert ga.get_buffers(0)[0] is not old and bt["n4"].data is not None
    # another node count -> realloc
    ctx = Context(1 << 16, no_alloc=True)
    x = ctx.new_tensor(F32, 4)
    g2 = Graph()
    g2.build_forward_expand(B.sqr(ctx, x))
    assert ga.needs_realloc(g2)


def test_needs_realloc_ignores_leaf_sizes_only_their_count():
    # a leaf no node consumes (expanded on its own) is checked by count only, as in ggml
    def graph(n_leaf: int) -> Graph:
        ctx = Context(1 << 16, no_alloc=True)
        x = ctx.new_tensor(F32, 8)
        w = ctx.new_tensor(F32, n_leaf)
        g = Graph()
        g.build_forward_expand(w)
        g.build_forward_expand(B.sqr(ctx, x))
        return g

    ga = gallocr_new(backend_cpu_buffer_type())
    ga.reserve(graph(8))
    assert not ga.needs_realloc(graph(64))
    assert ga.needs_realloc(graph(8).__class__())  # no nodes, no leafs: counts differ


def test_multi_buffer_graphs_are_not_reallocated_automatically():
    other = CPUBufferType()  # a second, distinct buffer type
    ga = gallocr_new_n([backend_cpu_buffer_type(), other])
    g, _ = mlp(n_tok=4)
    ids = [0, 0, 1, 1, 1, 1]
    assert gallocr_reserve_n(ga, g, ids, [0, 0, 0])
    again, _ = mlp(n_tok=4)
    assert ga.alloc_graph(again)
    big, _ = mlp(n_tok=8)
    assert ga.needs_realloc(big)
    assert not ga.alloc_graph(big)  # the scheduler must call reserve_n itself
    assert ga.reserve_n(big, ids, [0, 0, 0]) and ga.alloc_graph(big)


def test_reserve_n_places_nodes_in_their_buffers():
    other = CPUBufferType()
    ga = gallocr_new_n([backend_cpu_buffer_type(), other])
    g, ts = mlp()
    # leafs in buffer 0, n0..n2 in 0, the rest in 1
    assert ga.reserve_n(g, [0, 0, 0, 1, 1, 1], [0, 0, 0])
    assert ga.alloc_graph(g)
    buf0, buf1 = ga.get_buffers(0), ga.get_buffers(1)
    for k in ("w", "x", "b", "n0", "n1", "n2", "t"):
        assert ts[k].buffer in buf0, k
    for k in ("n3", "n4"):
        assert ts[k].buffer in buf1, k
    # buffer 1 holds n3 and n4 (in place): 96 B; buffer 0 as before but n3 is elsewhere: 448
    assert (ga.get_buffer_size(0), ga.get_buffer_size(1)) == (448, 96)


def test_identical_buffer_types_share_one_buffer():
    cpu = backend_cpu_buffer_type()
    ga = gallocr_new_n([cpu, cpu])
    g, _ = mlp()
    sizes: list[int] = []
    assert gallocr_reserve_n_size(ga, g, [0, 1, 0, 1, 0, 1], None, sizes) == [448, 448] == sizes
    assert ga.get_buffers(0) == []  # reserve_n_size plans without allocating
    with pytest.raises(AllocationError, match="reserve"):
        ga.alloc_graph(g)  # ggml would dereference a NULL buffer here
    ga.reserve_n(g, [0, 1, 0, 1, 0, 1], None)
    assert ga.get_buffer_size(0) == 448 and ga.get_buffer_size(1) == 0
    assert ga.buffers[0] is ga.buffers[1]
    chunks = ga.get_buffers(0)
    gallocr_free(ga)
    assert all(c.freed for c in chunks) and ga.get_buffer_size(0) == 0


def test_max_buffer_size_splits_into_chunks_and_tensors_get_real_memory():
    class SmallCPU(CPUBufferType):
        def get_max_size(self) -> int:
            return 256

    ga = gallocr_new(SmallCPU())
    g, ts = mlp()
    assert ga.alloc_graph(g)
    # chunk 0 (max 256): w 192 at 0, x (128) does not fit the last block (64 left) -> chunk 1 at 0,
    # b (32) fits chunk 0's tail: reuse factors: chunk 0 192-192-32 = -32, chunk 1 128-128-32 = -32;
    # the first candidate wins, ties do not replace it -> chunk 0 at 192.
    # n0 (96): no inner block; chunk 0's tail (224,32) is too small, chunk 1's (128,128) fits -> (1,128).
    # w and x are freed into inner blocks (0,192) of chunk 0 and (0,128) of chunk 1. n1, n2 reuse n0.
    # Freeing b merges chunk 0 back into one block. n3 (96) best-fits chunk 1's inner (0,128) -> (1,0).
    # Both chunks peak at 224.
    recs = {r.name: (r.chunk, r.offset) for r in ga.plan().records}
    assert recs == {"w": (0, 0), "x": (1, 0), "b": (0, 192), "n0": (1, 128), "n1": (1, 128), "n2": (1, 128),
                    "n3": (1, 0), "n4": (1, 0)}
    assert ga.plan().chunk_sizes == {0: [224, 224]}
    chunks = ga.get_buffers(0)
    assert [c.size for c in chunks] == [224, 224]
    assert ts["x"].buffer is chunks[1] and ts["w"].buffer is chunks[0]
    assert ga.get_buffer_size(0) == 448


def test_bad_buffer_ids_are_refused():
    ga = gallocr_new_n([backend_cpu_buffer_type(), CPUBufferType()])
    g, _ = mlp()
    with pytest.raises(AllocationError, match="buffer id 2"):
        ga.reserve_n(g, [0, 0, 2, 0, 0, 0], [0, 0, 0])
    with pytest.raises(AllocationError, match="6 nodes"):
        ga.reserve_n(g, [0, 0], [0, 0, 0])
    with pytest.raises(IndexError):
        ga.get_buffer_size(5)
    with pytest.raises(AllocationError, match="nothing planned"):
        gallocr_new(backend_cpu_buffer_type()).plan()


def test_allocator_debug_env_narrates(monkeypatch, capsys):
    monkeypatch.setenv("GGML_ALLOCATOR_DEBUG", "1")
    g, _ = mlp()
    gallocr_new(backend_cpu_buffer_type()).reserve(g)
    err = capsys.readouterr().err
    assert "alloc n0 (96 bytes) at buffer 0 chunk 0 offset 352" in err
    assert "reuse n0 for n1 in place" in err
    assert "free w (192 bytes)" in err
    monkeypatch.setenv("GGML_ALLOCATOR_DEBUG", "0")
    gallocr_new(backend_cpu_buffer_type()).reserve(mlp()[0])
    assert capsys.readouterr().err == ""


def test_plot_needs_matplotlib(monkeypatch, tmp_path):
    import sys

    g, _ = mlp()
    ga = gallocr_new(backend_cpu_buffer_type())
    ga.reserve(g)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(PlotUnavailableError, match="matplotlib"):
        ga.plan().plot(tmp_path / "plan.png")


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    g, _ = mlp()
    ga = gallocr_new(backend_cpu_buffer_type())
    ga.reserve(g)
    out = ga.plan().plot(tmp_path / "plan.png", title="mlp")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_alloc_graph_memory_is_real():
    g, ts = mlp()
    ga = gallocr_new(backend_cpu_buffer_type())
    ga.alloc_graph(g)
    x = ts["x"]
    api.backend_tensor_set(x, np.arange(32, dtype=np.float32))
    assert np.array_equal(x.numpy().reshape(-1), np.arange(32, dtype=np.float32))


def test_an_output_view_does_not_protect_its_source():
    # ggml checks OUTPUT on the parent and on the parent's view_src, never on views OF the parent.
    # a = sqr(x) (in place over the INPUT x: one child), v = reshape(a) OUTPUT, c = sqr(v), d = sqr(a).
    # a: children v and d, one view v. After c (v's only consumer) a has no views and one child left,
    # so d takes a's memory in place: the OUTPUT view v now shows d. pyggml mirrors this.
    def build(protect_source: bool) -> list[Tensor]:
        ctx = Context(1 << 16, no_alloc=True)
        x = ctx.new_tensor(F32, 4).set_name("x")
        x.set_input()
        a = B.sqr(ctx, x)
        v = B.reshape_2d(ctx, a, 2, 2)
        # the flag on the view alone (newer ggml_set_output also flags the view's source, for
        # exactly this reason; the allocator itself only looks at the parent and its view_src)
        v.flags |= TensorFlag.OUTPUT
        if protect_source:
            a.flags |= TensorFlag.OUTPUT
        c = B.sqr(ctx, v)
        d = B.sqr(ctx, a)
        g = Graph()
        for t in (v, c, d):
            g.build_forward_expand(t)
        assert g.nodes == [a, v, c, d]
        gallocr_new(backend_cpu_buffer_type()).alloc_graph(g)
        return [x, a, v, c, d]

    x, a, v, _, d = build(False)
    assert d.data == a.data == v.data == x.data
    # flagging the source as OUTPUT too keeps it: d then gets memory of its own
    x, a, v, _, d = build(True)
    assert a.data == v.data == x.data and d.data != a.data
