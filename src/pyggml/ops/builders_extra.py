"""Op constructors for ggml's less common forward ops: expert matmul, direct convolutions, window
and relative-position ops, ROLL, PAD_REFLECT_1D, and the DeepSeek indexer / hyper-connection ops.

Their CPU kernels existed before these builders did, so tests built the nodes by hand; each
function here is ggml.c's constructor of the same name (without ``ggml_``), with its arguments in
ggml's order, its shape checks as ShapeError / TypeMismatchError, and ggml's result type, shape,
src slots and op_params. Re-exported by ops/builders.py (``B.roll``) and the flat ``pyggml.*``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..context import Context
from ..errors import TypeMismatchError
from ..tensor import Tensor, are_same_shape
from ..types import GGMLType
from ._build import F16, F32, I32, _dup_or_view, _ne, _new, _node, _require
from .enums import Op


def _conv_out(ins: int, ks: int, s: int, p: int, d: int) -> int:
    """ggml_calc_conv_output_size (C division: the operands are positive for any valid conv)."""
    return (ins + 2 * p - d * (ks - 1) - 1) // s + 1


def _is_contiguous_channels(t: Tensor) -> bool:
    """ggml_is_contiguous_channels: a CWHN tensor permuted to WHCN (channels innermost in memory)."""
    return t.nb[0] > t.nb[2] and t.nb[1] > t.nb[0] and t.nb[2] == t.type.type_size


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


def get_rows_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """ggml_get_rows_back: scatter-add rows a at I32 ids b into an F32 tensor shaped like matrix c.

    c only gives the shape: as in ggml it is not recorded as a source.
    """
    op = "GET_ROWS_BACK"
    _require(a.is_matrix() and b.is_vector(), op, f"a must be a matrix and b a vector, got {_ne(a)}, {_ne(b)}")
    _require(b.type == I32, op, f"ids must be I32, got {b.type.type_name}", TypeMismatchError)
    _require(c.is_matrix() and a.ne[0] == c.ne[0], op, f"c {_ne(c)} must be a matrix with rows like a {_ne(a)}")
    return _node(_new(ctx, F32, [c.ne[0], c.ne[1]]), Op.GET_ROWS_BACK, a, b)


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


def get_rel_pos(ctx: Context, a: Tensor, qh: int, kh: int) -> Tensor:
    """ggml_get_rel_pos (SAM): F16 [a.ne0, kh, qh] relative-position rows picked from a [C, 2*kh - 1]."""
    _require(qh == kh, "GET_REL_POS", f"qh ({qh}) must equal kh ({kh})")
    _require(2 * max(qh, kh) - 1 == a.ne[1], "GET_REL_POS", f"a {_ne(a)} must have ne[1] == {2 * max(qh, kh) - 1}")
    return _node(_new(ctx, F16, [a.ne[0], kh, qh]), Op.GET_REL_POS, a)


def _add_rel_pos(ctx: Context, a: Tensor, pw: Tensor, ph: Tensor, inplace: bool) -> Tensor:
    op = "ADD_REL_POS"
    _require(are_same_shape(pw, ph), op, f"pw {_ne(pw)} and ph {_ne(ph)} differ in shape")
    _require(a.is_contiguous() and pw.is_contiguous() and ph.is_contiguous(), op, "a, pw and ph must be contiguous")
    _require(pw.type == F32 and ph.type == F32, op, "pw and ph must be F32", TypeMismatchError)
    _require(pw.ne[3] == a.ne[2], op, f"pw {_ne(pw)} ne[3] must equal a {_ne(a)} ne[2]")
    _require(pw.ne[0] * pw.ne[0] == a.ne[0], op, f"a.ne[0] must be pw.ne[0]^2, got {_ne(a)}, {_ne(pw)}")
    _require(pw.ne[1] * pw.ne[2] == a.ne[1], op, f"a.ne[1] must be pw.ne[1]*pw.ne[2], got {_ne(a)}, {_ne(pw)}")
    return _node(_dup_or_view(ctx, a, inplace), Op.ADD_REL_POS, a, pw, ph, params=[int(inplace)])


def add_rel_pos(ctx: Context, a: Tensor, pw: Tensor, ph: Tensor) -> Tensor:
    """ggml_add_rel_pos (SAM): a + ph (per row) + pw (per column) in blocks; op_params i32[0] = inplace."""
    return _add_rel_pos(ctx, a, pw, ph, False)


def add_rel_pos_inplace(ctx: Context, a: Tensor, pw: Tensor, ph: Tensor) -> Tensor:
    return _add_rel_pos(ctx, a, pw, ph, True)


# ---------------------------------------------------------------------- DeepSeek V4: indexer, hyper-connections
def lightning_indexer(ctx: Context, q: Tensor, k: Tensor, weights: Tensor, mask: Tensor) -> Tensor:
    """ggml_lightning_indexer: per key, sum_h relu(q_h . k) * w_h + mask -> F32 [n_kv, T, 1, S].

    q F32 [E, n_head, T, S], k [E, 1, n_kv, S], weights F32 [n_head, T, 1, S], mask F16 [n_kv, T, 1, S'].
    """
    op = "LIGHTNING_INDEXER"
    _require(q.type == F32 and weights.type == F32, op, "q and weights must be F32", TypeMismatchError)
    _require(mask.type == F16, op, f"mask must be F16, got {mask.type.type_name}", TypeMismatchError)
    shapes = f"q {_ne(q)}, k {_ne(k)}, weights {_ne(weights)}, mask {_ne(mask)}"
    _require(q.ne[0] == k.ne[0] and k.ne[1] == 1 and mask.ne[0] == k.ne[2], op, f"q/k/mask do not fit: {shapes}")
    _require(q.ne[1] == weights.ne[0] and q.ne[2] == weights.ne[1] and weights.ne[2] == 1, op,
             f"weights do not fit q: {shapes}")
    _require(mask.ne[1] == q.ne[2] and mask.ne[2] == 1, op, f"mask does not fit q: {shapes}")
    _require(q.ne[3] == k.ne[3] == weights.ne[3] and weights.ne[3] % mask.ne[3] == 0, op,
             f"dim 3 differs: {shapes}")
    return _node(_new(ctx, F32, [k.ne[2], q.ne[2], 1, q.ne[3]]), Op.LIGHTNING_INDEXER, q, k, weights, mask)


def dsv4_hc_comb(ctx: Context, mixes: Tensor, scale: Tensor, base: Tensor, eps: float, n_iter: int) -> Tensor:
    """ggml_dsv4_hc_comb: the per-token hc x hc mixing matrix (F32 [hc, hc, T], hc = 4) from mixes
    [hc*(hc+2), T]; op_params {f32 eps, i32 n_iter}."""
    op = "DSV4_HC_COMB"
    _require(mixes.type == F32 and scale.type == F32 and base.type == F32, op, "mixes, scale and base must be F32",
             TypeMismatchError)
    _require(n_iter > 0, op, f"n_iter must be positive, got {n_iter}")
    mix_dim = mixes.ne[0]
    hc = next((i for i in range(1, mix_dim + 1) if i * i + 2 * i <= mix_dim and (2 + i) * i == mix_dim), 0)
    _require(hc == 4, op, f"mixes.ne[0] = {mix_dim} must be hc*(hc+2) with hc = 4")
    _require(mixes.ne[2] == 1 and mixes.ne[3] == 1, op, f"mixes must be 2-d, got {_ne(mixes)}")
    _require(scale.ne[0] >= 3 and scale.ne[1:] == [1, 1, 1], op, f"scale must be [>=3], got {_ne(scale)}")
    _require(base.ne == [mix_dim, 1, 1, 1], op, f"base must be [{mix_dim}], got {_ne(base)}")
    result = _new(ctx, F32, [hc, hc, mixes.ne[1]])
    result.set_op_params_f32(0, eps)
    result.set_op_params_i32(1, n_iter)
    return _node(result, Op.DSV4_HC_COMB, mixes, scale, base)


def _dsv4_hc_pre(ctx: Context, x: Tensor, weights: Tensor, scale: float, gated: bool) -> Tensor:
    op = "DSV4_HC_PRE"
    _require(x.type == F32 and weights.type == F32, op, "x and weights must be F32", TypeMismatchError)
    n_embd, hc, n_tokens = x.ne[0], x.ne[1], x.ne[2]
    _require(hc > 0 and x.ne[3] == 1, op, f"x must be [n_embd, hc, T], got {_ne(x)}")
    want = [n_embd, hc, n_tokens, 1] if gated else [hc, n_tokens, 1, 1]
    _require(weights.ne == want, op, f"weights must be {want} for x {_ne(x)}, got {_ne(weights)}")
    result = _new(ctx, F32, [n_embd, n_tokens])
    result.set_op_params_f32(0, scale)
    result.set_op_params_i32(1, int(gated))
    return _node(result, Op.DSV4_HC_PRE, x, weights)


def dsv4_hc_pre(ctx: Context, x: Tensor, weights: Tensor) -> Tensor:
    """ggml_dsv4_hc_pre: sum over the hc streams of x [n_embd, hc, T] weighted by weights [hc, T]."""
    return _dsv4_hc_pre(ctx, x, weights, 1.0, False)


def dsv4_hc_pre_gated(ctx: Context, x: Tensor, gate: Tensor, scale: float) -> Tensor:
    """ggml_dsv4_hc_pre_gated: scale * sum_h x[:, h] * sigmoid(gate[:, h]), gate shaped like x."""
    return _dsv4_hc_pre(ctx, x, gate, scale, True)


def dsv4_hc_post(ctx: Context, x: Tensor, residual: Tensor, post: Tensor, comb: Tensor | None) -> Tensor:
    """ggml_dsv4_hc_post: F32 [n_embd, hc, T] = x * post + residual mixed by comb (identity when None)."""
    op = "DSV4_HC_POST"
    _require(x.type == F32 and residual.type == F32 and post.type == F32, op, "x, residual and post must be F32",
             TypeMismatchError)
    n_embd, n_tokens, hc = x.ne[0], x.ne[1], residual.ne[1]
    _require(hc > 0 and x.ne[2] == 1 and x.ne[3] == 1, op, f"x must be [n_embd, T], got {_ne(x)}")
    _require(residual.ne[0] == n_embd and residual.ne[2] == n_tokens and residual.ne[3] == 1, op,
             f"residual must be [{n_embd}, hc, {n_tokens}], got {_ne(residual)}")
    _require(post.ne == [hc, n_tokens, 1, 1], op, f"post must be [{hc}, {n_tokens}], got {_ne(post)}")
    if comb is not None:
        _require(comb.type == F32, op, "comb must be F32", TypeMismatchError)
        _require(comb.ne == [hc, hc, n_tokens, 1], op, f"comb must be [{hc}, {hc}, {n_tokens}], got {_ne(comb)}")
    return _node(_new(ctx, F32, [n_embd, hc, n_tokens]), Op.DSV4_HC_POST, x, residual, post, comb)


__all__ = [n for n, v in list(globals().items())
           if not n.startswith("_") and callable(v) and getattr(v, "__module__", None) == __name__]
