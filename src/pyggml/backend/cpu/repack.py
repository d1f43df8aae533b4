"""The CPU's extra buffer type "CPU_REPACK": weights interleaved at load for the compiled tile kernels.

ggml-cpu's CPU_REPACK (cpu/repack.cpp) rewrites Q4_0/Q4_K/IQ4_NL weights as groups of 8 interleaved
rows when they are set, so that its gemv/gemm kernels read one stream with no per-call shuffling.
This is the same idea for pyggml's kernels (jit/repacked.py), in layouts of our own:

* **Q4_K**, groups of 8 rows, per superblock (``Q4K_GROUP_BYTES`` = 1184 bytes for 8 rows, 148 a row
  against 144): the 8 rows' code words interleaved a u32 at a time (the 32 bytes at step p hold bytes
  4p..4p+3 of each row's qs, so one load gives two sub-blocks' 4 codes of all 8 rows in its two
  nibbles), then the 6-bit scales as bytes ``[sub-block][row]``, the mins as ``[pair][row][2]``, and
  the rows' fp16 d and dmin. The kernels no longer unpack the 12 packed scale bytes per call.
* **Q8_0, Q4_0, IQ4_NL**, groups of 4 rows (the register tile's height), same size as the source:
  per block the 4 rows' fp16 scales (one 8-byte load), then the 4 rows' codes. Q8_0 codes are
  stored offset to unsigned (``w ^ 0x80 = w + 128``) so vpdpbusd multiplies them by the signed
  activations directly; the 4-bit types keep their packed nibbles and go through a 16-byte table.

Every repacked product gives the bits of the kernels it replaces (the same integer sums and float
steps, tests compare them). A tensor stored here is repacked by ``set_tensor`` (whole tensors only,
as in ggml) and read back unpacked by ``get_tensor``, so saving or inspecting a loaded model still
sees the GGUF bytes. Which weights come here is the model loader's choice (llama.cpp's test op: a
weight whose MUL_MAT this buffer type supports), and ``--no-repack`` turns it off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ... import memory
from ...ops.enums import Op
from ...types import GGMLType
from ..base import BufferType
from ..errors import AllocationError, NotSupportedError
from .backend import _MALLOC_ALIGN, TENSOR_ALIGNMENT, CPUBuffer

if TYPE_CHECKING:
    from ...tensor import Tensor

#: rows interleaved per group, by type
GROUP_ROWS = {GGMLType.Q4_K: 8, GGMLType.Q8_0: 4, GGMLType.Q4_0: 4, GGMLType.IQ4_NL: 4}
#: bytes of one Q4_K superblock of a group of 8 rows: codes, scales, mins, d, dmin
Q4K_CODES, Q4K_SCALES, Q4K_MINS, Q4K_D, Q4K_DMIN = 0, 1024, 1088, 1152, 1168
Q4K_GROUP_BYTES = 1184
#: ggml's row-count rule for every repacked type (ne[1] % 8 == 0)
ROW_MULTIPLE = 8
#: source bytes repacked at a time (repack): a chunk's transposes stay in L2
_CHUNK_BYTES = 256 * 1024


def repacked_nbytes(ty: GGMLType, ne0: int, ne1: int) -> int:
    """Bytes of a repacked ne0 x ne1 weight (Q4_K grows by 4 bytes a superblock; the others keep their size)."""
    if ty == GGMLType.Q4_K:
        return ne1 // 8 * (ne0 // 256) * Q4K_GROUP_BYTES
    return ne1 * (ne0 // ty.blck_size) * ty.type_size


# ----------------------------------------------------------------------------------- layouts
def _q4k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sc, mn): the 8 six-bit scales and mins of each 12-byte Q4_K scale group (last axis), as uint8."""
    s = s.astype(np.uint8)
    lo, hi = s[..., 0:4], s[..., 4:8]
    top = s[..., 8:12]
    sc = np.concatenate([lo & 63, (top & 0xF) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([hi & 63, (top >> 4) | ((hi >> 6) << 4)], axis=-1)
    return sc, mn


def _q4k_pack_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """The inverse of _q4k_scales: 12 packed bytes from 8 six-bit scales and mins (every bit used once)."""
    out = np.empty((*sc.shape[:-1], 12), np.uint8)
    out[..., 0:4] = sc[..., 0:4] | ((sc[..., 4:8] >> 4) << 6)
    out[..., 4:8] = mn[..., 0:4] | ((mn[..., 4:8] >> 4) << 6)
    out[..., 8:12] = (sc[..., 4:8] & 0xF) | ((mn[..., 4:8] & 0xF) << 4)
    return out


def _split_last(a: np.ndarray, *shape: int) -> np.ndarray:
    """A view of ``a`` with its last axis split into ``shape``: always a view (a reshape of a strided slice
    could be a copy, and the writes into it would be lost)."""
    strides, step = [], a.strides[-1]
    for d in reversed(shape):
        strides.insert(0, step)
        step *= d
    return np.lib.stride_tricks.as_strided(a, a.shape[:-1] + shape, a.strides[:-1] + tuple(strides))


def _repack_q4_k(blk: np.ndarray, out: np.ndarray) -> None:
    """blk: (m, nsb, 144) Q4_K blocks -> out (m/8, nsb, 1184): repacked groups, written through strided views of
    ``out`` (no whole-tensor temporaries: a load repacks straight into the weight buffer)."""
    m, nsb, _ = blk.shape
    g = blk.reshape(m // 8, 8, nsb, 144)
    qs = np.ascontiguousarray(g[..., 16:144]).view(np.uint32)  # (G, 8, nsb, 32)
    _split_last(out[..., Q4K_CODES:Q4K_SCALES].view(np.uint32), 32, 8)[:] = qs.transpose(0, 2, 3, 1)
    sc, mn = _q4k_scales(g[..., 4:16])  # (G, 8, nsb, 8)
    _split_last(out[..., Q4K_SCALES:Q4K_MINS], 8, 8)[:] = sc.transpose(0, 2, 3, 1)
    _split_last(out[..., Q4K_MINS:Q4K_D], 4, 8, 2)[:] = mn.reshape(m // 8, 8, nsb, 4, 2).transpose(0, 2, 3, 1, 4)
    _split_last(out[..., Q4K_D:Q4K_DMIN], 8, 2)[:] = g[..., 0:2].transpose(0, 2, 1, 3)
    _split_last(out[..., Q4K_DMIN:], 8, 2)[:] = g[..., 2:4].transpose(0, 2, 1, 3)


def _unpack_q4_k(rp: np.ndarray, m: int, nsb: int) -> np.ndarray:
    rp = rp.reshape(m // 8, nsb, Q4K_GROUP_BYTES)
    g = np.empty((m // 8, 8, nsb, 144), np.uint8)
    codes = np.ascontiguousarray(rp[..., Q4K_CODES:Q4K_SCALES]).view(np.uint32).reshape(m // 8, nsb, 32, 8)
    g[..., 16:144] = np.ascontiguousarray(codes.transpose(0, 3, 1, 2)).view(np.uint8)
    sc = rp[..., Q4K_SCALES:Q4K_MINS].reshape(m // 8, nsb, 8, 8).transpose(0, 3, 1, 2)
    mn = rp[..., Q4K_MINS:Q4K_D].reshape(m // 8, nsb, 4, 8, 2).transpose(0, 3, 1, 2, 4).reshape(m // 8, 8, nsb, 8)
    g[..., 4:16] = _q4k_pack_scales(sc, mn)
    g[..., 0:2] = rp[..., Q4K_D:Q4K_DMIN].reshape(m // 8, nsb, 8, 2).transpose(0, 2, 1, 3)
    g[..., 2:4] = rp[..., Q4K_DMIN:].reshape(m // 8, nsb, 8, 2).transpose(0, 2, 1, 3)
    return g.reshape(m, nsb * 144)


def _repack_q0(blk: np.ndarray, flip: bool, out: np.ndarray) -> None:
    """blk: (m, nb, 2 + cb) Q8_0/Q4_0/IQ4_NL blocks -> out (m/4, nb, 4 * (2 + cb)): per block the 4 rows' fp16
    scales, then their codes (flip: Q8_0's offset to unsigned)."""
    m, nb, bb = blk.shape
    g = blk.reshape(m // 4, 4, nb, bb).transpose(0, 2, 1, 3)  # (G, nb, 4, bb)
    _split_last(out[..., :8], 4, 2)[:] = g[..., 0:2]
    codes = _split_last(out[..., 8:], 4, bb - 2)
    codes[:] = g[..., 2:]
    if flip:
        codes ^= np.uint8(0x80)


def _unpack_q0(rp: np.ndarray, m: int, nb: int, bb: int, flip: bool) -> np.ndarray:
    rp = rp.reshape(m // 4, nb, 4 * bb)
    g = np.empty((m // 4, nb, 4, bb), np.uint8)
    g[..., 0:2] = rp[..., :8].reshape(m // 4, nb, 4, 2)
    g[..., 2:] = rp[..., 8:].reshape(m // 4, nb, 4, bb - 2)
    if flip:
        g[..., 2:] ^= np.uint8(0x80)
    return g.transpose(0, 2, 1, 3).reshape(m, nb * bb)


def repack(ty: GGMLType, raw: np.ndarray, ne0: int, ne1: int, out: np.ndarray | None = None) -> np.ndarray:
    """The repacked bytes of an ne0 x ne1 weight whose GGUF bytes are ``raw`` (uint8), written into ``out``
    (uint8, repacked_nbytes long) when given."""
    nb = ne0 // ty.blck_size
    blk = raw.reshape(ne1, nb, ty.type_size)
    n = repacked_nbytes(ty, ne0, ne1)
    out = np.empty(n, np.uint8) if out is None else out
    if out.nbytes != n:
        raise ValueError(f"repack: the output holds {out.nbytes} bytes, the repacked {ty.name} weight {n}")
    rows = GROUP_ROWS[ty]
    dst = out.reshape(ne1 // rows, nb, -1)
    step = max(1, _CHUNK_BYTES // (rows * nb * ty.type_size))  # row groups a chunk
    for g0 in range(0, ne1 // rows, step):
        src, into = blk[g0 * rows : (g0 + step) * rows], dst[g0 : g0 + step]
        if ty == GGMLType.Q4_K:
            _repack_q4_k(src, into)
        else:
            _repack_q0(src, ty == GGMLType.Q8_0, into)
    return out


def unpack(ty: GGMLType, packed: np.ndarray, ne0: int, ne1: int) -> np.ndarray:
    """The GGUF bytes of a repacked weight (repack's inverse)."""
    nb = ne0 // ty.blck_size
    if ty == GGMLType.Q4_K:
        return _unpack_q4_k(packed, ne1, nb).reshape(-1)
    return _unpack_q0(packed, ne1, nb, ty.type_size, ty == GGMLType.Q8_0).reshape(-1)


# ----------------------------------------------------------------------------- buffer type
def _has_layout(t: Tensor) -> bool:
    """Whether this CPU's kernels have a repacked layout for weight ``t`` (type, 2-D, rows)."""
    from .quants import repacked  # the kernels decide what this CPU runs

    return (t.type in repacked.TYPES and t.ne[2] == 1 and t.ne[3] == 1 and t.ne[1] % ROW_MULTIPLE == 0
            and t.ne[0] % t.type.blck_size == 0)


def repackable(t: Tensor) -> bool:
    """Whether weight ``t`` can be repacked now: a layout, and the compiled kernels on (not PYGGML_JIT=0)."""
    from .quants import repacked

    return _has_layout(t) and repacked.enabled()


def in_repack_buffer(t: Tensor | None) -> bool:
    """Whether ``t`` (or the tensor it views) lives in a CPU_REPACK buffer."""
    if t is None:
        return False
    base = t.view_src if t.view_src is not None else t
    return base.buffer is not None and isinstance(base.buffer.buft, CPURepackBufferType)


def is_repacked(t: Tensor | None) -> bool:
    """Whether ``t``'s bytes are in a repacked layout (it lives in a CPU_REPACK buffer and has a layout)."""
    return in_repack_buffer(t) and _has_layout(t.view_src if t.view_src is not None else t)


def supports_op(op: Tensor) -> bool:
    """The ops the repacked kernels compute (ggml's extra_buffer_type::supports_op): MUL_MAT of a whole
    repacked 2-D weight by F32 rows into a contiguous F32 result, without the Hadamard hint. The weight may
    also be in no buffer yet (llama.cpp's placement test op)."""
    a, b = op.src[0], op.src[1]
    return (op.op == Op.MUL_MAT and a is not None and b is not None and a.view_src is None and repackable(a)
            and b.type == GGMLType.F32 and b.nb[0] == 4 and op.type == GGMLType.F32 and op.is_contiguous()
            and op.get_op_params_i32(1) == 0 and a.ne[0] == b.ne[0])


def check_op(op: Tensor) -> None:
    """Raise when ``op`` reads a repacked tensor and is not an op the repacked kernels compute (any other
    kernel would read the interleaved bytes as if they were the tensor's)."""
    if any(is_repacked(s) for s in op.src if s is not None) and not supports_op(op):
        names = ", ".join(repr(s.name) for s in op.src if is_repacked(s))
        raise NotSupportedError(f"{op.op.name} node {op.name!r} reads the repacked weight {names} (CPU_REPACK "
                                "buffer), which only a MUL_MAT by F32 rows into a contiguous F32 result can read "
                                "with the compiled kernels on; load the model with repacking off (--no-repack, "
                                "Model(..., use_extra_bufts=False))")


class CPURepackBuffer(CPUBuffer):
    """Host memory whose weights are stored repacked: written whole, read back in GGUF layout."""

    def _check_whole(self, tensor: Tensor, offset: int, size: int, what: str) -> None:
        if offset != 0 or size != tensor.nbytes():
            raise NotSupportedError(f"CPU_REPACK tensor {tensor.name!r}: {what} must cover the whole tensor "
                                    f"({tensor.nbytes()} bytes), not {size} bytes at offset {offset}")

    def set_tensor(self, tensor: Tensor, data: np.ndarray, offset: int, size: int) -> None:
        if not _has_layout(tensor):
            super().set_tensor(tensor, data, offset, size)
            return
        self._check_whole(tensor, offset, size, "set_tensor")
        n = repacked_nbytes(tensor.type, tensor.ne[0], tensor.ne[1])
        repack(tensor.type, np.asarray(data[:size], np.uint8), tensor.ne[0], tensor.ne[1],
               out=memory.region_view(tensor.data, n))

    def get_tensor(self, tensor: Tensor, data: np.ndarray, offset: int, size: int) -> None:
        if not _has_layout(tensor):
            super().get_tensor(tensor, data, offset, size)
            return
        n = repacked_nbytes(tensor.type, tensor.ne[0], tensor.ne[1])
        raw = unpack(tensor.type, memory.region_view(tensor.data, n), tensor.ne[0], tensor.ne[1])
        data[:size] = raw[offset : offset + size]

    def memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        if _has_layout(tensor):
            raise NotSupportedError(f"CPU_REPACK tensor {tensor.name!r}: memset is not supported (set it whole)")
        super().memset_tensor(tensor, value, offset, size)

    def cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        return False  # the scheduler bounces through get/set, which repack


class CPURepackBufferType(BufferType):
    """"CPU_REPACK": not host memory to other backends (its bytes are not the tensors' layout), as in ggml."""

    def name(self) -> str:
        return "CPU_REPACK"

    def _alloc_buffer(self, size: int) -> CPURepackBuffer:
        try:
            mem = memory.aligned_empty(size, _MALLOC_ALIGN)
        except (MemoryError, ValueError) as e:
            raise AllocationError(f"failed to allocate CPU_REPACK buffer of size {size}") from e
        memory.register(mem)
        return CPURepackBuffer(self, mem, owned=True)

    def get_alignment(self) -> int:
        return TENSOR_ALIGNMENT

    def get_alloc_size(self, tensor: Tensor) -> int:
        if _has_layout(tensor):
            return repacked_nbytes(tensor.type, tensor.ne[0], tensor.ne[1])
        return tensor.nbytes()

    def is_host(self) -> bool:
        return False

    def supports_op(self, op: Tensor) -> bool:
        return supports_op(op)


def available() -> bool:
    """Whether this CPU has any repacked kernel and the compiled kernels are on."""
    from .quants import repacked

    return bool(repacked.TYPES) and repacked.enabled()


_repack_buft = CPURepackBufferType()


def repack_buffer_type() -> CPURepackBufferType:
    """The one CPU_REPACK buffer type (ggml_backend_cpu_repack_buffer_type)."""
    if _repack_buft.device is None:
        from .backend import _cpu_device

        _repack_buft.device = _cpu_device
    return _repack_buft


__all__ = [
    "CPURepackBuffer",
    "CPURepackBufferType",
    "available",
    "check_op",
    "is_repacked",
    "repack",
    "repack_buffer_type",
    "repackable",
    "repacked_nbytes",
    "supports_op",
    "unpack",
]
