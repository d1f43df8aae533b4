"""The recurrent memory as llama.cpp keeps it (src/llama-memory-recurrent.cpp): one state per sequence.

A recurrent layer (Mamba's SSM, RWKV's WKV) does not keep a row per token: it rolls a fixed-size state
forward. Per layer there are two state tensors, ``r`` {n_embd_r, mem_size} (Mamba's conv window, RWKV's
token shift) and ``s`` {n_embd_s, mem_size} (the SSM / WKV state), F32 and zeroed; a cell is one row of
each. ``mem_size`` is n_seq_max: every sequence owns at most one cell (its ``tail``), which holds the
position of the sequence's last token. Several sequences can share a cell after ``seq_cp``; the first
ubatch that extends one of them copies the shared state into a free cell first (copy on write, through
each cell's ``src``: the graph's ``s_copy`` input says which row each cell of the ubatch starts from).

A ubatch's cells are made contiguous (``head`` .. ``head + n``); the states they start from are gathered
with GET_ROWS (``build_rs``, llm/graph.py) and their new states written with SET_ROWS (``store_rs``).

Every state tensor keeps two rows per cell, then one row that stays zero (no graph ever writes it):
``row[c]`` is the one holding cell c's state, and a ubatch writes the new states into the other one
(the graph's ``rs_dst`` input). Once the ubatch has run, its cells move to the rows it wrote
(:meth:`moved`). llama.cpp writes the new states into the op's output and copies them over the old ones
(a megabyte a layer for a 216 MB Mamba-2); here the CPU backend fuses the SET_ROWS with the SSM_SCAN,
which writes the new states into their rows itself, so no state is copied, and a failed or aborted
decode leaves every cell on its old row: rolling the states back costs nothing. A cell written again in
the same decode (a later ubatch of a long prompt) is written in place: its row from before the decode
stays untouched either way. A new sequence starts from a zero state: llama.cpp zeroes a cell of the
block (``rs_z``) in the graph first, which makes the graph of a sequence's first token another graph
than its next tokens'; here it reads the zero row (``zero_row``): same states, one graph for every
token step.

Only whole sequences can be forgotten: ``seq_rm`` of a range that ends a sequence but does not start at 0
is refused (returns False), as llama.cpp refuses it, since the state of an earlier position is gone.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..backend.api import (
    backend_buffer_clear,
    backend_tensor_get,
    backend_tensor_set,
)
from ..backend.base import BufferType
from ..context import Context, tensor_overhead
from ..errors import PyGGMLError
from ..tensor import Tensor
from ..types import GGMLType
from .hparams import HParams
from .kv_cache import alloc_layer_tensors

_POS_MAX = 2**31 - 1  # llama_pos's max: "to the end"


class StateError(PyGGMLError):
    """A sequence state that cannot be read back: another format, another model or memory layout,
    truncated data, or too few free cells (llm/state.py raises it too)."""


class StateReader(Protocol):
    """What reads a saved state (llm/state.py's reader): bytes taken in order, or struct-unpacked."""

    def take(self, n: int) -> memoryview: ...

    def unpack(self, fmt: str) -> tuple: ...


@dataclass
class RSRun:
    """One sequence set of a ubatch: its first sequence id, all its ids (a bit mask) and its last position."""

    seq_first: int
    seq_mask: int
    last_pos: int


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


class RecurrentMemory:
    """``llama_memory_recurrent`` over the layers ``layer_ids`` (the ones ``hparams.is_recurrent``)."""

    def __init__(self, hp: HParams, layer_ids: list[int], mem_size: int, n_seq_max: int,
                 buft: BufferType | dict[int, BufferType], type_r: GGMLType = GGMLType.F32,
                 type_s: GGMLType = GGMLType.F32) -> None:
        if mem_size < 1:
            raise PyGGMLError(f"a recurrent memory needs at least one cell, got {mem_size}")
        self.hp = hp
        self.layer_ids = list(layer_ids)
        self.size = mem_size
        self.n_seq_max = n_seq_max
        n_r, n_s = hp.n_embd_r(), hp.n_embd_s()
        self.ctx = Context((2 * len(layer_ids) + 1) * tensor_overhead(), no_alloc=True)
        self.r: dict[int, Tensor] = {}
        self.s: dict[int, Tensor] = {}
        #: two rows per cell (row[c] says which holds its state), then the row that stays zero (the module doc)
        self.zero_row = 2 * mem_size
        for il in self.layer_ids:
            self.r[il] = self.ctx.new_tensor(type_r, n_r, 2 * mem_size + 1).set_name(f"cache_r_l{il}")
            self.s[il] = self.ctx.new_tensor(type_s, n_s, 2 * mem_size + 1).set_name(f"cache_s_l{il}")
        self.buffers = alloc_layer_tensors({il: (self.r[il], self.s[il]) for il in self.layer_ids}, buft)
        # the cells (mem_cell): position, sequence set (bit mask), source row, staged source, and per
        # sequence id s the cell cells[s].tail holding its state
        self.pos = [-1] * mem_size
        self.seq = [0] * mem_size
        self.src = [-1] * mem_size
        self.src0 = [-1] * mem_size
        self.tail = [-1] * mem_size
        self.row = list(range(mem_size))  # the row holding each cell's state: c or c + mem_size
        self.head = 0
        self.used = 0
        self.n = 0  # cells of the last find_slot: head .. head+n-1
        self.rs_z = -1  # llama.cpp's row the graph zeroes for new sequences: never needed here (zero_row)
        self._moved = [False] * mem_size  # cells already moved to another row in this decode

    # ------------------------------------------------------------------ bookkeeping
    def clear(self, data: bool = True) -> None:
        self.pos = [-1] * self.size
        self.seq = [0] * self.size
        self.src = [-1] * self.size
        self.src0 = [-1] * self.size
        self.tail = [-1] * self.size
        self.head = self.used = 0
        if data:
            self.row = list(range(self.size))
            for buf in self.buffers:
                backend_buffer_clear(buf, 0)

    def state(self) -> tuple:
        """A copy of the cells' bookkeeping (what a decode changes besides the state rows)."""
        return (list(self.pos), list(self.seq), list(self.src), list(self.src0), list(self.tail), list(self.row),
                self.head, self.used, self.n, self.rs_z)

    def set_state(self, st: tuple) -> None:
        (pos, seq, src, src0, tail, row, self.head, self.used, self.n, self.rs_z) = st
        self.pos, self.seq, self.src, self.src0, self.tail = list(pos), list(seq), list(src), list(src0), list(tail)
        self.row = list(row)

    # ------------------------------------------------------------------ the state rows
    def begin(self) -> None:
        """A decode starts: no cell has moved to another row yet."""
        self._moved = [False] * self.size

    def _dst(self, c: int) -> int:
        """The row cell c's next state goes to: its other row, or its own once it has moved in this decode."""
        cur = self.row[c]
        if self._moved[c]:
            return cur
        return cur + self.size if cur < self.size else cur - self.size

    def dst_data(self) -> np.ndarray:
        """The graph's ``rs_dst`` input: for each cell of the block, the row its new state is written to."""
        return np.asarray([self._dst(c) for c in range(self.head, self.head + self.n)], dtype=np.int64)

    def moved(self) -> None:
        """A ubatch's graph has run: the cells of its block hold their states in the rows it wrote."""
        for c in range(self.head, self.head + self.n):
            self.row[c] = self._dst(c)
            self._moved[c] = True

    def state_rows(self) -> list[np.ndarray]:
        """Every state tensor's rows as the cells see them (copies, r tensors then s): each cell's row and the
        zero row; what a failed decode must leave unchanged (the other rows hold nothing)."""
        rows = [*self.row, self.zero_row]
        return [backend_tensor_get(t).reshape(t.ne[1], -1)[rows] for t in (*self.r.values(), *self.s.values())]

    def _empty(self, i: int) -> bool:
        return self.seq[i] == 0

    def _free(self, i: int) -> None:
        """Mark cell i empty (its sequence set already cleared)."""
        if self.pos[i] >= 0:
            self.used -= 1
        self.pos[i] = -1
        self.src[i] = -1

    def seq_pos_min(self, seq_id: int) -> int:
        ps = [self.pos[i] for i in range(self.size) if self.seq[i] >> seq_id & 1]
        return min(ps) if ps else -1

    def seq_pos_max(self, seq_id: int) -> int:
        ps = [self.pos[i] for i in range(self.size) if self.seq[i] >> seq_id & 1]
        return max(ps) if ps else -1

    # ------------------------------------------------------------------ the memory API
    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """llama_memory_seq_rm: forget positions [p0, p1) of the sequence (seq_id < 0: of all). A state
        cannot be rolled back: a range that cuts a sequence's end without starting at 0 is refused
        (False, nothing changed); a range before the sequence's last position changes nothing (its
        earlier positions are not kept apart from the state)."""
        p0 = max(p0, 0)
        p1 = _POS_MAX if p1 < 0 else p1
        if seq_id >= self.n_seq_max or seq_id >= self.size:
            return False
        if seq_id >= 0:
            t = self.tail[seq_id]
            if t >= 0:
                cpos = self.pos[t]
                if 0 < p0 <= cpos < p1:  # a partial erase at the end: the state of p0-1 is gone
                    return False
                if p0 <= cpos < p1:
                    self.tail[seq_id] = -1
        elif p0 != p1 and (p0 != 0 or p1 != _POS_MAX):
            return False
        new_head = self.size
        for i in range(self.size):
            if not p0 <= self.pos[i] < p1:
                continue
            if seq_id < 0:
                for s in _bits(self.seq[i]):  # (llama.cpp leaves these tails dangling)
                    if s < self.size and self.tail[s] == i:
                        self.tail[s] = -1
                self.seq[i] = 0
            elif self.seq[i] >> seq_id & 1:
                self.seq[i] &= ~(1 << seq_id)
            else:
                continue
            if self._empty(i):
                self._free(i)
                new_head = min(new_head, i)
        if new_head != self.size and new_head < self.head:
            self.head = new_head
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """llama_memory_seq_cp: dst drops its state and shares src's (the whole state: a recurrent state has
        no positions to pick from, so p0 and p1 are not used)."""
        if src == dst or not (0 <= src < self.size and 0 <= dst < self.size):
            return
        td = self.tail[dst]
        if td >= 0:
            self.seq[td] &= ~(1 << dst)
            self.tail[dst] = -1
            if self._empty(td):
                self.pos[td] = -1
                self.src[td] = -1
                self.used -= 1
        ts = self.tail[src]
        if ts >= 0:
            self.seq[ts] |= 1 << dst
            self.tail[dst] = ts

    def seq_keep(self, seq_id: int) -> None:
        """llama_memory_seq_keep: every other sequence forgets its state."""
        new_head = self.size
        for i in range(self.size):
            if i != seq_id:
                self.tail[i] = -1
            if not self.seq[i] >> seq_id & 1:
                if self.pos[i] >= 0:
                    self.used -= 1
                self.pos[i], self.src[i], self.seq[i] = -1, -1, 0
                new_head = min(new_head, i)
            else:
                self.seq[i] = 1 << seq_id
        if new_head != self.size and new_head < self.head:
            self.head = new_head

    def _tail_cell(self, seq_id: int, p0: int, p1: int) -> int:
        p0 = max(p0, 0)
        p1 = _POS_MAX if p1 < 0 else p1
        if p0 == p1 or not 0 <= seq_id < self.size:
            return -1
        t = self.tail[seq_id]
        if t >= 0 and self.seq[t] >> seq_id & 1 and p0 <= self.pos[t] < p1:
            return t
        return -1

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """llama_memory_seq_add: only the position moves (a state has no per-position data)."""
        if delta == 0:
            return
        t = self._tail_cell(seq_id, p0, p1)
        if t >= 0:
            self.pos[t] += delta

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        if d == 1:
            return
        t = self._tail_cell(seq_id, p0, p1)
        if t >= 0:
            self.pos[t] //= d

    # ------------------------------------------------------------------ slots
    @staticmethod
    def runs_of(seq_mask: np.ndarray, seq_first: np.ndarray, pos: np.ndarray, n_seqs: int) -> list[RSRun]:
        """The sequence sets of a ubatch of n_seqs equal runs of tokens (split_equal / split_seq)."""
        k = len(pos) // n_seqs
        return [RSRun(int(seq_first[s * k]), int(seq_mask[s * k]), int(pos[s * k + k - 1])) for s in range(n_seqs)]

    def find_slot(self, runs: list[RSRun]) -> bool:
        """llama_memory_recurrent::find_slot: give each run's first sequence a cell of its own (copying a
        shared state into an empty cell), gather the ubatch's cells into one contiguous block in run order,
        set their positions, and stage for each the row its state starts from (``src0``)."""
        size, n_seqs = self.size, len(runs)
        if self.head > self.used + 2 * n_seqs:
            self.head = 0
        for run in runs:
            for sid in _bits(run.seq_mask):
                if sid >= size:
                    raise PyGGMLError(f"seq_id={sid} >= n_seq_max={self.n_seq_max}: try a bigger --parallel value")
                if sid != run.seq_first and self.tail[sid] >= 0:  # a sequence that becomes shared
                    t = self.tail[sid]
                    self.seq[t] &= ~(1 << sid)
                    self.tail[sid] = -1
                    if self._empty(t):
                        self.pos[t] = -1
                        self.src[t] = -1
                        self.used -= 1
        nxt = self.head
        for _ in range(size):
            if nxt >= size:
                nxt -= size
            if self._empty(nxt):
                break
            nxt += 1
        lo, hi = size - 1, 0
        for s, run in enumerate(runs):
            sid = run.seq_first
            t = self.tail[sid]
            owns = t >= 0 and self.seq[t] & (self.seq[t] - 1) == 0
            if not owns:
                if nxt >= size or not self._empty(nxt):
                    raise PyGGMLError("the recurrent memory has no free cell (more sequences than n_seq_max)")
                if t >= 0:  # copy on write: the shared state moves to an empty cell of its own
                    self.pos[nxt], self.src[nxt] = self.pos[t], self.src[t]
                    self.seq[t] &= ~(1 << sid)
                    self.seq[nxt] |= 1 << sid
                self.tail[sid] = nxt
                if s + 1 < n_seqs:
                    for _ in range(size):
                        nxt += 1
                        if nxt >= size:
                            nxt -= size
                        if self._empty(nxt):
                            break
            lo = min(lo, self.tail[sid])
            hi = max(hi, self.tail[sid])
        for s, run in enumerate(runs):  # gather: run s goes to cell lo + s
            dst, src = lo + s, self.tail[run.seq_first]
            if dst == src:
                continue
            self.pos[dst], self.pos[src] = self.pos[src], self.pos[dst]
            self.src[dst], self.src[src] = self.src[src], self.src[dst]
            self.seq[dst], self.seq[src] = self.seq[src], self.seq[dst]
            for j in range(size):
                if self.tail[j] == src:
                    self.tail[j] = dst
                elif self.tail[j] == dst:
                    self.tail[j] = src
        for s, run in enumerate(runs):
            c = lo + s
            self.pos[c] = run.last_pos
            self.seq[c] = run.seq_mask
            for sid in _bits(run.seq_mask):
                self.tail[sid] = c
        for i in range(lo, hi + 1):
            self.src0[i] = self.zero_row if self.src[i] < 0 else self.src[i]  # a new sequence: zero state
            self.src[i] = i  # moved or cleared once only
        self.head, self.n = lo, hi - lo + 1
        self.used = sum(1 for m in self.seq if m)
        return self.n >= n_seqs

    def prepare(self, ubatches: list[list[RSRun]]) -> bool:
        """llama_memory_recurrent::prepare: whether every ubatch finds its cells (nothing changes)."""
        saved = self.state()
        try:
            return all(self.find_slot(runs) for runs in ubatches)
        except PyGGMLError:
            return False
        finally:
            self.set_state(saved)

    def s_copy_data(self) -> np.ndarray:
        """The graph's ``rs_s_copy`` input: for each cell of the block, the row its state starts from (the row
        of the cell it copies, or the zero row)."""
        rows = [c if c == self.zero_row else self.row[c] for c in self.src0[self.head : self.head + self.n]]
        return np.asarray(rows, dtype=np.int32)

    # ------------------------------------------------------------------ sequence state (llama_state_seq_*)
    def _row_sizes(self) -> tuple[int, int]:
        return self.hp.n_embd_r() * 4, self.hp.n_embd_s() * 4

    def state_write(self, seq_id: int, out: io.BufferedIOBase | io.BytesIO) -> None:
        """llama_memory_recurrent::state_write for one sequence: ``u32 cell_count``, per cell ``i32 pos,
        u32 n_seq_id (0)``, then ``u32 s_trans (0), u32 n_layer`` and per recurrent layer its r rows (``i32
        type, u64 row size``, the rows), then per layer its s rows the same way."""
        cells = [i for i in range(self.size) if self.seq[i] >> seq_id & 1]
        out.write(struct.pack("<I", len(cells)))
        for c in cells:
            out.write(struct.pack("<iI", self.pos[c], 0))
        rows = [self.src[c] if self.src[c] >= 0 else c for c in cells]
        out.write(struct.pack("<II", 0, self.hp.n_layer))
        for tensors in (self.r, self.s):
            for il in self.layer_ids:
                t = tensors[il]
                row = t.nb[1]
                out.write(struct.pack("<iQ", int(t.type), row))
                for c in rows:
                    out.write(backend_tensor_get(t, offset=self.row[c] * row, size=row).tobytes())

    def state_read(self, seq_id: int, r: StateReader) -> None:
        """llama_memory_recurrent::state_read into sequence ``seq_id``: its state is dropped and the saved
        one placed in a cell of its own. On failure the sequence holds nothing."""
        (cell_count,) = r.unpack("<I")
        if cell_count > self.size:
            raise StateError(f"the state holds {cell_count} recurrent cells, the memory has {self.size}")
        self.seq_rm(seq_id, -1, -1)
        if cell_count == 0:
            r.unpack("<II")  # (s_trans, n_layer) still follow
            self._skip_data(r, 0)
            return
        positions = []
        for _ in range(cell_count):
            p, n_ids = r.unpack("<iI")
            if n_ids != 0:
                raise StateError("the state's recurrent cell is not sequence-agnostic (a whole-memory state "
                                          "cannot be read into one sequence)")
            positions.append(p)
        if not self.find_slot([RSRun(seq_id, 1 << seq_id, positions[-1])]):
            raise StateError("no free recurrent cell for the state")
        head = self.head
        try:
            self._read_data(r, head, cell_count)
        except BaseException:
            self.seq_rm(seq_id, -1, -1)
            raise

    def _skip_data(self, r: StateReader, cell_count: int) -> None:
        for _ in range(2 * len(self.layer_ids)):
            _, row = r.unpack("<iQ")
            r.take(row * cell_count)

    def _read_data(self, r: StateReader, head: int, cell_count: int) -> None:
        s_trans, n_layer = r.unpack("<II")
        if n_layer != self.hp.n_layer:
            raise StateError(f"the state has {n_layer} layers, the model {self.hp.n_layer}")
        if s_trans:
            raise StateError("the state's recurrent s rows are transposed: this memory keeps them by cell")
        for kind, tensors in (("r", self.r), ("s", self.s)):
            for il in self.layer_ids:
                t = tensors[il]
                ty, row = r.unpack("<iQ")
                if ty != int(t.type) or row != t.nb[1]:
                    name = GGMLType(ty).name if ty in GGMLType._value2member_map_ else f"type {ty}"
                    raise StateError(f"layer {il}: the state's {kind} rows are {name}, {row} bytes; the memory's "
                                     f"{t.type.name}, {t.nb[1]} bytes (another model?)")
                data = np.frombuffer(r.take(row * cell_count), np.uint8)
                for k in range(cell_count):  # each cell's row (one cell per sequence: one row)
                    backend_tensor_set(t, data[k * row : (k + 1) * row], self.row[head + k] * row, row)
