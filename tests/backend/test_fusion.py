"""Backend-level fusions of the CPU plan: fewer records, the same graph, the same bits for every node."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import pyggml as gg
from helpers.opcheck import OpCase
from pyggml import quants
from pyggml.backend.cpu import repack_buffer as repack
from pyggml.backend.cpu.compute import graph_compute, new_plan
from pyggml.backend.cpu.jit import JitKernel
from pyggml.backend.cpu.ops import mat_jit as jit_matmul
from pyggml.backend.cpu.quants import repacked
from pyggml.errors import PyGGMLError
from pyggml.graph import Graph
from pyggml.ops import builders as B
from pyggml.ops.enums import GluOp
from pyggml.ops.unary import glu_split
from pyggml.tensor import Tensor
from pyggml.types import GGMLType

#: builds a case's graph in a fresh OpCase (same seed: same data) and returns the nodes to compare
Build = Callable[[OpCase], list[Tensor]]


def _graph(build: Build) -> tuple[Graph, list[Tensor]]:
    nodes = build(OpCase())
    g = Graph()
    for t in nodes:
        g.build_forward_expand(t)
    return g, nodes


def _fused_vs_unfused(monkeypatch: pytest.MonkeyPatch, build: Build, n_fused: int, n_threads: int = 2) -> None:
    """The plan has ``n_fused`` records with fusions on, and every node in ``build``'s list gets the same
    bits with fusions off."""
    g, nodes = _graph(build)
    n_nodes = len(g.nodes)
    plan = new_plan(g)
    assert plan.n_compiled == n_fused
    graph_compute(g, n_threads)
    assert len(g.nodes) == n_nodes  # the graph itself is unchanged
    got = [t.numpy().copy() for t in nodes]
    monkeypatch.setenv("PYGGML_FUSION", "0")
    g2, nodes2 = _graph(build)
    assert new_plan(g2).n_compiled > n_fused
    graph_compute(g2, n_threads)
    for a, t in zip(got, nodes2, strict=True):
        np.testing.assert_array_equal(a.view(np.uint32), t.numpy().view(np.uint32), err_msg=t.name)


@pytest.mark.parametrize(("rows", "weight_rows"), [(1, 1), (7, 1), (6, 3)])
@pytest.mark.parametrize("in_place", [False, True])
def test_rms_norm_then_mul(monkeypatch: pytest.MonkeyPatch, rows: int, weight_rows: int, in_place: bool) -> None:
    """``in_place``: the MUL's output on the norm's, as the graph allocator places a model's norm weight."""
    def build(c: OpCase) -> list[Tensor]:
        norm = B.rms_norm(c.ctx, c.tensor(GGMLType.F32, 640, rows, lo=-4, hi=4), 1e-6)
        mul = B.mul(c.ctx, norm, c.tensor(GGMLType.F32, 640, weight_rows, lo=-2, hi=2))
        if in_place:
            mul.data = norm.data
            return [mul]
        return [norm, mul]

    _fused_vs_unfused(monkeypatch, build, 1)


def _residual_norm(rows: int, with_mul: bool) -> Build:
    def build(c: OpCase) -> list[Tensor]:
        x, res = c.tensor(GGMLType.F32, 896, rows, lo=-3, hi=3), c.tensor(GGMLType.F32, 896, rows, lo=-3, hi=3)
        s = B.add(c.ctx, x, res)
        norm = B.rms_norm(c.ctx, s, 1e-6)
        out = [s, norm]
        if with_mul:
            out.append(B.mul(c.ctx, norm, c.tensor(GGMLType.F32, 896, lo=-2, hi=2)))
        return out

    return build


