"""Op constructors for the recurrent and solver ops: SSM_CONV, SSM_SCAN (Mamba), RWKV_WKV6,
GATED_LINEAR_ATTN, RWKV_WKV7, GATED_DELTA_NET and SOLVE_TRI.

The recurrences return one F32 tensor holding the outputs followed by the final states (ggml's
"concatenated y + states" layout), which the caller views apart.

CPU kernels: backend/cpu/ops/recurrent.py. The conventions every builder keeps: ops/builders.py.
"""

from __future__ import annotations

__all__ = [
    "gated_delta_net",
    "gated_linear_attn",
    "rwkv_wkv6",
    "rwkv_wkv7",
    "solve_tri",
    "ssm_conv",
    "ssm_scan",
]

from ..context import Context
from ..errors import TypeMismatchError
from ..tensor import Tensor, are_same_shape
from ._build import F32, I32, _ne, _new, _node, _require
from .enums import Op

_INT32_MAX = 2**31 - 1


def _rows_packed(t: Tensor) -> bool:
    """Elements and rows contiguous (nb0 == type size, nb1 == ne0*nb0), as ggml_ssm_scan asserts."""
    return t.nb[0] == t.type.type_size and t.nb[1] == t.ne[0] * t.nb[0]


def ssm_conv(ctx: Context, sx: Tensor, c: Tensor) -> Tensor:
    """ggml_ssm_conv: causal conv of sx [d_conv-1+n_t, d_inner, n_s] by c [d_conv, d_inner].

    The result is F32 [d_inner, n_t, n_s].
    """
    op = "SSM_CONV"
    _require(sx.is_3d(), op, f"sx must be 3-d, got {_ne(sx)}")
    _require(c.is_matrix(), op, f"c must be a matrix, got {_ne(c)}")
    d_conv, d_inner = c.ne[0], c.ne[1]
    n_t = sx.ne[0] - d_conv + 1
    _require(sx.ne[1] == d_inner, op, f"sx {_ne(sx)} must have ne[1] == d_inner = {d_inner}")
    _require(n_t >= 0, op, f"sx {_ne(sx)} is shorter than the conv window {d_conv - 1}")
    return _node(_new(ctx, F32, [d_inner, n_t, sx.ne[2]]), Op.SSM_CONV, sx, c)


def ssm_scan(ctx: Context, s: Tensor, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, ids: Tensor,
             K: int) -> Tensor:
    """ggml_ssm_scan: Mamba's selective scan -> F32 1-d [y (x's size) | K state slots per sequence].

    s {d_state, head_dim, n_head, *}, x {head_dim, n_head, n_seq_tokens, n_seqs}, dt {n_head, nt, ns},
    A {d_state or 1, n_head}, B/C {d_state, n_group, nt, ns}, ids I32 {ns}. Slot 0 is each sequence's
    final state, slot k < K the state k tokens earlier; op_params i32[0] = K.
    """
    op = "SSM_SCAN"
    _require(1 <= K <= _INT32_MAX, op, f"K must be in 1..{_INT32_MAX}, got {K}")
    _require(s.is_contiguous() and dt.is_contiguous() and A.is_contiguous(), op, "s, dt and A must be contiguous")
    _require(_rows_packed(x) and _rows_packed(B) and _rows_packed(C), op, "x, B and C must have packed rows")
    _require(are_same_shape(B, C), op, f"B {_ne(B)} and C {_ne(C)} differ in shape")
    _require(ids.type == I32, op, f"ids must be I32, got {ids.type.type_name}", TypeMismatchError)
    d_state, head_dim, n_head, n_seq_tokens, n_seqs = s.ne[0], x.ne[0], x.ne[1], x.ne[2], x.ne[3]
    _require(dt.is_3d() and dt.ne[:3] == [n_head, n_seq_tokens, n_seqs], op,
             f"dt must be [{n_head}, {n_seq_tokens}, {n_seqs}], got {_ne(dt)}")
    _require(s.ne[1] == head_dim and s.ne[2] == n_head, op, f"s {_ne(s)} does not fit x {_ne(x)}")
    _require(B.ne[0] == d_state and B.ne[2] == n_seq_tokens and B.ne[3] == n_seqs, op,
             f"B {_ne(B)} does not fit s {_ne(s)} and x {_ne(x)}")
    _require(ids.is_vector() and ids.ne[0] == n_seqs, op, f"ids must be a vector of {n_seqs}, got {_ne(ids)}")
    _require(A.is_matrix() and A.ne[1] == n_head, op, f"A must be [d_state or 1, {n_head}], got {_ne(A)}")
    if A.ne[0] != 1:  # Mamba-1: one decay per state dim, and no rollback snapshots
        _require(A.ne[0] == d_state, op, f"A.ne[0] must be 1 or d_state = {d_state}, got {A.ne[0]}")
        _require(K == 1, op, f"Mamba-1 (A.ne[0] == d_state) keeps one state slot, got K = {K}")
    n = x.nelements() + K * s.ne[0] * s.ne[1] * s.ne[2] * ids.ne[0]
    result = _node(_new(ctx, F32, [n]), Op.SSM_SCAN, s, x, dt, A, B, C, ids)
    result.set_op_params_i32(0, K)
    return result


