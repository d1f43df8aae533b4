"""The torch backend's op kernels, and the honest list of what they support.

Each kernel reads its sources as strided torch views of device memory (buffer.tview), computes
in float32 with torch ops and writes the node's view, converting to the node's type on the way.
Quantized weights (MUL_MAT src0, GET_ROWS src0) stay quantized in device memory and are decoded
tile by tile: Q8_0 and Q4_0 by torch decoders on the device (torch_dequant.py); every other
type by reading the tile's rows back to the host, decoding them with pyggml.quants.dequantize
(ggml's reference decoders) and uploading float32, a host round trip per tile.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from ... import quants
from ...ops.builders import rope_yarn_corr_dims
from ...ops.enums import EMPTY_OPS, GluOp, Op, UnaryOp
from ...tensor import Tensor
from ...types import GGMLType
from ..errors import NotSupportedError
from .buffer import raw_rows, tview
from .torch_dequant import DEVICE_DECODERS

#: float types the kernels read and write
FLOAT_TYPES = frozenset({GGMLType.F32, GGMLType.F16, GGMLType.BF16})
#: rows of a quantized weight decoded per tile
TILE_ROWS = 4096

TorchKernel = Callable[[Tensor], None]
KERNELS: dict[Op, TorchKernel] = {}


def _kernel(*ops: Op) -> Callable[[TorchKernel], TorchKernel]:
    def register(fn: TorchKernel) -> TorchKernel:
        for op in ops:
            KERNELS[op] = fn
        return fn

    return register


# ---------------------------------------------------------------------- helpers
def f32(t: Tensor) -> torch.Tensor:
    return tview(t).float()


def store(node: Tensor, value: torch.Tensor) -> None:
    """Write a float result of the node's shape into the node, converting to its type."""
    out = tview(node)
    out.copy_(value.reshape(out.shape))


def _can_dequantize(ty: GGMLType) -> bool:
    if not ty.is_quantized:
        return False
    try:
        quants.codec.get_codec(ty)
    except Exception:
        return False
    return True


def dequant_raw(raw: torch.Tensor, ty: GGMLType) -> torch.Tensor:
    """Quantized rows (n, row_bytes) to float32 (n, ne0) on raw's device."""
    decode = DEVICE_DECODERS.get(ty)
    if decode is not None:
        return decode(raw)
    host = np.ascontiguousarray(raw.cpu().numpy())
    return torch.from_numpy(quants.dequantize(host, ty)).to(raw.device)


def dequant_rows(t: Tensor, i3: int, i2: int, r0: int, r1: int) -> torch.Tensor:
    """Rows [r0, r1) of matrix (i3, i2) of a quantized tensor, as float32 on t's device."""
    return dequant_raw(raw_rows(t)[i3, i2, r0:r1], t.type)


