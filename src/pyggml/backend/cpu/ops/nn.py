"""Neural-network kernels: NORM, RMS_NORM (and RMS_NORM_BACK), GROUP_NORM, L2_NORM, SOFT_MAX (and
SOFT_MAX_BACK), ROPE (and ROPE_BACK), FLASH_ATTN_EXT, GET_REL_POS, ADD_REL_POS, LIGHTNING_INDEXER
and DeepSeek V4's hyper-connection ops (DSV4_HC_PRE, DSV4_HC_POST, DSV4_HC_COMB).

Numerics follow ggml-cpu: row sums of squares accumulate in double and narrow to float once;
softmax sums exponentials in double and scales by a float reciprocal; RoPE builds its angles by
repeated float32 multiplication (theta_{i+1} = theta_i * base^(-2/n_dims)), which differs from an
exact power by up to 2e-3 at position 8000 - and is what llama.cpp computes.

Builders: pyggml/ops/nn.py (the same family).
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

from .... import quants
from ....ops.enums import Op
from ....tensor import Tensor
from ....types import GGMLType
from .._common import (
    F16,
    F32,
    FLOAT_TYPES,
    I32,
    KernelInputError,
    load_f32,
    require_f32,
    require_types,
    shape4,
    store,
    tile_to,
    unsupported,
)
from ..kernel_table import kernel
from ..quants.actquant import fake_quant
from ..simd import round_to_f16


# ------------------------------------------------------------------------------------------ norms
def _rows_f32(node: Tensor) -> np.ndarray:
    a = node.src[0]
    require_f32(node, a, node)
    return a.view4()


@kernel(Op.RMS_NORM)
def rms_norm(node: Tensor, n_threads: int) -> None:
    """y = x / sqrt(mean(x^2) + eps): squares in float, their sum in double, mean narrowed to float."""
    x = _rows_f32(node)
    eps = np.float32(node.get_op_params_f32(0))
    ssq = np.square(x).sum(axis=-1, keepdims=True, dtype=np.float64)
    mean = (ssq / x.shape[-1]).astype(np.float32)
    scale = np.float32(1.0) / np.sqrt(mean + eps)
    np.multiply(x, scale, out=node.view4())


@kernel(Op.NORM)
def norm(node: Tensor, n_threads: int) -> None:
    """Layer norm without affine: (x - mean) / sqrt(var + eps), mean and var from double sums."""
    x = _rows_f32(node)
    eps = np.float32(node.get_op_params_f32(0))
    n = x.shape[-1]
    mean = x.sum(axis=-1, keepdims=True, dtype=np.float64).astype(np.float32) / np.float32(n)
    y = x - mean
    var = (np.square(y).sum(axis=-1, keepdims=True, dtype=np.float64) / n).astype(np.float32)
    scale = np.float32(1.0) / np.sqrt(var + eps)
    node.view4()[...] = y * scale


@kernel(Op.L2_NORM)
def l2_norm(node: Tensor, n_threads: int) -> None:
    """y = x / max(||x||, eps) per row."""
    x = _rows_f32(node)
    eps = np.float32(node.get_op_params_f32(0))
    ssq = np.square(x).sum(axis=-1, keepdims=True, dtype=np.float64).astype(np.float32)
    scale = np.float32(1.0) / np.maximum(np.sqrt(ssq), eps)
    node.view4()[...] = x * scale


@kernel(Op.GROUP_NORM)
def group_norm(node: Tensor, n_threads: int) -> None:
    """Normalize over ne0*ne1*(channels of a group); channels are dim 2, split in ceil(ne2/n_groups)."""
    x = _rows_f32(node)
    n_groups = node.get_op_params_i32(0)
    eps = np.float32(node.get_op_params_f32(1))
    if n_groups <= 0:
        raise KernelInputError(f"GROUP_NORM: n_groups must be positive, got {n_groups}")
    _, ne2, ne1, ne0 = x.shape
    per = (ne2 + n_groups - 1) // n_groups
    out = node.view4()
    for g in range(n_groups):
        c0, c1 = g * per, min(g * per + per, ne2)
        if c0 >= c1:
            continue
        blk = x[:, c0:c1]
        cnt = ne0 * ne1 * (c1 - c0)
        mean = (blk.sum(axis=(1, 2, 3), keepdims=True, dtype=np.float64) / cnt).astype(np.float32)
        y = blk - mean
        var = (np.square(y).sum(axis=(1, 2, 3), keepdims=True, dtype=np.float64) / cnt).astype(np.float32)
        out[:, c0:c1] = y * (np.float32(1.0) / np.sqrt(var + eps))


# --------------------------------------------------------------------------------------- softmax


def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """ALiBi slope per head (float32); all ones when max_bias == 0."""
    if max_bias <= 0:
        return np.ones(n_head, dtype=np.float32)
    n_head_log2 = 1 << math.floor(math.log2(n_head))
    m0 = np.float32(2.0) ** np.float32(-max_bias / n_head_log2)
    m1 = np.float32(2.0) ** np.float32(-(max_bias / 2.0) / n_head_log2)
    h = np.arange(n_head)
    return np.where(
        h < n_head_log2,
        m0 ** (h + 1).astype(np.float32),
        m1 ** (2 * (h - n_head_log2) + 1).astype(np.float32),
    ).astype(np.float32)


@kernel(Op.SOFT_MAX)
def soft_max(node: Tensor, n_threads: int) -> None:
    """softmax(x*scale + slope*mask) per row, with optional per-head sinks (src2).

    op_params f32 {scale, max_bias}. The mask (F16/F32) row is the query row; it broadcasts over
    heads (dim 2) and batches (dim 3) by modulo.
    """
    a, mask, sinks = node.src[0], node.src[1], node.src[2]
    require_f32(node, a)
    require_types(node, mask, (F16, F32))
    require_f32(node, sinks)
    scale = np.float32(node.get_op_params_f32(0))
    max_bias = node.get_op_params_f32(1)
    ne3, ne2, ne1, ne0 = shape4(a)
    w = a.view4() * scale
    if mask is not None:
        m = load_f32(mask)[:, :, :ne1, :]
        slope = alibi_slopes(ne2, max_bias)[None, :, None, None]
        w = w + slope * tile_to(m, (ne3, ne2, ne1, ne0))
    mx = w.max(axis=-1, keepdims=True)
    sink = None
    if sinks is not None:
        sink = sinks.view4().reshape(-1)[:ne2].astype(np.float32)[None, :, None, None]
        mx = np.maximum(mx, sink)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(w - mx)
        total = e.sum(axis=-1, keepdims=True, dtype=np.float64)
        if sink is not None:
            total = total + np.exp(sink - mx).astype(np.float64)
        node.view4()[...] = e * (1.0 / total).astype(np.float32)


# ------------------------------------------------------------------------------------------ rope

GGML_ROPE_TYPE_NEOX = 2
GGML_ROPE_TYPE_MROPE = 8
GGML_ROPE_TYPE_VISION = 24
GGML_ROPE_TYPE_IMROPE = 40

_ROPE_CACHE: OrderedDict[tuple, tuple[np.ndarray, np.ndarray]] = OrderedDict()
_ROPE_CACHE_SIZE = 32


def rope_yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                        beta_slow: float) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims, in float32: the dims where YaRN ramps from extrapolation to interpolation."""
    f = np.float32

    def corr_dim(n_rot: float) -> np.float32:
        with np.errstate(divide="ignore"):
            ratio = f(n_ctx_orig) / (f(n_rot) * f(2) * f(math.pi))
            return f(n_dims) * np.log(ratio) / (f(2) * np.log(f(freq_base)))

    start = np.floor(corr_dim(beta_fast))
    end = np.ceil(corr_dim(beta_slow))
    return float(max(f(0), start)), float(min(f(n_dims - 1), end))


