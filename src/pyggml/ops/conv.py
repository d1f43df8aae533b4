"""Op constructors of convolutions and image ops: IM2COL (conv_1d/conv_2d through MUL_MAT), the
direct convolutions, COL2IM_1D, POOL_1D/POOL_2D (and POOL_2D_BACK), UPSCALE (interpolate), PAD,
PAD_REFLECT_1D.

CPU kernels: backend/cpu/ops/conv.py. The conventions every builder keeps: ops/builders.py.
"""

from __future__ import annotations

__all__ = [
    "GGML_SCALE_FLAG_ALIGN_CORNERS",
    "GGML_SCALE_FLAG_ANTIALIAS",
    "OpPool",
    "ScaleMode",
    "calc_conv_output_size",
    "calc_pool_output_size",
    "col2im_1d",
    "conv_1d",
    "conv_2d",
    "conv_2d_direct",
    "conv_2d_dw_direct",
    "conv_3d_direct",
    "conv_transpose_1d",
    "conv_transpose_2d_p0",
    "im2col",
    "im2col_3d",
    "im2col_back",
    "interpolate",
    "pad",
    "pad_circular",
    "pad_ext",
    "pad_reflect_1d",
    "pool_1d",
    "pool_2d",
    "pool_2d_back",
    "upscale",
    "upscale_ext",
]

from collections.abc import Sequence
from enum import IntEnum

from ..context import Context
from ..errors import TypeMismatchError
from ..tensor import Tensor
from ..types import GGMLType
from ._build import F16, F32, _ne, _new, _node, _require
from .enums import Op
from .mat import mul_mat
from .rows import cont
from .shape import permute, reshape_2d, reshape_3d, reshape_4d


class OpPool(IntEnum):
    MAX = 0
    AVG = 1


class ScaleMode(IntEnum):
    NEAREST = 0
    BILINEAR = 1
    BICUBIC = 2


GGML_SCALE_FLAG_ALIGN_CORNERS = 1 << 8
GGML_SCALE_FLAG_ANTIALIAS = 1 << 9


# ---------------------------------------------------------------------- convolution via im2col
def calc_conv_output_size(ins: int, ks: int, s: int, p: int, d: int) -> int:
    return (ins + 2 * p - d * (ks - 1) - 1) // s + 1


def im2col(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int,
           is_2D: bool, dst_type: GGMLType) -> Tensor:
    """Unfold input b into columns for kernel a, so a convolution becomes a MUL_MAT."""
    if is_2D:
        _require(a.ne[2] == b.ne[2], "IM2COL", f"channel count differs: kernel {_ne(a)}, input {_ne(b)}")
    else:
        _require(b.ne[1] == a.ne[1] and b.ne[3] == 1, "IM2COL",
                 f"channel count differs: kernel {_ne(a)}, input {_ne(b)}")
    oh = calc_conv_output_size(b.ne[1], a.ne[1], s1, p1, d1) if is_2D else 0
    ow = calc_conv_output_size(b.ne[0], a.ne[0], s0, p0, d0)
    _require((not is_2D or oh > 0) and ow > 0, "IM2COL", "input too small for the kernel")
    ne = [a.ne[2] * a.ne[1] * a.ne[0] if is_2D else a.ne[1] * a.ne[0], ow,
          oh if is_2D else b.ne[2], b.ne[3] if is_2D else 1]
    return _node(_new(ctx, dst_type, ne), Op.IM2COL, a, b, params=[s0, s1, p0, p1, d0, d1, int(is_2D)])


def conv_1d(ctx: Context, a: Tensor, b: Tensor, s0: int, p0: int, d0: int) -> Tensor:
    """1-D convolution of b [L, IC, N] by kernel a [K, IC, OC] -> [OL, OC, N], as IM2COL + MUL_MAT."""
    col = im2col(ctx, a, b, s0, 0, p0, 0, d0, 0, False, F16)
    r = mul_mat(ctx, reshape_2d(ctx, col, col.ne[0], col.ne[2] * col.ne[1]),
                reshape_2d(ctx, a, a.ne[0] * a.ne[1], a.ne[2]))
    return reshape_3d(ctx, r, col.ne[1], a.ne[2], col.ne[2])


