"""Backend-level fusions: consecutive compiled nodes the plan runs as one record (ggml-cpu fuses RMS_NORM
and its MUL the same way; the others are what ggml's GPU backends fuse): nn.py's norm chains (and NORM with
LayerNorm's weight and bias), ROPE into the KV cache, gate_up.py's FFN products, mm_add_jit.py's repacked
products and the bias ADDs, residual ADDs and GELU after them, recurrent_jit.py's SSM_SCAN into the state rows and
SSM_CONV with its bias and SiLU.

The graph keeps every node and a fused kernel writes every node's output with the bits of that node's own
kernel, so an eval callback, a later reader or a test sees the same tensors (but for the SSM_SCAN's new
states, which only the SET_ROWS after it may read: the readers argument lets its rule check that); what
goes is a barrier and a pass over memory per fused node. The plan (plan.py) offers each compiled node with
the one before it; a fused record may take in the next node again (ADD + RMS_NORM, then its MUL; NORM + MUL,
then the bias ADD), and a fusion only a later node completes (Choice.pending) goes back to its records when
none does. The gate/up and ROPE fusions save about 1% of a decode step for seconds of compiling: they wait
until their kernels are cached (jit.ready_or_wanted); the encoder's (products with their ADDs and GELU, the
LayerNorms) compile in the background on a first run and are taken once cached.
"""

from __future__ import annotations

from ....tensor import Tensor
from .. import traits
from ..jit import Choice, JitKernel, Readers
from ..plan import FREE, NOT_FREE, ROWS
from . import elementwise_jit as elementwise
from . import gate_up_jit as gate_up
from . import mm_add_jit as mm_add
from . import nn_jit as nn
from . import recurrent_jit as recurrent
from . import rows_jit as rows
from . import shape_jit as shape


def fuse(prev: Tensor, prev_choice: Choice, node: Tensor, choice: Choice, readers: Readers) -> Choice | None:
    """The kernel computing ``prev`` (with its fused parts) and then ``node``, or None."""
    for rule in _RULES:
        fused = rule(prev, prev_choice, node, choice, readers)
        if fused is not None:
            # a pending fusion lists its nodes, this one last; a complete one lists the parts before this one
            group = [n for n, _ in fused.pending] if fused.pending else [*(n for n, _ in fused.parts), node]
            return fused if memory_safe(group) else None
    return None


def _extent(t: Tensor) -> tuple[int, int]:
    return t.data, t.data + t.nbytes()


def _base(t: Tensor) -> Tensor:
    while t.view_src is not None:
        t = t.view_src
    return t


def _same_rows(a: Tensor, b: Tensor) -> bool:
    return a.data == b.data and list(a.ne[1:]) == list(b.ne[1:]) and list(a.nb) == list(b.nb)


def memory_safe(nodes: list[Tensor]) -> bool:
    """Whether ``nodes`` may run as one fused kernel without barriers between them.

    The graph allocator plans memory for node-by-node execution: once the last reader of a tensor has run,
    a later node's output may take its memory. A fused kernel runs its nodes row by row, each thread its own
    rows, so an output that lands on an input (or an earlier output) of the group at another offset would
    overwrite rows another thread has yet to read (seen: gpt-oss's ADD + RMS_NORM + MUL, its MUL result
    allocated over part of the ADD's input, one token wrong when a core was busy). An output may only stay
    clear of them, or sit exactly on one, row for row. (An in-place node's destination, the tensor its
    output views, is not an input.)"""
    # what the group computes itself: its nodes, views of them (a reshape between two parts), and an in-place
    # node's destination (SET_ROWS into the KV cache), which is written, not read
    own = {id(n) for n in nodes} | {id(_base(n)) for n in nodes if n.view_src is not None}
    inputs = [s for n in nodes for s in n.src if s is not None and id(_base(s)) not in own and id(s) not in own]
    for i, out in enumerate(nodes):
        lo, hi = _extent(out)
        for other in (*inputs, *nodes[:i]):
            olo, ohi = _extent(other)
            if lo < ohi and olo < hi and not _same_rows(out, other):
                return False
    return True


_RULES = (nn.fuse_norm, nn.fuse_norm_affine, gate_up.fuse_gate_up, mm_add.fuse_mm_add, nn.fuse_rope_set_rows,
          recurrent.fuse_ssm_scan_set_rows, recurrent.fuse_ssm_conv_bias)

#: kernels that read their sources and write their outputs and nothing else: no work buffer, no shared work
#: counter, no barrier of their own (so a thread may go on to the next record while another is still in
#: this one; the products and attention hand out chunks and share scratch, and are not here)
_BARRIER_FREE: frozenset[JitKernel] = frozenset({
    shape.k_concat_4, shape.k_concat_2, shape.k_concat_any, shape.k_repeat_4, shape.k_repeat_2,
    rows.k_set_rows_f16_i64, rows.k_set_rows_f16_i32, rows.k_set_rows_f32_i64, rows.k_set_rows_f32_i32,
    rows.k_copy_f32_f32, rows.k_copy_f32_f16, rows.k_copy_f16_f32, rows.k_copy_f16_f16,
    traits.k_get_rows_f32, traits.k_get_rows_f16, traits.k_get_rows_q8_0, traits.k_get_rows_q4_0,
    traits.k_get_rows_q5_0, traits.k_get_rows_q4_k, traits.k_get_rows_q6_k,
    recurrent.k_ssm_conv, recurrent.k_ssm_conv_bias, recurrent.k_ssm_scan, recurrent.k_ssm_scan_set_rows,
})
#: of those, the row kernels: a thread takes record.span's share of the output's rows and computes each from
#: the same row of every source of the output's shape (elementwise_jit's _binary, k_scale and _activation_rows,
#: the RMS norms)
_ROW_KERNELS: frozenset[JitKernel] = frozenset({
    elementwise.k_add, elementwise.k_sub, elementwise.k_mul, elementwise.k_div, elementwise.k_scale,
    elementwise.k_reglu, elementwise.k_geglu, elementwise.k_swiglu, elementwise.k_relu, elementwise.k_gelu,
    elementwise.k_silu, elementwise.k_tanh, elementwise.k_exp, elementwise.k_sigmoid, elementwise.k_neg,
    elementwise.k_abs, elementwise.k_sqr,
    nn.k_rms_norm, nn.k_rms_norm_mul,
})


def barrier_free(choice: Choice) -> int:
    """plan.py's Independent: NOT_FREE, FREE or ROWS for a record (with its fused parts)."""
    if choice.wsize:
        return NOT_FREE
    if choice.kernel in _ROW_KERNELS:
        kind = ROWS
    elif choice.kernel in _BARRIER_FREE:
        kind = FREE
    else:
        return NOT_FREE
    for _, part in choice.parts:
        if barrier_free(part) == NOT_FREE:
            return NOT_FREE
        if barrier_free(part) != ROWS:
            kind = FREE
    return kind


__all__ = ["barrier_free", "fuse", "memory_safe"]
