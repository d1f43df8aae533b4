"""Shared helpers for the op tests: build tensors in a Context, compute through the CPU executor,
and compare with a numpy reference using test-backend-ops' NMSE.

The references in the tests are written independently of the kernels (plain numpy or loops);
input values are read back with pyggml.tensor_data (not the kernels' loaders), so a view's strides
are interpreted by code the kernels do not share.
"""

from __future__ import annotations

import math

import numpy as np

from pyggml import quants
from pyggml.backend.cpu.compute import graph_compute
from pyggml.context import Context
from pyggml.graph import Graph
from pyggml.tensor import Tensor
from pyggml.tensor_data import to_f32_4d
from pyggml.types import GGMLType

#: test-backend-ops thresholds
NMSE_DEFAULT = 1e-7
NMSE_MATMUL = 5e-4
NMSE_SOFTMAX = 1e-6


def nmse(out: np.ndarray, ref: np.ndarray) -> float:
    """test-backend-ops' error: sum((a-b)^2) / sum(a^2), a being the backend's result."""
    a = np.asarray(out, dtype=np.float64).reshape(-1)
    b = np.asarray(ref, dtype=np.float64).reshape(-1)
    num = float(((a - b) ** 2).sum())
    den = float((a**2).sum())
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def assert_close(out: np.ndarray, ref: np.ndarray, max_nmse: float = NMSE_DEFAULT) -> float:
    """Fail like test-backend-ops: shape mismatch, any NaN, mismatched infinities, or NMSE > max."""
    out = np.asarray(out)
    ref = np.asarray(ref)
    assert out.shape == ref.shape, f"shape {out.shape} != reference {ref.shape}"
    assert not np.isnan(out).any(), "result has NaN"
    assert not np.isnan(ref).any(), "reference has NaN"
    inf_o, inf_r = np.isinf(out), np.isinf(ref)
    assert (inf_o == inf_r).all(), "infinities differ in position"
    assert (np.sign(out[inf_o]) == np.sign(ref[inf_r])).all(), "infinities differ in sign"
    fin = ~inf_o
    err = nmse(out[fin], ref[fin])
    assert err <= max_nmse, f"NMSE {err:.3g} > {max_nmse:.3g}"
    return err


class OpCase:
    """One small world for an op test: a Context, a seeded RNG, and compute()."""

    def __init__(self, mem: int = 64 << 20, seed: int = 0) -> None:
        self.ctx = Context(mem)
        self.rng = np.random.default_rng(seed)

    def tensor(self, ty: GGMLType, *ne: int, data: np.ndarray | None = None, lo: float = -1.0,
               hi: float = 1.0) -> Tensor:
        """A new tensor with ggml's ne, filled with ``data`` (numpy order) or uniform [lo, hi)."""
        t = self.ctx.new_tensor(ty, *ne)
        shape = (t.ne[3], t.ne[2], t.ne[1], t.ne[0])
        if data is None:
            data = self.rng.uniform(lo, hi, size=shape).astype(np.float32)
        data = np.asarray(data).reshape(shape)
        if ty.is_quantized and quants.requires_imatrix(ty):
            rows = np.ascontiguousarray(data, dtype=np.float32).reshape(-1, t.ne[0])
            q = quants.quantize(rows, ty, imatrix=np.ones(t.ne[0], dtype=np.float32))
            t.view4()[...] = q.reshape(t.view4().shape)
        else:
            t.set(data)
        return t

    def ints(self, ty: GGMLType, *ne: int, data: np.ndarray) -> Tensor:
        t = self.ctx.new_tensor(ty, *ne)
        t.set(np.asarray(data).astype(ty.traits.np_dtype))
        return t

    def compute(self, out: Tensor, n_threads: int = 1) -> np.ndarray:
        """Build the forward graph of ``out``, run it on the CPU executor, return out as float32 4-d."""
        g = Graph()
        g.build_forward_expand(out)
        graph_compute(g, n_threads)
        return values(out)


def values(t: Tensor) -> np.ndarray:
    """t's data as float32 (ne3, ne2, ne1, ne0), read through pyggml.tensor_data (honours strides)."""
    if t.type in (GGMLType.I8, GGMLType.I16, GGMLType.I32, GGMLType.I64):
        return np.array(t.view4())
    return np.array(to_f32_4d(t), dtype=np.float32)


def round_f16(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """bf16 round to nearest even, independent of pyggml.tensor_data (float64 arithmetic on the bits)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32)


def round_to(x: np.ndarray, ty: GGMLType) -> np.ndarray:
    if ty == GGMLType.F16:
        return round_f16(x)
    if ty == GGMLType.BF16:
        return round_bf16(x)
    return np.asarray(x, dtype=np.float32)


def rope_ref(x: np.ndarray, pos: np.ndarray, n_dims: int, neox: bool, base: float = 10000.0,
              freq_scale: float = 1.0, ext_factor: float = 0.0, attn_factor: float = 1.0,
              corr: tuple[float, float] = (0.0, 0.0), ff: np.ndarray | None = None) -> np.ndarray:
    """Float64 RoPE with YaRN, theta = p * base^(-2i/n_dims) / ff_i (exact powers)."""
    x = x.astype(np.float64)
    y = x.copy()
    half = n_dims // 2
    i = np.arange(half)
    theta_extrap = pos[:, None].astype(np.float64) * base ** (-2.0 * i / n_dims)
    if ff is not None:
        theta_extrap = theta_extrap / ff[:half]
    theta_interp = freq_scale * theta_extrap
    mscale = attn_factor
    if ext_factor != 0:
        ramp = 1 - np.clip((i - corr[0]) / max(0.001, corr[1] - corr[0]), 0, 1)
        mix = ramp * ext_factor
        theta = theta_interp * (1 - mix) + theta_extrap * mix
        mscale *= 1 + 0.1 * math.log(1 / freq_scale)
    else:
        theta = theta_interp
    cos = (np.cos(theta) * mscale)[None, :, None, :]
    sin = (np.sin(theta) * mscale)[None, :, None, :]
    if neox:
        x0, x1 = x[..., :half], x[..., half:n_dims]
        y[..., :half] = x0 * cos - x1 * sin
        y[..., half:n_dims] = x0 * sin + x1 * cos
    else:
        x0, x1 = x[..., 0:n_dims:2], x[..., 1:n_dims:2]
        y[..., 0:n_dims:2] = x0 * cos - x1 * sin
        y[..., 1:n_dims:2] = x0 * sin + x1 * cos
    return y