def conv_2d(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int) -> Tensor:
    """2-D convolution of b [W, H, IC, N] by kernel a [KW, KH, IC, OC] -> [OW, OH, OC, N]."""
    col = im2col(ctx, a, b, s0, s1, p0, p1, d0, d1, True, a.type)
    r = mul_mat(ctx, reshape_2d(ctx, col, col.ne[0], col.ne[3] * col.ne[2] * col.ne[1]),
                reshape_2d(ctx, a, a.ne[0] * a.ne[1] * a.ne[2], a.ne[3]))
    r = reshape_4d(ctx, r, col.ne[1], col.ne[2], col.ne[3], a.ne[3])
    return cont(ctx, permute(ctx, r, 0, 1, 3, 2))


# ---------------------------------------------------------------------- pooling / resampling / padding
def calc_pool_output_size(ins: int, ks: int, s: int, p: float) -> int:
    return int((ins + 2 * p - ks) / s + 1)


def pool_1d(ctx: Context, a: Tensor, op: OpPool, k0: int, s0: int, p0: int) -> Tensor:
    ne = [calc_pool_output_size(a.ne[0], k0, s0, p0), a.ne[1], a.ne[2], a.ne[3]]
    _require(ne[0] > 0, "POOL_1D", "input too small for the kernel")
    return _node(_new(ctx, F32, ne), Op.POOL_1D, a, params=[int(op), k0, s0, p0])


def pool_2d(ctx: Context, a: Tensor, op: OpPool, k0: int, k1: int, s0: int, s1: int, p0: float, p1: float) -> Tensor:
    ne = [calc_pool_output_size(a.ne[0], k0, s0, p0), calc_pool_output_size(a.ne[1], k1, s1, p1), a.ne[2], a.ne[3]]
    _require(ne[0] > 0 and ne[1] > 0, "POOL_2D", "input too small for the kernel")
    return _node(_new(ctx, F32, ne), Op.POOL_2D, a, params=[int(op), k0, k1, s0, s1, int(p0), int(p1)])


def interpolate(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, mode: int) -> Tensor:
    """ggml_interpolate: resample a to [ne0, ne1, ne2, ne3] (mode: ScaleMode | flags)."""
    _require((mode & 0xFF) < len(ScaleMode), "UPSCALE", f"unknown scale mode {mode & 0xFF}")
    return _node(_new(ctx, a.type, [ne0, ne1, ne2, ne3]), Op.UPSCALE, a, params=[int(mode)])


def upscale(ctx: Context, a: Tensor, scale_factor: int, mode: int = ScaleMode.NEAREST) -> Tensor:
    return interpolate(ctx, a, a.ne[0] * scale_factor, a.ne[1] * scale_factor, a.ne[2], a.ne[3], mode)


def upscale_ext(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int,
                mode: int = ScaleMode.NEAREST) -> Tensor:
    return interpolate(ctx, a, ne0, ne1, ne2, ne3, mode)


def pad_ext(ctx: Context, a: Tensor, lp0: int, rp0: int, lp1: int, rp1: int, lp2: int, rp2: int,
            lp3: int, rp3: int, circular: bool = False) -> Tensor:
    pads = [lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3]
    _require(min(pads) >= 0, "PAD", f"negative padding {pads}")
    ne = [a.ne[0] + lp0 + rp0, a.ne[1] + lp1 + rp1, a.ne[2] + lp2 + rp2, a.ne[3] + lp3 + rp3]
    return _node(_new(ctx, a.type, ne), Op.PAD, a, params=[*pads, int(circular)])