@pytest.mark.parametrize("rows", [1, 5])
def test_residual_add_then_rms_norm_and_its_mul(monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    _fused_vs_unfused(monkeypatch, _residual_norm(rows, True), 1)


def test_a_residual_add_and_a_norm_without_its_mul_stay_two_records() -> None:
    """ADD + RMS_NORM waits for the MUL (Choice.pending); with none, the plan runs the two as they were."""
    g, (s, norm) = _graph(_residual_norm(3, False))
    plan = new_plan(g)
    assert plan.nodes == [s, norm]
    graph_compute(g, 2)
    expect = s.numpy() / np.sqrt(np.mean(s.numpy().astype(np.float64) ** 2, axis=-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(norm.numpy(), expect, rtol=1e-5)


def test_a_broadcast_add_is_not_fused_with_the_norm(monkeypatch: pytest.MonkeyPatch) -> None:
    def build(c: OpCase) -> list[Tensor]:
        s = B.add(c.ctx, c.tensor(GGMLType.F32, 64, 3), c.tensor(GGMLType.F32, 64, 1))  # a bias, not a residual
        norm = B.rms_norm(c.ctx, s, 1e-5)
        return [s, norm, B.mul(c.ctx, norm, c.tensor(GGMLType.F32, 64))]

    _fused_vs_unfused(monkeypatch, build, 2)  # the ADD alone, then the norm with its MUL


@pytest.mark.parametrize(("rows", "bias"), [(1, True), (7, True), (3, False)])
def test_norm_then_its_weight_and_bias(monkeypatch: pytest.MonkeyPatch, rows: int, bias: bool) -> None:
    """LayerNorm's NORM, MUL by the weight row and ADD of the bias row as one record (759 values: a tail after
    the 8-wide variance sums); without the bias, the NORM and its MUL."""
    def build(c: OpCase) -> list[Tensor]:
        norm = B.norm(c.ctx, c.tensor(GGMLType.F32, 759, rows, lo=-4, hi=4), 1e-12)
        nodes = [norm, B.mul(c.ctx, norm, c.tensor(GGMLType.F32, 759, lo=-2, hi=2))]
        if bias:
            nodes.append(B.add(c.ctx, nodes[-1], c.tensor(GGMLType.F32, 759, lo=-1, hi=1)))
        return nodes

    _fused_vs_unfused(monkeypatch, build, 1)


def test_a_norm_weight_of_other_rows_is_not_fused() -> None:
    c = OpCase()
    norm = B.norm(c.ctx, c.tensor(GGMLType.F32, 64, 3), 1e-5)
    g = Graph()
    g.build_forward_expand(B.mul(c.ctx, norm, c.tensor(GGMLType.F32, 64, 3)))  # a tensor of norm's shape, not a row
    assert new_plan(g).n_compiled == 2


def test_a_mul_of_something_else_is_not_fused() -> None:
    c = OpCase()
    x = c.tensor(GGMLType.F32, 64, 2)
    norm = B.rms_norm(c.ctx, x, 1e-6)
    other = B.mul(c.ctx, x, x)  # follows the norm but does not read it
    g = Graph()
    g.build_forward_expand(norm)
    g.build_forward_expand(other)
    assert new_plan(g).n_compiled == 2


def _ffn(ty: GGMLType, use_repack: bool, k: int, m: int, n: int, glu: GluOp | None, up_first: bool
         ) -> tuple[Graph, list[Tensor], object]:
    """gate and up products of one activation (weights of ``ty``, repacked or plain), then their split GLU."""
    rng = np.random.default_rng(5)
    wctx = gg.init(4096, no_alloc=True)
    gate, up = wctx.new_tensor(ty, k, m), wctx.new_tensor(ty, k, m)
    buft = repack.repack_buffer_type() if use_repack else gg.backend_cpu_buffer_type()
    buf = gg.backend_alloc_ctx_tensors_from_buft(wctx, buft)
    for w in (gate, up):
        gg.backend_tensor_set(w, quants.quantize(rng.standard_normal((m, k)).astype(np.float32), ty).reshape(-1))
    c = OpCase()
    x = c.tensor(GGMLType.F32, k, n, lo=-3, hi=3)
    g, u = B.mul_mat(c.ctx, gate, x), B.mul_mat(c.ctx, up, x)
    nodes = [g, u] if glu is None else [g, u, glu_split(c.ctx, u, g, glu) if up_first else glu_split(c.ctx, g, u, glu)]
    graph = Graph()
    for t in nodes:
        graph.build_forward_expand(t)
    return graph, nodes, buf


def _ffn_case(monkeypatch: pytest.MonkeyPatch, ty: GGMLType, use_repack: bool, n: int, glu: GluOp | None = GluOp.SWIGLU,
              up_first: bool = False, m: int = 1000, k: int = 512) -> None:
    monkeypatch.setenv("PYGGML_FUSION", "all")  # compile the fused kernel if it is not cached (jit.ready_or_wanted)
    got = []
    for fusion in (True, False):
        monkeypatch.setenv("PYGGML_FUSION", "all" if fusion else "0")
        graph, nodes, buf = _ffn(ty, use_repack, k, m, n, glu, up_first)
        assert new_plan(graph).n_compiled == (1 if fusion else len(nodes))
        graph_compute(graph, 2)
        got.append([t.numpy().copy() for t in nodes])
        buf.free()
    for a, b in zip(*got, strict=True):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("ty", [GGMLType.Q5_0, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K])
@pytest.mark.parametrize("glu", [GluOp.SWIGLU, GluOp.GEGLU])
def test_gate_and_up_products_and_their_glu_plain(monkeypatch: pytest.MonkeyPatch, ty: GGMLType, glu: GluOp) -> None:
    """A decode's FFN with plain weights: 1003 rows (chunks of about 64, a SiLU vector tail of 3 at the end)."""
    _ffn_case(monkeypatch, ty, False, 1, glu, m=1003)


@pytest.mark.parametrize("ty", [GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0,
                                GGMLType.IQ4_NL])
@pytest.mark.parametrize("n", [1, 5])
def test_gate_and_up_products_and_their_glu_repacked(monkeypatch: pytest.MonkeyPatch, ty: GGMLType, n: int) -> None:
    if ty not in repacked.TYPES:
        pytest.skip(f"this CPU has no repacked {ty.name} kernel")
    _ffn_case(monkeypatch, ty, True, n, up_first=n == 5)


def _product_after(ty: GGMLType, k: int, m: int, n: int, after: str) -> tuple[Graph, list[Tensor], object]:
    """A repacked product, then element-wise nodes on it, each on the one before: ``after``'s letters, b a bias
    ADD (a row), r a residual ADD (a same-shape tensor), g a GELU."""
    rng = np.random.default_rng(7)
    wctx = gg.init(4096, no_alloc=True)
    w = wctx.new_tensor(ty, k, m)
    buf = gg.backend_alloc_ctx_tensors_from_buft(wctx, repack.repack_buffer_type())
    gg.backend_tensor_set(w, quants.quantize(rng.standard_normal((m, k)).astype(np.float32), ty).reshape(-1))
    c = OpCase()
    nodes = [B.mul_mat(c.ctx, w, c.tensor(GGMLType.F32, k, n, lo=-3, hi=3))]
    for op in after:
        prev = nodes[-1]
        if op == "g":
            nodes.append(B.gelu(c.ctx, prev))
        else:
            nodes.append(B.add(c.ctx, prev, c.tensor(GGMLType.F32, m, 1 if op == "b" else n, lo=-2, hi=2)))
    graph = Graph()
    for t in nodes:
        graph.build_forward_expand(t)
    return graph, nodes, buf


@pytest.mark.parametrize("ty", [GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q4_0, GGMLType.Q5_0,
                                GGMLType.IQ4_NL])
@pytest.mark.parametrize(("n", "after"), [(1, "b"), (37, "br"), (5, "bg"), (9, "g"), (37, "brg")])
def test_a_repacked_product_and_the_adds_and_gelu_after_it(monkeypatch: pytest.MonkeyPatch, ty: GGMLType, n: int,
                                                            after: str) -> None:
    """One record for the product and up to three element-wise nodes after it (an encoder's ``w x + b +
    residual``, ``gelu(w x + b)``), every node's bits as their own records give them."""
    if ty not in repacked.TYPES:
        pytest.skip(f"this CPU has no repacked {ty.name} kernel")
    got = []
    for fusion in ("1", "0"):
        monkeypatch.setenv("PYGGML_FUSION", fusion)
        graph, nodes, buf = _product_after(ty, 512, 264, n, after)
        assert new_plan(graph).n_compiled == (1 if fusion == "1" else len(nodes))
        graph_compute(graph, 2)
        got.append([t.numpy().copy() for t in nodes])
        buf.free()
    for a, b in zip(*got, strict=True):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_a_fourth_elementwise_node_after_a_product_is_a_record_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    if GGMLType.Q8_0 not in repacked.TYPES:
        pytest.skip("this CPU has no repacked Q8_0 kernel")
    graph, _, buf = _product_after(GGMLType.Q8_0, 256, 64, 3, "brgb")
    assert new_plan(graph).n_compiled == 2
    buf.free()


def test_gate_and_up_without_a_glu_stay_two_records(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYGGML_FUSION", "all")
    graph, nodes, buf = _ffn(GGMLType.Q5_0, False, 256, 64, 1, None, False)
    assert new_plan(graph).nodes == nodes
    graph_compute(graph, 2)
    assert np.isfinite(nodes[0].numpy()).all() and not np.array_equal(nodes[0].numpy(), nodes[1].numpy())
    buf.free()


def test_products_of_different_activations_are_not_fused() -> None:
    c = OpCase()
    gate = c.tensor(GGMLType.Q8_0, 64, 8)
    g = B.mul_mat(c.ctx, gate, c.tensor(GGMLType.F32, 64, 1))
    u = B.mul_mat(c.ctx, gate, c.tensor(GGMLType.F32, 64, 1))
    graph = Graph()
    for t in (g, u, glu_split(c.ctx, g, u, GluOp.SWIGLU)):
        graph.build_forward_expand(t)
    assert new_plan(graph).n_compiled == 3


def test_gate_and_up_fuse_with_the_column_group_kernel_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode takes k_mm_* instead of k_mv_* once that is compiled (jit.lean_unless_ready): both fuse."""
    monkeypatch.setattr(jit_matmul, "lean_unless_ready", lambda lean, superset, later=False: superset)
    _ffn_case(monkeypatch, GGMLType.Q5_0, False, 1, GluOp.GEGLU, m=515)


@pytest.mark.parametrize(("ty", "n"), [(GGMLType.Q5_0, 3), (GGMLType.Q6_K, 6)])
def test_a_batch_of_decodes_fuses_gate_and_up_with_the_column_group_kernel(
        monkeypatch: pytest.MonkeyPatch, ty: GGMLType, n: int) -> None:
    """2..8 rows (a server's sequences decoding together) take k_mm_*, which fuses as well (k_gu_mm_*)."""
    _ffn_case(monkeypatch, ty, False, n, GluOp.GEGLU, m=515)


def _rope_into_cache(mode: int, cache_type: GGMLType, bad_index: bool = False) -> Build:
    def build(c: OpCase) -> list[Tensor]:
        head, n_head, n_tok = 64, 2, 3
        x = c.tensor(GGMLType.F32, head, n_head, n_tok, lo=-5, hi=5)
        pos = c.ints(GGMLType.I32, n_tok, data=np.array([3, 4, 900]))
        k = B.rope_ext(c.ctx, x, pos, None, head, mode, 4096, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
        cache = c.tensor(cache_type, head * n_head, 8, lo=0, hi=0)
        idx = c.ints(GGMLType.I64, n_tok, data=np.array([5, 0, 9 if bad_index else 2]))
        return [k, B.set_rows(c.ctx, cache, B.reshape_2d(c.ctx, k, head * n_head, n_tok), idx)]

    return build


@pytest.mark.parametrize("mode", [0, 2])
@pytest.mark.parametrize("cache_type", [GGMLType.F16, GGMLType.F32])
def test_rope_into_the_kv_cache(monkeypatch: pytest.MonkeyPatch, mode: int, cache_type: GGMLType) -> None:
    monkeypatch.setenv("PYGGML_FUSION", "all")
    _fused_vs_unfused(monkeypatch, _rope_into_cache(mode, cache_type), 1)


def test_costly_fusions_wait_for_their_kernel_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold first run does not compile the gate/up+GLU or ROPE+SET_ROWS kernels (jit.ready_or_wanted)."""
    monkeypatch.delenv("PYGGML_FUSION", raising=False)
    monkeypatch.setattr(JitKernel, "load_cached", lambda self: False)
    g, _ = _graph(_rope_into_cache(2, GGMLType.F16))
    assert new_plan(g).n_compiled == 2
    graph, nodes, buf = _ffn(GGMLType.Q5_0, False, 256, 64, 1, GluOp.GEGLU, False)
    assert new_plan(graph).nodes == nodes
    buf.free()


def test_rope_into_the_kv_cache_with_a_bad_index_is_the_set_rows_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYGGML_FUSION", "all")
    g, _ = _graph(_rope_into_cache(2, GGMLType.F16, bad_index=True))
    assert new_plan(g).n_compiled == 1
    with pytest.raises(PyGGMLError, match="out of range"):
        graph_compute(g, 2)


def test_a_fused_output_over_an_input_row_of_another_thread_is_not_fused() -> None:
    """The graph allocator may put a later node's output over an earlier node's input once its last reader
    has run; fused with no barrier, one thread's output rows would overwrite input rows another thread has
    yet to read. Here the MUL's output sits one row past the ADD's first input: no fusion, three records."""
    c = OpCase()
    rows = 6
    big = c.tensor(GGMLType.F32, 896, rows + 1, lo=-3, hi=3)
    x = B.view_2d(c.ctx, big, 896, rows, big.nb[1], 0)
    s = B.add(c.ctx, x, c.tensor(GGMLType.F32, 896, rows, lo=-3, hi=3))
    norm = B.rms_norm(c.ctx, s, 1e-6)
    out = B.mul(c.ctx, norm, c.tensor(GGMLType.F32, 896, lo=-2, hi=2))
    g = Graph()
    g.build_forward_expand(out)
    assert new_plan(g).n_compiled == 1  # where it lies, the chain is one record
    out.data = big.data + big.nb[1]  # now its rows start at x's second row
    assert new_plan(g).n_compiled == 3
    out.data = big.data  # exactly over x, row for row: each thread writes only rows it has read
    assert new_plan(g).n_compiled == 1


def _scan_into_rows(src_rows: list[int], dst_rows: list[int], other_reader: bool = False, nt: int = 2) -> Build:
    """A Mamba-2 SSM_SCAN of two sequences of ``nt`` tokens (states read at ``src_rows`` of a state tensor) and
    the SET_ROWS of its new states into that tensor's ``dst_rows`` (llm/graph.py's store_rs); the nodes
    compared are the scan's y, the state tensor and, with ``other_reader``, a node that reads the new states
    too. The state rows are 32-byte aligned, as a recurrent memory's are, so that a decode (nt 1) into other
    rows takes the non-temporal stores."""

    def build(c: OpCase) -> list[Tensor]:
        d_state, head_dim, n_head, ns = 40, 3, 4, 2
        width = d_state * head_dim * n_head
        big = c.tensor(GGMLType.F32, width * 5 + 8)
        s = B.view_2d(c.ctx, big, width, 5, width * 4, (-big.data % 32))
        assert s.data % 32 == 0 and s.nb[1] % 32 == 0
        x = c.tensor(GGMLType.F32, head_dim, n_head, nt, ns)
        dt = c.tensor(GGMLType.F32, n_head, nt, ns, lo=-3.0, hi=3.0)
        a = c.tensor(GGMLType.F32, 1, n_head, lo=-2.0, hi=-0.1)
        bc = c.tensor(GGMLType.F32, 2 * d_state, nt, ns)
        bb = B.view_4d(c.ctx, bc, d_state, 1, nt, ns, d_state * 4, bc.nb[1], bc.nb[2], 0)
        cc = B.view_4d(c.ctx, bc, d_state, 1, nt, ns, d_state * 4, bc.nb[1], bc.nb[2], d_state * 4)
        ids = c.ints(GGMLType.I32, ns, data=np.array(src_rows))
        scan = B.ssm_scan(c.ctx, B.reshape_4d(c.ctx, s, d_state, head_dim, n_head, 5), x, dt, a, bb, cc, ids, 1)
        n_y = x.nelements()
        new = B.view_1d(c.ctx, scan, s.ne[0] * ns, n_y * 4)
        stored = B.set_rows(c.ctx, s, B.reshape_2d(c.ctx, new, s.ne[0], ns),
                            c.ints(GGMLType.I64, ns, data=np.array(dst_rows)))
        out = [B.view_1d(c.ctx, scan, n_y, 0), stored]
        return [*out, B.scale(c.ctx, new, 2.0)] if other_reader else out

    return build


@pytest.mark.parametrize(("src_rows", "dst_rows"), [
    ([0, 1], [3, 2]),  # the memory's other rows: the scan writes the states there
    ([0, 1], [0, 4]),  # a sequence's own row (a cell written again in a decode)
    ([0, 1], [1, 3]),  # a row the other sequence reads: through the scan's output first
])
@pytest.mark.parametrize("nt", [1, 2])
def test_ssm_scan_into_state_rows(monkeypatch: pytest.MonkeyPatch, src_rows: list[int], dst_rows: list[int],
                                  nt: int) -> None:
    _fused_vs_unfused(monkeypatch, _scan_into_rows(src_rows, dst_rows, nt=nt), 1, n_threads=3)


def test_ssm_scan_states_read_by_another_node_are_not_fused() -> None:
    g, _ = _graph(_scan_into_rows([0, 1], [3, 2], other_reader=True))
    assert new_plan(g).n_compiled == 3


def _conv_bias_silu(n_t: int, silu: bool, in_place: bool) -> Build:
    """A Mamba layer's SSM_CONV over a window of 3 + n_t columns, the ADD of its bias and the SiLU of that; 45
    channels (the SiLU's last 5 of a row take libm's expf, not the vector one); ``in_place``: the ADD and the
    SiLU over the conv's output, as the graph allocator places them."""

    def build(c: OpCase) -> list[Tensor]:
        d_inner, n_s = 45, 2
        conv = B.ssm_conv(c.ctx, c.tensor(GGMLType.F32, 3 + n_t, d_inner, n_s, lo=-3, hi=3),
                          c.tensor(GGMLType.F32, 4, d_inner))
        add = B.add(c.ctx, conv, c.tensor(GGMLType.F32, d_inner))
        out = [conv, add]
        if silu:
            out.append(B.silu(c.ctx, add))
        if in_place:
            for t in out[1:]:
                t.data = conv.data
            return out[-1:]
        return out

    return build


@pytest.mark.parametrize("n_t", [1, 6])
@pytest.mark.parametrize(("silu", "in_place"), [(True, False), (True, True), (False, False)])
def test_ssm_conv_with_its_bias_and_silu(monkeypatch: pytest.MonkeyPatch, n_t: int, silu: bool,
                                         in_place: bool) -> None:
    _fused_vs_unfused(monkeypatch, _conv_bias_silu(n_t, silu, in_place), 1, n_threads=3)
