"""Op constructors of matrix products: MUL_MAT, MUL_MAT_ID (mixture of experts), OUT_PROD, ADD_ID.

CPU kernels: backend/cpu/ops/mat.py. The conventions every builder keeps: ops/builders.py.
"""

from __future__ import annotations

__all__ = [
    "GGML_PREC_DEFAULT",
    "GGML_PREC_F32",
    "add_id",
    "can_mul_mat",
    "can_out_prod",
    "mul_mat",
    "mul_mat_id",
    "mul_mat_set_prec",
    "out_prod",
]

from ..context import Context
from ..errors import PyGGMLError, TypeMismatchError
from ..tensor import Tensor
from ._build import F32, I32, _ne, _new, _node, _require
from .enums import Op

GGML_PREC_DEFAULT = 0
GGML_PREC_F32 = 10


# ---------------------------------------------------------------------- matrix products
def can_mul_mat(a: Tensor, b: Tensor) -> bool:
    return a.ne[0] == b.ne[0] and b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0


def mul_mat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Rows of a (weights, [K, M]) dotted with rows of b ([K, N]): F32 [M, N, b.ne2, b.ne3]."""
    _require(can_mul_mat(a, b), "MUL_MAT", f"cannot multiply a {_ne(a)} by b {_ne(b)} "
             "(need a.ne0 == b.ne0 and b.ne2, b.ne3 multiples of a.ne2, a.ne3)")
    _require(not a.is_transposed(), "MUL_MAT", "a must not be transposed")
    return _node(_new(ctx, F32, [a.ne[1], b.ne[1], b.ne[2], b.ne[3]]), Op.MUL_MAT, a, b)


def mul_mat_set_prec(a: Tensor, prec: int) -> None:
    _require(a.op == Op.MUL_MAT, "mul_mat_set_prec", "not a MUL_MAT node", PyGGMLError)
    a.op_params[0] = prec


def can_out_prod(a: Tensor, b: Tensor) -> bool:
    return a.ne[1] == b.ne[1] and b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0


def out_prod(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Outer products summed over rows: a [m, n], b [p, n] -> F32 [m, p]."""
    _require(can_out_prod(a, b), "OUT_PROD", f"cannot take the outer product of {_ne(a)} and {_ne(b)}")
    _require(not a.is_transposed(), "OUT_PROD", "a must not be transposed")
    return _node(_new(ctx, F32, [a.ne[0], b.ne[0], b.ne[2], b.ne[3]]), Op.OUT_PROD, a, b)


# ---------------------------------------------------------------------- mixture of experts
def mul_mat_id(ctx: Context, as_: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """ggml_mul_mat_id: c[:, e, t] = as[:, :, ids[e, t]] . b[:, e % b.ne1, t], F32 [rows, n_used, n_tokens].

    as [cols, rows, n_expert], b [cols, n_used (or a divisor of it), n_tokens], ids I32 [n_used, n_tokens].
    """
    op = "MUL_MAT_ID"
    _require(not as_.is_transposed(), op, "the expert matrices must not be transposed")
    _require(ids.type == I32, op, f"ids must be I32, got {ids.type.type_name}", TypeMismatchError)
    _require(as_.ne[3] == 1, op, f"as must be 3-d (one matrix per expert), got {_ne(as_)}")
    _require(b.ne[3] == 1, op, f"b must be 3-d, got {_ne(b)}")
    _require(ids.ne[2] == 1 and ids.ne[3] == 1, op, f"ids must be 2-d, got {_ne(ids)}")
    _require(ids.ne[1] == b.ne[2], op, f"ids {_ne(ids)} needs one expert list per token of b {_ne(b)}")
    _require(as_.ne[0] == b.ne[0], op, f"row length differs: as {_ne(as_)}, b {_ne(b)}")
    _require(ids.ne[0] % b.ne[1] == 0, op, f"b {_ne(b)} cannot be broadcast over ids {_ne(ids)}")
    result = _new(ctx, F32, [as_.ne[1], ids.ne[0], b.ne[2], 1])
    return _node(result, Op.MUL_MAT_ID, as_, b, ids)


def add_id(ctx: Context, a: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """ggml_add_id: dst[:, i1, i2] = a[:, i1, i2] + b[:, ids[i1, i2]] (a per-expert bias), shaped like a."""
    op = "ADD_ID"
    _require(a.ne[0] == b.ne[0], op, f"row length differs: a {_ne(a)}, b {_ne(b)}")
    _require(a.ne[1] == ids.ne[0] and a.ne[2] == ids.ne[1], op, f"ids {_ne(ids)} does not index a {_ne(a)}")
    _require(ids.type == I32, op, f"ids must be I32, got {ids.type.type_name}", TypeMismatchError)
    return _node(ctx.dup_tensor(a), Op.ADD_ID, a, b, ids)
