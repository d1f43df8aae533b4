"""FLASH_ATTN_EXT's one-chunk steps: the value sums kept in registers over a block of cells
(attn_jit._mad_cells) give the bits of the cell-by-cell steps (each cell's fma rounded to fp16, the
accumulator scaled and rounded on every new maximum), for head sizes that take each register count.
tests/llm/test_llm_flash_attn.py checks the whole op against llama.cpp's logits (head size 16)."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from pyggml.backend.cpu.ops import attn_jit
from pyggml.backend.cpu.simd import _F16C, F16_TO_F32

pytestmark = pytest.mark.skipif(not _F16C, reason="the kept value sums need F16C")

@numba.njit  # not cached: a cache here would outlive edits to the kernels it inlines
def _row(q, k, v, mask, dk, dv, n, cells, msvs, tab):  # pragma: no cover - compiled
    qq, acc, vrow = np.empty(dk, np.float32), np.empty(dv, np.float32), np.empty(max(dk, dv), np.float32)
    big, total = attn_jit._one_chunk(q.ctypes.data, k.ctypes.data, 2 * dk, v.ctypes.data, 2 * dv, mask.ctypes.data,
                                     np.float32(1.0), np.float32(0.125), np.float32(0.0), 0, n, dk, dv, True, qq,
                                     acc, vrow, cells, msvs, tab)
    return big, total, acc


def _one_row(dk: int, dv: int, n: int, rising: bool, seed: int) -> tuple[tuple, tuple]:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(dk).astype(np.float32)
    k = rng.standard_normal((n, dk)).astype(np.float16)
    if rising:  # scores that keep rising: a new maximum (the accumulator rescaled) at many cells of each block
        k = (k * (1.0 + np.arange(n) / 8.0)[:, None] * np.sign(k @ q.astype(np.float16))[:, None]).astype(np.float16)
    v = (rng.standard_normal((n, dv)) * 4.0).astype(np.float16)
    mask = np.zeros(n, np.float16)
    mask[rng.random(n) < 0.2] = -np.inf  # skipped cells
    args = (q, k.view(np.uint16), v.view(np.uint16), mask.view(np.uint16), dk, dv, n)
    n_kept = attn_jit._MAD_CELLS
    kept = _row(*args, np.empty(n_kept, np.int64), np.empty(2 * n_kept, np.float32), F16_TO_F32)
    each = _row(*args, np.empty(0, np.int64), np.empty(0, np.float32), F16_TO_F32)
    return kept, each


@pytest.mark.parametrize("dv", [16, 32, 64, 112, 128, 256])
@pytest.mark.parametrize("rising", [False, True])
def test_kept_value_sums_have_the_cell_by_cell_bits(dv: int, rising: bool) -> None:
    if dv % attn_jit._MAD_W:
        pytest.skip(f"head size {dv} is not a multiple of {attn_jit._MAD_W} floats: it takes the cell-by-cell steps")
    (big, total, acc), (big1, total1, acc1) = _one_row(64, dv, 3 * attn_jit._MAD_CELLS + 17, rising, dv)
    assert (big, total) == (big1, total1)
    np.testing.assert_array_equal(acc, acc1)
    assert np.abs(acc).max() > 0.0
    # fp16 values, as ggml's VKQ16 holds them
    np.testing.assert_array_equal(acc, acc.astype(np.float16).astype(np.float32))
