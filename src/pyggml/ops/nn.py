"""Op constructors of the neural-network layers: NORM, RMS_NORM (and RMS_NORM_BACK), GROUP_NORM,
L2_NORM, SOFT_MAX (and SOFT_MAX_BACK), ROPE (and ROPE_BACK), FLASH_ATTN_EXT, the SAM relative
positions (GET_REL_POS, ADD_REL_POS) and DeepSeek V4's indexer and hyper-connection ops.

CPU kernels: backend/cpu/ops/nn.py. The conventions every builder keeps: ops/builders.py.
"""

from __future__ import annotations

__all__ = [
    "GGML_ROPE_TYPE_IMROPE",
    "GGML_ROPE_TYPE_MROPE",
    "GGML_ROPE_TYPE_NEOX",
    "GGML_ROPE_TYPE_VISION",
    "add_rel_pos",
    "add_rel_pos_inplace",
    "dsv4_hc_comb",
    "dsv4_hc_post",
    "dsv4_hc_pre",
    "dsv4_hc_pre_gated",
    "flash_attn_ext",
    "flash_attn_ext_add_sinks",
    "flash_attn_ext_get_prec",
    "flash_attn_ext_set_prec",
    "get_rel_pos",
    "group_norm",
    "group_norm_inplace",
    "l2_norm",
    "l2_norm_inplace",
    "lightning_indexer",
    "norm",
    "norm_inplace",
    "rms_norm",
    "rms_norm_back",
    "rms_norm_inplace",
    "rope",
    "rope_ext",
    "rope_ext_back",
    "rope_ext_inplace",
    "rope_inplace",
    "rope_multi",
    "rope_multi_back",
    "rope_set_offset",
    "rope_yarn_corr_dims",
    "soft_max",
    "soft_max_add_sinks",
    "soft_max_ext",
    "soft_max_ext_back",
    "soft_max_ext_back_inplace",
    "soft_max_ext_inplace",
    "soft_max_inplace",
]

import math
from collections.abc import Sequence

from ..context import Context
from ..errors import PyGGMLError, TypeMismatchError
from ..tensor import Tensor, are_same_shape
from ._build import F16, F32, I32, _dup_or_view, _ne, _new, _node, _require, _twins
from .enums import Op
from .mat import can_mul_mat

GGML_ROPE_TYPE_NEOX = 2
GGML_ROPE_TYPE_MROPE = 8
GGML_ROPE_TYPE_VISION = 24
GGML_ROPE_TYPE_IMROPE = 40
GGML_MROPE_SECTIONS = 4


# ---------------------------------------------------------------------- normalisation
def _norm_like(ctx: Context, a: Tensor, op: Op, inplace: bool, eps: float) -> Tensor:
    return _node(_dup_or_view(ctx, a, inplace), op, a, params=[float(eps)])


norm, norm_inplace = _twins(_norm_like, Op.NORM, ": each row to mean 0 and variance 1 (eps added to the variance).")
rms_norm, rms_norm_inplace = _twins(_norm_like, Op.RMS_NORM, ": each row divided by its root mean square (+ eps).")
l2_norm, l2_norm_inplace = _twins(_norm_like, Op.L2_NORM, ": each row divided by max(its L2 norm, eps).")


def _group_norm(ctx: Context, a: Tensor, n_groups: int, eps: float, inplace: bool) -> Tensor:
    return _node(_dup_or_view(ctx, a, inplace), Op.GROUP_NORM, a, params=[int(n_groups), float(eps)])


def group_norm(ctx: Context, a: Tensor, n_groups: int, eps: float) -> Tensor:
    return _group_norm(ctx, a, n_groups, eps, False)


def group_norm_inplace(ctx: Context, a: Tensor, n_groups: int, eps: float) -> Tensor:
    return _group_norm(ctx, a, n_groups, eps, True)


# ---------------------------------------------------------------------- softmax
def _soft_max(ctx: Context, a: Tensor, mask: Tensor | None, scale: float, max_bias: float, inplace: bool) -> Tensor:
    _require(a.is_contiguous(), "SOFT_MAX", "a must be contiguous")
    if mask is not None:
        _require(mask.type in (F16, F32), "SOFT_MAX", "mask must be F16 or F32", TypeMismatchError)
        _require(mask.is_contiguous(), "SOFT_MAX", "mask must be contiguous")
        _require(mask.ne[0] == a.ne[0] and mask.ne[1] >= a.ne[1] and a.ne[2] % mask.ne[2] == 0
                 and a.ne[3] % mask.ne[3] == 0, "SOFT_MAX", f"mask {_ne(mask)} does not fit a {_ne(a)}")
    if max_bias > 0:
        _require(mask is not None, "SOFT_MAX", "max_bias > 0 (ALiBi) needs a mask")
    return _node(_dup_or_view(ctx, a, inplace), Op.SOFT_MAX, a, mask, params=[float(scale), float(max_bias)])


