"""A repacked weight's product and the element-wise nodes after it, as one kernel: the ADDs that take it as
their first operand (the bias, a row broadcast over the tokens, then the residual an encoder adds next) and a
GELU (BERT: ``wo * attn + bo + inpL``, ``gelu(w_up * x + b_up)``, ``w_down * h + b_down + ffn_inp``; Qwen2's
q/k/v biases too).

Each chunk of weight rows runs these on its span of every token's row as soon as the product has written it
(still in cache), instead of a barrier and a pass over the whole output per node: a BERT-base batch of 800
tokens has 72 bias ADDs, 24 residual ones and 12 GELUs, 7% of its CPU time node by node. Every node's output
is written, each with its own kernel's bits (an ADD is one float32 addition per element, the GELU
elementwise_jit's row function). The fused kernel's record is the last node's; AUX word 0 is the product's
record, words 1 and 2 the element-wise nodes' before it (0 where there are fewer), word 3 the GELU table.
"""

from __future__ import annotations

import numba

from ....ops.enums import Op
from ....tensor import Tensor
from ....types import GGMLType
from ..jit import Choice, background, compile_in_background, jit_kernel
from ..jit.record import AUX, T_DST, T_SRC0, T_SRC1, rec
from ..native import atomic_add, f32p, u32p
from ..quants.gemm import quantize_src1
from ..quants.quantize import _quantize_q8_0_lanes, _quantize_q8_k
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
from .elementwise_jit import _TABLE_ADDR, _gelu_row, k_add, k_gelu

F32 = GGMLType.F32
_ADD = int(Op.ADD)
#: element-wise nodes one record takes after its product
MAX_AFTER = 3
_opts = {"inline": "always", "cache": True, "error_model": "numpy"}


@numba.njit(**_opts)
def _add_span(add, r0, r1, n):  # pragma: no cover - compiled
    """The ADD of record ``add`` (dst = src0 + src1, src1's rows broadcast) on elements [r0, r1) of its n rows."""
    r = rec(add)
    d, a, b = r[T_DST], r[T_SRC0], r[T_SRC1]
    nd, na, nb, b_rows = r[T_DST + 6], r[T_SRC0 + 6], r[T_SRC1 + 6], r[T_SRC1 + 2]
    w = r1 - r0
    for j in range(n):
        dv = numba.carray(f32p(d + j * nd + 4 * r0), w)
        av = numba.carray(f32p(a + j * na + 4 * r0), w)
        bv = numba.carray(f32p(b + (j % b_rows) * nb + 4 * r0), w)
        for i in range(w):
            dv[i] = av[i] + bv[i]


@numba.njit(**_opts)
def _gelu_span(act, r0, r1, n, table):  # pragma: no cover - compiled
    """The GELU of record ``act`` on elements [r0, r1) of its n rows."""
    r = rec(act)
    d, a, nd, na = r[T_DST], r[T_SRC0], r[T_DST + 6], r[T_SRC0 + 6]
    w = r1 - r0
    for j in range(n):
        x = a + j * na + 4 * r0
        _gelu_row(numba.carray(f32p(x), w), numba.carray(u32p(x), w), table, numba.carray(f32p(d + j * nd + 4 * r0), w))


@numba.njit(**_opts)
def _after(e, r0, r1, n, table):  # pragma: no cover - compiled
    if rec(e)[0] == _ADD:
        _add_span(e, r0, r1, n)
    else:
        _gelu_span(e, r0, r1, n, table)


@numba.njit(**_opts)
def _mm_add(node, ith, nth, ctrl, quantize, bs, es, chunks, run):  # pragma: no cover - compiled
    """gemm.walk over the product's chunks, each followed by the element-wise nodes on its rows."""
    r = rec(node)
    mm, e1, e2 = r[AUX], r[AUX + 1], r[AUX + 2]
    table = numba.carray(f32p(r[AUX + 3]), 65536)
    q = quantize_src1(mm, ith, nth, ctrl, quantize, bs, es)
    n = q[6]
    n_chunks = chunks(mm, n, nth)
    c = ith
    while c < n_chunks:
        r0, r1 = run(mm, c, n_chunks, q, ith, 0)
        if e1 != 0:
            _after(e1, r0, r1, n, table)
        if e2 != 0:
            _after(e2, r0, r1, n, table)
        _after(node, r0, r1, n, table)
        c = atomic_add(ctrl + 8 * C_CHUNK, 1)


