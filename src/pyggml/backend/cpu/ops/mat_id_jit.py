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

from ....ops.enums import Op
from ....tensor import Tensor
from ....types import GGMLType
from ..jit import Choice, selector
from ..quants import gemm
from ..simd import TAB_ADDR
from ..traits import traits

F32, I32 = GGMLType.F32, GGMLType.I32
_opts = {"inline": "always", "cache": True, "error_model": "numpy"}


@selector(Op.MUL_MAT_ID)
def _sel_mul_mat_id(node: Tensor) -> Choice | None:
    a, b, ids = node.src[0], node.src[1], node.src[2]
    tr = traits(a.type)
    kern, (bs, es) = tr.mmid, tr.act_block
    if (kern is None or b.type != F32 or b.nb[0] != 4 or ids.type != I32 or ids.nb[0] != 4 or node.type != F32
            or node.nb[0] != 4 or a.nb[0] != a.type.type_size or a.ne[0] != b.ne[0] or a.ne[3] != 1
            or b.ne[3] != 1 or a.ne[0] % bs):
        return None  # other types and layouts go to the numpy kernel
    n = b.ne[1] * b.ne[2]
    return Choice(kern, ints=(TAB_ADDR,), wsize=gemm.act_bytes(n, a.ne[0], bs, es))
