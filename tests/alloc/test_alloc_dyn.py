"""ggml_dyn_tallocr, step by step: every expected offset below is derived from ggml-alloc.c's rules."""

from __future__ import annotations

import pytest

from pyggml.alloc.dyn_tallocr import (
    GGML_VBUFFER_MAX_CHUNKS,
    MAX_FREE_BLOCKS,
    SIZE_HALF,
    BufferAddress,
    DynTallocr,
    round_up,
)
from pyggml.backend.errors import AllocationError


def blocks(d: DynTallocr, chunk: int = 0) -> list[tuple[int, int]]:
    return [(o, s) for o, s in d.chunks[chunk].blocks]


def test_round_up_and_alignment_of_every_address():
    assert [round_up(n, 32) for n in (0, 1, 31, 32, 33, 64)] == [0, 32, 32, 32, 64, 64]
    d = DynTallocr(32)
    # 1 byte takes a whole 32-byte slot, so the next address is 32
    assert d.alloc(1) == BufferAddress(0, 0)
    assert d.alloc(40) == BufferAddress(0, 32)
    assert d.alloc(8) == BufferAddress(0, 96)
    assert d.max_size(0) == 128
    with pytest.raises(AllocationError, match="power of two"):
        DynTallocr(24)


def test_free_merges_with_both_neighbours():
    d = DynTallocr(16)
    a, b, c = d.alloc(16), d.alloc(16), d.alloc(16)
    d.alloc(16)  # keeps the tail block separate from c
    d.free_bytes(a, 16)
    d.free_bytes(c, 16)
    # free list: [0,16) [32,48) and the big tail at 64
    assert blocks(d)[:2] == [(0, 16), (32, 16)]
    d.free_bytes(b, 16)
    # b ends where... b starts at 16 = end of [0,16): that block grows and swallows [32,48)
    assert blocks(d)[0] == (0, 48)
    assert len(blocks(d)) == 2


def test_free_before_a_block_moves_its_start_and_merges_with_previous():
    d = DynTallocr(16)
    a, b, c = d.alloc(16), d.alloc(16), d.alloc(16)
    d.free_bytes(c, 16)  # [32,48) joins the tail: the tail now starts at 32
    assert blocks(d) == [(32, SIZE_HALF - 32)]
    d.free_bytes(a, 16)  # no neighbour: inserted before, sorted by offset
    assert blocks(d) == [(0, 16), (32, SIZE_HALF - 32)]
    # b's end (32) is the tail's start: the tail moves down to 16, then merges with [0,16)
    d.free_bytes(b, 16)
    assert blocks(d) == [(0, SIZE_HALF)]


def test_best_fit_prefers_smallest_inner_block_and_ties_go_to_the_later_block():
    d = DynTallocr(16)
    addrs = [d.alloc(s) for s in (32, 16, 48, 16, 32, 16)]  # offsets 0,32,48,96,112,144; max 160
    # free the 32 at 0, the 48 at 48, the 32 at 112 -> inner blocks (0,32) (48,48) (112,32)
    for i in (0, 2, 4):
        d.free_bytes(addrs[i], (32, 16, 48, 16, 32, 16)[i])
    assert blocks(d)[:3] == [(0, 32), (48, 48), (112, 32)]
    # a 32-byte request: the two 32-byte blocks tie; ggml's "<=" keeps the later one (112)
    assert d.alloc(32) == BufferAddress(0, 112)
    # a 16-byte request: best fit is now the 32 at 0 (smaller than the 48)
    assert d.alloc(16) == BufferAddress(0, 0)
    assert d.max_size(0) == 160


def test_last_block_is_used_only_when_no_inner_block_fits():
    d = DynTallocr(16)
    a = d.alloc(16)
    d.alloc(16)
    d.free_bytes(a, 16)  # inner block (0,16), tail at 32
    # 32 bytes do not fit the inner block: the tail is used, the chunk grows to 64
    assert d.alloc(32) == BufferAddress(0, 32)
    assert d.max_size(0) == 64