def _theta_table(pos: np.ndarray, ne2: int, half: int, theta_scale: np.float32, mode: int,
                 sections: list[int]) -> np.ndarray:
    """(ne2, half) angles before YaRN: theta_i = pos * theta_scale^i by repeated float32 multiplication.

    For the multi-section modes (MROPE, IMROPE, VISION) each pair takes its angle from the time,
    height, width or extra position stream as ggml_mrope_cache_init selects.
    """
    out = np.empty((ne2, half), dtype=np.float32)
    if not mode & GGML_ROPE_TYPE_MROPE:
        theta = pos[:ne2].astype(np.float32)
        for i in range(half):
            out[:, i] = theta
            theta = theta * theta_scale
        return out
    base = [pos[k * ne2 : (k + 1) * ne2].astype(np.float32) for k in range(4)]
    t_t, t_h, t_w, t_e = (b.copy() for b in base)
    s0, s1, s2, s3 = sections
    sect_dims = s0 + s1 + s2 + s3
    if sect_dims <= 0:
        raise KernelInputError("ROPE: multi-section rope needs positive sections")
    sec_w = s1 + s0
    sec_e = s2 + sec_w
    is_imrope = mode == GGML_ROPE_TYPE_IMROPE
    indep = mode == GGML_ROPE_TYPE_VISION
    for i in range(half):
        sector = i % sect_dims
        if indep:
            if sector == 0:
                t_t = base[0].copy()
            elif sector == s0:
                t_h = base[1].copy()
            elif sector == sec_w:
                t_w = base[2].copy()
            elif sector == sec_e:
                t_e = base[3].copy()
        if is_imrope:
            if sector % 3 == 1 and sector < 3 * s1:
                th = t_h
            elif sector % 3 == 2 and sector < 3 * s2:
                th = t_w
            elif sector % 3 == 0 and sector < 3 * s0:
                th = t_t
            else:
                th = t_e
        elif s0 <= sector < sec_w:
            th = t_h
        elif sec_w <= sector < sec_w + s2:
            th = t_w
        elif sector >= sec_w + s2:
            th = t_e
        else:
            th = t_t
        out[:, i] = th
        t_t, t_h, t_w, t_e = (t * theta_scale for t in (t_t, t_h, t_w, t_e))
    return out