def pad(ctx: Context, a: Tensor, p0: int, p1: int, p2: int, p3: int) -> Tensor:
    """Zero-pad each dim on the right."""
    return pad_ext(ctx, a, 0, p0, 0, p1, 0, p2, 0, p3)


def pad_circular(ctx: Context, a: Tensor, lp0: int, rp0: int, lp1: int, rp1: int, lp2: int, rp2: int,
                 lp3: int, rp3: int) -> Tensor:
    return pad_ext(ctx, a, lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3, circular=True)


def _conv_out(ins: int, ks: int, s: int, p: int, d: int) -> int:
    """ggml_calc_conv_output_size (C division: the operands are positive for any valid conv)."""
    return (ins + 2 * p - d * (ks - 1) - 1) // s + 1


def _is_contiguous_channels(t: Tensor) -> bool:
    """ggml_is_contiguous_channels: a CWHN tensor permuted to WHCN (channels innermost in memory)."""
    return t.nb[0] > t.nb[2] and t.nb[1] > t.nb[0] and t.nb[2] == t.type.type_size


# ---------------------------------------------------------------------- convolutions (direct kernels)
def conv_transpose_1d(ctx: Context, a: Tensor, b: Tensor, s0: int, p0: int, d0: int) -> Tensor:
    """ggml_conv_transpose_1d: kernel a [K, OC, IC] over b [L, IC] -> F32 [(L-1)*s0 + K, OC, b.ne2].

    ggml implements only p0 = 0 and d0 = 1; op_params i32 {s0, p0, d0}.
    """
    op = "CONV_TRANSPOSE_1D"
    _require(b.is_matrix(), op, f"the input must be a matrix, got {_ne(b)}")
    _require(a.ne[2] == b.ne[1], op, f"input channels differ: kernel {_ne(a)}, input {_ne(b)}")
    _require(a.ne[3] == 1, op, f"the kernel must be 3-d, got {_ne(a)}")
    _require(p0 == 0, op, f"only p0 == 0 is supported, got {p0}")
    _require(d0 == 1, op, f"only d0 == 1 is supported, got {d0}")
    ne = [(b.ne[0] - 1) * s0 + a.ne[0], a.ne[1], b.ne[2], 1]
    return _node(_new(ctx, F32, ne), Op.CONV_TRANSPOSE_1D, a, b, params=[s0, p0, d0])


def conv_transpose_2d_p0(ctx: Context, a: Tensor, b: Tensor, stride: int) -> Tensor:
    """ggml_conv_transpose_2d_p0: kernel a [KW, KH, OC, IC] over b [W, H, IC, N] -> F32 [OW, OH, OC, N]."""
    op = "CONV_TRANSPOSE_2D"
    _require(a.ne[3] == b.ne[2], op, f"input channels differ: kernel {_ne(a)}, input {_ne(b)}")
    ne = [(b.ne[0] - 1) * stride + a.ne[0], (b.ne[1] - 1) * stride + a.ne[1], a.ne[2], b.ne[3]]
    return _node(_new(ctx, F32, ne), Op.CONV_TRANSPOSE_2D, a, b, params=[stride])


def conv_2d_direct(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int,
                   d0: int, d1: int) -> Tensor:
    """ggml_conv_2d_direct: kernel a [KW, KH, IC, OC] over b [W, H, IC, N] -> [OW, OH, OC, N] of b's type.

    One CONV_2D node (no IM2COL + MUL_MAT); op_params i32 {s0, s1, p0, p1, d0, d1}.
    """
    _require(a.ne[2] == b.ne[2], "CONV_2D", f"input channels differ: kernel {_ne(a)}, input {_ne(b)}")
    ne = [_conv_out(b.ne[0], a.ne[0], s0, p0, d0), _conv_out(b.ne[1], a.ne[1], s1, p1, d1), a.ne[3], b.ne[3]]
    return _node(_new(ctx, b.type, ne), Op.CONV_2D, a, b, params=[s0, s1, p0, p1, d0, d1])


