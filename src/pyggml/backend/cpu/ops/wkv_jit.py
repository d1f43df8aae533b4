"""Compiled RWKV_WKV6, GATED_LINEAR_ATTN and RWKV_WKV7 (F32), in ggml-cpu's float order on x86 with AVX2/FMA.

The numpy kernels (recurrent.py) vectorize over heads and sum with numpy's pairwise sums; these follow
ggml_compute_forward_rwkv_wkv6_f32 / _gla_f32 / _rwkv_wkv7_f32 (ops.cpp) operation by operation, so their
outputs are llama.cpp's bits:

- WKV6 and GLA walk the key channel i of a head and update all value channels j at once: per element
  ``kv = v_j * k_i``, the state and the running output each one fused multiply-add (the order of i is the
  order of the output's sum). The vector width does not matter: every j is its own chain.
- WKV7 walks the value channel i (the state's row) and takes two dot products over the key channel j, the
  state row against ``a`` (before the update) and the updated row against ``r``, each as ggml_vec_dot_f32
  (four 8-lane fma accumulators over steps of 32, GGML_F32x8_REDUCE). ggml reads whole steps of 32, so the
  compiled kernel takes heads whose size is a multiple of 32 (every RWKV-7 model's 64); other sizes run the
  numpy kernel.

Threads take contiguous ranges of heads (ggml's h_start/h_end) for every token, so no barrier is needed and
the bits do not depend on the thread count. Sources past the record's three slots (the remaining operands
and the initial state) reach the kernel as data addresses in the AUX words, with the sequence count.
"""

from __future__ import annotations

import numba

from ....ops.enums import Op
from ....tensor import Tensor
from ..jit import Choice, jit_kernel, selector
from ..jit.record import AUX, T_DST, T_SRC0, T_SRC1, T_SRC2, aux_f32, rec
from ..native import f32p, fmaf
from .elementwise_jit import all_f32
from .mat_f_jit import vec_dot_f32

_opts = {"inline": "always", "cache": True, "error_model": "numpy"}
#: ggml's GGML_F32_STEP on AVX2: WKV7's dot products read the state rows in whole steps of this many floats
WKV7_STEP = 32


@numba.njit(**_opts)
def _heads(n_heads, ith, nth):  # pragma: no cover - compiled
    """Thread ith's heads [h0, h1): ggml's (HEADS * ith) / nth split."""
    return n_heads * ith // nth, min(n_heads * (ith + 1) // nth, n_heads)