def rope_cache(pos: np.ndarray, ne0: int, ne2: int, n_dims: int, mode: int, n_ctx_orig: int,
               params: tuple[float, ...], sections: list[int],
               freq_factors: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin (ne2, ne0/2) float32 for every position row, with YaRN and attn_factor folded in.

    Graphs compute the same cache in every layer; it is memoized on its inputs.
    """
    ff_key = None if freq_factors is None else freq_factors.tobytes()
    key = (pos.tobytes(), ne0, ne2, n_dims, mode, n_ctx_orig, params, tuple(sections), ff_key)
    hit = _ROPE_CACHE.get(key)
    if hit is not None:
        _ROPE_CACHE.move_to_end(key)
        return hit
    freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow = (np.float32(p) for p in params)
    half = ne0 // 2
    theta_scale = np.float32(np.power(freq_base, np.float32(-2.0) / np.float32(n_dims)))
    theta = _theta_table(pos, ne2, half, theta_scale, mode, sections)
    ff = np.ones(half, dtype=np.float32)
    if freq_factors is not None:
        n = min(half, freq_factors.shape[0])
        ff[:n] = freq_factors[:n]
    extrap = theta / ff[None, :]
    interp = freq_scale * extrap
    mscale = attn_factor
    if ext_factor != 0:
        low, high = rope_yarn_corr_dims(n_dims, n_ctx_orig, float(freq_base), float(beta_fast), float(beta_slow))
        y = (np.arange(half, dtype=np.float32) - np.float32(low)) / np.float32(max(0.001, high - low))
        ramp_mix = (np.float32(1) - np.minimum(np.float32(1), np.maximum(np.float32(0), y))) * ext_factor
        th = interp * (np.float32(1) - ramp_mix) + extrap * ramp_mix
        mscale = mscale * (np.float32(1.0) + np.float32(0.1) * np.log(np.float32(1.0) / freq_scale))
    else:
        th = interp
    cos = (np.cos(th) * mscale).astype(np.float32)
    sin = (np.sin(th) * mscale).astype(np.float32)
    _ROPE_CACHE[key] = (cos, sin)
    if len(_ROPE_CACHE) > _ROPE_CACHE_SIZE:
        _ROPE_CACHE.popitem(last=False)
    return cos, sin


@kernel(Op.ROPE, Op.ROPE_BACK)
def rope(node: Tensor, n_threads: int) -> None:
    """Rotary embedding of src0 [head_dim, n_head, n_tokens, ne3] at positions src1 (I32, one per token).

    NORMAL (mode 0) rotates pairs (x[2i], x[2i+1]); NEOX and the multi-section modes rotate
    (x[i], x[i + n_dims/2]); VISION rotates (x[i], x[i + n_dims]) over the whole row. Dims past
    n_dims are copied unchanged. ROPE_BACK (same params) rotates the other way.
    """
    a, pos_t, ff_t = node.src[0], node.src[1], node.src[2]
    require_types(node, a, (F32, F16))
    require_types(node, node, (a.type,))
    require_types(node, pos_t, (I32,))
    require_f32(node, ff_t)
    p = node.op_params
    n_dims, mode, n_ctx_orig = int(p[1]), int(p[2]), int(p[4])
    params = tuple(float(v) for v in node.op_params_f32[5:11])
    sections = [int(v) for v in p[11:15]]
    n_offs = int(p[15])  # ggml_rope_set_offset: the rotated window starts at this dim
    _, ne2, _, ne0 = shape4(a)
    if n_dims > ne0 or n_dims % 2 or n_dims <= 0:
        raise KernelInputError(f"ROPE: n_dims={n_dims} must be even, positive and <= ne0={ne0}")
    if n_offs < 0 or n_offs % 2 or n_offs + n_dims > ne0 or (n_offs and mode == GGML_ROPE_TYPE_VISION):
        raise KernelInputError(f"ROPE: offset {n_offs} must be even, >= 0, fit n_dims={n_dims} in ne0={ne0}, "
                               "and is not allowed in vision mode")
    if mode not in (0, GGML_ROPE_TYPE_NEOX, GGML_ROPE_TYPE_MROPE, GGML_ROPE_TYPE_VISION, GGML_ROPE_TYPE_IMROPE):
        raise unsupported(node, f"rope mode {mode}")
    if mode == GGML_ROPE_TYPE_VISION and n_dims != ne0 // 2:
        raise KernelInputError("ROPE: vision mode needs n_dims == ne0/2")
    pos = np.ascontiguousarray(pos_t.view4().reshape(-1))
    need = 4 * ne2 if mode & GGML_ROPE_TYPE_MROPE else ne2
    if pos.shape[0] < need:
        raise KernelInputError(f"ROPE: {pos.shape[0]} positions for {need} needed")
    ff = None if ff_t is None else np.ascontiguousarray(ff_t.view4().reshape(-1))
    cos, sin = rope_cache(pos, ne0, ne2, n_dims, mode, n_ctx_orig, params, sections, ff)
    if node.op == Op.ROPE_BACK:  # the inverse rotation: the transpose, i.e. sin negated
        sin = -sin
    x = load_f32(a)
    y = x.copy()
    if mode == GGML_ROPE_TYPE_VISION:
        win, xw = y, x
    else:  # dims outside [n_offs, n_offs + n_dims) are copied unchanged
        win, xw = y[..., n_offs : n_offs + n_dims], x[..., n_offs : n_offs + n_dims]
    if mode == 0:
        c, s = cos[None, :, None, : n_dims // 2], sin[None, :, None, : n_dims // 2]
        x0, x1 = xw[..., 0:n_dims:2], xw[..., 1:n_dims:2]
        win[..., 0:n_dims:2] = x0 * c - x1 * s
        win[..., 1:n_dims:2] = x0 * s + x1 * c
    else:
        off = n_dims if mode == GGML_ROPE_TYPE_VISION else n_dims // 2
        c, s = cos[None, :, None, :off], sin[None, :, None, :off]
        x0, x1 = xw[..., :off], xw[..., off : 2 * off]
        win[..., :off] = x0 * c - x1 * s
        win[..., off : 2 * off] = x0 * s + x1 * c
    store(node, y)


# ------------------------------------------------------------------------------- flash attention


@kernel(Op.FLASH_ATTN_EXT)
def flash_attn_ext(node: Tensor, n_threads: int) -> None:
    """softmax(scale*Q·Kᵀ [softcap] + slope*mask [+ sinks]) · V, output permuted to [DV, n_head, n_q, ne3].

    Q is first converted to K's vec_dot_type (fp16 for an F16 cache) except on ggml's tiled path
    (>= 64 query rows with F16/F32 K and V of one type), where Q stays F32. KV heads broadcast
    over query heads (GQA): query head h uses KV head h // (n_head / n_head_kv). The softmax is taken
    whole, in float32, so the result differs from ggml's by round-off (its online softmax, fp16 V
    accumulator and split decodes); the compiled kernel (attn_jit.py) takes ggml's steps.
    """
    q, k, v, mask, sinks = (node.src[i] for i in range(5))
    require_f32(node, q)
    require_types(node, mask, (F16, F32))
    require_f32(node, sinks)
    for t in (k, v):
        if not (t.type in FLOAT_TYPES or t.type.is_quantized):
            raise unsupported(node)
    scale = node.get_op_params_f32(0)
    max_bias = node.get_op_params_f32(1)
    softcap = node.get_op_params_f32(2)
    nq3, nh, nq, dk = shape4(q)
    nk3, nhk, nkv, _ = shape4(k)
    nv3, nhv, _, dv = shape4(v)
    if nh % nhk or nh % nhv or nq3 % nk3 or nq3 % nv3:
        raise KernelInputError("FLASH_ATTN_EXT: K/V heads must divide Q heads")
    qf = q.view4()
    path = fa_path(nq, nq3, nkv)
    tiled = path == "tiled" and k.type == v.type and k.type in (F16, F32)
    if not tiled and k.type != F32:
        qf = fake_quant(np.ascontiguousarray(qf).reshape(-1, dk), _vec_dot_type(k.type)).reshape(qf.shape)
    kf = load_f32(k)
    vf = load_f32(v)
    if nk3 != nq3:
        kf = np.repeat(kf, nq3 // nk3, axis=0)
    if nv3 != nq3:
        vf = np.repeat(vf, nq3 // nv3, axis=0)
    rk, rv = nh // nhk, nh // nhv
    s = np.matmul(qf.reshape(nq3, nhk, rk, nq, dk), np.swapaxes(kf, -1, -2)[:, :, None]).reshape(nq3, nh, nq, nkv)
    if softcap != 0:
        s = np.float32(softcap) * np.tanh(s * np.float32(scale / softcap))
    else:
        s = s * np.float32(scale)
    if mask is not None:
        m = load_f32(mask)[:, :, :nq, :nkv]
        slope = alibi_slopes(nh, max_bias)[None, :, None, None]
        s = s + slope * tile_to(m, (nq3, nh, nq, nkv))
    sink_h = None if sinks is None else sinks.view4().reshape(-1)[:nh].astype(np.float32)  # one logit a head
    if not tiled and v.type == F16:
        # V accumulates in fp16 on ggml's one-chunk and split paths: a rounding of 1e-3, not round-off, so it is
        # taken step by step (a first run's decode runs here until the compiled kernel has landed)
        vrep = np.repeat(vf, rv, axis=1)  # (nq3, nh, nkv, dv): query head h reads KV head h // rv
        out_f16 = _fa_online_f16(s, vrep, sink_h, path == "split", n_threads)
        node.view4()[...] = out_f16.transpose(0, 2, 1, 3)
        return
    mx = s.max(axis=-1, keepdims=True)
    if sink_h is not None:
        sink = sink_h[None, :, None, None]
        mx = np.maximum(mx, sink)
    mx = np.where(np.isfinite(mx), mx, np.float32(0.0))
    with np.errstate(invalid="ignore", over="ignore"):
        pr = np.exp(s - mx)
    total = pr.sum(axis=-1, keepdims=True, dtype=np.float64)
    if sinks is not None:
        total = total + np.exp(sink - mx).astype(np.float64)
    out = np.matmul(pr.reshape(nq3, nhv, rv, nq, nkv), vf[:, :, None]).reshape(nq3, nh, nq, dv)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(total == 0, 0.0, 1.0 / total).astype(np.float32)
    node.view4()[...] = (out * inv).transpose(0, 2, 1, 3)


#: ggml's query rows per tile (GGML_FA_TILE_Q: batches of this many rows or more take the tiled path), and the
#: cells from which a one-token decode splits its cells between the threads
FA_TILE_Q, FA_SPLIT_MIN_KV = 64, 512


def fa_path(n_q: int, ne3: int, n_kv: int) -> str:
    """ggml's path for a FLASH_ATTN_EXT of ``n_q`` query rows (ne3 sequences of them) over ``n_kv`` cells
    (ggml_compute_forward_flash_attn_ext_f16): "split", "tiled" or "chunk"; each rounds differently."""
    if n_q == 1 and ne3 == 1 and n_kv >= FA_SPLIT_MIN_KV:
        return "split"
    return "tiled" if n_q >= FA_TILE_Q else "chunk"


def _fa_chunk_f16(s: np.ndarray, vrep: np.ndarray, ic0: int, ic1: int) -> tuple[np.ndarray, ...]:
    """ggml's one-chunk online softmax over cells [ic0, ic1) for every query row at once: scores ``s`` (nq3, nh,
    nq, nkv) with the mask added (-inf: the cell is skipped), V rows ``vrep`` (nq3, nh, nkv, dv) of F16 values. The
    fp16 accumulator is rounded after its rescale and after each cell's add, as ggml_vec_scale_f16 and
    ggml_vec_mad_f16 round it. Returns the rows' (max, sum, accumulator)."""
    big = np.full(s.shape[:-1], -np.inf, np.float32)
    total = np.zeros(s.shape[:-1], np.float32)
    acc = np.zeros((*s.shape[:-1], vrep.shape[-1]), np.float32)
    live_cells = np.flatnonzero((s[..., ic0:ic1] != -np.inf).reshape(-1, ic1 - ic0).any(axis=0)) + ic0
    with np.errstate(invalid="ignore", over="ignore"):
        for ic in live_cells:
            sc = s[..., ic]
            live = sc != -np.inf
            up = live & (sc > big)
            ms = np.where(up, np.exp(big - sc), np.float32(1.0)).astype(np.float32)
            vs = np.where(live & ~up, np.exp(sc - big), np.float32(1.0)).astype(np.float32)
            step = round_to_f16(round_to_f16(acc * ms[..., None]) + vrep[:, :, ic, None, :] * vs[..., None])
            acc = np.where(live[..., None], step, acc)
            total = np.where(live, total * ms + vs, total)
            big = np.where(up, sc, big)
    return big, total, acc


