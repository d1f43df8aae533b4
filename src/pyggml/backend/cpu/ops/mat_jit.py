"""Compiled MUL_MAT: the selector, and quantized weights for few src1 rows (decode); F16/F32 weights are
matmul_f.py's, repacked weights repacked.py's.

Quantized weights: src1 rows are quantized to the weight's vec_dot_type into the shared work
buffer (Q8_0 with the x86 rounding, or Q8_K), the threads meet at a barrier, then take chunks of
weight rows from a shared counter and run quants/dots.py's fused integer mat-vec kernels on them: the
same kernels, so the same bits, as the numpy path's decode products. This is ggml's MUL_MAT:
convert src1, barrier, chunked vec_dot (ggml-cpu.c:1328-1467).

Quantized prompts: Q4_K/Q6_K take the integer GEMM tiles (gemm.py), which give the mat-vec
kernels' bits; Q8_0/Q4_0/Q5_0 the mat-vec kernels at every size (llama.cpp's tinyBLAS_Q0 is the
same per-output dot); other types past matmul.MATVEC_MAX_COLS the numpy kernel (dequantized
tiles and BLAS).
"""

from __future__ import annotations

from ....ops.enums import Op
from ....tensor import Tensor
from ....types import GGMLType
from ..jit import Choice, lean_unless_ready, selector
from ..quants import gemm, q0tiles, repacked
from ..repack_buffer import is_repacked
from ..repack_buffer import supports_op as repack_supports_op
from ..simd import TAB_ADDR
from ..threads import available_cores
from ..traits import traits
from .mat_f_jit import float_choice

F32, F16, BF16 = GGMLType.F32, GGMLType.F16, GGMLType.BF16
_opts = {"inline": "always", "cache": True, "error_model": "numpy"}




#: Q8_0/Q4_0/Q5_0 products of at least this many src1 rows decode their weight rows once into register
#: tiles (q0tiles.q0_tiles_kernel); fewer take the row dots directly. Both give the same bits. A batch of 8
#: decodes (-np 8) ran faster on the row dots (4864 x 896, one thread, time over one row's, loaded machine:
#: Q8_0 5.2 rows vs 6.9 tiles, Q5_0 4.5 vs 4.7; at 12 rows Q8_0 8.0 vs 9.2, Q5_0 6.9 vs 6.5)
Q0_TILE_MIN_COLS = 9
#: src1 rows up to which a product takes the one-row kernel k_mv_* (the same bits, a weight read per row) while
#: k_mm_* compiles in the background (jit.lean_unless_ready): a first ``generate`` of a short prompt compiles
#: only what its decode needs (Gemma 3 270M: k_mm_q5_0, q6_k and q8_0 are 12 of its 37 CPU seconds of compiling)
LEAN_MAX_COLS = 8


def _quantized_choice(node: Tensor, a: Tensor, b: Tensor) -> Choice | None:
    tr = traits(a.type)
    n = b.ne[1] * b.ne[2] * b.ne[3]
    if tr.mm is None or a.ne[2] != 1 or a.ne[3] != 1 or not node.is_contiguous() or a.nb[0] != a.type.type_size:
        return None
    k = a.ne[0]
    act = gemm.act_bytes(n, k, *tr.act_block)
    if tr.tiles is not None and n >= Q0_TILE_MIN_COLS and gemm.AVAILABLE:
        per_thread = q0tiles.q0_scratch_bytes(k)
        return Choice(tr.tiles, ints=(TAB_ADDR, act, per_thread, q0tiles.q0_chunk_bytes(k)),
                      wsize=act + available_cores() * per_thread)
    if n <= tr.matvec_max_cols:
        # two or more rows (a batch of decodes): the kernel that decodes each weight row once for them all; a
        # short prompt on a first run takes the one-row kernel (its bits) while that one compiles aside
        later = 2 <= n <= LEAN_MAX_COLS and tr.mv is not tr.mm
        kern = lean_unless_ready(tr.mv, tr.mm, later) if n == 1 or later else tr.mm
        return Choice(kern, ints=(TAB_ADDR,), wsize=act)
    if tr.gemm is not None and gemm.AVAILABLE:
        kern, blk_bytes = tr.gemm
        scratch = available_cores() * gemm.tiles_scratch_bytes(k, tr.act_block[0], blk_bytes)
        return Choice(kern, ints=(TAB_ADDR, act), wsize=act + scratch)
    return None


def _repacked_choice(node: Tensor, a: Tensor, b: Tensor) -> Choice:
    """The kernel for a MUL_MAT whose weight ``a`` is repacked (repack_buffer.supports_op has accepted it)."""
    n, k = b.ne[1] * b.ne[2] * b.ne[3], a.ne[0]
    tr = traits(a.type)
    # the K-quants' activations are Q8_K rows; the Q8_0 family's carry their starting lanes (repacked.ACT_BLOCK)
    return Choice(tr.repacked, wsize=gemm.act_bytes(n, k, *(tr.act_block if tr.act_block[0] == 256
                                                            else repacked.ACT_BLOCK)))


@selector(Op.MUL_MAT)
def _sel_mul_mat(node: Tensor) -> Choice | None:
    a, b = node.src[0], node.src[1]
    if node.get_op_params_i32(1) != 0 or b.type != F32 or node.type != F32 or a.ne[0] != b.ne[0]:
        return None  # the Hadamard hint, other src1 types and bad shapes go to the numpy kernel
    if b.nb[0] != 4:
        return None
    if a.type in (F16, BF16, F32):
        return float_choice(node, a, b)
    if is_repacked(a):
        return _repacked_choice(node, a, b) if repack_supports_op(node) else None
    return _quantized_choice(node, a, b)
