"""Op constructors that view, move, repeat or mask data: RESHAPE, VIEW, PERMUTE, TRANSPOSE (views,
no kernel), REPEAT, REPEAT_BACK, CONCAT, ACC, SET, DIAG, DIAG_MASK_*, TRI, ARANGE,
TIMESTEP_EMBEDDING, ROLL, WIN_PART, WIN_UNPART.

CPU kernels: backend/cpu/ops/shape.py. The conventions every builder keeps: ops/builders.py.
"""

from __future__ import annotations

__all__ = [
    "TriType",
    "acc",
    "acc_inplace",
    "arange",
    "concat",
    "diag",
    "diag_mask_inf",
    "diag_mask_inf_inplace",
    "diag_mask_zero",
    "diag_mask_zero_inplace",
    "permute",
    "repeat",
    "repeat_4d",
    "repeat_back",
    "reshape",
    "reshape_1d",
    "reshape_2d",
    "reshape_3d",
    "reshape_4d",
    "roll",
    "set",
    "set_1d",
    "set_1d_inplace",
    "set_2d",
    "set_2d_inplace",
    "set_inplace",
    "timestep_embedding",
    "transpose",
    "tri",
    "view_1d",
    "view_2d",
    "view_3d",
    "view_4d",
    "win_part",
    "win_unpart",
]

import math
import struct
from enum import IntEnum

from ..context import Context
from ..errors import TypeMismatchError
from ..tensor import GGML_MAX_DIMS, Tensor, can_repeat
from ._build import F32, _dup_or_view, _format, _ne, _new, _node, _require, _twins
from .enums import Op


class TriType(IntEnum):
    UPPER_DIAG = 0
    UPPER = 1
    LOWER_DIAG = 2
    LOWER = 3


def _acc(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int, inplace: bool) -> Tensor:
    _require(b.nelements() <= a.nelements(), "ACC", "b has more elements than a")
    _require(a.is_contiguous(), "ACC", "a must be contiguous")
    _require(a.type == F32 and b.type == F32, "ACC", "a and b must be F32", TypeMismatchError)
    return _node(_dup_or_view(ctx, a, inplace), Op.ACC, a, b, params=[nb1, nb2, nb3, offset, int(inplace)])


