"""CPU kernels of the elementwise ops against numpy references (binary, unary, GLU, scale...)."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest

from helpers.opcheck import NMSE_DEFAULT, OpCase, assert_close, round_f16, round_to, values
from pyggml.ops import builders as B
from pyggml.ops.enums import GluOp, UnaryOp
from pyggml.types import GGMLType

F32, F16, BF16 = GGMLType.F32, GGMLType.F16, GGMLType.BF16

_NP_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}


def _tile(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return np.tile(x, [s // h for s, h in zip(shape, x.shape, strict=True)])


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize(
    ("ta", "tb"), [(F32, F32), (F16, F16), (F16, F32), (BF16, BF16), (BF16, F32)]
)
@pytest.mark.parametrize(
    ("ne_a", "ne_b"),
    [
        ((16, 5, 4, 3), (16, 5, 4, 3)),
        ((16, 5, 4, 3), (16, 1, 2, 1)),  # repeat in dims 1..3 (dim 2 by a whole multiple)
        ((16, 5, 4, 3), (8, 5, 1, 3)),  # repeat along dim 0 (ggml allows it)
        ((7, 3, 1, 1), (1, 1, 1, 1)),  # scalar
    ],
)
def test_binary_broadcast(op: str, ta: GGMLType, tb: GGMLType, ne_a: tuple, ne_b: tuple) -> None:
    c = OpCase()
    a = c.tensor(ta, *ne_a)
    b = c.tensor(tb, *ne_b, lo=0.5, hi=1.5)
    out = getattr(B, op)(c.ctx, a, b)
    got = c.compute(out)
    va, vb = values(a), values(b)
    ref = round_to(_NP_BINARY[op](va, _tile(vb, va.shape)), out.type)
    assert_close(got, ref)


@pytest.mark.parametrize("op", ["add", "mul"])
def test_binary_non_contiguous(op: str) -> None:
    """Permuted a, transposed b, written into a fresh contiguous result."""
    c = OpCase()
    base_a = c.tensor(F32, 6, 4, 5, 2)
    a = B.permute(c.ctx, base_a, 1, 2, 0, 3)  # ne = [5, 6, 4, 2]
    base_b = c.tensor(F32, 6, 5)
    b = B.transpose(c.ctx, base_b)  # ne = [5, 6]
    assert not a.is_contiguous() and not b.is_contiguous()
    got = c.compute(getattr(B, op)(c.ctx, a, b))
    va, vb = values(a), values(b)
    assert_close(got, _NP_BINARY[op](va, np.broadcast_to(vb, va.shape)))


def test_add_inplace_writes_into_a() -> None:
    c = OpCase()
    a = c.tensor(F32, 8, 3)
    b = c.tensor(F32, 8, 1)
    before = values(a).copy()
    out = B.add_inplace(c.ctx, a, b)
    c.compute(out)
    assert_close(values(a), before + values(b))


@pytest.mark.parametrize(("name", "params"), [("sub", ["ctx", "a", "b"]), ("rms_norm", ["ctx", "a", "eps"]),
                                             ("diag_mask_inf", ["ctx", "a", "n_past"]), ("sqrt", ["ctx", "a"])])
def test_twins_show_their_parameters_and_inplace_views_a(name: str, params: list[str]) -> None:
    """X and X_inplace made by ops._build._twins: ggml's parameters (not impl's op/inplace), and the
    inplace twin's result is a view of a while X's is a new tensor."""
    build, build_inplace = getattr(B, name), getattr(B, f"{name}_inplace")
    assert list(inspect.signature(build).parameters) == params == list(inspect.signature(build_inplace).parameters)
    c = OpCase()
    a = c.tensor(F32, 8, 8)
    extra = {"b": [a], "eps": [1e-5], "n_past": [2]}.get(params[-1], [])
    assert build(c.ctx, a, *extra).view_src is None
    assert build_inplace(c.ctx, a, *extra).view_src is a


def test_add_quantized_src0() -> None:
    """ADD into a quantized tensor dequantizes, adds, re-quantizes (ggml's add_q_f32)."""
    c = OpCase()
    a = c.tensor(GGMLType.Q8_0, 64, 4)
    b = c.tensor(F32, 64, 4)
    got = c.compute(B.add(c.ctx, a, b))
    assert_close(got, values(a) + values(b), max_nmse=1e-4)


def test_add1() -> None:
    c = OpCase()
    a = c.tensor(F32, 9, 4)
    s = c.tensor(F32, 1, data=np.array([0.75], dtype=np.float32))
    assert_close(c.compute(B.add1(c.ctx, a, s)), values(a) + np.float32(0.75))


@pytest.mark.parametrize("ty", [F32, F16, BF16])
@pytest.mark.parametrize("name", ["sqr", "sqrt", "log", "sin", "cos"])
def test_unary_math(name: str, ty: GGMLType) -> None:
    c = OpCase()
    lo = 0.1 if name in ("sqrt", "log") else -3.0
    a = c.tensor(ty, 33, 3, 2, data=None, lo=lo, hi=3.0)
    x = values(a).astype(np.float64)
    fn = {"sqr": np.square, "sqrt": np.sqrt, "log": np.log, "sin": np.sin, "cos": np.cos}[name]
    got = c.compute(getattr(B, name)(c.ctx, a))
    assert_close(got, round_to(fn(x).astype(np.float32), ty))


@pytest.mark.parametrize("b", [0.0, 0.25])
def test_scale(b: float) -> None:
    c = OpCase()
    a = c.tensor(F32, 17, 6)
    out = B.scale_bias(c.ctx, a, 1.75, b) if b else B.scale(c.ctx, a, 1.75)
    assert_close(c.compute(out), values(a) * np.float32(1.75) + np.float32(b))


@pytest.mark.parametrize("ty", [F32, F16])
def test_clamp(ty: GGMLType) -> None:
    c = OpCase()
    a = c.tensor(ty, 20, 4)
    x = values(a).copy()  # CLAMP is always in place in ggml
    got = c.compute(B.clamp(c.ctx, a, -0.3, 0.4))
    ref = round_to(np.clip(x, -0.3, 0.4), ty)
    assert np.abs(ref - x).max() > 0.1  # the test data does get clamped
    assert_close(got, ref)


def test_leaky_relu() -> None:
    c = OpCase()
    a = c.tensor(F32, 20, 4)
    x = values(a)
    assert_close(c.compute(B.leaky_relu(c.ctx, a, 0.1)), np.where(x > 0, x, np.float32(0.1) * x))


def test_fill() -> None:
    c = OpCase()
    a = c.tensor(F32, 5, 3)
    got = c.compute(B.fill(c.ctx, a, 2.5))
    assert (got == 2.5).all()


# ------------------------------------------------------------------------------- unary references


def _gelu_tanh(v: float) -> float:
    return 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * v * (1.0 + 0.044715 * v * v)))