def soft_max(ctx: Context, a: Tensor) -> Tensor:
    return _soft_max(ctx, a, None, 1.0, 0.0, False)


def soft_max_inplace(ctx: Context, a: Tensor) -> Tensor:
    return _soft_max(ctx, a, None, 1.0, 0.0, True)


def soft_max_ext(ctx: Context, a: Tensor, mask: Tensor | None, scale: float, max_bias: float) -> Tensor:
    """softmax(a*scale + mask*slope) over rows; slope is ALiBi's when max_bias > 0, else 1."""
    return _soft_max(ctx, a, mask, scale, max_bias, False)


def soft_max_ext_inplace(ctx: Context, a: Tensor, mask: Tensor | None, scale: float, max_bias: float) -> Tensor:
    return _soft_max(ctx, a, mask, scale, max_bias, True)


def soft_max_add_sinks(a: Tensor, sinks: Tensor | None) -> None:
    """Attach per-head attention sinks (F32 [n_head]) to a SOFT_MAX node."""
    if sinks is None:
        a.src[2] = None
        return
    _require(a.op == Op.SOFT_MAX and a.src[2] is None, "soft_max_add_sinks", "not a SOFT_MAX node without sinks",
             PyGGMLError)
    src0 = a.src[0]
    assert src0 is not None
    _require(sinks.ne[0] == src0.ne[2], "soft_max_add_sinks", f"need {src0.ne[2]} sinks, got {sinks.ne[0]}")
    _require(sinks.type == F32, "soft_max_add_sinks", "sinks must be F32", TypeMismatchError)
    a.src[2] = sinks


# ---------------------------------------------------------------------- rope
def _rope(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, sections: Sequence[int] | None,
          mode: int, n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float,
          attn_factor: float, beta_fast: float, beta_slow: float, inplace: bool) -> Tensor:
    _require((mode & 1) == 0, "ROPE", "mode & 1 == 1 is no longer supported")
    _require(b.is_vector() and b.type == I32, "ROPE", "positions must be an I32 vector", TypeMismatchError)
    mrope = bool(mode & GGML_ROPE_TYPE_MROPE)
    want = a.ne[2] * 4 if mrope else a.ne[2]
    _require(b.ne[0] == want, "ROPE", f"need {want} positions for a {_ne(a)}, got {b.ne[0]}")
    if c is not None:
        _require(c.type == F32, "ROPE", "freq factors must be F32", TypeMismatchError)
        _require(c.ne[0] >= n_dims // 2, "ROPE", f"need at least {n_dims // 2} freq factors, got {c.ne[0]}")
    params: list[int | float] = [0, n_dims, mode, 0, n_ctx_orig, float(freq_base), float(freq_scale),
                                 float(ext_factor), float(attn_factor), float(beta_fast), float(beta_slow)]
    secs = list(sections) if (mrope and sections) else [0] * GGML_MROPE_SECTIONS
    params += [int(s) for s in secs]
    return _node(_dup_or_view(ctx, a, inplace), Op.ROPE, a, b, c, params=params)


def rope(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int) -> Tensor:
    return _rope(ctx, a, b, None, n_dims, None, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0, False)


def rope_inplace(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int) -> Tensor:
    return _rope(ctx, a, b, None, n_dims, None, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0, True)


def rope_ext(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, mode: int, n_ctx_orig: int,
             freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
             beta_fast: float, beta_slow: float) -> Tensor:
    """Rotary embedding of a [head_dim, n_head, n_tokens] at I32 positions b, with YaRN parameters."""
    return _rope(ctx, a, b, c, n_dims, None, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                 attn_factor, beta_fast, beta_slow, False)


def rope_ext_inplace(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, mode: int,
                     n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float,
                     attn_factor: float, beta_fast: float, beta_slow: float) -> Tensor:
    return _rope(ctx, a, b, c, n_dims, None, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                 attn_factor, beta_fast, beta_slow, True)


def rope_multi(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, sections: Sequence[int],
               mode: int, n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float,
               attn_factor: float, beta_fast: float, beta_slow: float) -> Tensor:
    return _rope(ctx, a, b, c, n_dims, sections, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                 attn_factor, beta_fast, beta_slow, False)


def rope_ext_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, mode: int, n_ctx_orig: int,
                  freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
                  beta_fast: float, beta_slow: float) -> Tensor:
    """ggml_rope_ext_back: rope_ext's node with op ROPE_BACK (the inverse rotation, rope's gradient)."""
    result = rope_ext(ctx, a, b, c, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor,
                      beta_fast, beta_slow)
    result.op = Op.ROPE_BACK
    return result


def rope_multi_back(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, sections: Sequence[int],
                    mode: int, n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float,
                    attn_factor: float, beta_fast: float, beta_slow: float) -> Tensor:
    """ggml_rope_multi_back: rope_multi's node with op ROPE_BACK."""
    result = rope_multi(ctx, a, b, c, n_dims, sections, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                        attn_factor, beta_fast, beta_slow)
    result.op = Op.ROPE_BACK
    return result


