"""Backend-level fusions of the CPU plan: fewer records, the same graph, the same bits for every node."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.opcheck import OpCase
from pyggml.backend.cpu import plan as plan_mod
from pyggml.backend.cpu.compute import _resolve, graph_compute
from pyggml.backend.cpu.jit import nn
from pyggml.graph import Graph
from pyggml.ops import builders as B
from pyggml.types import GGMLType


def _norm_mul(rows: int, weight_rows: int) -> tuple[Graph, object, object]:
    c = OpCase()
    x = c.tensor(GGMLType.F32, 640, rows, lo=-4, hi=4)
    w = c.tensor(GGMLType.F32, 640, weight_rows, lo=-2, hi=2)
    norm = B.rms_norm(c.ctx, x, 1e-6)
    out = B.mul(c.ctx, norm, w)
    g = Graph()
    g.build_forward_expand(out)
    return g, norm, out


@pytest.mark.parametrize(("rows", "weight_rows"), [(1, 1), (7, 1), (6, 3)])
def test_rms_norm_then_mul_is_one_record_with_both_nodes_bits(monkeypatch, rows: int, weight_rows: int) -> None:
    g, norm, out = _norm_mul(rows, weight_rows)
    fused = plan_mod.GraphPlan(g, _resolve)
    assert fused.n_compiled == 1 and fused.nodes == [out]  # one record, named by the MUL
    assert g.nodes[-2:] == [norm, out]  # the graph is unchanged
    graph_compute(g, 2)
    got_norm, got_out = norm.numpy().copy(), out.numpy().copy()
    monkeypatch.setattr(plan_mod, "_FUSION", False)
    g2, norm2, out2 = _norm_mul(rows, weight_rows)
    assert plan_mod.GraphPlan(g2, _resolve).n_compiled == 2
    graph_compute(g2, 2)
    np.testing.assert_array_equal(got_norm.view(np.uint32), norm2.numpy().view(np.uint32))
    np.testing.assert_array_equal(got_out.view(np.uint32), out2.numpy().view(np.uint32))


def test_a_mul_of_something_else_is_not_fused() -> None:
    c = OpCase()
    x = c.tensor(GGMLType.F32, 64, 2)
    norm = B.rms_norm(c.ctx, x, 1e-6)
    other = B.mul(c.ctx, x, x)  # follows the norm but does not read it
    g = Graph()
    g.build_forward_expand(norm)
    g.build_forward_expand(other)
    assert nn.fuse_rms_norm_mul(norm, nn.Choice(nn.k_rms_norm), other, nn.Choice(nn.k_mul)) is None
    assert plan_mod.GraphPlan(g, _resolve).n_compiled == 2