def _gelu_quick(v: float) -> float:
    return v / (1.0 + math.exp(-1.702 * v))


def _gelu_table_ref(x: np.ndarray) -> np.ndarray:
    """ggml's F32 GELU: 0 at <= -10, x at >= 10, else fp16(gelu(fp16(x)))."""
    h = round_f16(x)
    y = round_f16(np.vectorize(_gelu_tanh)(h.astype(np.float64)))
    return np.where(x <= -10, 0.0, np.where(x >= 10, x, y)).astype(np.float32)


def _gelu_quick_table_ref(x: np.ndarray) -> np.ndarray:
    h = round_f16(x)
    return round_f16(np.vectorize(_gelu_quick)(h.astype(np.float64)))


def _softplus(v: float) -> float:
    return v if v > 20 else math.log1p(math.exp(v))


_UNARY_REF = {
    UnaryOp.ABS: np.abs,
    UnaryOp.SGN: np.sign,
    UnaryOp.NEG: np.negative,
    UnaryOp.STEP: lambda x: (x > 0).astype(np.float64),
    UnaryOp.TANH: np.tanh,
    UnaryOp.ELU: lambda x: np.where(x > 0, x, np.expm1(x)),
    UnaryOp.RELU: lambda x: np.maximum(x, 0),
    UnaryOp.SIGMOID: lambda x: 1 / (1 + np.exp(-x)),
    UnaryOp.GELU: _gelu_table_ref,
    UnaryOp.GELU_QUICK: _gelu_quick_table_ref,
    UnaryOp.SILU: lambda x: x / (1 + np.exp(-x)),
    UnaryOp.HARDSWISH: lambda x: x * np.clip((x + 3) / 6, 0, 1),
    UnaryOp.HARDSIGMOID: lambda x: np.clip((x + 3) / 6, 0, 1),
    UnaryOp.EXP: np.exp,
    UnaryOp.EXPM1: np.expm1,
    UnaryOp.SOFTPLUS: np.vectorize(_softplus),
    UnaryOp.GELU_ERF: np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2)))),
    UnaryOp.FLOOR: np.floor,
    UnaryOp.CEIL: np.ceil,
    UnaryOp.ROUND: np.vectorize(lambda v: math.copysign(math.floor(abs(v) + 0.5), v)),
    UnaryOp.TRUNC: np.trunc,
}


def _unary_input(c: OpCase, ty: GGMLType) -> np.ndarray:
    x = c.rng.uniform(-5, 5, size=(3, 40)).astype(np.float32)
    x[0, :8] = [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.0, -0.0]  # rounding ties and zeros
    x[1, :4] = [-12.0, 12.0, 25.0, -25.0]  # GELU clamps, softplus tail
    return x


@pytest.mark.parametrize("ty", [F32, F16])
@pytest.mark.parametrize("op", [op for op in UnaryOp if op != UnaryOp.XIELU], ids=lambda o: o.name)
def test_unary(op: UnaryOp, ty: GGMLType) -> None:
    c = OpCase()
    a = c.tensor(ty, 40, 3, data=_unary_input(c, ty))
    got = c.compute(B.unary(c.ctx, a, op))
    x = values(a)
    ref = np.asarray(_UNARY_REF[op](x.astype(np.float64)), dtype=np.float64).astype(np.float32)
    if op in (UnaryOp.GELU, UnaryOp.GELU_QUICK):
        ref = np.asarray(_UNARY_REF[op](x))
    assert_close(got, round_to(ref, ty))