def conv_2d_dw_direct(ctx: Context, a: Tensor, b: Tensor, stride0: int, stride1: int, pad0: int, pad1: int,
                      dilation0: int, dilation1: int) -> Tensor:
    """ggml_conv_2d_dw_direct: depthwise kernel a [KW, KH, 1, C] over b [W, H, C, N] -> [OW, OH, C, N].

    When b is channels-innermost in memory (a permuted CWHN tensor), the result gets the same
    permuted strides, as in ggml; op_params i32 {s0, s1, p0, p1, d0, d1}.
    """
    op = "CONV_2D_DW"
    _require(a.ne[2] == 1, op, f"the depthwise kernel must have ne[2] == 1, got {_ne(a)}")
    _require(a.ne[3] == b.ne[2], op, f"channels differ: kernel {_ne(a)}, input {_ne(b)}")
    ne = [_conv_out(b.ne[0], a.ne[0], stride0, pad0, dilation0),
          _conv_out(b.ne[1], a.ne[1], stride1, pad1, dilation1), b.ne[2], b.ne[3]]
    result = _new(ctx, b.type, ne)
    if _is_contiguous_channels(b):
        _require(result.type.blck_size == 1, op, "channels-innermost layout needs a non-block type",
                 TypeMismatchError)
        ts = result.type.type_size
        result.nb[0] = result.ne[2] * ts
        result.nb[1] = result.ne[0] * result.nb[0]
        result.nb[2] = ts
    return _node(result, Op.CONV_2D_DW, a, b, params=[stride0, stride1, pad0, pad1, dilation0, dilation1])


def conv_3d_direct(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, s2: int, p0: int, p1: int, p2: int,
                   d0: int, d1: int, d2: int, c: int, n: int, oc: int) -> Tensor:
    """ggml_conv_3d_direct: kernel a [KW, KH, KD, OC*IC] over b [W, H, D, IC*N] -> F32 [OW, OH, OD, OC*N].

    op_params i32 {s0, s1, s2, p0, p1, p2, d0, d1, d2, c, n, oc} (c = input channels).
    """
    op = "CONV_3D"
    _require(a.ne[3] == c * oc, op, f"kernel {_ne(a)} must have ne[3] == c*oc = {c * oc}")
    _require(b.ne[3] == c * n, op, f"input {_ne(b)} must have ne[3] == c*n = {c * n}")
    ne = [_conv_out(b.ne[0], a.ne[0], s0, p0, d0), _conv_out(b.ne[1], a.ne[1], s1, p1, d1),
          _conv_out(b.ne[2], a.ne[2], s2, p2, d2), oc * n]
    return _node(_new(ctx, F32, ne), Op.CONV_3D, a, b, params=[s0, s1, s2, p0, p1, p2, d0, d1, d2, c, n, oc])


def im2col_3d(ctx: Context, a: Tensor, b: Tensor, IC: int, s0: int, s1: int, s2: int, p0: int, p1: int,
              p2: int, d0: int, d1: int, d2: int, dst_type: GGMLType) -> Tensor:
    """ggml_im2col_3d: b [IW, IH, ID, N*IC] unfolded for kernel a [KW, KH, KD, OC*IC] into
    [IC*KD*KH*KW, OW, OH, N*OD] of dst_type; op_params i32 {s0, s1, s2, p0, p1, p2, d0, d1, d2, IC}."""
    _require(IC > 0, "IM2COL_3D", f"IC must be positive, got {IC}")  # ggml would divide by zero
    n = b.ne[3] // IC
    od = _conv_out(b.ne[2], a.ne[2], s2, p2, d2)
    oh = _conv_out(b.ne[1], a.ne[1], s1, p1, d1)
    ow = _conv_out(b.ne[0], a.ne[0], s0, p0, d0)
    _require(od > 0 and oh > 0 and ow > 0, "IM2COL_3D", f"input {_ne(b)} too small for kernel {_ne(a)}")
    ne = [a.ne[0] * a.ne[1] * a.ne[2] * IC, ow, oh, od * n]
    return _node(_new(ctx, dst_type, ne), Op.IM2COL_3D, a, b, params=[s0, s1, s2, p0, p1, p2, d0, d1, d2, IC])