def _fa_sink(big: np.ndarray, total: np.ndarray, acc: np.ndarray, sink: np.ndarray) -> None:
    """The attention sink's logit joined to each row's softmax at the end (in place; ggml: first chunk only)."""
    sk = np.broadcast_to(sink[None, :, None], big.shape)
    up = sk > big
    with np.errstate(invalid="ignore", over="ignore"):
        ms = np.where(up, np.exp(big - sk), np.float32(1.0)).astype(np.float32)
        vs = np.where(up, np.float32(1.0), np.exp(sk - big)).astype(np.float32)
    acc *= ms[..., None]
    total[...] = total * ms + vs
    big[...] = np.maximum(big, sk)


def _fa_online_f16(s: np.ndarray, vrep: np.ndarray, sink: np.ndarray | None, split: bool,
                   n_threads: int) -> np.ndarray:
    """FLASH_ATTN_EXT's result (nq3, nh, nq, dv) with ggml's steps for an F16 V outside the tiled path: one chunk
    per row, or for a split decode one chunk per thread (the compiled kernel's thread count) merged in order."""
    from ..threads import available_cores

    nkv = s.shape[-1]
    nth = max(1, min(n_threads, available_cores())) if split else 1
    cs = (nkv + nth - 1) // nth
    big = np.full(s.shape[:-1], -np.inf, np.float32)
    total = np.zeros(s.shape[:-1], np.float32)
    acc = np.zeros((*s.shape[:-1], vrep.shape[-1]), np.float32)
    for c in range(nth):
        ic0, ic1 = c * cs, min(nkv, (c + 1) * cs)
        if ic0 >= nkv:
            break
        pb, pt, pa = _fa_chunk_f16(s, vrep, ic0, ic1)
        if sink is not None and c == 0:
            _fa_sink(pb, pt, pa, sink)
        if nth == 1:
            big, total, acc = pb, pt, pa
            break
        with np.errstate(invalid="ignore", over="ignore"):
            keep = pt != 0
            mnew = np.maximum(big, pb)
            s_old = np.where(keep, np.exp(big - mnew), np.float32(1.0)).astype(np.float32)
            s_new = np.where(keep, np.exp(pb - mnew), np.float32(0.0)).astype(np.float32)
        acc = np.where(keep[..., None], acc * s_old[..., None] + pa * s_new[..., None], acc)
        total = np.where(keep, total * s_old + pt * s_new, total)
        big = np.where(keep, mnew, big)
    with np.errstate(divide="ignore"):
        inv = np.where(total == 0, np.float32(0.0), np.float32(1.0) / total).astype(np.float32)
    return acc * inv[..., None]


