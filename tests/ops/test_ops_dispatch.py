"""The CPU executor: dispatch, COMPUTE flags, error reporting, threads, and custom (Python) ops."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.opcheck import OpCase, assert_close, values
from pyggml.backend.cpu.compute import KERNELS, compute_forward, graph_compute
from pyggml.errors import PyGGMLError, UnsupportedOpError
from pyggml.graph import Graph
from pyggml.ops import builders as B
from pyggml.ops.enums import EMPTY_OPS, Op
from pyggml.types import GGMLType

F32, F16 = GGMLType.F32, GGMLType.F16

#: ops the brief requires a CPU kernel for
REQUIRED = {
    "DUP", "ADD", "ADD1", "ACC", "SUB", "MUL", "DIV", "SQR", "SQRT", "LOG", "SIN", "COS", "SUM", "SUM_ROWS",
    "MEAN", "ARGMAX", "COUNT_EQUAL", "REPEAT", "REPEAT_BACK", "CONCAT", "NORM", "RMS_NORM", "GROUP_NORM",
    "L2_NORM", "MUL_MAT", "OUT_PROD", "SCALE", "SET", "CPY", "CONT", "GET_ROWS", "SET_ROWS", "DIAG",
    "DIAG_MASK_INF", "DIAG_MASK_ZERO", "SOFT_MAX", "ROPE", "CLAMP", "IM2COL", "POOL_1D", "POOL_2D", "UPSCALE",
    "PAD", "ARANGE", "TIMESTEP_EMBEDDING", "ARGSORT", "TOP_K", "LEAKY_RELU", "TRI", "FILL", "CUMSUM",
    "FLASH_ATTN_EXT", "UNARY", "GLU", "MAP_CUSTOM1", "MAP_CUSTOM2", "MAP_CUSTOM3", "CUSTOM",
}


def test_every_required_op_has_a_kernel() -> None:
    assert {op.name for op in KERNELS} >= REQUIRED
    assert not (set(KERNELS) & EMPTY_OPS)


def test_op_without_kernel_names_op_and_types() -> None:
    c = OpCase()
    a = c.tensor(F32, 4)
    node = c.ctx.new_tensor(F32, 4)
    node.op = Op.FLASH_ATTN_BACK
    node.src[0] = a
    g = Graph()
    g.build_forward_expand(node)
    with pytest.raises(UnsupportedOpError, match=r"FLASH_ATTN_BACK.*dst=f32 src0=f32"):
        graph_compute(g)


def test_node_missing_an_operand_is_reported() -> None:
    c = OpCase()
    node = c.ctx.new_tensor(F32, 4)
    node.op = Op.MUL_MAT
    node.src[0] = c.tensor(F32, 4, 4)
    g = Graph()
    g.build_forward_expand(node)
    with pytest.raises(PyGGMLError, match=r"MUL_MAT.*missing src1"):
        graph_compute(g)


def test_unsupported_types_raise_before_anything_runs() -> None:
    c = OpCase()
    a = c.tensor(F32, 8, 2)
    first = B.scale(c.ctx, a, 2.0)
    bad = c.ctx.new_tensor(F32, 8, 2)
    bad.op = Op.FLASH_ATTN_BACK
    bad.src[0] = first
    g = Graph()
    g.build_forward_expand(bad)
    with pytest.raises(UnsupportedOpError):
        graph_compute(g)
    assert (values(first) == 0).all()  # resolved up front: the SCALE node never ran
    h = c.tensor(F16, 8, 2)
    with pytest.raises(UnsupportedOpError, match=r"SOFT_MAX.*src0=f16"):
        c.compute(B.soft_max(c.ctx, h))


def test_only_compute_flagged_nodes_run() -> None:
    c = OpCase()
    a = c.tensor(F32, 6)
    t0 = B.scale(c.ctx, a, 3.0)
    t1 = B.scale(c.ctx, a, 5.0)
    g = Graph()
    g.build_forward_select([t0, t1], 1)
    graph_compute(g)
    assert (values(t0) == 0).all()
    assert_close(values(t1), values(a) * np.float32(5.0))


def test_view_ops_compute_nothing_and_n_threads_checked() -> None:
    c = OpCase()
    a = c.tensor(F32, 4, 3)
    v = B.transpose(c.ctx, a)
    compute_forward(v, 2)  # no kernel needed, nothing happens
    g = Graph()
    g.build_forward_expand(B.cont(c.ctx, v))
    with pytest.raises(PyGGMLError, match="n_threads"):
        graph_compute(g, 0)


def test_results_do_not_depend_on_n_threads() -> None:
    c = OpCase()
    a = c.tensor(GGMLType.Q4_0, 64, 10)
    b = c.tensor(F32, 64, 3)
    r1 = c.compute(B.mul_mat(c.ctx, a, b), n_threads=1).copy()
    r4 = c.compute(B.mul_mat(c.ctx, a, b), n_threads=4)
    assert (r1 == r4).all()


# ------------------------------------------------------------------------------------ custom ops


def test_map_custom1_ith_nth() -> None:
    c = OpCase()
    a = c.tensor(F32, 10, 4)
    calls: list[tuple[int, int]] = []

    def fun(dst, src, ith, nth, userdata):  # ggml's custom1 signature
        calls.append((ith, nth))
        rows = range(ith, src.ne[1], nth)
        for r in rows:
            dst.view4()[0, 0, r] = src.view4()[0, 0, r] * userdata

    got = c.compute(B.map_custom1(c.ctx, a, fun, 2, 3.0), n_threads=4)
    assert calls == [(0, 2), (1, 2)]
    assert_close(got, values(a) * 3.0)
    calls.clear()
    c.compute(B.map_custom1(c.ctx, a, fun, B.GGML_N_TASKS_MAX, 1.0), n_threads=3)
    assert calls == [(0, 3), (1, 3), (2, 3)]


def test_map_custom2_and_3() -> None:
    c = OpCase()
    a, b, d = c.tensor(F32, 5), c.tensor(F32, 5), c.tensor(F32, 5)

    def f2(dst, x, y, ith, nth, ud):
        if ith == 0:
            dst.view4()[...] = x.view4() - y.view4()

    def f3(dst, x, y, z, ith, nth, ud):
        if ith == 0:
            dst.view4()[...] = x.view4() * y.view4() + z.view4() + ud

    assert_close(c.compute(B.map_custom2(c.ctx, a, b, f2)), values(a) - values(b))
    assert_close(c.compute(B.map_custom3(c.ctx, a, b, d, f3, 1, 0.5)), values(a) * values(b) + values(d) + 0.5)


def test_custom_4d_sees_args_in_src() -> None:
    c = OpCase()
    a, b = c.tensor(F32, 3, 2), c.tensor(F32, 3, 2)

    def fun(dst, ith, nth, ud):
        if ith == 0:
            dst.view4()[...] = np.maximum(dst.src[0].view4(), dst.src[1].view4())

    got = c.compute(B.custom_4d(c.ctx, F32, 3, 2, 1, 1, [a, b], fun, 1, None))
    assert_close(got, np.maximum(values(a), values(b)))


def test_custom_node_without_callable_is_reported() -> None:
    c = OpCase()
    a = c.tensor(F32, 3)
    node = B.map_custom1(c.ctx, a, lambda *args: None, 1, None)
    node.extra = None
    with pytest.raises(PyGGMLError, match="MAP_CUSTOM1"):
        c.compute(node)


def test_blas_runs_on_one_thread_and_the_count_is_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """In the numpy kernel BLAS always runs on one thread, mat-vec or mat-mat: our threads split big products,
    and OpenBLAS's own threads spin after each call, taking the cores from ours. The caller's count is
    restored after the graph. (Compiled kernels take small products and use no BLAS: turned off here.)"""
    from pyggml.backend.cpu import blas

    monkeypatch.setenv("PYGGML_JIT", "0")
    if not blas.available():
        pytest.fail("numpy's OpenBLAS thread control was not found")
    real = blas.set_threads
    real(2)
    seen: list[int] = []
    monkeypatch.setattr(blas, "set_threads", lambda n: (seen.append(n), real(n))[1])
    c = OpCase()
    a = c.tensor(F32, 32, 8)
    for cols in (1, 16):
        seen.clear()
        c.compute(B.mul_mat(c.ctx, a, c.tensor(F32, 32, cols)), n_threads=2)
        assert seen[0] == 1, cols
        assert blas.get_threads() == 2


def test_abort_callback_stops_after_the_current_node() -> None:
    c = OpCase()
    a = c.tensor(F32, 4)
    t1 = B.scale(c.ctx, a, 2.0)
    t2 = B.scale(c.ctx, t1, 3.0)
    g = Graph()
    g.build_forward_expand(t2)
    calls = []
    status = graph_compute(g, 1, abort_callback=lambda: calls.append(1) or True)
    assert status == 1 and len(calls) == 1  # GGML_STATUS_ABORTED after the first node
    assert_close(values(t1), values(a) * np.float32(2.0))
    assert (values(t2) == 0).all()
    assert graph_compute(g, 1, abort_callback=lambda: False) == 0
    assert_close(values(t2), values(a) * np.float32(6.0))


def test_graph_compute_with_ctx() -> None:
    from pyggml.backend.cpu.compute import graph_compute_with_ctx
    from pyggml.context import Context

    c = OpCase()
    a = c.tensor(F32, 5)
    g = Graph()
    g.build_forward_expand(B.sqr(c.ctx, a))
    assert graph_compute_with_ctx(c.ctx, g, 2) == 0
    with pytest.raises(PyGGMLError, match="no_alloc"):
        graph_compute_with_ctx(Context(1 << 16, no_alloc=True), g, 1)
