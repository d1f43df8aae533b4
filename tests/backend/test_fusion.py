"""Backend-level fusions of the CPU plan: fewer records, the same graph, the same bits for every node."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from helpers.opcheck import OpCase
from pyggml.backend.cpu import plan as plan_mod
from pyggml.backend.cpu.compute import _resolve, graph_compute
from pyggml.graph import Graph
from pyggml.ops import builders as B
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
    plan = plan_mod.GraphPlan(g, _resolve)
    assert plan.n_compiled == n_fused
    graph_compute(g, n_threads)
    assert len(g.nodes) == n_nodes  # the graph itself is unchanged
    got = [t.numpy().copy() for t in nodes]
    monkeypatch.setattr(plan_mod, "_FUSION", False)
    g2, nodes2 = _graph(build)
    assert plan_mod.GraphPlan(g2, _resolve).n_compiled > n_fused
    graph_compute(g2, n_threads)
    for a, t in zip(got, nodes2, strict=True):
        np.testing.assert_array_equal(a.view(np.uint32), t.numpy().view(np.uint32), err_msg=t.name)


@pytest.mark.parametrize(("rows", "weight_rows"), [(1, 1), (7, 1), (6, 3)])
def test_rms_norm_then_mul(monkeypatch: pytest.MonkeyPatch, rows: int, weight_rows: int) -> None:
    def build(c: OpCase) -> list[Tensor]:
        norm = B.rms_norm(c.ctx, c.tensor(GGMLType.F32, 640, rows, lo=-4, hi=4), 1e-6)
        return [norm, B.mul(c.ctx, norm, c.tensor(GGMLType.F32, 640, weight_rows, lo=-2, hi=2))]

    _fused_vs_unfused(monkeypatch, build, 1)


@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("with_mul", [True, False])
def test_residual_add_then_rms_norm(monkeypatch: pytest.MonkeyPatch, rows: int, with_mul: bool) -> None:
    def build(c: OpCase) -> list[Tensor]:
        x, res = c.tensor(GGMLType.F32, 896, rows, lo=-3, hi=3), c.tensor(GGMLType.F32, 896, rows, lo=-3, hi=3)
        s = B.add(c.ctx, x, res)
        norm = B.rms_norm(c.ctx, s, 1e-6)
        out = [s, norm]
        if with_mul:
            out.append(B.mul(c.ctx, norm, c.tensor(GGMLType.F32, 896, lo=-2, hi=2)))
        return out

    _fused_vs_unfused(monkeypatch, build, 1)


def test_a_broadcast_add_is_not_fused_with_the_norm(monkeypatch: pytest.MonkeyPatch) -> None:
    def build(c: OpCase) -> list[Tensor]:
        s = B.add(c.ctx, c.tensor(GGMLType.F32, 64, 3), c.tensor(GGMLType.F32, 64, 1))  # a bias, not a residual
        norm = B.rms_norm(c.ctx, s, 1e-5)
        return [s, norm, B.mul(c.ctx, norm, c.tensor(GGMLType.F32, 64))]

    _fused_vs_unfused(monkeypatch, build, 2)  # the ADD alone, then the norm with its MUL


def test_a_mul_of_something_else_is_not_fused() -> None:
    c = OpCase()
    x = c.tensor(GGMLType.F32, 64, 2)
    norm = B.rms_norm(c.ctx, x, 1e-6)
    other = B.mul(c.ctx, x, x)  # follows the norm but does not read it
    g = Graph()
    g.build_forward_expand(norm)
    g.build_forward_expand(other)
    assert plan_mod.GraphPlan(g, _resolve).n_compiled == 2