def test_later_chunk_wins_inner_best_fit_even_with_a_larger_block():
    # max chunk size 64: the second tensor that does not fit opens chunk 1
    d = DynTallocr(16, max_buffer_size=64)
    x = [d.alloc(16) for _ in range(4)]  # chunk 0 full: 0,16,32,48 (its only block is consumed)
    assert blocks(d) == []
    y = [d.alloc(32), d.alloc(16), d.alloc(16)]  # chunk 1: 0, 32, 48 -> full
    assert [a.chunk for a in y] == [1, 1, 1]
    z = d.alloc(16)  # chunk 2
    assert z == BufferAddress(2, 0)
    # inner blocks: chunk 0 gets (0,16) and (32,16) freed; chunk 1 gets (0,32) freed
    d.free_bytes(x[0], 16)
    d.free_bytes(x[2], 16)
    d.free_bytes(y[0], 32)
    d.free_bytes(y[2], 16)  # chunk 1 now has (0,32) inner and (48,16) last
    # a 16-byte request: chunk 0 has exact 16-byte inner blocks, but best_fit_size restarts per
    # chunk, so chunk 1's (0,32) replaces chunk 0's choice (ggml-alloc.c's quirk)
    assert d.alloc(16) == BufferAddress(1, 0)


def test_last_block_choice_by_reuse_factor():
    d = DynTallocr(16, max_buffer_size=64)
    # chunk 0: max 64, the tail consumed; free its last 32 -> last block (32, 32), reuse 64-32-16 = 16
    a = [d.alloc(32), d.alloc(32)]
    d.free_bytes(a[1], 32)
    # chunk 1: opened by a 48 request; its tail (48, 16) has reuse 48-48-16 = -16 (needs growth)
    b = d.alloc(48)
    assert b == BufferAddress(1, 0)
    # the first candidate (chunk 0, reuse 16) is taken since best starts at INT64_MIN;
    # chunk 1's -16 is neither a better reuse (best is not negative) nor a fit (negative)
    assert d.alloc(16) == BufferAddress(0, 32)


def test_last_block_prefers_less_growth_when_all_must_grow():
    d = DynTallocr(16, max_buffer_size=128)
    d.alloc(112)  # chunk 0 max 112, tail (112, 16)
    d.alloc(128)  # chunk 1 (0 fits nothing in chunk 0), consumed entirely
    c = d.alloc(96)  # chunk 2: tail (96, 32)
    assert c.chunk == 2
    # a 32 request: chunk 0 tail is 16 (too small), chunk 1 has none, chunk 2 tail fits:
    # reuse = 96 - 96 - 32 = -32 -> chosen as the only candidate, chunk 2 grows to 128
    assert d.alloc(32) == BufferAddress(2, 96)
    assert [d.max_size(i) for i in range(3)] == [112, 128, 128]


def test_new_chunk_size_and_the_unbounded_16th_chunk():
    d = DynTallocr(16, max_buffer_size=32)
    # a tensor bigger than the max chunk size still gets a chunk of its own size
    assert d.alloc(100) == BufferAddress(0, 0)
    assert d.max_size(0) == 112
    for i in range(1, GGML_VBUFFER_MAX_CHUNKS - 1):
        assert d.alloc(32).chunk == i
    # chunk 15 (the 16th) is unbounded: many tensors fit
    last = [d.alloc(32) for _ in range(5)]
    assert {a.chunk for a in last} == {GGML_VBUFFER_MAX_CHUNKS - 1}
    assert d.chunks[-1].blocks[-1][0] + d.chunks[-1].blocks[-1][1] == SIZE_HALF
    assert d.total_size() == 112 + 14 * 32 + 5 * 32
    assert d.max_size(99) == 0


def test_out_of_free_blocks_raises():
    d = DynTallocr(16)
    addrs = [d.alloc(16) for _ in range(2 * MAX_FREE_BLOCKS + 2)]
    # freeing every other tensor leaves isolated holes: 255 fit next to the tail block
    with pytest.raises(AllocationError, match="out of free blocks"):
        for a in addrs[0 : 2 * MAX_FREE_BLOCKS : 2]:
            d.free_bytes(a, 16)
    assert len(d.chunks[0].blocks) == MAX_FREE_BLOCKS


def test_reset_forgets_everything():
    d = DynTallocr(32)
    d.alloc(100)
    d.reset()
    assert d.n_chunks == 0 and d.total_size() == 0
    assert d.alloc(8) == BufferAddress(0, 0)