def _check_wkv(op: str, state: Tensor, key: Tensor, named: dict[str, Tensor]) -> tuple[int, int, int, int]:
    """Shared checks of the WKV-style ops: all contiguous, [S, H, n_tokens] operands, state S*S*H*n_seqs."""
    for name, t in (*named.items(), ("state", state)):
        _require(t.is_contiguous(), op, f"{name} must be contiguous")
    S, H, n_tokens, n_seqs = key.ne[0], key.ne[1], key.ne[2], state.ne[1]
    for name, t in named.items():
        _require(t.ne[:3] == [S, H, n_tokens], op, f"{name} must be [{S}, {H}, {n_tokens}], got {_ne(t)}")
    _require(state.nelements() == S * S * H * n_seqs, op,
             f"state {_ne(state)} must hold S*S*H*n_seqs = {S * S * H * n_seqs} values")
    return S, H, n_tokens, n_seqs


def rwkv_wkv6(ctx: Context, k: Tensor, v: Tensor, r: Tensor, tf: Tensor, td: Tensor, state: Tensor) -> Tensor:
    """ggml_rwkv_wkv6: RWKV-6 time mixing -> F32 [S*H, n_tokens + S*n_seqs] (outputs, then new states)."""
    _require(tf.is_contiguous(), "RWKV_WKV6", "tf must be contiguous")
    S, H, n_tokens, n_seqs = _check_wkv("RWKV_WKV6", state, k, {"k": k, "v": v, "r": r, "td": td})
    return _node(_new(ctx, F32, [S * H, n_tokens + S * n_seqs, 1, 1]), Op.RWKV_WKV6, k, v, r, tf, td, state)


def gated_linear_attn(ctx: Context, k: Tensor, v: Tensor, q: Tensor, g: Tensor, state: Tensor,
                      scale: float) -> Tensor:
    """ggml_gated_linear_attn: GLA -> F32 [S*H, n_tokens + S*n_seqs]; op_params f32[0] = scale."""
    S, H, n_tokens, n_seqs = _check_wkv("GATED_LINEAR_ATTN", state, k, {"k": k, "v": v, "q": q, "g": g})
    result = _new(ctx, F32, [S * H, n_tokens + S * n_seqs, 1, 1])
    result.set_op_params_f32(0, scale)
    return _node(result, Op.GATED_LINEAR_ATTN, k, v, q, g, state)


def rwkv_wkv7(ctx: Context, r: Tensor, w: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor,
              state: Tensor) -> Tensor:
    """ggml_rwkv_wkv7: RWKV-7 time mixing -> F32 [S*H, n_tokens + S*n_seqs] (outputs, then new states)."""
    _require(r.is_contiguous(), "RWKV_WKV7", "r must be contiguous")
    S, H, n_tokens, n_seqs = _check_wkv("RWKV_WKV7", state, k, {"w": w, "k": k, "v": v, "a": a, "b": b})
    return _node(_new(ctx, F32, [S * H, n_tokens + S * n_seqs, 1, 1]), Op.RWKV_WKV7, r, w, k, v, a, b, state)


def solve_tri(ctx: Context, a: Tensor, b: Tensor, left: bool, lower: bool, uni: bool) -> Tensor:
    """ggml_solve_tri: X with A X = B for square lower-triangular A [n, n, ...] and B [k, n, ...] (F32).

    ggml implements only left, lower, non-unit-diagonal systems, and so does this builder.
    """
    op = "SOLVE_TRI"
    _require(a.type == F32 and b.type == F32, op, "a and b must be F32", TypeMismatchError)
    _require(a.ne[0] == a.ne[1], op, f"a must be square, got {_ne(a)}")
    _require(a.ne[1] == b.ne[1], op, f"b {_ne(b)} must have as many rows as a {_ne(a)}")
    _require(a.ne[2] == b.ne[2] and a.ne[3] == b.ne[3], op, f"batch dims differ: a {_ne(a)}, b {_ne(b)}")
    _require(a.is_contiguous() and b.is_contiguous(), op, "a and b must be contiguous")
    _require(lower and left and not uni, op, "only left=True, lower=True, uni=False is supported (as in ggml)")
    return _node(_new(ctx, F32, list(b.ne)), Op.SOLVE_TRI, a, b)


def gated_delta_net(ctx: Context, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                    K: int) -> Tensor:
    """ggml_gated_delta_net: the gated delta rule -> F32 [S_v*H, n_tokens*n_seqs + K*S_v*n_seqs]
    (outputs, then K state snapshots, slot 0 the last token's); op_params i32[0] = K.

    v [S_v, H, T, n_seqs], g [1 or S_v, H, T, n_seqs], beta [1, H, T, n_seqs], state [S_v, S_v, H, n_seqs].
    """
    op = "GATED_DELTA_NET"
    _require(q.is_contiguous_rows() and k.is_contiguous_rows() and v.is_contiguous_rows(), op,
             "q, k and v must have contiguous rows")
    _require(g.is_contiguous() and beta.is_contiguous() and state.is_contiguous(), op,
             "g, beta and state must be contiguous")
    _require(all(t.type == F32 for t in (q, k, v, g, beta, state)), op, "all operands must be F32",
             TypeMismatchError)
    S_v, H, n_tokens, n_seqs = v.ne
    _require(g.ne[0] in (1, S_v), op, f"g.ne[0] must be 1 or S_v = {S_v}, got {g.ne[0]}")
    _require(beta.ne[0] == 1, op, f"beta.ne[0] must be 1, got {beta.ne[0]}")
    _require(state.ne == [S_v, S_v, H, n_seqs], op, f"state must be [{S_v}, {S_v}, {H}, {n_seqs}], got {_ne(state)}")
    _require(K >= 1, op, f"K must be at least 1, got {K}")
    result = _new(ctx, F32, [S_v * H, n_tokens * n_seqs + K * S_v * n_seqs, 1, 1])
    result.set_op_params_i32(0, K)
    return _node(result, Op.GATED_DELTA_NET, q, k, v, g, beta, state)
