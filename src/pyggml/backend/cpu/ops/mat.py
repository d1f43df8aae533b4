"""Matrix kernels: MUL_MAT, MUL_MAT_ID, OUT_PROD, ADD_ID.

MUL_MAT follows ggml's numerics through BLAS: src1 is first converted to the weight's
``vec_dot_type`` (fp16/bf16 rounding, or Q8_0/Q8_1/Q8_K quantization, see actquant) and the
weight is dequantized in row tiles, so the float dot of the two equals ggml's integer dot up to
summation order. A big weight is never dequantized whole: tiles of about 1 M floats keep the
temporary small and the BLAS calls large.

Builders: pyggml/ops/mat.py (the same family).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Sequence

import numpy as np

from .... import quants
from ....ops.enums import Op
from ....tensor import Tensor
from ....types import GGMLType
from .. import blas
from .._common import F16, F32, FLOAT_TYPES, I32, KernelInputError, load_f32, require_types, shape4, unsupported
from ..kernel_table import kernel
from ..quants.actquant import fake_quant
from ..quants.dots import widen_f16
from ..simd import round_to_f16
from ..traits import traits
from . import mat_q

#: floats of dequantized weight per tile
_TILE_FLOATS = 1 << 20
#: op_params[1] of MUL_MAT (ggml_mul_mat_set_hint): src0 is a Hadamard matrix
GGML_HINT_SRC0_IS_HADAMARD = 1
#: float-weight products with many rows: rows of x per sgemm call (4 per attention product of a 512-token
#: batch with 4 heads, so 2 threads take 2 each)
_X_BLOCK_ROWS = 512
#: up to this many src1 rows per weight plane, BLAS runs on one thread (see blas.py)
_MATVEC_ROWS = 4


def _vec_dot_type(ty: GGMLType) -> GGMLType:
    if ty in FLOAT_TYPES:
        return ty
    return quants.get_codec(ty).vec_dot_type


def _weight_rows_f32(w: np.ndarray, ty: GGMLType) -> np.ndarray:
    """Stored weight rows (r, row) of type ``ty`` -> float32 (r, ne0)."""
    if ty == F32:
        return w
    if ty == F16:
        return w.astype(np.float32)
    if ty.is_quantized:
        return quants.dequantize(np.ascontiguousarray(w), ty)
    from ....tensor_data import bf16_to_f32

    return bf16_to_f32(w)


def _check_mul_mat(node: Tensor, a: Tensor, b: Tensor) -> None:
    if not (a.type in FLOAT_TYPES or a.type.is_quantized):
        raise unsupported(node)
    require_types(node, b, FLOAT_TYPES)
    require_types(node, node, (F32,))
    if a.ne[0] != b.ne[0] or b.ne[2] % a.ne[2] or b.ne[3] % a.ne[3]:
        raise KernelInputError(f"MUL_MAT: cannot multiply {a.ne} by {b.ne}")


def weight_product(w: np.ndarray, ty: GGMLType, x: np.ndarray, n_threads: int) -> np.ndarray:
    """x (N, k) float32 times the weight rows w (m, stored row) of type ``ty`` -> (N, m) float32, as ggml.

    Quantized weights go through the matmul package: fused integer dot products against x quantized to the
    weight's vec_dot_type for few columns, dequantized row tiles through BLAS for many. Float
    weights quantize x to their vec_dot_type (F16/BF16 rounding) and use BLAS on row tiles; for
    big products (attention's KQ and KQV with an F16 cache) the rounding and fixed blocks of x's
    rows are shared between our threads, each running a one-thread sgemm into the result.

    The result is this thread's scratch buffer (mat_q.scratch), overwritten by the next call:
    callers copy it into the destination right away. Reusing it (and the rounded activations and
    widened weight below) saves the page faults of fresh multi-MB arrays on every product.
    """
    n, k = x.shape
    m = w.shape[0]
    _wait_for_warm_up(ty, n)
    out = mat_q.scratch("wp_out", (n, m))
    if ty.is_quantized:
        return mat_q.mul_mat_q(w, ty, x, out, n_threads)
    matvec = n <= _MATVEC_ROWS
    # big products: x's rows split between our threads (mat_q.parallel_ranges), one-thread
    # sgemm each, as the quantized tiles do; OpenBLAS's own threads wait for each other at every
    # call and lost to one thread whenever the other core was busy
    nt = 1 if matvec or 2 * n * m * k < mat_q.BLAS_PARALLEL_MIN_FLOPS else n_threads
    vdt = _vec_dot_type(ty)
    if vdt == F16:  # ggml rounds src1 to fp16, here into scratch
        x = round_to_f16(x, mat_q.scratch("wp_x", (n, k)))
    elif vdt != F32:
        x = fake_quant(np.ascontiguousarray(x), vdt)
    else:
        x = np.ascontiguousarray(x, dtype=np.float32)
    # OpenBLAS on one thread always: its own threads spin after each call and took the cores from ours
    # (a KV stream per sequence makes many small attention products: every op of the step ran 1.6x slower)
    blas.set_threads(1)
    tile = max(16, _TILE_FLOATS // max(k, 1))
    for r0 in range(0, m, tile):
        r1 = min(m, r0 + tile)
        rows = w[r0:r1]
        if ty == F16 and rows.dtype == np.float16:
            wf = widen_f16(rows, mat_q.scratch("wp_w", (r1 - r0, k)))
        else:
            wf = _weight_rows_f32(rows, ty)

        def blocks(b0: int, b1: int, wf: np.ndarray = wf, r0: int = r0, r1: int = r1) -> None:
            # fixed blocks of x rows, whatever nt (parallel_ranges hands one thread all blocks at
            # once): sgemm's result for a row depends on how the rows were cut, so the cut must
            # not change with the thread count
            for i0 in range(b0 * _X_BLOCK_ROWS, min(n, b1 * _X_BLOCK_ROWS), _X_BLOCK_ROWS):
                i1 = min(n, i0 + _X_BLOCK_ROWS)
                np.matmul(x[i0:i1], wf.T, out=out[i0:i1, r0:r1])

        nblk = (n + _X_BLOCK_ROWS - 1) // _X_BLOCK_ROWS
        mat_q.parallel_ranges(blocks, nblk, nt, nblk)
    return out


#: (weight type, prompt path?) -> the warm-up process compiling that path's numba functions, or None where this
#: process compiled them itself (warm_aside)
_warming: dict[tuple[GGMLType, bool], subprocess.Popen | None] = {}
#: rough compile costs of a first run's numba functions, in units of about 0.3 CPU s (measured on a 2-core EPYC): a
#: K-quant's one-row dots (mat_q.row_dot) 3, another type's 1; the activation quantizer the products of one
#: vec_dot_type share, Q8_K 1 and Q8_0 2; a helper process spends about 2 starting
_K_QUANT_COST, _OTHER_COST, _HELPER_START_COST = 3, 1, 2
_QUANTIZER_COST = {GGMLType.Q8_K: 1, GGMLType.Q8_0: 2}


def _matvec_max(ty: GGMLType) -> int:
    """The most columns a product of a ``ty`` weight takes on its decode path (mat_q.mul_mat_q, weight_product)."""
    return traits(ty).matvec_max_cols if ty.is_quantized else _MATVEC_ROWS


def _prompt_path(ty: GGMLType, n_cols: int) -> bool:
    """Whether a product of ``n_cols`` columns takes the prompt path (dequantized tiles and BLAS)."""
    return n_cols > _matvec_max(ty)


def _compile_cost(paths: Sequence[tuple[GGMLType, bool]]) -> int:
    """The compile cost of paths of one vec_dot_type: their row dots and, once, their activation quantizer."""
    dots = sum(_K_QUANT_COST if ty.name.endswith("_K") else _OTHER_COST for ty, _ in paths)
    return dots + _QUANTIZER_COST.get(_vec_dot_type(paths[0][0]), 0)


def warm_aside(nodes: Iterable[Tensor]) -> None:
    """A first run (jit.deferring) runs its products on this module's Python kernels, whose numba functions
    (the row dots, the activation quantizers, the dequantizers) would compile one after another as the run
    reaches them: most of its wait for a first token. The paths ``nodes``' MUL_MATs take (weight type, decode or
    prompt) are shared out between this process, which compiles its share now, and a helper process, which
    fills numba's disk cache with the rest (longest compile first, each to the side that is free sooner); a
    product whose path the helper has not finished waits for it (_wait_for_warm_up) instead of compiling the
    same functions a second time."""
    paths = [(n.src[0].type, _prompt_path(n.src[0].type, n.src[1].ne[1] * n.src[1].ne[2] * n.src[1].ne[3]))
             for n in nodes if n.op == Op.MUL_MAT and n.src[0].type != F32]
    paths = [p for p in dict.fromkeys(paths) if p not in _warming]
    if not paths:
        return
    groups: dict[GGMLType, list[tuple[GGMLType, bool]]] = {}
    for p in paths:
        groups.setdefault(_vec_dot_type(p[0]), []).append(p)
    # the paths sharing an activation quantizer go to one side together (it compiles once) where there are two
    # such groups or more; paths of one group are shared out one by one (the row dots are the larger part)
    units = list(groups.values()) if len(groups) > 1 else [[p] for p in paths]
    mine: list[tuple[GGMLType, bool]] = []
    aside: list[tuple[GGMLType, bool]] = []
    load = [0, _HELPER_START_COST]
    for unit in sorted(units, key=lambda u: -_compile_cost(u)):
        side = 0 if load[0] <= load[1] else 1
        load[side] += _compile_cost(unit)
        (mine if side == 0 else aside).extend(unit)
    proc = None
    if aside:
        from .. import jit

        spec = [(t.name, prompt) for t, prompt in aside]
        # deferring there too, so that it compiles the row dots this process will call (mat_q.row_dot)
        proc = jit.run_aside(f"from {jit.__name__} import set_background_default; set_background_default('all'); "
                             f"from {__name__} import warm; warm({spec!r})")
    _warming.update(dict.fromkeys(aside, proc))
    _warming.update(dict.fromkeys(mine))
    warm([(t.name, prompt) for t, prompt in mine])


def _wait_for_warm_up(ty: GGMLType, n_cols: int) -> None:
    """Wait for the warm-up process compiling this product's path, if one still is (warm_aside)."""
    proc = _warming.get((ty, _prompt_path(ty, n_cols))) if _warming else None
    if proc is not None:
        proc.wait()


