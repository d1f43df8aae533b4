"""ggml's dynamic tensor allocator (``ggml_dyn_tallocr``): best fit over free blocks in up to 16 chunks.

It only plans: it hands out ``(chunk, offset)`` addresses and tracks each chunk's high-water
mark, and the graph allocator later backs every chunk with one backend buffer of that size.
The choices follow ggml-alloc.c exactly, including its quirks, because planned buffer sizes are
compared against ggml's own:

* inner blocks (all but each chunk's last) are searched first, best fit, ties going to the
  later block, and since the best size restarts for every chunk a fitting block in a later chunk
  wins over any earlier chunk's choice;
* only when no inner block fits is a chunk's last block used, picked by how much the chunk
  would have to grow (``reuse_factor``);
* otherwise a new chunk is opened, sized ``max(size, max_chunk_size)``; the 16th is unbounded.
"""

from __future__ import annotations

from typing import NamedTuple

from ..backend.errors import AllocationError

MAX_FREE_BLOCKS = 256
GGML_VBUFFER_MAX_CHUNKS = 16
SIZE_MAX = (1 << 64) - 1
#: SIZE_MAX/2: the size of an unbounded chunk (keeps offset arithmetic from overflowing)
SIZE_HALF = SIZE_MAX // 2
_INT64_MIN = -(1 << 63)


class BufferAddress(NamedTuple):
    """A place in a chunked virtual buffer: which chunk, and the offset inside it."""

    chunk: int
    offset: int


ADDRESS_INVALID = BufferAddress(-1, SIZE_MAX)


def round_up(size: int, alignment: int) -> int:
    """aligned_offset(NULL, size, alignment): size rounded up to a multiple of the alignment."""
    return size + (-size) % alignment


def _as_int64(x: int) -> int:
    """The value C gets from ``(int64_t)`` of a size_t expression that may have wrapped."""
    x &= SIZE_MAX
    return x - (1 << 64) if x >> 63 else x


class Chunk:
    """One chunk: free blocks as ``[offset, size]`` pairs sorted by offset, and its high-water mark."""

    __slots__ = ("blocks", "max_size")

    def __init__(self, size: int) -> None:
        self.blocks: list[list[int]] = [[0, size]]
        self.max_size = 0

    def insert_block(self, offset: int, size: int) -> None:
        if len(self.blocks) >= MAX_FREE_BLOCKS:
            raise AllocationError(f"graph allocation: out of free blocks ({MAX_FREE_BLOCKS} per chunk); "
                                  "memory is too fragmented")
        pos = 0
        while pos < len(self.blocks) and self.blocks[pos][0] < offset:
            pos += 1
        self.blocks.insert(pos, [offset, size])


class DynTallocr:
    """``ggml_dyn_tallocr``: the planner behind one buffer type of a graph allocator."""

    def __init__(self, alignment: int, max_buffer_size: int = SIZE_MAX) -> None:
        if alignment <= 0 or alignment & (alignment - 1):
            raise AllocationError(f"alignment must be a power of two, got {alignment}")
        self.alignment = alignment
        self.max_chunk_size = min(max_buffer_size, SIZE_HALF)
        self.chunks: list[Chunk] = []

    @property
    def n_chunks(self) -> int:
        return len(self.chunks)

    def reset(self) -> None:
        self.chunks = []

    def max_size(self, chunk: int) -> int:
        """High-water mark of a chunk (0 for a chunk that does not exist)."""
        return self.chunks[chunk].max_size if chunk < len(self.chunks) else 0

    def total_size(self) -> int:
        return sum(c.max_size for c in self.chunks)

    def _new_chunk(self, min_size: int) -> int:
        if len(self.chunks) >= GGML_VBUFFER_MAX_CHUNKS:
            return -1
        # a chunk may exceed max_chunk_size for a single huge tensor; the last one is unbounded
        size = max(min_size, self.max_chunk_size)
        if len(self.chunks) == GGML_VBUFFER_MAX_CHUNKS - 1:
            size = SIZE_HALF
        self.chunks.append(Chunk(size))
        return len(self.chunks) - 1

    def alloc(self, size: int) -> BufferAddress:
        """Reserve ``size`` bytes (rounded up to the alignment); returns where."""
        size = round_up(size, self.alignment)
        best_chunk = best_block = -1

        # 1. best fit among the inner blocks of every chunk (not the last block of each)
        for c, chunk in enumerate(self.chunks):
            best_fit_size = SIZE_MAX
            blocks = chunk.blocks
            for i in range(len(blocks) - 1):
                bsize = blocks[i][1]
                if size <= bsize <= best_fit_size:
                    best_chunk, best_block, best_fit_size = c, i, bsize

        # 2. a chunk's last block, preferring the least growth, then the tightest fit
        if best_block == -1:
            best_reuse = _INT64_MIN
            for c, chunk in enumerate(self.chunks):
                if not chunk.blocks:
                    continue
                offset, bsize = chunk.blocks[-1]
                reuse = _as_int64(chunk.max_size - offset - size)
                better_reuse = best_reuse < 0 and reuse > best_reuse
                better_fit = 0 <= reuse < best_reuse
                if bsize >= size and (better_reuse or better_fit):
                    best_chunk, best_block, best_reuse = c, len(chunk.blocks) - 1, reuse

        # 3. a new chunk
        if best_block == -1:
            best_chunk = self._new_chunk(size)
            best_block = 0
        if best_chunk == -1:
            raise AllocationError(f"graph allocation: failed to reserve memory for {size} bytes "
                                  f"(all {GGML_VBUFFER_MAX_CHUNKS} chunks are full)")

        chunk = self.chunks[best_chunk]
        block = chunk.blocks[best_block]
        addr = BufferAddress(best_chunk, block[0])
        block[0] += size
        block[1] -= size
        if block[1] == 0:
            del chunk.blocks[best_block]
        chunk.max_size = max(chunk.max_size, addr.offset + size)
        return addr

    def free_bytes(self, addr: BufferAddress, size: int) -> None:
        """Return ``size`` bytes at ``addr``, merging with the free neighbours."""
        size = round_up(size, self.alignment)
        chunk = self.chunks[addr.chunk]
        blocks = chunk.blocks
        offset = addr.offset
        for i, block in enumerate(blocks):
            if block[0] + block[1] == offset:  # the freed range extends this block
                block[1] += size
                if i < len(blocks) - 1 and block[0] + block[1] == blocks[i + 1][0]:
                    block[1] += blocks[i + 1][1]
                    del blocks[i + 1]
                return
            if offset + size == block[0]:  # the freed range precedes this block
                block[0] = offset
                block[1] += size
                if i > 0 and blocks[i - 1][0] + blocks[i - 1][1] == block[0]:
                    blocks[i - 1][1] += block[1]
                    del blocks[i]
                return
        chunk.insert_block(offset, size)