@jit_kernel
def k_mm_add_rep_q8_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mm_add(node, ith, nth, ctrl, _quantize_q8_0_lanes, 32, 4, _q8_0_chunks, _q8_0_run)


@jit_kernel
def k_mm_add_rep_q4_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mm_add(node, ith, nth, ctrl, _quantize_q8_0_lanes, 32, 4, _q4_0_chunks, _q4_0_run)


@jit_kernel
def k_mm_add_rep_q5_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mm_add(node, ith, nth, ctrl, _quantize_q8_0_lanes, 32, 4, _q5_0_chunks, _q5_0_run)


@jit_kernel
def k_mm_add_rep_iq4_nl(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mm_add(node, ith, nth, ctrl, _quantize_q8_0_lanes, 32, 4, _iq4_nl_chunks, _iq4_nl_run)


@jit_kernel
def k_mm_add_rep_q4_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mm_add(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _q4k_chunks, _q4k_run)


@jit_kernel
def k_mm_add_rep_q6_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mm_add(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _q6k_chunks, _q6k_run)


#: the repacked product kernel (traits.py) -> its fused kernel
_FUSED = {traits(ty).repacked: fused for ty, fused in ((GGMLType.Q8_0, k_mm_add_rep_q8_0),
                                                       (GGMLType.Q4_0, k_mm_add_rep_q4_0),
                                                       (GGMLType.Q5_0, k_mm_add_rep_q5_0),
                                                       (GGMLType.IQ4_NL, k_mm_add_rep_iq4_nl),
                                                       (GGMLType.Q4_K, k_mm_add_rep_q4_k),
                                                       (GGMLType.Q6_K, k_mm_add_rep_q6_k))}
_KERNELS = frozenset(_FUSED.values())


def _elementwise_after(node: Tensor, prev: Tensor, choice: Choice) -> bool:
    """Whether ``node`` is an F32 ADD of ``prev`` (a 2-D contiguous result) and a row or a same-shape tensor,
    or the GELU of ``prev``, with their compiled kernels."""
    if node.src[0] is not prev or node.type != F32 or node.ne != prev.ne or node.ne[2] != 1 or node.ne[3] != 1:
        return False
    if not (node.is_contiguous() and prev.is_contiguous()):
        return False
    if choice.kernel is k_gelu:
        return True
    b = node.src[1]
    if choice.kernel is not k_add or b is None or b is prev or b.type != F32:
        return False
    return b.nb[0] == 4 and b.ne[0] == node.ne[0] and b.ne[1] in (1, node.ne[1]) and b.ne[2] == 1 and b.ne[3] == 1


#: the kernel a node fused as a part had alone (its part record is written with it)
_ALONE = {int(Op.ADD): Choice(k_add), int(Op.UNARY): Choice(k_gelu, ints=(_TABLE_ADDR, 0))}


def fuse_mm_add(prev: Tensor, prev_choice: Choice, node: Tensor, choice: Choice,
                readers: object = None) -> Choice | None:
    """A repacked product and an ADD or GELU after it, or such a record and one more (MAX_AFTER in all); or
    None. Taken once the fused kernel is compiled: a first run has it compile in the background
    (jit.compile_in_background) and keeps the nodes apart, unless background compiles are off (then the plan
    compiles it)."""
    if not _elementwise_after(node, prev, choice):
        return None
    if prev_choice.kernel in _FUSED and not prev_choice.parts and not prev_choice.pending:
        fused, parts = _FUSED[prev_choice.kernel], ((prev, prev_choice),)
    elif prev_choice.kernel in _KERNELS and len(prev_choice.parts) < MAX_AFTER:
        fused, parts = prev_choice.kernel, (*prev_choice.parts, (prev, _ALONE[int(prev.op)]))
    else:
        return None
    if not fused.load_cached() and background():
        compile_in_background(fused)
        return None
    return Choice(fused, ints=(0,) * (MAX_AFTER - len(parts)) + (_TABLE_ADDR,), parts=parts)


__all__ = ["fuse_mm_add"]