def _vec_dot_type(ty: GGMLType) -> GGMLType:
    if ty in FLOAT_TYPES:
        return ty

    return quants.get_codec(ty).vec_dot_type


@kernel(Op.LIGHTNING_INDEXER)
def lightning_indexer(node: Tensor, n_threads: int) -> None:
    """DeepSeek DSA indexer: dst[ik, t, s] = sum_h relu(q[:, h, t, s] . k[:, ik, s]) * w[h, t, s] + mask[ik, t].

    q F32 [n_embd, n_head, T, S], k [n_embd, 1, n_kv, S] (any type with to_float), w F32 [n_head, T, 1, S],
    mask F16 [n_kv, T, 1, S or 1]; dst F32 [n_kv, T, 1, S].
    """
    q, k, w, m = (node.src[i] for i in range(4))
    require_f32(node, q, w)
    require_types(node, m, (F16,))
    require_f32(node, node)
    qv = q.view4()  # (S, T, H, E)
    kv = load_f32(k)[:, :, 0, :]  # (S, n_kv, E)
    wv = w.view4()[:, 0]  # (S, T, H)
    mv = load_f32(m)[:, 0]  # (S or 1, T, n_kv)
    n_stream, n_tok = qv.shape[0], qv.shape[1]
    qk = np.matmul(qv, np.swapaxes(kv, -1, -2)[:, None])  # (S, T, H, n_kv)
    score = (np.maximum(qk, np.float32(0.0)) * wv[..., None]).sum(axis=2, dtype=np.float32)
    mask = mv[np.arange(n_stream) % mv.shape[0]][:, :n_tok]
    node.view4()[:, 0] = score + mask


