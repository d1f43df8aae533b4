"""The CPU's type traits (ggml-cpu's ``type_traits_cpu[]``): for each weight type, one row saying what the CPU
backend runs for it.

A row holds the numpy path's kernels (the fused row dots of a quantized MUL_MAT, the row dequantizer of its
BLAS tiles, the column count up to which the row dots beat BLAS) and the compiled kernels of the graph plans
(mat-vec, prompt tiles or integer GEMM, MUL_MAT_ID, GET_ROWS, the repacked product where this CPU has one).
The compiled kernels are declared here, each a one-line call of a driver in quants/ with the type's
functions, so a new type is a new row with its kernels beside it; the selectors in ops/ read the table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...types import GGMLType
from .jit import JitKernel, jit_kernel
from .jit.record import AUX, rec
from .quants import gemm, q0tiles
from .quants.dots import (
    _dq_q4_0,
    _dq_q4_k,
    _dq_q5_0,
    _dq_q6_k,
    _dq_q8_0,
    _mv1_iq2_s,
    _mv1_iq2_xs,
    _mv1_iq2_xxs,
    _mv1_iq3_s,
    _mv1_iq3_xxs,
    _mv1_iq4_nl,
    _mv1_iq4_xs,
    _mv1_q2_k,
    _mv1_q3_k,
    _mv1_q4_0,
    _mv1_q4_k,
    _mv1_q5_0,
    _mv1_q5_k,
    _mv1_q6_k,
    _mv1_q8_0,
    _mv_iq2_s,
    _mv_iq2_xs,
    _mv_iq2_xxs,
    _mv_iq3_s,
    _mv_iq3_xxs,
    _mv_iq4_nl,
    _mv_iq4_xs,
    _mv_q2_k,
    _mv_q3_k,
    _mv_q4_0,
    _mv_q4_1,
    _mv_q4_k,
    _mv_q5_0,
    _mv_q5_1,
    _mv_q5_k,
    _mv_q6_k,
    _mv_q8_0,
)
from .quants.intrinsics import _COL_BLOCK_BYTES
from .quants.matvec import _matvec_q, _mul_mat_id
from .quants.quantize import _quantize_q8_0, _quantize_q8_0_lanes, _quantize_q8_k
from .quants.repacked import (
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
from .quants.to_float import _dequantizing, _get_rows, _row_f16, _row_f32

Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, IQ4_NL = (GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q4_1,
                                        GGMLType.Q5_1, GGMLType.IQ4_NL)
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K
IQ4_XS, IQ3_S, IQ3_XXS = GGMLType.IQ4_XS, GGMLType.IQ3_S, GGMLType.IQ3_XXS
IQ2_XXS, IQ2_XS, IQ2_S = GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S
F32, F16 = GGMLType.F32, GGMLType.F16


# ------------------------------------------------------------------------------------ the kernels
# k_mm_*: groups of up to ROWDOT_COLS activation rows share each weight decode (batches); k_mv_*: one
# activation row at a time, for decodes and the shortest prompts (compiled only when a graph has one)
@jit_kernel
def k_mm_q8_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv_q8_0)


@jit_kernel
def k_mv_q8_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv1_q8_0)


@jit_kernel
def k_mm_q4_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv_q4_0)


@jit_kernel
def k_mv_q4_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv1_q4_0)


@jit_kernel
def k_mm_q5_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv_q5_0)


@jit_kernel
def k_mv_q5_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv1_q5_0)


@jit_kernel
def k_mm_iq4_nl(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv_iq4_nl)


@jit_kernel
def k_mv_iq4_nl(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv1_iq4_nl)


@jit_kernel
def k_mm_q4_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv_q4_k)


@jit_kernel
def k_mv_q4_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_q4_k)


@jit_kernel
def k_mm_q5_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv_q5_k)


@jit_kernel
def k_mv_q5_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_q5_k)


@jit_kernel
def k_mm_q6_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv_q6_k)


@jit_kernel
def k_mv_q6_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_q6_k)


@jit_kernel
def k_mm_q2_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv_q2_k)


@jit_kernel
def k_mv_q2_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_q2_k)


@jit_kernel
def k_mm_q3_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv_q3_k)


@jit_kernel
def k_mv_q3_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_q3_k)


@jit_kernel
def k_mm_iq4_xs(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv_iq4_xs)


@jit_kernel
def k_mv_iq4_xs(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_iq4_xs)


@jit_kernel
def k_mm_iq3_s(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv_iq3_s)


@jit_kernel
def k_mv_iq3_s(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_iq3_s)


@jit_kernel
def k_mm_iq3_xxs(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv_iq3_xxs)


@jit_kernel
def k_mv_iq3_xxs(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_iq3_xxs)


@jit_kernel
def k_mm_iq2_xxs(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv_iq2_xxs)


@jit_kernel
def k_mv_iq2_xxs(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_iq2_xxs)


@jit_kernel
def k_mm_iq2_xs(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv_iq2_xs)


@jit_kernel
def k_mv_iq2_xs(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_iq2_xs)


@jit_kernel
def k_mm_iq2_s(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv_iq2_s)


@jit_kernel
def k_mv_iq2_s(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _matvec_q(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_iq2_s)


@jit_kernel
def k_gemm_q4_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    gemm.gemm_tiles(node, ith, nth, ctrl, rec(node)[AUX + 1], 256, gemm.SB_BYTES, 16, _quantize_q8_k,
                    gemm.repack_q4_k, gemm._q4k_4, gemm._q4k_1, gemm._q4k_one4, gemm._q4k_one1, _mv_q4_k)


@jit_kernel
def k_gemm_q3_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    gemm.gemm_tiles(node, ith, nth, ctrl, rec(node)[AUX + 1], 256, gemm.Q6_BYTES, 16, _quantize_q8_k,
                    gemm.repack_q3_k, gemm._q6k_4, gemm._q6k_1, gemm._q6k_one4, gemm._q6k_one1, _mv_q3_k)


@jit_kernel
def k_gemm_q6_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    gemm.gemm_tiles(node, ith, nth, ctrl, rec(node)[AUX + 1], 256, gemm.Q6_BYTES, 16, _quantize_q8_k,
                    gemm.repack_q6_k, gemm._q6k_4, gemm._q6k_1, gemm._q6k_one4, gemm._q6k_one1, _mv_q6_k)


_q0_tiles_q8_0, _q0_tiles_q4_0, _q0_tiles_q5_0 = (q0tiles.q0_tiles_kernel(kind) for kind in range(3))


@jit_kernel
def k_tiles_q8_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _q0_tiles_q8_0(node, ith, nth, ctrl, _COL_BLOCK_BYTES)


@jit_kernel
def k_tiles_q4_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _q0_tiles_q4_0(node, ith, nth, ctrl, _COL_BLOCK_BYTES)


@jit_kernel
def k_tiles_q5_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _q0_tiles_q5_0(node, ith, nth, ctrl, _COL_BLOCK_BYTES)


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
    _mul_mat_id(node, ith, nth, ctrl, _quantize_q8_0, 32, 32, _mv1_iq4_nl)


@jit_kernel
def k_mmid_q4_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mul_mat_id(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_q4_k)


@jit_kernel
def k_mmid_q5_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mul_mat_id(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_q5_k)


@jit_kernel
def k_mmid_q6_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mul_mat_id(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_q6_k)


@jit_kernel
def k_mmid_iq4_xs(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mul_mat_id(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_iq4_xs)


@jit_kernel
def k_mmid_iq3_s(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mul_mat_id(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_iq3_s)


@jit_kernel
def k_mmid_iq3_xxs(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mul_mat_id(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_iq3_xxs)


@jit_kernel
def k_mmid_iq2_xxs(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mul_mat_id(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_iq2_xxs)


@jit_kernel
def k_mmid_iq2_xs(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mul_mat_id(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_iq2_xs)


@jit_kernel
def k_mmid_iq2_s(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mul_mat_id(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_iq2_s)


@jit_kernel
def k_mmid_q2_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mul_mat_id(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_q2_k)


@jit_kernel
def k_mmid_q3_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _mul_mat_id(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _mv1_q3_k)


# GET_ROWS row converters: (source row address, destination row, row bytes, fp16 table)
_row_q8_0 = _dequantizing(_dq_q8_0)
_row_q4_0 = _dequantizing(_dq_q4_0)
_row_q5_0 = _dequantizing(_dq_q5_0)
_row_q4_k = _dequantizing(_dq_q4_k)
_row_q6_k = _dequantizing(_dq_q6_k)


@jit_kernel
def k_get_rows_f32(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _get_rows(node, ith, nth, ctrl, _row_f32)


@jit_kernel
def k_get_rows_f16(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _get_rows(node, ith, nth, ctrl, _row_f16)


@jit_kernel
def k_get_rows_q8_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _get_rows(node, ith, nth, ctrl, _row_q8_0)


@jit_kernel
def k_get_rows_q4_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _get_rows(node, ith, nth, ctrl, _row_q4_0)


@jit_kernel
def k_get_rows_q5_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _get_rows(node, ith, nth, ctrl, _row_q5_0)


@jit_kernel
def k_get_rows_q4_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _get_rows(node, ith, nth, ctrl, _row_q4_k)


@jit_kernel
def k_get_rows_q6_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    _get_rows(node, ith, nth, ctrl, _row_q6_k)


@jit_kernel
def k_rep_q4_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    gemm.walk(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _q4k_chunks, _q4k_run, 0)


@jit_kernel
def k_rep_q5_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    gemm.walk(node, ith, nth, ctrl, _quantize_q8_0_lanes, 32, 4, _q5_0_chunks, _q5_0_run, 0)


@jit_kernel
def k_rep_q6_k(node, ith, nth, ctrl):  # pragma: no cover - compiled
    gemm.walk(node, ith, nth, ctrl, _quantize_q8_k, 256, 16, _q6k_chunks, _q6k_run, 0)


@jit_kernel
def k_rep_q8_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    gemm.walk(node, ith, nth, ctrl, _quantize_q8_0_lanes, 32, 4, _q8_0_chunks, _q8_0_run, 0)


@jit_kernel
def k_rep_q4_0(node, ith, nth, ctrl):  # pragma: no cover - compiled
    gemm.walk(node, ith, nth, ctrl, _quantize_q8_0_lanes, 32, 4, _q4_0_chunks, _q4_0_run, 0)


@jit_kernel
def k_rep_iq4_nl(node, ith, nth, ctrl):  # pragma: no cover - compiled
    gemm.walk(node, ith, nth, ctrl, _quantize_q8_0_lanes, 32, 4, _iq4_nl_chunks, _iq4_nl_run, 0)


# ------------------------------------------------------------------------------------ the table
@dataclass(frozen=True)
class TypeTraitsCPU:
    """What the CPU backend runs for a weight of one type (None: that path is not there for the type)."""

    #: values per block of the activations' vec_dot_type (Q8_0: 32, Q8_K: 256) and per block sum (32 or 16)
    act_block: tuple[int, int] = (0, 0)
    #: numpy path: the fused integer row dots over ROWDOT_COLS columns (dots.py's _mv_*), and the row
    #: dequantizer of the BLAS tiles (_dq_*; the codec's dequantize where None)
    row_dot: Callable | None = None
    to_float: Callable | None = None
    #: src1 rows up to which the fused row dots beat the integer GEMM or dequantize + BLAS (the crossings below)
    matvec_max_cols: int = 0
    #: compiled MUL_MAT: mat-vec over two or more src1 rows (a row decoded once for up to ROWDOT_COLS of
    #: them), and for one (decode)
    mm: JitKernel | None = None
    mv: JitKernel | None = None
    #: compiled prompt products: register tiles over decoded rows (Q8_0 family), or the integer GEMM with its
    #: tile bytes per block (K-quants)
    tiles: JitKernel | None = None
    gemm: tuple[JitKernel, int] | None = None
    #: compiled MUL_MAT_ID (experts), GET_ROWS, and the product of a weight in CPU_REPACK's layout (where
    #: this CPU has the features it needs: quants/repacked.py's TYPES)
    mmid: JitKernel | None = None
    get_rows: JitKernel | None = None
    repacked: JitKernel | None = None
    #: numpy path: row_dot taking its activation rows one at a time (_mv1_*: the same bits; compiled in about
    #: half the time, which a first run's Python kernels want: ops/mat_q.row_dot)
    row_dot1: Callable | None = None


#: src1 rows up to which the fused kernels beat the integer GEMM (quants/gemm.py) or dequantize + BLAS,
#: per type: the crossings measured with ``bench/gemm.py --mv`` on 2 threads (GOPS fused/GEMM, 8960x1536 unless
#: said: Q4_K 195.5/188.4 at 32 columns, 207.0/227.6 at 40; Q6_K 198.2/180.6 at 48, 208.6/210.3 at 64, 1536x8960
#: 202.3/217.9 at 64; Q3_K (the Q6_K tiles, gemm.repack_q3_k) 217.9/171.3 at 32, 211.5/222.7 at 48, 172.6/421.2 at
#: 512; Q5_0 4864x896 76.9/66.8 at 32, 74.4/83.5 at 48; Q4_0 74.0/68.4 at 48, 74.8/93.8 at 64).
#: The fused kernels decode each weight block once for ROWDOT_COLS activation rows.
#: Q4_1/Q5_1 have plainer kernels (a decode per column), hence the lower limit.
#: Q8_0/Q4_0/Q5_0/IQ4_NL take the fused kernels at every column count: llama.cpp computes their prompts with the
#: same per-output dot as their decode on x86 (llamafile's tinyBLAS_Q0_AVX: 8 float lanes, fma per block), so a
#: product's bits never depend on the batch's shape, and neither do perplexity or imatrix. So do Q2_K/Q5_K/IQ4_XS,
#: which have no integer GEMM yet: their fused kernels beat dequantize + BLAS at a prompt ubatch's column counts
#: (fused/BLAS at 512 columns: Q2_K 182.9/153.9, Q5_K 150.8/144.7; 1024: 169.6/146.8, 160.1/158.0; IQ4_XS
#: 173.1/156.7 at 256, 155.4/168.7 at 1024).
ALL_COLS = 1 << 62

_Q8_0, _Q8_K = (32, 32), (256, 16)

TYPE_TRAITS_CPU: dict[GGMLType, TypeTraitsCPU] = {
    F32: TypeTraitsCPU(get_rows=k_get_rows_f32),
    F16: TypeTraitsCPU(get_rows=k_get_rows_f16),
    Q8_0: TypeTraitsCPU(_Q8_0, _mv_q8_0, _dq_q8_0, ALL_COLS, k_mm_q8_0, k_mv_q8_0, tiles=k_tiles_q8_0,
                        mmid=k_mmid_q8_0, get_rows=k_get_rows_q8_0, repacked=k_rep_q8_0, row_dot1=_mv1_q8_0),
    Q4_0: TypeTraitsCPU(_Q8_0, _mv_q4_0, _dq_q4_0, ALL_COLS, k_mm_q4_0, k_mv_q4_0, tiles=k_tiles_q4_0,
                        mmid=k_mmid_q4_0, get_rows=k_get_rows_q4_0, repacked=k_rep_q4_0, row_dot1=_mv1_q4_0),
    Q5_0: TypeTraitsCPU(_Q8_0, _mv_q5_0, _dq_q5_0, ALL_COLS, k_mm_q5_0, k_mv_q5_0, tiles=k_tiles_q5_0,
                        mmid=k_mmid_q5_0, get_rows=k_get_rows_q5_0, repacked=k_rep_q5_0, row_dot1=_mv1_q5_0),
    IQ4_NL: TypeTraitsCPU(_Q8_0, _mv_iq4_nl, None, ALL_COLS, k_mm_iq4_nl, k_mv_iq4_nl, mmid=k_mmid_iq4_nl,
                          repacked=k_rep_iq4_nl, row_dot1=_mv1_iq4_nl),
    Q4_1: TypeTraitsCPU(_Q8_0, _mv_q4_1, None, 8),
    Q5_1: TypeTraitsCPU(_Q8_0, _mv_q5_1, None, 8),
    Q4_K: TypeTraitsCPU(_Q8_K, _mv_q4_k, _dq_q4_k, 32, k_mm_q4_k, k_mv_q4_k, gemm=(k_gemm_q4_k, gemm.SB_BYTES),
                        mmid=k_mmid_q4_k, get_rows=k_get_rows_q4_k, repacked=k_rep_q4_k, row_dot1=_mv1_q4_k),
    Q5_K: TypeTraitsCPU(_Q8_K, _mv_q5_k, None, ALL_COLS, k_mm_q5_k, k_mv_q5_k, mmid=k_mmid_q5_k, row_dot1=_mv1_q5_k),
    Q6_K: TypeTraitsCPU(_Q8_K, _mv_q6_k, _dq_q6_k, 48, k_mm_q6_k, k_mv_q6_k, gemm=(k_gemm_q6_k, gemm.Q6_BYTES),
                        mmid=k_mmid_q6_k, get_rows=k_get_rows_q6_k, repacked=k_rep_q6_k, row_dot1=_mv1_q6_k),
    Q2_K: TypeTraitsCPU(_Q8_K, _mv_q2_k, None, ALL_COLS, k_mm_q2_k, k_mv_q2_k, mmid=k_mmid_q2_k, row_dot1=_mv1_q2_k),
    Q3_K: TypeTraitsCPU(_Q8_K, _mv_q3_k, None, 40, k_mm_q3_k, k_mv_q3_k, gemm=(k_gemm_q3_k, gemm.Q6_BYTES),
                        mmid=k_mmid_q3_k, row_dot1=_mv1_q3_k),
    IQ4_XS: TypeTraitsCPU(_Q8_K, _mv_iq4_xs, None, ALL_COLS, k_mm_iq4_xs, k_mv_iq4_xs, mmid=k_mmid_iq4_xs,
                          row_dot1=_mv1_iq4_xs),
    IQ3_S: TypeTraitsCPU(_Q8_K, _mv_iq3_s, None, ALL_COLS, k_mm_iq3_s, k_mv_iq3_s, mmid=k_mmid_iq3_s,
                         row_dot1=_mv1_iq3_s),
    IQ3_XXS: TypeTraitsCPU(_Q8_K, _mv_iq3_xxs, None, ALL_COLS, k_mm_iq3_xxs, k_mv_iq3_xxs, mmid=k_mmid_iq3_xxs,
                           row_dot1=_mv1_iq3_xxs),
    IQ2_XXS: TypeTraitsCPU(_Q8_K, _mv_iq2_xxs, None, ALL_COLS, k_mm_iq2_xxs, k_mv_iq2_xxs, mmid=k_mmid_iq2_xxs,
                           row_dot1=_mv1_iq2_xxs),
    IQ2_XS: TypeTraitsCPU(_Q8_K, _mv_iq2_xs, None, ALL_COLS, k_mm_iq2_xs, k_mv_iq2_xs, mmid=k_mmid_iq2_xs,
                          row_dot1=_mv1_iq2_xs),
    IQ2_S: TypeTraitsCPU(_Q8_K, _mv_iq2_s, None, ALL_COLS, k_mm_iq2_s, k_mv_iq2_s, mmid=k_mmid_iq2_s,
                         row_dot1=_mv1_iq2_s),
}
#: the types with fused integer row dots (the numpy path's decode products)
FUSED = frozenset(t for t, tr in TYPE_TRAITS_CPU.items() if tr.row_dot is not None)
#: FUSED's column limits (test and bench figures read them by type)
MATVEC_MAX_COLS = {t: TYPE_TRAITS_CPU[t].matvec_max_cols for t in FUSED}


def traits(ty: GGMLType) -> TypeTraitsCPU:
    """The row of ``ty`` (an empty row for a type the CPU runs only through numpy and the codecs)."""
    return TYPE_TRAITS_CPU.get(ty, _NONE)


_NONE = TypeTraitsCPU()