def test_unary_non_contiguous_rows() -> None:
    """A row-strided view (contiguous rows, gaps between them) goes through UNARY."""
    c = OpCase()
    base = c.tensor(F32, 12, 6)
    v = B.view_2d(c.ctx, base, 8, 3, base.nb[1] * 2, 4 * 2)
    got = c.compute(B.silu(c.ctx, v))
    x = values(v).astype(np.float64)
    assert_close(got, (x / (1 + np.exp(-x))).astype(np.float32))


def test_gelu_is_within_fp16_table_accuracy_of_exact() -> None:
    """ggml's table GELU deviates from exact tanh-GELU by up to ~4e-3 relative, never more."""
    c = OpCase()
    a = c.tensor(F32, 256, 4, lo=-6, hi=6)
    got = c.compute(B.gelu(c.ctx, a))
    exact = np.vectorize(_gelu_tanh)(values(a).astype(np.float64))
    big = np.abs(exact) > 1e-2
    rel = np.abs(got[big] - exact[big]) / np.abs(exact[big])
    assert rel.max() < 5e-3


def test_xielu() -> None:
    c = OpCase()
    a = c.tensor(F32, 32, 3, lo=-4, hi=4)
    an, ap, beta, eps = 0.8, 0.8, 0.5, -1e-6
    got = c.compute(B.xielu(c.ctx, a, an, ap, beta, eps))
    x = values(a).astype(np.float64)
    alpha_n = beta + _softplus(an)
    alpha_p = _softplus(ap)
    ref = np.where(x > 0, alpha_p * x * x + beta * x, (np.expm1(np.minimum(x, eps)) - x) * alpha_n + beta * x)
    assert_close(got, ref.astype(np.float32))


# -------------------------------------------------------------------------------------------- GLU


def _glu_act(op: GluOp, x: np.ndarray) -> np.ndarray:
    if op == GluOp.REGLU:
        return np.maximum(x, 0)
    if op == GluOp.GEGLU:
        return _gelu_table_ref(x)
    if op == GluOp.SWIGLU:
        return x / (1 + np.exp(-x.astype(np.float64)))
    if op == GluOp.GEGLU_ERF:
        return np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))(x.astype(np.float64))
    if op == GluOp.GEGLU_QUICK:
        return _gelu_quick_table_ref(x)
    raise AssertionError(op)


_GLU_OPS = [GluOp.REGLU, GluOp.GEGLU, GluOp.SWIGLU, GluOp.GEGLU_ERF, GluOp.GEGLU_QUICK]


@pytest.mark.parametrize("ty", [F32, F16])
@pytest.mark.parametrize("swapped", [False, True])
@pytest.mark.parametrize("op", _GLU_OPS, ids=lambda o: o.name)
def test_glu_fused(op: GluOp, swapped: bool, ty: GGMLType) -> None:
    c = OpCase()
    a = c.tensor(ty, 64, 3, 2, lo=-3, hi=3)
    got = c.compute(B.glu(c.ctx, a, op, swapped))
    xa = values(a)
    x, g = (xa[..., 32:], xa[..., :32]) if swapped else (xa[..., :32], xa[..., 32:])
    ref = (np.asarray(_glu_act(op, x), dtype=np.float64) * g).astype(np.float32)
    assert_close(got, round_to(ref, ty))


@pytest.mark.parametrize("op", _GLU_OPS, ids=lambda o: o.name)
def test_glu_split(op: GluOp) -> None:
    c = OpCase()
    a = c.tensor(F32, 24, 5, lo=-3, hi=3)
    g = c.tensor(F32, 24, 5)
    got = c.compute(B.glu_split(c.ctx, a, g, op))
    ref = (np.asarray(_glu_act(op, values(a)), dtype=np.float64) * values(g)).astype(np.float32)
    assert_close(got, ref)


@pytest.mark.parametrize("split", [False, True])
def test_swiglu_oai(split: bool) -> None:
    c = OpCase()
    alpha, limit = 1.702, 2.0
    if split:
        a = c.tensor(F32, 16, 4, lo=-4, hi=4)
        b = c.tensor(F32, 16, 4, lo=-4, hi=4)
        x, g = values(a), values(b)
    else:
        a = c.tensor(F32, 32, 4, lo=-4, hi=4)
        b = None
        x, g = values(a)[..., :16], values(a)[..., 16:]
    got = c.compute(B.swiglu_oai(c.ctx, a, b, alpha, limit))
    x = np.minimum(x, limit).astype(np.float64)
    g = np.clip(g, -limit, limit).astype(np.float64)
    ref = x / (1 + np.exp(-alpha * x)) * (g + 1)
    assert_close(got, ref.astype(np.float32), max_nmse=NMSE_DEFAULT)