def im2col_back(ctx: Context, a: Tensor, b: Tensor, ne: Sequence[int], s0: int, s1: int, p0: int, p1: int,
                d0: int, d1: int, is_2D: bool) -> Tensor:
    """ggml_im2col_back: the gradient of IM2COL; columns a scattered back onto an F32 input grid of
    shape ``ne`` (4 values); b is the kernel, giving KW/KH. op_params as IM2COL."""
    _require(len(ne) == 4, "IM2COL_BACK", f"ne must have 4 values, got {list(ne)}")
    return _node(_new(ctx, F32, ne), Op.IM2COL_BACK, a, b, params=[s0, s1, p0, p1, d0, d1, int(is_2D)])


def col2im_1d(ctx: Context, a: Tensor, s0: int, oc: int, p0: int) -> Tensor:
    """ggml_col2im_1d: overlap-add GEMM columns a [K*oc, T_in] into a signal [T_out, oc] of a's type.

    T_out = (T_in - 1)*s0 + K - 2*p0; op_params i32 {s0, oc, p0}.
    """
    op = "COL2IM_1D"
    _require(a.is_matrix() and a.is_contiguous(), op, f"a must be a contiguous matrix, got {_ne(a)}")
    _require(a.type in (F32, F16, GGMLType.BF16), op, f"a must be F32, F16 or BF16, got {a.type.type_name}",
             TypeMismatchError)
    _require(s0 > 0 and oc > 0 and p0 >= 0, op, f"need s0 > 0, oc > 0, p0 >= 0, got {s0}, {oc}, {p0}")
    k = a.ne[0] // oc
    t_out = (a.ne[1] - 1) * s0 + k - 2 * p0
    _require(a.ne[0] == k * oc, op, f"a.ne[0] = {a.ne[0]} is not a whole number of oc = {oc} blocks")
    _require(k > 0 and t_out > 0, op, f"empty result: K = {k}, T_out = {t_out}")
    return _node(_new(ctx, a.type, [t_out, oc]), Op.COL2IM_1D, a, params=[s0, oc, p0])


# ---------------------------------------------------------------------- shape ops
def pad_reflect_1d(ctx: Context, a: Tensor, p0: int, p1: int) -> Tensor:
    """ggml_pad_reflect_1d: reflection padding of dim 0 by p0 left and p1 right (edges not repeated)."""
    op = "PAD_REFLECT_1D"
    _require(p0 >= 0 and p1 >= 0, op, f"negative padding ({p0}, {p1})")
    _require(p0 < a.ne[0] and p1 < a.ne[0], op, f"padding ({p0}, {p1}) must be shorter than the row {a.ne[0]}")
    _require(a.is_contiguous(), op, "a must be contiguous")
    _require(a.type == F32, op, f"a must be F32, got {a.type.type_name}", TypeMismatchError)
    ne = [a.ne[0] + p0 + p1, a.ne[1], a.ne[2], a.ne[3]]
    return _node(_new(ctx, a.type, ne), Op.PAD_REFLECT_1D, a, params=[p0, p1])


def pool_2d_back(ctx: Context, a: Tensor, af: Tensor, op: int, k0: int, k1: int, s0: int, s1: int,
                 p0: float, p1: float) -> Tensor:
    """ggml_pool_2d_back: the POOL_2D gradient a spread over an F32 tensor shaped like the forward input af.

    op_params i32 {op, k0, k1, s0, s1, p0, p1}, the paddings truncated to int as ggml's int32 array does.
    """
    return _node(_new(ctx, F32, af.ne), Op.POOL_2D_BACK, a, af, params=[int(op), k0, k1, s0, s1, int(p0), int(p1)])
