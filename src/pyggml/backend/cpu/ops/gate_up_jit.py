"""A feed-forward block's gate and up products from one quantized activation, and its GLU made chunk by chunk.

``MUL_MAT(gate, x)``, ``MUL_MAT(up, x)`` and ``GLU(gate_out, up_out)`` are consecutive nodes of every
llama-style FFN. Fused (fusion.py), the activation is quantized once instead of twice, the threads take
chunks of both products from one counter, and each chunk's GLU is computed as soon as its gate and up rows
are (still in L1), split between the threads even for one token, where the GLU node alone runs on one.
Every output keeps its bits: the products are the kernels' own (chunk bounds do not change a row's sums),
and chunks start at multiples of mathf.LANES, so the activation takes the row's own vector/tail split.

The fused kernel's record is the GLU's; its parts are the two products' own records (AUX words 0 and 1), then
the GLU kind, the GELU table and whether up is the GLU's x.
"""

from __future__ import annotations

import numba

from ....ops.enums import GluOp, Op
from ....tensor import Tensor
from ....types import GGMLType
from ..jit import Choice, jit_kernel, ready_or_wanted
from ..jit.record import AUX, T_DST, T_SRC0, rec
from ..native import atomic_add, f32p
from ..quants.dots import (
    _mv1_q4_0,
    _mv1_q4_k,
    _mv1_q5_0,
    _mv1_q5_k,
    _mv1_q6_k,
    _mv1_q8_0,
    _mv_q4_0,
    _mv_q4_k,
    _mv_q5_0,
    _mv_q5_k,
    _mv_q6_k,
    _mv_q8_0,
)
from ..quants.gemm import quantize_src1
from ..quants.matvec import _mv_chunks, mv_run
from ..quants.quantize import _quantize_q8_0, _quantize_q8_0_lanes, _quantize_q8_k
from ..quants.repacked import (
    _iq4_nl_chunks,
    _iq4_nl_run,
    _q4_0_chunks,
    _q4_0_run,
    _q4k_chunks,
    _q4k_run,
    _q5_0_chunks,
    _q5_0_run,
    _q6k_chunks,
    _q6k_run,
    _q8_0_chunks,
    _q8_0_run,
)
from ..threads import C_CHUNK
from ..traits import traits
from .elementwise_jit import _TABLE_ADDR, _gelu_row, _relu_row, _silu_row, gated_row

Q8_0, Q4_0, Q5_0, IQ4_NL = GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.IQ4_NL
Q4_K, Q5_K, Q6_K = GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K

_opts = {"inline": "always", "cache": True, "error_model": "numpy"}
_GEGLU, _SWIGLU, _REGLU = int(GluOp.GEGLU), int(GluOp.SWIGLU), int(GluOp.REGLU)


@numba.njit(**_opts)
def _glu_span(d, x_at, g_at, m, n, r0, r1, kind, table):  # pragma: no cover - compiled
    """dst[j, r0:r1] = act(x[j, r0:r1]) * g[j, r0:r1] for the n rows (elementwise.gated_row, as the GLU node)."""
    for j in range(n):
        o = 4 * (j * m + r0)
        dv = numba.carray(f32p(d + o), r1 - r0)
        if kind == _GEGLU:
            gated_row(_gelu_row, x_at + o, g_at + o, dv, table)
        elif kind == _SWIGLU:
            gated_row(_silu_row, x_at + o, g_at + o, dv, table)
        else:
            gated_row(_relu_row, x_at + o, g_at + o, dv, table)


@numba.njit(**_opts)
def _gate_up(node, ith, nth, ctrl, quantize, bs, es, chunks, run, arg):  # pragma: no cover - compiled
    """gemm.walk over two weights sharing src1, with the GLU of each chunk (see the module docstring)."""
    r = rec(node)
    ga, ua = r[AUX], r[AUX + 1]
    q = quantize_src1(ga, ith, nth, ctrl, quantize, bs, es)
    n = q[6]
    n_chunks = chunks(ga, n, nth)
    rg, ru = rec(ga), rec(ua)
    m = rg[T_SRC0 + 2]
    x_at, g_at = (ru[T_DST], rg[T_DST]) if r[AUX + 4] != 0 else (rg[T_DST], ru[T_DST])
    table = numba.carray(f32p(r[AUX + 3]), 65536)
    c = ith
    while c < n_chunks:
        r0, r1 = run(ga, c, n_chunks, q, ith, arg)
        run(ua, c, n_chunks, q, ith, arg)
        _glu_span(r[T_DST], x_at, g_at, m, n, r0, r1, r[AUX + 2], table)
        c = atomic_add(ctrl + 8 * C_CHUNK, 1)


# one fused kernel per product kernel it can take the place of (decode's one-row mat-vecs, and the repacked
# kernels at every size): the row kernel and the weight layout are compile-time choices
@jit_kernel
def k_gu_q8_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _gate_up(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv_chunks, mv_run, _mv1_q8_0)


@jit_kernel
def k_gu_q4_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _gate_up(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv_chunks, mv_run, _mv1_q4_0)


@jit_kernel
def k_gu_q5_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _gate_up(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv_chunks, mv_run, _mv1_q5_0)


@jit_kernel
def k_gu_q4_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _gate_up(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv_chunks, mv_run, _mv1_q4_k)


@jit_kernel
def k_gu_q5_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _gate_up(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv_chunks, mv_run, _mv1_q5_k)


@jit_kernel
def k_gu_q6_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _gate_up(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv_chunks, mv_run, _mv1_q6_k)


# a batch of decodes (2..GATE_UP_MAX_COLS src1 rows): the row kernels that decode a weight row once for all rows
@jit_kernel
def k_gu_mm_q8_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _gate_up(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv_chunks, mv_run, _mv_q8_0)


