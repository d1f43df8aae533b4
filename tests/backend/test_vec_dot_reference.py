"""The quantized products against ggml-cpu's own: tests/data/vec_dot holds llama.cpp 0c1e570's
``type_traits_cpu[type].vec_dot`` of ggml-quantized weight rows with activation rows (its make_vec_dot.py says
how). The activation quantizers are exact and the integer block sums are too, so the two can differ only by the
float order of the scale steps: 1e-6 of a dot's natural size (sum of |w*x|) holds that with a wide margin and
fails on any wrong code, scale or offset (those move a dot by 1e-3 of it or more)."""

from __future__ import annotations

from pathlib import Path

import numba
import numpy as np
import pytest

from pyggml import quants
from pyggml.alloc.ctx_alloc import backend_alloc_ctx_tensors
from pyggml.backend.api import backend_tensor_set
from pyggml.backend.base import BufferUsage
from pyggml.backend.cpu.backend import backend_cpu_init
from pyggml.backend.cpu.compute import graph_compute
from pyggml.backend.cpu.ops import mat_q
from pyggml.backend.cpu.ops.mat_f_jit import vec_dot_bf16, vec_dot_f16
from pyggml.context import Context
from pyggml.graph import Graph
from pyggml.ops.builders import mul_mat
from pyggml.tensor import Tensor
from pyggml.tensor_data import bf16_to_f32, f32_to_bf16
from pyggml.types import GGMLType

DATA = np.load(Path(__file__).resolve().parents[1] / "data" / "vec_dot" / "vec_dot.npz")
FLOATS = ("f16", "bf16")
NAMES = sorted({k.rsplit("_", 1)[0] for k in DATA.files} - set(FLOATS))
#: the types whose products ggml's x86 kernels sum in the same float order as pyggml's (8 fma lanes per block):
#: bit for bit
SAME_BITS = {"q8_0", "q4_0", "q5_0"}


def _case(name: str) -> tuple[GGMLType, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    qt = GGMLType[name.upper()]
    x, w, ref = DATA[f"{name}_x"], DATA[f"{name}_w"], DATA[f"{name}_out"]
    wf = bf16_to_f32(w.view(np.uint16)) if qt == GGMLType.BF16 else w.view(np.float16).astype(np.float32) \
        if qt == GGMLType.F16 else quants.dequantize(w, qt)
    scale = np.abs(x).astype(np.float64) @ np.abs(wf).astype(np.float64).T
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
    _check(_compiled_product(wt, x[:n]), ref[:n], scale[:n], name)


def _compiled_product(wt: Tensor, x: np.ndarray) -> np.ndarray:
    """The weight tensor wt times the rows x through the CPU plan (2 threads), as (rows, wt.ne[1])."""
    ctx = Context(16 << 20)
    xt = ctx.new_tensor(GGMLType.F32, x.shape[1], x.shape[0])
    xt.set(x)
    out = mul_mat(ctx, wt, xt)
    g = Graph()
    g.build_forward_expand(out)
    assert graph_compute(g, 2) == 0
    return np.array(out.view4())[0, 0]


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("name", FLOATS)
def test_float_weights_take_ggmls_vec_dot(name: str, n: int) -> None:
    """A model's F16/BF16 weights (loaded as a model's are, into a WEIGHTS buffer) decode with ggml's vec_dot
    float steps (src1 rounded to fp16/bf16, fma lanes), not the double sums attention's F16 cache takes."""
    qt, x, w, ref, scale = _case(name)
    ctx = Context(1 << 20, no_alloc=True)
    wt = ctx.new_tensor(qt, x.shape[1], w.shape[0])
    buf = backend_alloc_ctx_tensors(ctx, backend_cpu_init())
    buf.set_usage(BufferUsage.WEIGHTS)
    backend_tensor_set(wt, w.reshape(-1))
    got = _compiled_product(wt, x[:n])
    err = np.abs(got.astype(np.float64) - ref[:n]) / scale[:n]
    assert err.max() <= 1e-6, f"{err.max():.2e} of a dot's size"
    # the float steps are vec_dot_f16/bf16's (a double sum would be within the tolerance above too)
    if qt == GGMLType.F16:
        want = _vec_dots_f16(w.view(np.uint16), x[:n].astype(np.float16).astype(np.float32))  # numba has no float16
    else:
        want = _vec_dots_bf16(w.view(np.uint16), bf16_to_f32(f32_to_bf16(x[:n])))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def _vec_dots(dot):
    @numba.njit
    def dots(w, x):  # pragma: no cover - compiled
        out = np.empty((x.shape[0], w.shape[0]), np.float32)
        for j in range(x.shape[0]):
            for r in range(w.shape[0]):
                out[j, r] = dot(w[r].ctypes.data, x[j].ctypes.data, w.shape[1])
        return out

    return dots


_vec_dots_f16, _vec_dots_bf16 = _vec_dots(vec_dot_f16), _vec_dots(vec_dot_bf16)
