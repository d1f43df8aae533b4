"""Byte-level helpers shared by the codecs: block views, fp16 fields, packing, data tables.

Codecs compute per-block scales and per-element levels in numba, then lay the bytes out here
with numpy; keeping layout apart from the search lets a reference quantizer and its
importance-weighted variant share one packer.
"""

from __future__ import annotations

import re
from importlib import resources

import numpy as np

from .fp import fp16_bits_to_fp32, fp32_to_fp16_bits


def load_table(name: str) -> np.ndarray:
    """One of the integer tables in ``quants/data`` as int64: numbers (decimal or 0x hex) separated
    by commas or white space; lines starting with ``#`` are headers."""
    text = resources.files(__package__).joinpath("data", name).read_text()
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return np.array([int(tok, 0) for tok in re.split(r"[\s,]+", body) if tok], dtype=np.int64)


def as_blocks(q: np.ndarray, type_size: int) -> np.ndarray:
    """uint8 (n_rows, row_bytes) -> uint8 (n_rows, n_blocks, type_size), a view."""
    n_rows, row_bytes = q.shape
    return q.reshape(n_rows, row_bytes // type_size, type_size)


def read_fp16(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The little-endian fp16 field at ``offset`` of every block, widened to float32."""
    raw = np.ascontiguousarray(blocks[..., offset : offset + 2])
    return fp16_bits_to_fp32(raw.view("<u2")[..., 0])


def fp16_bytes(x: np.ndarray) -> np.ndarray:
    """float32 array (...) -> its fp16 encoding as uint8 (..., 2), ready to drop into a block."""
    bits = np.ascontiguousarray(fp32_to_fp16_bits(x).astype("<u2"))
    return bits.view(np.uint8).reshape(*bits.shape, 2)


def put_fields(out: np.ndarray, fields: list[tuple[int, np.ndarray]]) -> np.ndarray:
    """Write byte fields (offset, uint8 (n_rows, n_blocks, width)) into the blocks out (n_rows, n_blocks,
    type_size); together they must cover every byte of a block."""
    covered = 0
    for offset, data in fields:
        width = data.shape[-1]
        out[..., offset : offset + width] = data
        covered += width
    if covered != out.shape[-1]:
        raise AssertionError(f"block fields cover {covered} of {out.shape[-1]} bytes")
    return out


def assemble(n_rows: int, n_blocks: int, type_size: int, fields: list[tuple[int, np.ndarray]]) -> np.ndarray:
    """Rows of whole blocks (n_rows, n_blocks * type_size) made of byte fields (see put_fields)."""
    out = put_fields(np.empty((n_rows, n_blocks, type_size), dtype=np.uint8), fields)
    return out.reshape(n_rows, n_blocks * type_size)


def pack_nibbles(levels: np.ndarray) -> np.ndarray:
    """(..., 2h) levels -> (..., h) bytes: element j in the low nibble, element j+h in the high one.

    Levels are OR-ed unmasked, as ggml's ``qs[j] = L[j] | (L[j+16] << 4)`` does, so an
    out-of-range level corrupts its neighbour exactly as it would in ggml.
    """
    h = levels.shape[-1] // 2
    lo = levels[..., :h].astype(np.uint8)
    hi = levels[..., h:].astype(np.uint8)
    return lo | (hi << np.uint8(4))


def pack_bits(bits: np.ndarray) -> np.ndarray:
    """(..., 8k) booleans/0-1 -> (..., k) bytes, element j at bit j%8 of byte j//8 (LSB first)."""
    return np.packbits(bits.astype(np.uint8), axis=-1, bitorder="little")
