"""Compiled MUL_MAT_ID (the mixture-of-experts product) for quantized expert weights.

As ggml's ggml_compute_forward_mul_mat_id: src1's rows are quantized once to the weights' vec_dot_type
(the same activation quantizer, so the same bits, as MUL_MAT), the threads meet, then they take chunks
of (expert, weight rows) from a shared counter; a chunk's rows are dotted with every activation row
routed to that expert, so each expert weight chunk is read once per step and the experts nobody chose
are never read. The row kernels are the mat-vec kernels of matmul.py.

    src0 = as [k, m, n_expert]   src1 = b [k, n_used or 1, n_tokens]   src2 = ids I32 [n_used, n_tokens]
    dst[:, s, t] = as[:, :, ids[s, t]] . b[:, s % b.ne1, t]
"""

from __future__ import annotations

import numba

from ....ops.enums import Op
from ....tensor import Tensor
from ....types import GGMLType
from ..jit import Choice, jit_kernel, selector
from ..jit.mathf import LANES
from ..jit.record import AUX, CHUNK_ROWS, T_DST, T_SRC0, T_SRC1, T_SRC2, chunk_bounds, rec
from ..native import atomic_add, f32p, i8p, i32p, u8p
from ..quants import gemm
from ..quants.dots import _mv1_q4_0, _mv1_q4_k, _mv1_q5_0, _mv1_q5_k, _mv1_q6_k, _mv1_q8_0, _mv_iq4_nl
from ..quants.quantize import _quantize_q8_0, _quantize_q8_k
from ..simd import TAB_ADDR
from ..threads import C_CHUNK
from .mat_jit import _MV_CHUNK_BYTES

F32, I32 = GGMLType.F32, GGMLType.I32
_opts = {"inline": "always", "cache": True, "error_model": "numpy"}


@numba.njit(**_opts)
def _mul_mat_id(node, ith, nth, ctrl, quantize, bs, es, mv):  # pragma: no cover - compiled
    r = rec(node)
    tab = numba.carray(f32p(r[AUX]), 65536)
    _, _, _, qa, da, ex, _ = gemm.quantize_src1(node, ith, nth, ctrl, quantize, bs, es)
    w, m, n_expert, rs, nb02 = r[T_SRC0], r[T_SRC0 + 2], r[T_SRC0 + 3], r[T_SRC0 + 6], r[T_SRC0 + 7]
    ne11 = r[T_SRC1 + 2]
    ids_at, n_used, n_tok, ids_nb1 = r[T_SRC2], r[T_SRC2 + 1], r[T_SRC2 + 2], r[T_SRC2 + 6]
    dst, d_nb1, d_nb2 = r[T_DST], r[T_DST + 6], r[T_DST + 7]
    rows = max(CHUNK_ROWS, _MV_CHUNK_BYTES // rs)
    per_expert = (m + rows - 1) // rows
    n_chunks = n_expert * per_expert
    c = ith
    while c < n_chunks:
        e, ci = c // per_expert, c % per_expert
        r0, r1 = chunk_bounds(m, ci, per_expert, LANES)
        we = w + e * nb02
        wu, wi = numba.carray(u8p(we), m * rs), numba.carray(i8p(we), m * rs)
        for t in range(n_tok):
            ids = numba.carray(i32p(ids_at + t * ids_nb1), n_used)
            for s in range(n_used):
                if ids[s] == e:
                    j = s % ne11 + t * ne11
                    out = numba.carray(f32p(dst + s * d_nb1 + t * d_nb2), (1, m))
                    mv(wu, wi, rs, m, qa[j : j + 1], da[j : j + 1], ex[j : j + 1], tab, out, r0, r1)
        c = atomic_add(ctrl + 8 * C_CHUNK, 1)


@jit_kernel
def k_mmid_q8_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mul_mat_id(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv1_q8_0)


@jit_kernel
def k_mmid_q4_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mul_mat_id(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv1_q4_0)


@jit_kernel
def k_mmid_q5_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mul_mat_id(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv1_q5_0)


@jit_kernel
def k_mmid_iq4_nl(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mul_mat_id(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv_iq4_nl)


@jit_kernel
def k_mmid_q4_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mul_mat_id(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_q4_k)


@jit_kernel
def k_mmid_q5_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mul_mat_id(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_q5_k)


@jit_kernel
def k_mmid_q6_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mul_mat_id(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_q6_k)


#: expert weight type -> (kernel, values per block of its vec_dot_type, values per block sum)
_KERNELS = {
    GGMLType.Q8_0: (k_mmid_q8_0, 32, 32), GGMLType.Q4_0: (k_mmid_q4_0, 32, 32), GGMLType.Q5_0: (k_mmid_q5_0, 32, 32),
    GGMLType.IQ4_NL: (k_mmid_iq4_nl, 32, 32), GGMLType.Q4_K: (k_mmid_q4_k, 256, 16),
    GGMLType.Q5_K: (k_mmid_q5_k, 256, 16), GGMLType.Q6_K: (k_mmid_q6_k, 256, 16),
}


@selector(Op.MUL_MAT_ID)
def _sel_mul_mat_id(node: Tensor) -> Choice | None:
    a, b, ids = node.src[0], node.src[1], node.src[2]
    kern, bs, es = _KERNELS.get(a.type, (None, 0, 0))
    if (kern is None or b.type != F32 or b.nb[0] != 4 or ids.type != I32 or ids.nb[0] != 4 or node.type != F32
            or node.nb[0] != 4 or a.nb[0] != a.type.type_size or a.ne[0] != b.ne[0] or a.ne[3] != 1
            or b.ne[3] != 1 or a.ne[0] % bs):
        return None  # other types and layouts go to the numpy kernel
    n = b.ne[1] * b.ne[2]
    return Choice(kern, ints=(TAB_ADDR,), wsize=gemm.act_bytes(n, a.ne[0], bs, es))
