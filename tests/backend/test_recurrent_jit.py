"""The compiled SSM_CONV and SSM_SCAN (backend/cpu/ops/recurrent_jit.py) against the numpy kernels.

As in test_cpu_plan.py: the plan must really take the compiled kernel, then every node is recomputed
with the numpy kernels. SSM_CONV sums in the same order (bit for bit); SSM_SCAN's state sums follow
ggml's vector order where the numpy kernel sums pairwise, and its decays take the C library's expf,
so the two agree to float32 rounding. The cases are Mamba's shapes: a conv over a saved window plus new
columns of several sequences; Mamba-1 (a decay per state dim, one dim per head) and Mamba-2 (a decay per
head, grouped B/C as views of one projection, d_state both under and over ggml's vector step of 32,
states read through ids that reorder them, and rollback snapshots with K > 1).
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.opcheck import OpCase, values
from pyggml.backend.cpu.compute import _resolve, compute_forward, graph_compute
from pyggml.backend.cpu.plan import plan_for
from pyggml.graph import Graph
from pyggml.ops import builders as B
from pyggml.tensor import Tensor
from pyggml.types import GGMLType

F32, I32 = GGMLType.F32, GGMLType.I32


def both(out: Tensor, n_threads: int = 2) -> tuple[np.ndarray, np.ndarray]:
    g = Graph()
    g.build_forward_expand(out)
    plan = plan_for(g, _resolve)
    assert any(n is out for n in plan.nodes), f"{out.op.name} did not take a compiled kernel"
    assert graph_compute(g, n_threads) == 0
    got = values(out)
    for node in g.nodes:
        compute_forward(node, n_threads)
    return got, values(out)


@pytest.mark.parametrize("n_t", [1, 7])
def test_ssm_conv_is_bit_exact(n_t: int) -> None:
    c = OpCase()
    d_conv, d_inner, n_s = 4, 40, 3
    sx = c.tensor(F32, d_conv - 1 + n_t, d_inner, n_s)
    w = c.tensor(F32, d_conv, d_inner)
    got, ref = both(B.ssm_conv(c.ctx, sx, w), n_threads=3)
    np.testing.assert_array_equal(got, ref)


def _scan(c: OpCase, d_state: int, head_dim: int, n_head: int, n_group: int, nt: int, ns: int, mamba1: bool,
          k: int = 1) -> Tensor:
    slots = ns + 2
    s = c.tensor(F32, d_state, head_dim, n_head, slots)
    x = c.tensor(F32, head_dim, n_head, nt, ns)
    dt = c.tensor(F32, n_head, nt, ns, lo=-3.0, hi=3.0)
    a = c.tensor(F32, d_state if mamba1 else 1, n_head, lo=-2.0, hi=-0.1)
    bc = c.tensor(F32, 2 * d_state * n_group + 3, nt, ns)  # B and C as views of one row, as a projection's
    bb = B.view_4d(c.ctx, bc, d_state, n_group, nt, ns, d_state * 4, bc.nb[1], bc.nb[2], 0)
    cc = B.view_4d(c.ctx, bc, d_state, n_group, nt, ns, d_state * 4, bc.nb[1], bc.nb[2], d_state * n_group * 4)
    ids = c.ints(I32, ns, data=np.arange(ns)[::-1] + 1)
    return B.ssm_scan(c.ctx, s, x, dt, a, bb, cc, ids, k)


@pytest.mark.parametrize(("d_state", "head_dim", "n_head", "n_group", "mamba1", "k"), [
    (16, 1, 24, 1, True, 1),  # Mamba-1: d_inner heads of dimension 1
    (16, 8, 6, 2, False, 1),  # Mamba-2, d_state under the vector step
    (72, 5, 4, 1, False, 1),  # two vector steps of 32 and a scalar tail of 8; rows in pairs and a last one
    (32, 4, 6, 3, False, 3),  # rollback snapshots
])
def test_ssm_scan_matches_numpy(d_state: int, head_dim: int, n_head: int, n_group: int, mamba1: bool,
                                k: int) -> None:
    c = OpCase(seed=d_state + k)
    got, ref = both(_scan(c, d_state, head_dim, n_head, n_group, nt=5, ns=2, mamba1=mamba1, k=k), n_threads=4)
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5 * float(np.abs(ref).max()))
