"""The quantized products against ggml-cpu's own: tests/data/vec_dot holds llama.cpp 0c1e570's
``type_traits_cpu[type].vec_dot`` of ggml-quantized weight rows with activation rows (its make_vec_dot.py says
how). The activation quantizers are exact and the integer block sums are too, so the two can differ only by the
float order of the scale steps: 1e-6 of a dot's natural size (sum of |w*x|) holds that with a wide margin and
fails on any wrong code, scale or offset (those move a dot by 1e-3 of it or more)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyggml import quants
from pyggml.backend.cpu.compute import graph_compute
from pyggml.backend.cpu.ops import mat_q
from pyggml.context import Context
from pyggml.graph import Graph
from pyggml.ops.builders import mul_mat
from pyggml.types import GGMLType

DATA = np.load(Path(__file__).resolve().parents[1] / "data" / "vec_dot" / "vec_dot.npz")
NAMES = sorted({k.rsplit("_", 1)[0] for k in DATA.files})
#: the types whose products ggml's x86 kernels sum in the same float order as pyggml's (8 fma lanes per block):
#: bit for bit
SAME_BITS = {"q8_0", "q4_0", "q5_0"}


def _case(name: str) -> tuple[GGMLType, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    qt = GGMLType[name.upper()]
    x, w, ref = DATA[f"{name}_x"], DATA[f"{name}_w"], DATA[f"{name}_out"]
    scale = np.abs(x).astype(np.float64) @ np.abs(quants.dequantize(w, qt)).astype(np.float64).T
    return qt, x, w, ref, scale


def _check(got: np.ndarray, ref: np.ndarray, scale: np.ndarray, name: str) -> None:
    if name in SAME_BITS:
        np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))
    err = np.abs(got.astype(np.float64) - ref) / scale
    assert err.max() <= 1e-6, f"{name}: {err.max():.2e} of a dot's size"


def test_the_reference_covers_every_fused_type() -> None:
    from pyggml.backend.cpu.traits import FUSED

    assert {GGMLType[n.upper()] for n in NAMES} == set(FUSED)


@pytest.mark.parametrize("name", NAMES)
def test_numpy_path_products_are_ggmls_vec_dot(name: str) -> None:
    qt, x, w, ref, scale = _case(name)
    _check(mat_q.mul_mat_q(w, qt, x, None, 2), ref, scale, name)
    _check(np.vstack([mat_q.mul_mat_q(w, qt, x[j : j + 1]) for j in range(len(x))]), ref, scale, name)


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("name", NAMES)
def test_compiled_products_are_ggmls_vec_dot(name: str, n: int) -> None:
    qt, x, w, ref, scale = _case(name)
    ctx = Context(16 << 20)
    wt = ctx.new_tensor(qt, x.shape[1], w.shape[0])
    wt.view4()[...] = w.reshape(wt.view4().shape)
    xt = ctx.new_tensor(GGMLType.F32, x.shape[1], n)
    xt.set(x[:n])
    out = mul_mat(ctx, wt, xt)
    g = Graph()
    g.build_forward_expand(out)
    assert graph_compute(g, 2) == 0
    _check(np.array(out.view4())[0, 0], ref[:n], scale[:n], name)