def warm(paths: Sequence[tuple[str, bool]]) -> None:
    """Run weight_product once per (weight type name, prompt path?): on one row for a decode, on one row more than
    the type's mat-vec takes for a prompt; what compiles every numba function that path calls."""
    k = 256
    for name, prompt in paths:
        ty = GGMLType[name]
        w = np.zeros((4, k // ty.blck_size * ty.type_size), np.uint8)
        w.flags.writeable = False  # as a model's mmapped weights
        weight_product(w, ty, np.zeros((_matvec_max(ty) + 1 if prompt else 1, k), np.float32), 1)


@kernel(Op.MUL_MAT)
def mul_mat(node: Tensor, n_threads: int) -> None:
    """dst[n, m] = dot(src0 row m, src1 row n) per (i2, i3); src0 broadcasts over dims 2 and 3.

    Source plane i02 = i12 / (ne12/ne02), so consecutive src1 planes share a weight plane (GQA):
    all src1 rows that use one weight plane are multiplied together.
    """
    a, b = node.src[0], node.src[1]
    if node.get_op_params_i32(1) == GGML_HINT_SRC0_IS_HADAMARD:
        _hadamard(node, b)
        return
    _check_mul_mat(node, a, b)
    ne03, ne02, m, k = shape4(a)
    ne13, ne12, n, _ = shape4(b)
    r2, r3 = ne12 // ne02, ne13 // ne03
    # rows of src1 grouped by weight plane: (ne03, r3, ne02, r2, n, k) -> per plane (r3*r2*n, k)
    xg = load_f32(b).reshape(ne03, r3, ne02, r2, n, k)
    out4 = node.view4()
    # dst is normally a fresh contiguous tensor; otherwise compute into a buffer and copy back
    direct = out4.flags.c_contiguous
    out = out4.reshape(ne03, r3, ne02, r2, n, m) if direct else np.empty((ne03, r3, ne02, r2, n, m), np.float32)
    w4 = a.view4()
    for i3 in range(ne03):
        for i2 in range(ne02):
            res = weight_product(w4[i3, i2], a.type, xg[i3, :, i2].reshape(-1, k), n_threads)
            out[i3, :, i2] = res.reshape(r3, r2, n, m)
    if not direct:
        out4[...] = out.reshape(out4.shape)


def _hadamard(node: Tensor, b: Tensor) -> None:
    """MUL_MAT with hint SRC0_IS_HADAMARD: src0 is a Sylvester Hadamard matrix, so ggml skips the
    product and runs a fast Walsh-Hadamard transform of each src1 row (F32, or F16 widened), scaled by 1/sqrt(n)."""
    require_types(node, b, (F32, F16))
    n = b.ne[0]
    if n & (n - 1):
        raise KernelInputError(f"MUL_MAT (Hadamard hint): row length {n} is not a power of 2")
    y = load_f32(b) * (np.float32(1.0) / np.sqrt(np.float32(n)))
    length = 1
    while length < n:  # butterflies: (u, v) -> (u + v, u - v), elementwise as ggml
        blk = y.reshape(*y.shape[:-1], n // (2 * length), 2, length)
        u, v = blk[..., 0, :], blk[..., 1, :]
        y = np.stack([u + v, u - v], axis=-2).reshape(y.shape)
        length *= 2
    node.view4()[...] = y


@kernel(Op.MUL_MAT_ID)
def mul_mat_id(node: Tensor, n_threads: int) -> None:
    """Mixture-of-experts matmul: dst[:, e, t] = as[:, :, ids[e, t]] · b[:, e % b.ne1, t].

    src0 = as [k, m, n_expert], src1 = b [k, n_used or 1, n_tokens], src2 = ids I32 [n_used, n_tokens];
    dst F32 [m, n_used, n_tokens]. The rows routed to one expert are multiplied together.
    """
    w, b, ids_t = node.src[0], node.src[1], node.src[2]
    if not (w.type in FLOAT_TYPES or w.type.is_quantized):
        raise unsupported(node)
    require_types(node, b, FLOAT_TYPES)
    require_types(node, ids_t, (I32,))
    require_types(node, node, (F32,))
    _, n_expert, _, k = shape4(w)
    _, n_tok, nb1, _ = shape4(b)
    ids = ids_t.view4()[0, 0]  # (n_tokens, n_used)
    n_used = ids.shape[1]
    if b.ne[0] != k or n_used % nb1 or ids.shape[0] != n_tok:
        raise KernelInputError(f"MUL_MAT_ID: as {w.ne}, b {b.ne} and ids {ids_t.ne} do not fit")
    _check_rows_index(ids, n_expert, "MUL_MAT_ID")
    x = load_f32(b)[0]  # (n_tok, nb1, k)
    out = node.view4()[0]  # (n_tok, n_used, m)
    w4 = w.view4()[0]  # (n_expert, m, row)
    tok, slot = np.meshgrid(np.arange(n_tok), np.arange(n_used), indexing="ij")
    for e in np.unique(ids):
        sel = ids == e
        t_sel, s_sel = tok[sel], slot[sel]
        res = weight_product(w4[e], w.type, np.ascontiguousarray(x[t_sel, s_sel % nb1]), n_threads)
        out[t_sel, s_sel] = res


@kernel(Op.ADD_ID)
def add_id(node: Tensor, n_threads: int) -> None:
    """dst[i0, i1, i2] = a[i0, i1, i2] + b[i0, ids[i1, i2]] (per-expert bias); F32 with I32 ids."""
    a, b, ids_t = node.src[0], node.src[1], node.src[2]
    require_types(node, a, (F32,))
    require_types(node, b, (F32,))
    require_types(node, ids_t, (I32,))
    ids = ids_t.view4()[0]  # (ne2, ne1)
    _check_rows_index(ids, b.ne[1], "ADD_ID")
    rows = b.view4()[0, 0]  # (n_expert, ne0)
    node.view4()[...] = a.view4() + rows[ids][None]


@kernel(Op.OUT_PROD)
def out_prod(node: Tensor, n_threads: int) -> None:
    """dst[i0, i1] = sum_j src0[i0, j] * src1[i1, j] per plane; src0 planes broadcast over dst planes."""
    a, b = node.src[0], node.src[1]
    if not (a.type in FLOAT_TYPES or a.type.is_quantized):
        raise unsupported(node)
    require_types(node, b, (F32,))
    require_types(node, node, (F32,))
    ne03, ne02, _, _ = shape4(a)
    ne13, ne12, _, _ = shape4(b)
    if ne12 % ne02 or ne13 % ne03:
        raise KernelInputError(f"OUT_PROD: cannot broadcast {a.ne} over {b.ne}")
    x = load_f32(a)  # (ne03, ne02, j, ne00)
    y = b.view4()  # (ne13, ne12, j, ne10)
    xb = np.repeat(np.repeat(x, ne12 // ne02, axis=1), ne13 // ne03, axis=0)
    node.view4()[...] = np.matmul(np.swapaxes(y, -1, -2), xb)


def _check_rows_index(idx: np.ndarray, limit: int, op: str) -> None:
    if idx.size and (idx.min() < 0 or idx.max() >= limit):
        bad = idx[(idx < 0) | (idx >= limit)][0]
        raise KernelInputError(f"{op}: row index {int(bad)} out of range [0, {limit})")