def acc(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    """dst = a; view(dst, nb1, nb2, nb3, offset) += b."""
    return _acc(ctx, a, b, nb1, nb2, nb3, offset, False)


def acc_inplace(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    return _acc(ctx, a, b, nb1, nb2, nb3, offset, True)


# ---------------------------------------------------------------------- repeat / concat
def repeat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Tile a to b's shape."""
    _require(can_repeat(a, b), "REPEAT", f"a {_ne(a)} cannot be tiled to {_ne(b)}")
    return _node(_new(ctx, a.type, b.ne), Op.REPEAT, a)


def repeat_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    ne = [ne0, ne1, ne2, ne3]
    ok = (a.is_empty() or all(ne[i] % a.ne[i] == 0 for i in range(4))) if all(ne) else a.is_empty()
    _require(ok, "REPEAT", f"a {_ne(a)} cannot be tiled to {ne}")
    return _node(_new(ctx, a.type, ne), Op.REPEAT, a)


def repeat_back(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Sum the repetitions of a back into b's shape."""
    _require(can_repeat(b, a), "REPEAT_BACK", f"{_ne(b)} does not tile {_ne(a)}")
    return _node(_new(ctx, a.type, b.ne), Op.REPEAT_BACK, a)


def concat(ctx: Context, a: Tensor, b: Tensor, dim: int) -> Tensor:
    _require(0 <= dim < GGML_MAX_DIMS, "CONCAT", f"dim {dim} out of range")
    _require(a.type == b.type, "CONCAT", "a and b must have the same type", TypeMismatchError)
    ne = list(a.ne)
    for d in range(GGML_MAX_DIMS):
        if d == dim:
            ne[d] = a.ne[d] + b.ne[d]
        else:
            _require(a.ne[d] == b.ne[d], "CONCAT", f"dim {d} differs: {_ne(a)} vs {_ne(b)}")
    return _node(_new(ctx, a.type, ne), Op.CONCAT, a, b, params=[dim])


def _set(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int, inplace: bool) -> Tensor:
    _require(a.nelements() >= b.nelements(), "SET", "b has more elements than a")
    return _node(_dup_or_view(ctx, a, inplace), Op.SET, a, b, params=[nb1, nb2, nb3, offset, int(inplace)])


def set(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    """dst = a with b written into view(dst, nb1, nb2, nb3, offset)."""
    return _set(ctx, a, b, nb1, nb2, nb3, offset, False)


def set_inplace(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    return _set(ctx, a, b, nb1, nb2, nb3, offset, True)


def set_1d(ctx: Context, a: Tensor, b: Tensor, offset: int) -> Tensor:
    return _set(ctx, a, b, a.nb[1], a.nb[2], a.nb[3], offset, False)


def set_1d_inplace(ctx: Context, a: Tensor, b: Tensor, offset: int) -> Tensor:
    return _set(ctx, a, b, a.nb[1], a.nb[2], a.nb[3], offset, True)


def set_2d(ctx: Context, a: Tensor, b: Tensor, nb1: int, offset: int) -> Tensor:
    return _set(ctx, a, b, nb1, a.nb[2], a.nb[3], offset, False)


def set_2d_inplace(ctx: Context, a: Tensor, b: Tensor, nb1: int, offset: int) -> Tensor:
    return _set(ctx, a, b, nb1, a.nb[2], a.nb[3], offset, True)


# ---------------------------------------------------------------------- views
def reshape(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """View of contiguous a with b's shape."""
    _require(a.is_contiguous(), "RESHAPE", "a must be contiguous")
    _require(a.nelements() == b.nelements(), "RESHAPE", f"element counts differ: {_ne(a)} vs {_ne(b)}")
    result = ctx.new_tensor_impl(a.type, b.ne, a, 0)
    _format(result, "%s (reshaped)", a.name)
    return _node(result, Op.RESHAPE, a)


def _reshape_nd(ctx: Context, a: Tensor, ne: list[int]) -> Tensor:
    _require(a.is_contiguous(), "RESHAPE", "a must be contiguous")
    _require(a.nelements() == math.prod(ne), "RESHAPE", f"{_ne(a)} has {a.nelements()} elements, not {math.prod(ne)}")
    result = ctx.new_tensor_impl(a.type, ne, a, 0)
    _format(result, "%s (reshaped)", a.name)
    return _node(result, Op.RESHAPE, a)


def reshape_1d(ctx: Context, a: Tensor, ne0: int) -> Tensor:
    return _reshape_nd(ctx, a, [ne0])


def reshape_2d(ctx: Context, a: Tensor, ne0: int, ne1: int) -> Tensor:
    return _reshape_nd(ctx, a, [ne0, ne1])


def reshape_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor:
    return _reshape_nd(ctx, a, [ne0, ne1, ne2])


def reshape_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    return _reshape_nd(ctx, a, [ne0, ne1, ne2, ne3])


def _view(ctx: Context, a: Tensor, ne: list[int], offset: int) -> Tensor:
    _require(offset >= 0, "VIEW", f"negative offset {offset}")
    result = ctx.new_tensor_impl(a.type, ne, a, offset)
    _format(result, "%s (view)", a.name)
    return _node(result, Op.VIEW, a, params=struct.pack("<Q", offset))


def view_1d(ctx: Context, a: Tensor, ne0: int, offset: int) -> Tensor:
    return _view(ctx, a, [ne0], offset)


def view_2d(ctx: Context, a: Tensor, ne0: int, ne1: int, nb1: int, offset: int) -> Tensor:
    r = _view(ctx, a, [ne0, ne1], offset)
    r.nb[1] = nb1
    r.nb[2] = r.nb[3] = nb1 * ne1
    return r


def view_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, nb1: int, nb2: int, offset: int) -> Tensor:
    r = _view(ctx, a, [ne0, ne1, ne2], offset)
    r.nb[1], r.nb[2] = nb1, nb2
    r.nb[3] = nb2 * ne2
    return r


def view_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int,
            nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    r = _view(ctx, a, [ne0, ne1, ne2, ne3], offset)
    r.nb[1], r.nb[2], r.nb[3] = nb1, nb2, nb3
    return r


def permute(ctx: Context, a: Tensor, axis0: int, axis1: int, axis2: int, axis3: int) -> Tensor:
    """Axis permutation view: source dim i moves to position axis_i."""
    axes = [axis0, axis1, axis2, axis3]
    _require(all(0 <= x < GGML_MAX_DIMS for x in axes) and len({*axes}) == 4, "PERMUTE",
             f"axes {axes} are not a permutation of 0..3")
    result = ctx.view_tensor(a)
    _format(result, "%s (permuted)", a.name)
    ne, nb = [0] * 4, [0] * 4
    for i, ax in enumerate(axes):
        ne[ax], nb[ax] = a.ne[i], a.nb[i]
    result.ne, result.nb = ne, nb
    return _node(result, Op.PERMUTE, a, params=axes)


def transpose(ctx: Context, a: Tensor) -> Tensor:
    result = ctx.view_tensor(a)
    _format(result, "%s (transposed)", a.name)
    result.ne[0], result.ne[1] = a.ne[1], a.ne[0]
    result.nb[0], result.nb[1] = a.nb[1], a.nb[0]
    return _node(result, Op.TRANSPOSE, a)


def diag(ctx: Context, a: Tensor) -> Tensor:
    _require(a.ne[1] == 1, "DIAG", f"a must be a row vector, got {_ne(a)}")
    return _node(_new(ctx, a.type, [a.ne[0], a.ne[0], a.ne[2], a.ne[3]]), Op.DIAG, a)


def _diag_mask(ctx: Context, a: Tensor, op: Op, inplace: bool, n_past: int) -> Tensor:
    return _node(_dup_or_view(ctx, a, inplace), op, a, params=[n_past])


diag_mask_inf, diag_mask_inf_inplace = _twins(_diag_mask, Op.DIAG_MASK_INF, ": -inf where column > n_past + row.")
diag_mask_zero, diag_mask_zero_inplace = _twins(_diag_mask, Op.DIAG_MASK_ZERO, ": 0 where column > n_past + row.")


# ---------------------------------------------------------------------- generators and sorting
def arange(ctx: Context, start: float, stop: float, step: float) -> Tensor:
    _require(stop > start, "ARANGE", f"stop {stop} must be greater than start {start}")
    _require(step > 0, "ARANGE", f"step {step} must be positive")
    steps = math.ceil((stop - start) / step)
    return _node(_new(ctx, F32, [steps]), Op.ARANGE, params=[float(start), float(stop), float(step)])


def timestep_embedding(ctx: Context, timesteps: Tensor, dim: int, max_period: int) -> Tensor:
    """Sinusoidal embedding of each timestep: F32 [dim, n]."""
    return _node(_new(ctx, F32, [dim, timesteps.ne[0]]), Op.TIMESTEP_EMBEDDING, timesteps, params=[dim, max_period])


def tri(ctx: Context, a: Tensor, type: TriType) -> Tensor:
    """Keep one triangle of each square matrix, zeroing the rest."""
    _require(a.type == F32, "TRI", "a must be F32", TypeMismatchError)
    _require(a.is_contiguous() and a.ne[0] == a.ne[1], "TRI", f"a must be contiguous and square, got {_ne(a)}")
    return _node(ctx.dup_tensor(a), Op.TRI, a, params=[int(type)])


def roll(ctx: Context, a: Tensor, shift0: int, shift1: int, shift2: int, shift3: int) -> Tensor:
    """ggml_roll: cyclic shift of every dim, dst[i] = a[(i - shift) mod ne]; op_params i32 shift0..3."""
    op = "ROLL"
    _require(a.nb[0] == a.type.type_size, op, "a's elements must be contiguous in dim 0")
    for d, s in enumerate((shift0, shift1, shift2, shift3)):
        _require(abs(s) < a.ne[d], op, f"|shift{d}| = {abs(s)} must be less than ne[{d}] = {a.ne[d]}")
    return _node(ctx.dup_tensor(a), Op.ROLL, a, params=[shift0, shift1, shift2, shift3])


def win_part(ctx: Context, a: Tensor, w: int) -> Tensor:
    """ggml_win_part: split a [C, W, H] into zero-padded w x w windows, F32 [C, w, w, npx*npy]."""
    _require(a.ne[3] == 1, "WIN_PART", f"a must be 3-d, got {_ne(a)}")
    _require(a.type == F32, "WIN_PART", f"a must be F32, got {a.type.type_name}", TypeMismatchError)
    npx = (a.ne[1] + (w - a.ne[1] % w) % w) // w
    npy = (a.ne[2] + (w - a.ne[2] % w) % w) // w
    return _node(_new(ctx, F32, [a.ne[0], w, w, npx * npy]), Op.WIN_PART, a, params=[npx, npy, w])


def win_unpart(ctx: Context, a: Tensor, w0: int, h0: int, w: int) -> Tensor:
    """ggml_win_unpart: reassemble w x w windows a into F32 [C, w0, h0] (the inverse of win_part)."""
    _require(a.type == F32, "WIN_UNPART", f"a must be F32, got {a.type.type_name}", TypeMismatchError)
    return _node(_new(ctx, F32, [a.ne[0], w0, h0]), Op.WIN_UNPART, a, params=[w])
