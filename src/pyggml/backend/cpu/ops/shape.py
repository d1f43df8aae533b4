"""Kernels that move, repeat or mask data: REPEAT, REPEAT_BACK, CONCAT, ACC, SET, DIAG,
DIAG_MASK_*, TRI, ARANGE, TIMESTEP_EMBEDDING, ROLL, WIN_PART, WIN_UNPART.

Pure data movement works on the raw stored values (bf16 bits, quantized bytes) so nothing is
rounded that ggml would copy bit for bit.

Builders: pyggml/ops/shape.py (the same family).
"""

from __future__ import annotations

import numpy as np

from .... import memory
from ....ops.enums import Op
from ....tensor import Tensor
from .._common import (
    F32,
    FLOAT_TYPES,
    I16,
    I32,
    KernelInputError,
    require_f32,
    require_types,
    shape4,
    store,
    unsupported,
)
from ..kernel_table import kernel


@kernel(Op.REPEAT)
def repeat(node: Tensor, n_threads: int) -> None:
    """Tile src0 to dst's shape (each dst ne is a whole multiple of src's)."""
    a = node.src[0]
    require_types(node, a, (*FLOAT_TYPES, I16, I32))
    reps = []
    for have, want in zip(shape4(a), shape4(node), strict=True):
        if have == 0 or want % have:
            raise KernelInputError(f"REPEAT: {a.ne} cannot be repeated to {node.ne}")
        reps.append(want // have)
    node.view4()[...] = np.tile(a.view4(), reps)


@kernel(Op.REPEAT_BACK)
def repeat_back(node: Tensor, n_threads: int) -> None:
    """Sum the repetitions of src0 back into dst's shape (the gradient of REPEAT)."""
    a = node.src[0]
    require_f32(node, a)
    n3, n2, n1, n0 = shape4(node)
    s3, s2, s1, s0 = shape4(a)
    if any(s % d for s, d in ((s3, n3), (s2, n2), (s1, n1), (s0, n0))):
        raise KernelInputError(f"REPEAT_BACK: {a.ne} is not a repetition of {node.ne}")
    x = np.ascontiguousarray(a.view4()).reshape(s3 // n3, n3, s2 // n2, n2, s1 // n1, n1, s0 // n0, n0)
    node.view4()[...] = x.sum(axis=(0, 2, 4, 6), dtype=np.float32)


@kernel(Op.CONCAT)
def concat(node: Tensor, n_threads: int) -> None:
    """Concatenate src0 and src1 along op_params i32[0] = dim (any type; bytes for quantized rows)."""
    a, b = node.src[0], node.src[1]
    if a.type != b.type or node.type != a.type:
        raise unsupported(node, "CONCAT operands must share one type")
    dim = node.get_op_params_i32(0)
    if not 0 <= dim < 4:
        raise KernelInputError(f"CONCAT: dim {dim} out of range")
    node.view4()[...] = np.concatenate([a.view4(), b.view4()], axis=3 - dim)


def _strided(addr: int, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int, dtype: np.dtype) -> np.ndarray:
    """A numpy view of real memory at ``addr`` with explicit byte strides (ACC/SET's re-viewed dst)."""
    extent = itemsize + sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) if all(shape) else 0
    region, off = memory.find_region(addr, extent)
    return np.ndarray(shape, dtype=dtype, buffer=region, offset=off, strides=strides)


def _acc_or_set(node: Tensor, accumulate: bool) -> None:
    a, b = node.src[0], node.src[1]
    allowed = (F32,) if accumulate else (F32, I32)
    require_types(node, a, allowed)
    require_types(node, b, (a.type,))
    nb1, nb2, nb3, offset, inplace = (node.get_op_params_i32(i) for i in range(5))
    esize = a.type.type_size
    shape = shape4(b)
    strides = (nb3, nb2, nb1, esize)
    extent = offset + sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) + esize
    if any(n == 0 for n in shape):
        extent = 0
    if extent > node.nbytes():
        raise KernelInputError(
            f"{node.op.name}: view of {b.ne} at offset {offset} with strides {strides} "
            f"exceeds dst ({node.nbytes()} bytes)"
        )
    if not inplace:
        node.view4()[...] = a.view4()
    dtype = a.view4().dtype
    dst_view = _strided(node.data + offset, shape, strides, esize, dtype)
    if accumulate:
        src_view = _strided(a.data + offset, shape, strides, esize, dtype) if not inplace else dst_view
        dst_view[...] = src_view + b.view4()
    else:
        dst_view[...] = b.view4()


@kernel(Op.ACC)
def acc(node: Tensor, n_threads: int) -> None:
    """dst = a; view(dst, nb1, nb2, nb3, offset) += b (op_params i32 {nb1, nb2, nb3, offset, inplace})."""
    _acc_or_set(node, accumulate=True)


@kernel(Op.SET)
def set_(node: Tensor, n_threads: int) -> None:
    """dst = a; view(dst, nb1, nb2, nb3, offset) = b (F32 and I32, as ggml)."""
    _acc_or_set(node, accumulate=False)


@kernel(Op.DIAG)
def diag(node: Tensor, n_threads: int) -> None:
    """A row vector [n,1,..] becomes the diagonal of an [n,n,..] matrix."""
    a = node.src[0]
    require_f32(node, a)
    x = a.view4()  # (ne3, ne2, 1, n)
    n = a.ne[0]
    out = np.zeros(shape4(node), dtype=np.float32)
    out[..., np.arange(n), np.arange(n)] = x[:, :, 0, :]
    node.view4()[...] = out