@kernel(Op.RMS_NORM_BACK)
def rms_norm_back(node: Tensor, n_threads: int) -> None:
    """Gradient of RMS_NORM: dx = (dz + x * (-sum(x dz) / (sum(x^2) + eps n))) / sqrt(mean(x^2) + eps).

    src0 = dz, src1 = x, op_params f32[0] = eps; sums in double as ggml.
    """
    dz, x = node.src[0], node.src[1]
    require_f32(node, dz, x)
    eps = np.float32(node.get_op_params_f32(0))
    xv, dzv = x.view4(), dz.view4()
    n = xv.shape[-1]
    sum_xx = np.square(xv).sum(axis=-1, keepdims=True, dtype=np.float64)
    sum_xdz = (xv * dzv).sum(axis=-1, keepdims=True, dtype=np.float64)
    mean_eps = (sum_xx.astype(np.float32) / np.float32(n)) + eps
    sum_eps = sum_xx.astype(np.float32) + eps * np.float32(n)
    rrms = np.float32(1.0) / np.sqrt(mean_eps)
    scale_x = (-sum_xdz).astype(np.float32) / sum_eps
    node.view4()[...] = (dzv + xv * scale_x) * rrms


@kernel(Op.SOFT_MAX_BACK)
def soft_max_back(node: Tensor, n_threads: int) -> None:
    """dx = scale * y * (dy - dot(y, dy)) per row; src0 = dy, src1 = y (the softmax output); max_bias must be 0."""
    dy, y = node.src[0], node.src[1]
    require_f32(node, dy, y)
    scale = np.float32(node.get_op_params_f32(0))
    if node.get_op_params_f32(1) != 0:
        raise KernelInputError("SOFT_MAX_BACK: max_bias must be 0 (as in ggml)")
    yv, dyv = y.view4(), dy.view4()
    dot = (yv * dyv).sum(axis=-1, keepdims=True, dtype=np.float32)
    node.view4()[...] = (dyv - dot) * yv * scale