@numba.njit(**_opts)
def _linear_attn(node, ith, nth, gla):  # pragma: no cover - compiled
    """WKV6 (gla False) and GLA (gla True): S_ij <- S_ij * decay_i + k_i v_j, out_j = sum_i q_i (...).

    WKV6: temp = fma(kv, u_i, S_ij), out_j = fma(temp, r_i, out_j), S_ij = fma(S_ij, w_i, kv).
    GLA:  temp = fma(S_ij, g_i, kv), out_j = fma(temp, q_i * scale, out_j), S_ij = temp.
    """
    r = rec(node)
    c, n_heads, n_t = r[T_DST + 1], r[T_SRC1 + 2], r[T_SRC1 + 3]
    size = c // n_heads
    if gla:
        s_addr, n_seqs, f_addr, dec_addr = r[AUX + 1], r[AUX + 2], 0, r[AUX]
        scale = aux_f32(node)[16]  # Choice.floats[0] (record word AUX + 8)
    else:
        f_addr, dec_addr, s_addr, n_seqs = r[AUX], r[AUX + 1], r[AUX + 2], r[AUX + 3]
        scale = numba.float32(1.0)
    n_state = size * c * n_seqs
    dst = numba.carray(f32p(r[T_DST]), c * n_t + n_state)
    k = numba.carray(f32p(r[T_SRC0]), c * n_t)
    v = numba.carray(f32p(r[T_SRC1]), c * n_t)
    q = numba.carray(f32p(r[T_SRC2]), c * n_t)  # r for WKV6, q for GLA
    dec = numba.carray(f32p(dec_addr), c * n_t)  # w (time decay) for WKV6, g for GLA
    first = numba.carray(f32p(f_addr if f_addr != 0 else dec_addr), c)  # u (time_first), WKV6 only
    init = numba.carray(f32p(s_addr), n_state)
    per_seq = n_t // n_seqs
    h0, h1 = _heads(n_heads, ith, nth)
    for h in range(h0, h1):  # a head's tokens one after the other: its state stays in cache (as in WKV7)
        for t in range(n_t):
            s_off = size * c * (t // per_seq)
            fresh = t % per_seq == 0
            th = t * c + h * size
            out = dst[th:th + size]
            vv = v[th:th + size]
            out[:] = 0
            for i in range(size):
                kk = k[th + i]
                qq = q[th + i] * scale if gla else q[th + i]
                dd = dec[th + i]
                uu = numba.float32(0.0) if gla else first[h * size + i]
                row = s_off + h * size * size + i * size
                cur = dst[c * n_t + row:c * n_t + row + size]
                # the state row from the initial state, or in place (then one array: the loop vectorizes)
                if fresh:
                    _linear_attn_row(init[row:row + size], cur, out, vv, kk, qq, dd, uu, gla)
                else:
                    _linear_attn_row_inplace(cur, out, vv, kk, qq, dd, uu, gla)


@numba.njit(**_opts)
def _linear_attn_row(prev, cur, out, vv, kk, qq, dd, uu, gla):  # pragma: no cover - compiled
    """One state row of WKV6 / GLA from ``prev`` into ``cur``, adding its share to the output row ``out``."""
    for j in range(cur.size):
        p = prev[j]
        kv = vv[j] * kk
        if gla:
            temp = fmaf(p, dd, kv)
            out[j] = fmaf(temp, qq, out[j])
            cur[j] = temp
        else:
            out[j] = fmaf(fmaf(kv, uu, p), qq, out[j])
            cur[j] = fmaf(p, dd, kv)


@numba.njit(**_opts)
def _linear_attn_row_inplace(cur, out, vv, kk, qq, dd, uu, gla):  # pragma: no cover - compiled
    """:func:`_linear_attn_row` with the row updated in place."""
    for j in range(cur.size):
        p = cur[j]
        kv = vv[j] * kk
        if gla:
            temp = fmaf(p, dd, kv)
            out[j] = fmaf(temp, qq, out[j])
            cur[j] = temp
        else:
            out[j] = fmaf(fmaf(kv, uu, p), qq, out[j])
            cur[j] = fmaf(p, dd, kv)


@jit_kernel
def k_rwkv_wkv6(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _linear_attn(node, ith, nth, False)


@jit_kernel
def k_gated_linear_attn(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _linear_attn(node, ith, nth, True)


@jit_kernel
def k_rwkv_wkv7(node, ith, nth, ctrl):  # pragma: no cover - compiled
    """RWKV-7: sa = S_i . a; S_ij <- fma(sa, b_j, fma(S_ij, w_j, v_i k_j)); out_i = S_i . r (ggml_vec_dot_f32)."""
    r = rec(node)
    c, n_heads, n_t = r[T_DST + 1], r[T_SRC1 + 2], r[T_SRC1 + 3]
    size = c // n_heads
    r_addr, w_addr, k_addr = r[T_SRC0], r[T_SRC1], r[T_SRC2]
    v_addr, a_addr, b_addr, s_addr, n_seqs = r[AUX], r[AUX + 1], r[AUX + 2], r[AUX + 3], r[AUX + 4]
    n_state = size * c * n_seqs
    dst_addr = r[T_DST]
    dst = numba.carray(f32p(dst_addr), c * n_t + n_state)
    w = numba.carray(f32p(w_addr), c * n_t)
    k = numba.carray(f32p(k_addr), c * n_t)
    v = numba.carray(f32p(v_addr), c * n_t)
    b = numba.carray(f32p(b_addr), c * n_t)
    init = numba.carray(f32p(s_addr), n_state)
    per_seq = n_t // n_seqs
    h0, h1 = _heads(n_heads, ith, nth)
    # a head's tokens one after the other: its state (size * size floats) stays in L1 over a prompt, where
    # ggml's token-outer loop goes through every head's state per token (same operations, same order)
    for h in range(h0, h1):
        for t in range(n_t):
            s_off = size * c * (t // per_seq)
            fresh = t % per_seq == 0
            th = t * c + h * size
            ww, kk, bb = w[th:th + size], k[th:th + size], b[th:th + size]
            for i in range(size):
                row = s_off + h * size * size + i * size
                out_row = c * n_t + row
                cur = dst[out_row:out_row + size]
                sa = vec_dot_f32(a_addr + 4 * th, (s_addr + 4 * row) if fresh else (dst_addr + 4 * out_row), size)
                vi = v[th + i]
                if fresh:
                    prev = init[row:row + size]
                    for j in range(size):
                        cur[j] = fmaf(sa, bb[j], fmaf(prev[j], ww[j], vi * kk[j]))
                else:  # in place: one array read and written at the same index vectorizes
                    for j in range(size):
                        cur[j] = fmaf(sa, bb[j], fmaf(cur[j], ww[j], vi * kk[j]))
                dst[th + i] = vec_dot_f32(dst_addr + 4 * out_row, r_addr + 4 * th, size)


def _fits(node: Tensor, srcs: tuple[Tensor, ...], state: Tensor) -> bool:
    """F32 contiguous operands whose shapes the numpy kernel would accept (it names any problem)."""
    if not all_f32(node, state, *srcs) or not all(t.is_contiguous() for t in (node, state, *srcs)):
        return False
    v = node.src[1]
    n_heads, n_t, c = v.ne[1], v.ne[2], node.ne[0]
    n_seqs = state.ne[1]
    if n_heads <= 0 or c % n_heads or n_seqs <= 0 or n_t % n_seqs:
        return False
    size = c // n_heads
    return state.nelements() == size * c * n_seqs and node.nelements() == c * n_t + size * c * n_seqs


@selector(Op.RWKV_WKV6)
def _sel_rwkv_wkv6(node: Tensor) -> Choice | None:
    k, v, r, tf, td, state = (node.src[i] for i in range(6))
    if not _fits(node, (k, v, r, tf, td), state) or tf.nelements() != node.ne[0]:
        return None
    return Choice(k_rwkv_wkv6, ints=(tf.data, td.data, state.data, state.ne[1]))


@selector(Op.GATED_LINEAR_ATTN)
def _sel_gated_linear_attn(node: Tensor) -> Choice | None:
    k, v, q, g, state = (node.src[i] for i in range(5))
    if not _fits(node, (k, v, q, g), state):
        return None
    return Choice(k_gated_linear_attn, ints=(g.data, state.data, state.ne[1]),
                  floats=(node.get_op_params_f32(0),))


@selector(Op.RWKV_WKV7)
def _sel_rwkv_wkv7(node: Tensor) -> Choice | None:
    r, w, k, v, a, b, state = (node.src[i] for i in range(7))
    if not _fits(node, (r, w, k, v, a, b), state) or (node.ne[0] // v.ne[1]) % WKV7_STEP:
        return None
    return Choice(k_rwkv_wkv7, ints=(v.data, a.data, b.data, state.data, state.ne[1]))