def _repeat_to(b: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """ggml_repeat semantics: tile b until it has ``shape`` (every dim a whole multiple)."""
    reps = [s // d for s, d in zip(shape, b.shape, strict=True)]
    return b.repeat(*reps) if any(r != 1 for r in reps) else b


# ---------------------------------------------------------------------- elementwise
_BINARY = {Op.ADD: torch.add, Op.SUB: torch.sub, Op.MUL: torch.mul, Op.DIV: torch.div}


@_kernel(Op.ADD, Op.SUB, Op.MUL, Op.DIV)
def _binary(node: Tensor) -> None:
    a = f32(node.src[0])  # type: ignore[arg-type]
    b = _repeat_to(f32(node.src[1]), a.shape)  # type: ignore[arg-type]
    store(node, _BINARY[node.op](a, b))


@_kernel(Op.SCALE)
def _scale(node: Tensor) -> None:
    s, bias = node.get_op_params_f32(0), node.get_op_params_f32(1)
    store(node, f32(node.src[0]) * s + bias)  # type: ignore[arg-type]


@_kernel(Op.RMS_NORM)
def _rms_norm(node: Tensor) -> None:
    eps = node.get_op_params_f32(0)
    x = f32(node.src[0]).double()  # type: ignore[arg-type]
    mean = (x * x).mean(dim=-1, keepdim=True)
    store(node, (x / torch.sqrt(mean + eps)).float())


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


_UNARY: dict[UnaryOp, Callable[[torch.Tensor], torch.Tensor]] = {
    UnaryOp.ABS: torch.abs,
    UnaryOp.NEG: torch.neg,
    UnaryOp.TANH: torch.tanh,
    UnaryOp.RELU: torch.relu,
    UnaryOp.SIGMOID: torch.sigmoid,
    UnaryOp.GELU: _gelu_tanh,
    UnaryOp.GELU_ERF: F.gelu,
    UnaryOp.GELU_QUICK: lambda x: x * torch.sigmoid(1.702 * x),
    UnaryOp.SILU: F.silu,
    UnaryOp.EXP: torch.exp,
}


@_kernel(Op.UNARY)
def _unary(node: Tensor) -> None:
    fn = _UNARY[UnaryOp(node.get_op_params_i32(0))]
    store(node, fn(f32(node.src[0])))  # type: ignore[arg-type]


_GLU: dict[GluOp, Callable[[torch.Tensor], torch.Tensor]] = {
    GluOp.REGLU: torch.relu,
    GluOp.GEGLU: _gelu_tanh,
    GluOp.SWIGLU: F.silu,
    GluOp.GEGLU_ERF: F.gelu,
    GluOp.GEGLU_QUICK: _UNARY[UnaryOp.GELU_QUICK],
}


@_kernel(Op.GLU)
def _glu(node: Tensor) -> None:
    act = _GLU[GluOp(node.get_op_params_i32(0))]
    a = f32(node.src[0])  # type: ignore[arg-type]
    if node.src[1] is not None:
        x, g = a, f32(node.src[1])
    else:
        n = node.ne[0]
        x, g = a[..., :n], a[..., n : 2 * n]
        if node.get_op_params_i32(1):
            x, g = g, x
    store(node, act(x) * g)


# ---------------------------------------------------------------------- copies
@_kernel(Op.CPY, Op.DUP, Op.CONT)
def _copy(node: Tensor) -> None:
    """Element order is ggml's row-major order, so shapes may differ when counts agree."""
    src = tview(node.src[0])  # type: ignore[arg-type]
    out = tview(node)
    out.copy_(src.reshape(-1).reshape(out.shape))


@_kernel(Op.GET_ROWS)
def _get_rows(node: Tensor) -> None:
    a, ids_t = node.src[0], node.src[1]
    assert a is not None and ids_t is not None
    ids = tview(ids_t)[0].long()  # (ne12, ne11, ne10)
    n3, n2 = ids.shape[0], ids.shape[1]
    i3 = torch.arange(n3, device=ids.device)[:, None, None]
    i2 = torch.arange(n2, device=ids.device)[None, :, None]
    if a.type.is_quantized:
        out = torch.empty((*ids.shape, a.ne[0]), dtype=torch.float32, device=ids.device)
        for j3 in range(n3):
            for j2 in range(n2):
                rows = ids[j3, j2]
                uniq, inverse = torch.unique(rows, return_inverse=True)
                raw = raw_rows(a)[j3, j2][uniq.to(raw_rows(a).device)]
                out[j3, j2] = dequant_raw(raw, a.type).to(out.device)[inverse]
        store(node, out)
        return
    src = tview(a)
    store(node, src[i3, i2, ids].to(torch.float32) if node.type != GGMLType.I32 else src[i3, i2, ids])


@_kernel(Op.SET_ROWS)
def _set_rows(node: Tensor) -> None:
    b, c = node.src[0], node.src[1]
    assert b is not None and c is not None
    rows = f32(b)  # (ne3, ne2, n_rows, ne0)
    ids = tview(c).long()[0]  # (ne12, ne11, ne10)
    n3, n2 = rows.shape[0], rows.shape[1]
    ids = ids.repeat(n3 // ids.shape[0], n2 // ids.shape[1], 1)
    i3 = torch.arange(n3, device=rows.device)[:, None, None]
    i2 = torch.arange(n2, device=rows.device)[None, :, None]
    out = tview(node)
    out[i3, i2, ids] = rows.to(out.dtype)


# ---------------------------------------------------------------------- matrix products
@_kernel(Op.MUL_MAT)
def _mul_mat(node: Tensor) -> None:
    a, b = node.src[0], node.src[1]
    assert a is not None and b is not None
    bv = f32(b)  # (ne13, ne12, N, K)
    r2, r3 = b.ne[2] // a.ne[2], b.ne[3] // a.ne[3]
    if not a.type.is_quantized:
        av = f32(a).repeat_interleave(r3, dim=0).repeat_interleave(r2, dim=1)
        store(node, torch.matmul(bv, av.transpose(-1, -2)))
        return
    out = torch.empty((b.ne[3], b.ne[2], b.ne[1], a.ne[1]), dtype=torch.float32, device=bv.device)
    for i3 in range(a.ne[3]):
        for i2 in range(a.ne[2]):
            b_sl = bv[i3 * r3 : (i3 + 1) * r3, i2 * r2 : (i2 + 1) * r2]
            for r0 in range(0, a.ne[1], TILE_ROWS):
                r1 = min(a.ne[1], r0 + TILE_ROWS)
                tile = dequant_rows(a, i3, i2, r0, r1)  # (rows, K)
                out[i3 * r3 : (i3 + 1) * r3, i2 * r2 : (i2 + 1) * r2, :, r0:r1] = torch.matmul(b_sl, tile.T)
    store(node, out)


@_kernel(Op.MUL_MAT_ID)
def _mul_mat_id(node: Tensor) -> None:
    """Mixture of experts: out[:, e, t] = as[:, :, ids[e, t]] . b[:, e % b.ne1, t]. Only the experts
    named in ids are read, so a partially uploaded expert tensor is fine (see sched.py)."""
    a, b, ids_t = node.src[0], node.src[1], node.src[2]
    assert a is not None and b is not None and ids_t is not None
    ids = tview(ids_t)[0, 0].long()  # (n_tokens, n_used)
    bv = f32(b)[0]  # (n_tokens, b.ne1, K)
    n_tokens, n_used = ids.shape
    out = torch.zeros((n_tokens, n_used, a.ne[1]), dtype=torch.float32, device=bv.device)
    slot = torch.arange(n_used, device=ids.device).expand(n_tokens, n_used) % b.ne[1]
    for e in torch.unique(ids).tolist():
        if not 0 <= e < a.ne[2]:
            raise NotSupportedError(f"MUL_MAT_ID {node.name!r}: expert id {e} is not in 0..{a.ne[2] - 1}")
        w = dequant_rows(a, 0, e, 0, a.ne[1]) if a.type.is_quantized else tview(a)[0, e].float()
        sel = ids == e
        out[sel] = bv[sel.nonzero(as_tuple=True)[0], slot[sel]] @ w.T
    store(node, out)


# ---------------------------------------------------------------------- attention pieces
def _alibi_slopes(n_head: int, max_bias: float, device: torch.device) -> torch.Tensor:
    if max_bias <= 0.0:
        return torch.ones(n_head, device=device)
    n_head_log2 = 1 << math.floor(math.log2(n_head))
    m0 = 2.0 ** (-max_bias / n_head_log2)
    m1 = 2.0 ** (-(max_bias / 2.0) / n_head_log2)
    slopes = [m0 ** (h + 1) if h < n_head_log2 else m1 ** (2 * (h - n_head_log2) + 1) for h in range(n_head)]
    return torch.tensor(slopes, dtype=torch.float32, device=device)


@_kernel(Op.SOFT_MAX)
def _soft_max(node: Tensor) -> None:
    x = f32(node.src[0])  # type: ignore[arg-type]
    scale, max_bias = node.get_op_params_f32(0), node.get_op_params_f32(1)
    x = x * scale
    if node.src[1] is not None:
        mask = f32(node.src[1])[:, :, : x.shape[2], :]
        mask = mask.repeat(x.shape[0] // mask.shape[0], x.shape[1] // mask.shape[1], 1, 1)
        slopes = _alibi_slopes(x.shape[1], max_bias, x.device)[None, :, None, None]
        x = x + slopes * mask
    store(node, torch.softmax(x, dim=-1))


def _rope_cache(pos: torch.Tensor, n_dims: int, node: Tensor, ff: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """cos and sin per (position, pair), following ggml's rope_yarn with float32 arithmetic:
    theta is built by repeated multiplication, as ggml's rope cache does."""
    freq_base, freq_scale = node.get_op_params_f32(5), node.get_op_params_f32(6)
    ext_factor, attn_factor = node.get_op_params_f32(7), node.get_op_params_f32(8)
    beta_fast, beta_slow = node.get_op_params_f32(9), node.get_op_params_f32(10)
    n_ctx_orig = node.get_op_params_i32(4)
    theta_scale = torch.tensor(freq_base ** (-2.0 / n_dims), dtype=torch.float32)
    half = n_dims // 2
    theta = torch.empty((pos.shape[0], half), dtype=torch.float32, device=pos.device)
    cur = pos.to(torch.float32)
    for k in range(half):
        theta[:, k] = cur
        cur = cur * theta_scale.to(pos.device)
    if ff is not None:
        theta = theta / ff[:half]
    theta_interp = freq_scale * theta
    mscale = attn_factor
    if ext_factor != 0.0:
        low, high = rope_yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
        i0 = torch.arange(0, n_dims, 2, device=pos.device, dtype=torch.float32)
        y = (i0 / 2 - low) / max(0.001, high - low)
        ramp = (1 - torch.clamp(y, 0, 1)) * ext_factor
        theta = theta_interp * (1 - ramp) + theta * ramp
        mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
    else:
        theta = theta_interp
    return torch.cos(theta) * mscale, torch.sin(theta) * mscale


@_kernel(Op.ROPE)
def _rope(node: Tensor) -> None:
    x_t, pos_t = node.src[0], node.src[1]
    assert x_t is not None and pos_t is not None
    n_dims, mode = node.get_op_params_i32(1), node.get_op_params_i32(2)
    x = f32(x_t)  # (ne3, ne2 = tokens, ne1 = heads, ne0)
    pos = tview(pos_t).reshape(-1)[: x.shape[1]]
    ff = f32(node.src[2]).reshape(-1) if node.src[2] is not None else None
    cos, sin = _rope_cache(pos, n_dims, node, ff)  # (tokens, n_dims/2)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    out = x.clone()
    rot = x[..., :n_dims]
    if mode & 2:  # NEOX: pairs are (i, i + n_dims/2)
        x0, x1 = rot[..., : n_dims // 2], rot[..., n_dims // 2 :]
        out[..., : n_dims // 2] = x0 * cos - x1 * sin
        out[..., n_dims // 2 : n_dims] = x0 * sin + x1 * cos
    else:  # NORMAL: pairs are adjacent
        x0, x1 = rot[..., 0::2], rot[..., 1::2]
        out[..., 0:n_dims:2] = x0 * cos - x1 * sin
        out[..., 1:n_dims:2] = x0 * sin + x1 * cos
    store(node, out)


# ---------------------------------------------------------------------- support
SUPPORTED_OPS = frozenset(KERNELS) | EMPTY_OPS


def _floats(*ts: Tensor | None) -> bool:
    return all(t is None or t.type in FLOAT_TYPES for t in ts)


def supports_op(node: Tensor) -> bool:
    """What the kernels above really handle: ops, sub-ops, types and layouts."""
    op = node.op
    if op in EMPTY_OPS:
        return True
    if op not in KERNELS:
        return False
    s0, s1, s2 = node.src[0], node.src[1], node.src[2]
    if op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV):
        return _floats(node, s0, s1)
    if op in (Op.SCALE, Op.RMS_NORM):
        return _floats(node, s0)
    if op == Op.UNARY:
        return UnaryOp(node.get_op_params_i32(0)) in _UNARY and _floats(node, s0)
    if op == Op.GLU:
        return GluOp(node.get_op_params_i32(0)) in _GLU and _floats(node, s0, s1)
    if op in (Op.CPY, Op.DUP, Op.CONT):
        return _floats(node, s0)
    if op == Op.GET_ROWS:
        assert s0 is not None
        ok_src = s0.type in FLOAT_TYPES or s0.type == GGMLType.I32 or _can_dequantize(s0.type)
        return ok_src and s1 is not None and s1.type == GGMLType.I32
    if op == Op.SET_ROWS:
        return _floats(node, s0) and s1 is not None and s1.type in (GGMLType.I32, GGMLType.I64)
    if op == Op.MUL_MAT:
        assert s0 is not None
        return (s0.type in FLOAT_TYPES or _can_dequantize(s0.type)) and _floats(s1) and node.type == GGMLType.F32
    if op == Op.MUL_MAT_ID:
        assert s0 is not None and s1 is not None and s2 is not None
        return ((s0.type in FLOAT_TYPES or _can_dequantize(s0.type)) and s1.type == GGMLType.F32
                and s2.type == GGMLType.I32 and node.type == GGMLType.F32 and s0.ne[3] == 1 and s1.ne[3] == 1)
    if op == Op.SOFT_MAX:
        return s2 is None and _floats(node, s0, s1)  # attention sinks are not implemented
    if op == Op.ROPE:
        mode = node.get_op_params_i32(2)
        return mode in (0, 2) and _floats(node, s0) and (s2 is None or s2.type == GGMLType.F32)
    return False


def compute_node(node: Tensor) -> None:
    if node.op in EMPTY_OPS:
        return
    fn = KERNELS.get(node.op)
    if fn is None or not supports_op(node):
        raise NotSupportedError(f"the torch backend cannot compute {node.name!r} (op {node.op.name}, "
                                f"type {node.type.type_name})")
    with torch.no_grad():
        fn(node)