@kernel(Op.GET_REL_POS)
def get_rel_pos(node: Tensor, n_threads: int) -> None:
    """SAM relative positions: dst[:, i1, i2] = src[:, (kh - i1 - 1) + i2] (F16/BF16 bits copied)."""
    a = node.src[0]
    require_types(node, a, (F16, GGMLType.BF16))
    kh, qh = node.ne[1], node.ne[2]
    idx = (kh - np.arange(kh)[None, :] - 1) + np.arange(qh)[:, None]  # (qh, kh)
    node.view4()[0] = a.view4()[0, 0][idx]


@kernel(Op.ADD_REL_POS)
def add_rel_pos(node: Tensor, n_threads: int) -> None:
    """SAM decomposed relative positions: dst = a, then per block of ne10 rows, dst[b, i, j] += ph[b, i] + pw[b, j]."""
    a, pw, ph = node.src[0], node.src[1], node.src[2]
    for t in (a, pw, ph):
        require_f32(node, t)
    n = pw.ne[0]
    d = load_f32(a).reshape(-1, n, n) + ph.view4().reshape(-1, n)[:, :, None] + pw.view4().reshape(-1, n)[:, None, :]
    node.view4()[...] = d.reshape(shape4(node))


_HC = 4  # DeepSeek-V4 hyper-connection count (fixed in ggml)