def rope_set_offset(a: Tensor, n_offs: int) -> Tensor:
    """ggml_rope_set_offset: rotate dims [n_offs, n_offs + n_dims) only (op_params i32[15]); returns a."""
    _require(a.op in (Op.ROPE, Op.ROPE_BACK), "rope_set_offset", "not a ROPE or ROPE_BACK node", PyGGMLError)
    _require(n_offs >= 0, "rope_set_offset", f"n_offs must be >= 0, got {n_offs}")
    _require(a.get_op_params_i32(2) != GGML_ROPE_TYPE_VISION, "rope_set_offset", "vision rope has no offset")
    a.set_op_params_i32(15, n_offs)
    return a


def rope_yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                        beta_slow: float) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims: the dimension range over which YaRN ramps (floor/ceil, clamped)."""

    def corr_dim(n_rot: float) -> float:
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(freq_base))

    start = math.floor(corr_dim(beta_fast))
    end = math.ceil(corr_dim(beta_slow))
    return float(max(0, start)), float(min(n_dims - 1, end))


# ---------------------------------------------------------------------- attention
def flash_attn_ext(ctx: Context, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float,
                   max_bias: float, logit_softcap: float) -> Tensor:
    """softmax(scale*q.k [softcap] + mask*slope) . v, F32 [v.ne0, q.ne2, q.ne1, q.ne3] (heads before tokens)."""
    _require(can_mul_mat(k, q), "FLASH_ATTN_EXT", f"k {_ne(k)} does not match q {_ne(q)}")
    _require(q.ne[3] == k.ne[3] == v.ne[3], "FLASH_ATTN_EXT", "q, k and v differ in dim 3")
    if mask is not None:
        _require(mask.is_contiguous(), "FLASH_ATTN_EXT", "mask must be contiguous")
        _require(mask.ne[1] >= q.ne[1] and q.ne[2] % mask.ne[2] == 0 and q.ne[3] % mask.ne[3] == 0,
                 "FLASH_ATTN_EXT", f"mask {_ne(mask)} does not fit q {_ne(q)}")
    if max_bias > 0:
        _require(mask is not None, "FLASH_ATTN_EXT", "max_bias > 0 (ALiBi) needs a mask")
    result = _new(ctx, F32, [v.ne[0], q.ne[2], q.ne[1], q.ne[3]])
    return _node(result, Op.FLASH_ATTN_EXT, q, k, v, mask,
                 params=[float(scale), float(max_bias), float(logit_softcap)])


def flash_attn_ext_set_prec(a: Tensor, prec: int) -> None:
    _require(a.op == Op.FLASH_ATTN_EXT, "flash_attn_ext_set_prec", "not a FLASH_ATTN_EXT node", PyGGMLError)
    a.op_params[3] = prec


def flash_attn_ext_get_prec(a: Tensor) -> int:
    return int(a.op_params[3])


def flash_attn_ext_add_sinks(a: Tensor, sinks: Tensor | None) -> None:
    if sinks is None:
        a.src[4] = None
        return
    _require(a.op == Op.FLASH_ATTN_EXT and a.src[4] is None, "flash_attn_ext_add_sinks",
             "not a FLASH_ATTN_EXT node without sinks", PyGGMLError)
    q = a.src[0]
    assert q is not None
    _require(sinks.ne[0] == q.ne[2] and sinks.type == F32, "flash_attn_ext_add_sinks",
             f"need F32 [{q.ne[2]}] sinks, got {sinks.type.type_name} {_ne(sinks)}")
    a.src[4] = sinks


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


def rms_norm_back(ctx: Context, a: Tensor, b: Tensor, eps: float) -> Tensor:
    """ggml_rms_norm_back: the RMS_NORM gradient, a = dz, b = x; op_params f32[0] = eps."""
    return _node(ctx.dup_tensor(a), Op.RMS_NORM_BACK, a, b, params=[float(eps)])


def _soft_max_ext_back(ctx: Context, a: Tensor, b: Tensor, scale: float, max_bias: float, inplace: bool) -> Tensor:
    return _node(_dup_or_view(ctx, a, inplace), Op.SOFT_MAX_BACK, a, b, params=[float(scale), float(max_bias)])


def soft_max_ext_back(ctx: Context, a: Tensor, b: Tensor, scale: float, max_bias: float) -> Tensor:
    """ggml_soft_max_ext_back: the softmax gradient, a = dy, b = the softmax output; f32 {scale, max_bias}."""
    return _soft_max_ext_back(ctx, a, b, scale, max_bias, False)


def soft_max_ext_back_inplace(ctx: Context, a: Tensor, b: Tensor, scale: float, max_bias: float) -> Tensor:
    return _soft_max_ext_back(ctx, a, b, scale, max_bias, True)