def _diag_mask(node: Tensor, value: float) -> None:
    a = node.src[0]
    require_f32(node, a)
    n_past = node.get_op_params_i32(0)
    if n_past < 0:
        raise KernelInputError(f"{node.op.name}: n_past must be >= 0, got {n_past}")
    x = a.view4()
    cols = np.arange(a.ne[0])[None, :]
    rows = np.arange(a.ne[1])[:, None]
    masked = cols > n_past + rows
    node.view4()[...] = np.where(masked, np.float32(value), x)


@kernel(Op.DIAG_MASK_INF)
def diag_mask_inf(node: Tensor, n_threads: int) -> None:
    """Elements with column > n_past + row become -inf (op_params i32[0] = n_past)."""
    _diag_mask(node, -np.inf)


@kernel(Op.DIAG_MASK_ZERO)
def diag_mask_zero(node: Tensor, n_threads: int) -> None:
    """Elements with column > n_past + row become 0."""
    _diag_mask(node, 0.0)


_TRI_KEEP = {
    0: lambda c, r: c >= r,  # UPPER_DIAG
    1: lambda c, r: c > r,  # UPPER
    2: lambda c, r: c <= r,  # LOWER_DIAG
    3: lambda c, r: c < r,  # LOWER
}


@kernel(Op.TRI)
def tri(node: Tensor, n_threads: int) -> None:
    """Zero everything outside a triangle; op_params i32[0] = ggml_tri_type."""
    a = node.src[0]
    require_f32(node, a)
    keep = _TRI_KEEP.get(node.get_op_params_i32(0))
    if keep is None:
        raise KernelInputError(f"TRI: invalid tri type {node.get_op_params_i32(0)}")
    cols = np.arange(a.ne[0])[None, :]
    rows = np.arange(a.ne[1])[:, None]
    node.view4()[...] = np.where(keep(cols, rows), a.view4(), np.float32(0.0))


@kernel(Op.ARANGE)
def arange(node: Tensor, n_threads: int) -> None:
    """dst[i] = start + step*i in float32; op_params f32 {start, stop, step}."""
    require_f32(node, node)
    start = np.float32(node.get_op_params_f32(0))
    step = np.float32(node.get_op_params_f32(2))
    i = np.arange(node.nelements()).astype(np.float32)
    node.view4()[...] = (start + step * i).reshape(shape4(node))


@kernel(Op.TIMESTEP_EMBEDDING)
def timestep_embedding(node: Tensor, n_threads: int) -> None:
    """Sinusoidal embedding: [cos(t f_j) | sin(t f_j)], f_j = exp(-ln(max_period) j / half); odd dim ends in 0."""
    a = node.src[0]
    require_f32(node, a)
    dim = node.get_op_params_i32(0)
    max_period = node.get_op_params_i32(1)
    half = dim // 2
    t = a.view4().reshape(-1)[: a.ne[0]].astype(np.float32)
    j = np.arange(half).astype(np.float32)
    freq = np.exp(np.float32(-np.log(np.float32(max_period))) * j / np.float32(half)).astype(np.float32)
    arg = t[:, None] * freq[None, :]
    out = np.zeros((a.ne[0], node.ne[0]), dtype=np.float32)
    out[:, :half] = np.cos(arg)
    out[:, half : 2 * half] = np.sin(arg)
    store(node, out.reshape(shape4(node)))


@kernel(Op.ROLL)
def roll(node: Tensor, n_threads: int) -> None:
    """Cyclic shift of every dim: dst[i] = src[(i - shift) mod ne]; op_params i32 shift0..shift3."""
    a = node.src[0]
    require_f32(node, a)
    shifts = [node.get_op_params_i32(i) for i in range(4)]
    node.view4()[...] = np.roll(a.view4(), shift=(shifts[3], shifts[2], shifts[1], shifts[0]), axis=(0, 1, 2, 3))


@kernel(Op.WIN_PART)
def win_part(node: Tensor, n_threads: int) -> None:
    """Split [C, W, H] into zero-padded w x w windows [C, w, w, npx*npy]; op_params i32 {npx, npy, w}."""
    a = node.src[0]
    require_f32(node, a)
    npx, npy, w = (node.get_op_params_i32(i) for i in range(3))
    x = a.view4()[0]  # (H, W, C)
    h, wd, ch = x.shape
    padded = np.zeros((npy * w, npx * w, ch), dtype=np.float32)
    padded[:h, :wd] = x
    win = padded.reshape(npy, w, npx, w, ch).transpose(0, 2, 1, 3, 4).reshape(npy * npx, w, w, ch)
    node.view4()[...] = win


@kernel(Op.WIN_UNPART)
def win_unpart(node: Tensor, n_threads: int) -> None:
    """Reassemble w x w windows [C, w, w, n] into [C, W, H] (the inverse of WIN_PART); op_params i32 {w}."""
    a = node.src[0]
    require_f32(node, a)
    w = node.get_op_params_i32(0)
    wd, h = node.ne[1], node.ne[2]
    npx = (wd + (w - wd % w) % w) // w
    x = a.view4()  # (n, w, w, C)
    npy = x.shape[0] // npx
    full = x.reshape(npy, npx, w, w, -1).transpose(0, 2, 1, 3, 4).reshape(npy * w, npx * w, -1)
    node.view4()[0] = full[:h, :wd]