@kernel(Op.DSV4_HC_PRE)
def dsv4_hc_pre(node: Tensor, n_threads: int) -> None:
    """dst[:, t] = scale * sum_h x[:, h, t] * w; x [n_embd, hc, T]; op_params {f32 scale, i32 gated}.

    Plain: w = weights[h, t] ([hc, T]). Gated: w = sigmoid(gate[:, h, t]) ([n_embd, hc, T]).
    """
    x, w = node.src[0], node.src[1]
    for t in (x, w, node):
        require_f32(node, t)
    scale = np.float32(node.get_op_params_f32(0))
    gated = node.get_op_params_i32(1) != 0
    xv = x.view4()[0]  # (T, hc, n_embd)
    if gated:
        g = w.view4()[0]  # (T, hc, n_embd)
        wv = np.float32(1.0) / (np.float32(1.0) + np.exp(-g))
    else:
        wv = w.view4()[0, 0][:, :, None]  # (T, hc, 1)
    acc = np.zeros((xv.shape[0], xv.shape[2]), dtype=np.float32)
    for h in range(xv.shape[1]):  # sequential float sum over the streams, as ggml
        acc += xv[:, h, :] * wv[:, h, :]
    node.view4()[0, 0] = scale * acc


@kernel(Op.DSV4_HC_POST)
def dsv4_hc_post(node: Tensor, n_threads: int) -> None:
    """dst[:, d, t] = x[:, t] post[d, t] + sum_s residual[:, s, t] comb[d, s, t].

    Without comb (src3 NULL) the mixing is the identity: each stream adds its own residual.
    """
    x, res, post, comb = (node.src[i] for i in range(4))
    for t in (x, res, post, comb, node):
        require_f32(node, t)
    xv = x.view4()[0, 0]  # (T, n_embd)
    rv = res.view4()[0]  # (T, hc, n_embd)
    pv = post.view4()[0, 0]  # (T, hc)
    out = xv[:, None, :] * pv[:, :, None]  # (T, d, n_embd)
    if comb is None:
        out = out + rv
    else:
        cv = comb.view4()[0]  # (T, s, d)
        for s in range(rv.shape[1]):
            out = out + rv[:, s, None, :] * cv[:, s, :, None]
    node.view4()[0] = out


@kernel(Op.DSV4_HC_COMB)
def dsv4_hc_comb(node: Tensor, n_threads: int) -> None:
    """The 4x4 mixing matrix per token: softmax over destinations of mixes*scale[2] + base, plus eps, then
    Sinkhorn-style column/row normalisation (n_iter = op_params i32[1], eps = f32[0])."""
    mixes, scale, base = node.src[0], node.src[1], node.src[2]
    for t in (mixes, scale, base, node):
        require_f32(node, t)
    eps = np.float32(node.get_op_params_f32(0))
    n_iter = node.get_op_params_i32(1)
    if n_iter < 1:
        raise KernelInputError(f"DSV4_HC_COMB: n_iter must be positive, got {n_iter}")
    off = 2 * _HC
    mv = mixes.view4()[0, 0][:, off : off + _HC * _HC].reshape(-1, _HC, _HC)  # (T, src, dst)
    bv = base.view4().reshape(-1)[off : off + _HC * _HC].reshape(_HC, _HC)
    v = mv * np.float32(scale.view4().reshape(-1)[2]) + bv
    e = np.exp(v - v.max(axis=-1, keepdims=True))
    comb = e * (np.float32(1.0) / e.sum(axis=-1, keepdims=True, dtype=np.float32)) + eps

    def norm_cols(cm: np.ndarray) -> np.ndarray:  # each destination column, summed over sources
        return cm * (np.float32(1.0) / (eps + cm.sum(axis=1, keepdims=True, dtype=np.float32)))

    def norm_rows(cm: np.ndarray) -> np.ndarray:
        return cm * (np.float32(1.0) / (eps + cm.sum(axis=2, keepdims=True, dtype=np.float32)))

    comb = norm_cols(comb)
    for _ in range(1, n_iter):
        comb = norm_cols(norm_rows(comb))
    node.view4()[0] = comb

