"""Torch decoders for the block formats worth decoding on the device (Q8_0, Q4_0).

They follow ggml's reference ``dequantize_row_*`` exactly (an F16 scale per block of 32, times
the integer quants), so they give the same float32 values as pyggml.quants.dequantize; the tests
check that bit for bit. Other types go through the host decoders (see kernels.dequant_raw).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...types import GGMLType

QK = 32


def _blocks(raw: torch.Tensor, block_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, row_bytes) uint8 -> per-block F16 scale as float32 (rows, nb, 1) and the quant bytes."""
    blk = raw.reshape(raw.shape[0], -1, block_bytes)
    d = blk[..., :2].contiguous().view(torch.float16).float()
    return d, blk[..., 2:]


def dequant_q8_0(raw: torch.Tensor) -> torch.Tensor:
    """block_q8_0 {f16 d; int8 qs[32]}: x = d * qs."""
    d, qs = _blocks(raw, 2 + QK)
    return (d * qs.contiguous().view(torch.int8).float()).reshape(raw.shape[0], -1)


def dequant_q4_0(raw: torch.Tensor) -> torch.Tensor:
    """block_q4_0 {f16 d; uint8 qs[16]}: low nibbles are elements 0..15, high ones 16..31, minus 8."""
    d, qs = _blocks(raw, 2 + QK // 2)
    lo = (qs & 0x0F).to(torch.int16) - 8
    hi = (qs >> 4).to(torch.int16) - 8
    return (d * torch.cat([lo, hi], dim=-1).float()).reshape(raw.shape[0], -1)


DEVICE_DECODERS: dict[GGMLType, Callable[[torch.Tensor], torch.Tensor]] = {
    GGMLType.Q8_0: dequant_q8_0,
    GGMLType.Q4_0: dequant_q4_0,
}
