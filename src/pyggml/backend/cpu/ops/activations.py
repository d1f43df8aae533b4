"""Elementwise activation functions with ggml-cpu's numerics (shared by UNARY and GLU).

ggml-cpu builds GELU and GELU_QUICK for F32 from fp16 lookup tables (``GGML_GELU_FP16``):
the input is rounded to fp16 and the table holds ``fp16(gelu(x))`` for every fp16 x. That costs
about 4e-3 relative accuracy against exact GELU, and is what llama.cpp computes, so we do the
same. GELU_ERF is exact ``erff``; numpy has no erf, so a numba ufunc provides it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numba
import numpy as np

from ....ops.enums import UnaryOp

_SQRT_2_OVER_PI = np.float32(0.79788456080286535587989211986876)
_GELU_COEF_A = np.float32(0.044715)
_GELU_QUICK_COEF = np.float32(-1.702)
_SQRT_2_INV = np.float32(0.70710678118654752440084436210484)


def _erf_scalar(x):  # pragma: no cover - compiled
    return math.erf(x)


_erf = None


def erf(x: np.ndarray) -> np.ndarray:
    """erff elementwise (a numba ufunc, built on first use: numpy has no erf)."""
    global _erf
    if _erf is None:
        _erf = numba.vectorize(["float32(float32)", "float64(float64)"], cache=True)(_erf_scalar)
    return _erf(np.asarray(x, dtype=np.float32))


def gelu_tanh_exact(x: np.ndarray) -> np.ndarray:
    """ggml_gelu_f32 in float32: 0.5x(1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2)))."""
    x = np.asarray(x, dtype=np.float32)
    inner = _SQRT_2_OVER_PI * x * (np.float32(1.0) + _GELU_COEF_A * x * x)
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(inner))


def gelu_quick_exact(x: np.ndarray) -> np.ndarray:
    """ggml_gelu_quick_f32: x / (1 + exp(-1.702 x))."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore"):
        return x * (np.float32(1.0) / (np.float32(1.0) + np.exp(_GELU_QUICK_COEF * x)))


def _fp16_table(fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """table[h] = fp16(fn(f32(h))) for all 65536 fp16 bit patterns, as ggml_cpu_init builds it."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(all="ignore"):
        return fn(h).astype(np.float16)


_GELU_TABLE = _fp16_table(gelu_tanh_exact)
_GELU_QUICK_TABLE = _fp16_table(gelu_quick_exact)


_GELU_TABLE_F32 = _GELU_TABLE.astype(np.float32)


def _lookup(table: np.ndarray, x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        idx = np.asarray(x, dtype=np.float32).astype(np.float16).view(np.uint16)
    return table[idx].astype(np.float32)


def gelu(x: np.ndarray) -> np.ndarray:
    """ggml_vec_gelu_f32 with GGML_GELU_FP16: 0 below -10, x above 10, else the fp16 table (numpy: the Python
    kernels compile nothing before a first run's first token)."""
    x = np.asarray(x, dtype=np.float32)
    return np.where(x <= -10.0, np.float32(0.0), np.where(x >= 10.0, x, _lookup(_GELU_TABLE_F32, x)))


def gelu_quick(x: np.ndarray) -> np.ndarray:
    """ggml_vec_gelu_quick_f32 with GGML_GELU_QUICK_FP16: the fp16 table, no clamps."""
    return _lookup(_GELU_QUICK_TABLE, x)


def gelu_erf(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + erf(x / sqrt 2)), exact as ggml's GELU_ERF."""
    x = np.asarray(x, dtype=np.float32)
    return np.float32(0.5) * x * (np.float32(1.0) + erf(x * _SQRT_2_INV))


def silu(x: np.ndarray) -> np.ndarray:
    """x / (1 + exp(-x))."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore"):
        return x / (np.float32(1.0) + np.exp(-x))


def sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.float32(1.0) / (np.float32(1.0) + np.exp(-x))


def relu(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x, np.float32(0.0))


def _hardsigmoid(x: np.ndarray) -> np.ndarray:
    return np.minimum(np.float32(1.0), np.maximum(np.float32(0.0), (x + np.float32(3.0)) / np.float32(6.0)))


def _softplus(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.where(x > 20, x, np.log(np.float32(1.0) + np.exp(x)))


def _sgn(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, np.float32(1.0), np.where(x < 0, np.float32(-1.0), np.float32(0.0)))


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """C roundf: halves go away from zero (np.round would go to even)."""
    return (np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))).astype(np.float32)


def xielu(x: np.ndarray, alpha_n: float, alpha_p: float, beta: float, eps: float) -> np.ndarray:
    """xIELU with op_params already transformed by ggml_xielu (alpha_n includes beta + softplus)."""
    an, ap, b, e = (np.float32(v) for v in (alpha_n, alpha_p, beta, eps))
    pos = ap * x * x + b * x
    neg = (np.expm1(np.minimum(x, e)) - x) * an + b * x
    return np.where(x > 0, pos, neg).astype(np.float32)


#: UnaryOp -> float32 function (XIELU takes parameters and is handled by the kernel).
UNARY_FUNCS: dict[UnaryOp, Callable[[np.ndarray], np.ndarray]] = {
    UnaryOp.ABS: np.abs,
    UnaryOp.SGN: _sgn,
    UnaryOp.NEG: np.negative,
    UnaryOp.STEP: lambda x: np.where(x > 0, np.float32(1.0), np.float32(0.0)),
    UnaryOp.TANH: np.tanh,
    UnaryOp.ELU: lambda x: np.where(x > 0, x, np.expm1(x)),
    UnaryOp.RELU: relu,
    UnaryOp.SIGMOID: sigmoid,
    UnaryOp.GELU: gelu,
    UnaryOp.GELU_QUICK: gelu_quick,
    UnaryOp.SILU: silu,
    UnaryOp.HARDSWISH: lambda x: x * _hardsigmoid(x),
    UnaryOp.HARDSIGMOID: _hardsigmoid,
    UnaryOp.EXP: np.exp,
    UnaryOp.EXPM1: np.expm1,
    UnaryOp.SOFTPLUS: _softplus,
    UnaryOp.GELU_ERF: gelu_erf,
    UnaryOp.FLOOR: np.floor,
    UnaryOp.CEIL: np.ceil,
    UnaryOp.ROUND: _round_half_away,
    UnaryOp.TRUNC: np.trunc,
}