@jit_kernel
def k_gu_mm_q4_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _gate_up(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv_chunks, mv_run, _mv_q4_0)


@jit_kernel
def k_gu_mm_q5_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _gate_up(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv_chunks, mv_run, _mv_q5_0)


@jit_kernel
def k_gu_mm_q4_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _gate_up(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv_chunks, mv_run, _mv_q4_k)


@jit_kernel
def k_gu_mm_q5_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _gate_up(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv_chunks, mv_run, _mv_q5_k)


@jit_kernel
def k_gu_mm_q6_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _gate_up(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv_chunks, mv_run, _mv_q6_k)


@jit_kernel
def k_gu_rep_q4_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _gate_up(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _q4k_chunks, _q4k_run, 0)


@jit_kernel
def k_gu_rep_q6_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _gate_up(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _q6k_chunks, _q6k_run, 0)


@jit_kernel
def k_gu_rep_q8_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _gate_up(node, ith, nth, ctrl, _quantize_q8_0_lanes, 32, 4, _q8_0_chunks, _q8_0_run, 0)


@jit_kernel
def k_gu_rep_q4_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _gate_up(node, ith, nth, ctrl, _quantize_q8_0_lanes, 32, 4, _q4_0_chunks, _q4_0_run, 0)


@jit_kernel
def k_gu_rep_q5_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _gate_up(node, ith, nth, ctrl, _quantize_q8_0_lanes, 32, 4, _q5_0_chunks, _q5_0_run, 0)


@jit_kernel
def k_gu_rep_iq4_nl(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _gate_up(node, ith, nth, ctrl, _quantize_q8_0_lanes, 32, 4, _iq4_nl_chunks, _iq4_nl_run, 0)


#: src1 rows up to which a plain weight's gate and up products are fused (a batch of decodes; a prompt's
#: products keep their own kernels: the integer GEMM or register tiles, chunked for many columns)
GATE_UP_MAX_COLS = 8
#: the product kernel a gate or up projection took (traits.py) -> the fused kernel for its type: for one src1
#: row (k_mm_* then gives k_mv_*'s bits, see jit.lean_unless_ready), and for 2..GATE_UP_MAX_COLS rows
_PLAIN = {kern: fused for ty, fused in ((Q8_0, k_gu_q8_0), (Q4_0, k_gu_q4_0), (Q5_0, k_gu_q5_0), (Q4_K, k_gu_q4_k),
                                        (Q5_K, k_gu_q5_k), (Q6_K, k_gu_q6_k))
          for kern in (traits(ty).mv, traits(ty).mm)}
_PLAIN_BATCH = {traits(ty).mm: fused for ty, fused in ((Q8_0, k_gu_mm_q8_0), (Q4_0, k_gu_mm_q4_0),
                                                        (Q5_0, k_gu_mm_q5_0), (Q4_K, k_gu_mm_q4_k),
                                                        (Q5_K, k_gu_mm_q5_k), (Q6_K, k_gu_mm_q6_k))}
_REPACKED = {traits(ty).repacked: fused for ty, fused in ((Q4_K, k_gu_rep_q4_k), (Q6_K, k_gu_rep_q6_k),
                                                          (Q8_0, k_gu_rep_q8_0),
                                                          (Q4_0, k_gu_rep_q4_0), (Q5_0, k_gu_rep_q5_0),
                                                          (IQ4_NL, k_gu_rep_iq4_nl))}
_FUSED_KERNELS = {*_PLAIN.values(), *_PLAIN_BATCH.values(), *_REPACKED.values()}
_GLUS = (_GEGLU, _SWIGLU, _REGLU)


def fuse_gate_up(prev: Tensor, prev_choice: Choice, node: Tensor, choice: Choice,
                 readers: object = None) -> Choice | None:
    """Two products of one src1 by same-shape weights with the same kernel (pending: only their GLU completes
    the fusion); then the split GLU of the two. Or None; also while the fused kernel is not compiled yet
    (jit.ready_or_wanted)."""
    if node.op == Op.MUL_MAT and prev.op == Op.MUL_MAT:
        fused = _REPACKED.get(prev_choice.kernel)
        x, a, b = prev.src[1], prev.src[0], node.src[0]
        n = x.ne[1] * x.ne[2] * x.ne[3]
        if fused is None and n == 1:
            fused = _PLAIN.get(prev_choice.kernel)
        elif fused is None and n <= GATE_UP_MAX_COLS:
            fused = _PLAIN_BATCH.get(prev_choice.kernel)
        if fused is None or choice.kernel is not prev_choice.kernel or node.src[1] is not x:
            return None
        if a.type != b.type or a.ne != b.ne or a.nb != b.nb or not (prev.is_contiguous() and node.is_contiguous()):
            return None
        return Choice(fused, pending=((prev, prev_choice), (node, choice)))
    if node.op != Op.GLU or not prev_choice.pending or prev_choice.kernel not in _FUSED_KERNELS:
        return None
    (gate, _), (up, _) = prev_choice.pending
    x, g = node.src[0], node.src[1]
    kind = node.get_op_params_i32(0)
    if g is None or {id(x), id(g)} != {id(gate), id(up)} or kind not in _GLUS:
        return None
    if node.ne != up.ne or not node.is_contiguous() or node.data == g.data:
        return None  # the GLU writes act(x) before multiplying by g: g must not be its destination
    if not ready_or_wanted(prev_choice.kernel):
        return None
    return Choice(prev_choice.kernel, ints=(kind, _TABLE_ADDR, int(x is up)), parts=prev_choice.pending)


__all__ = ["fuse_gate_up"]
