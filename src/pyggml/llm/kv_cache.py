"""The KV cache as llama.cpp keeps it (src/llama-kv-cache.cpp): cells shared by up to 64 sequences.

Per layer, K is ``[n_embd_k_gqa, kv_size]`` and V either the same or, without flash attention,
transposed (element j of cell c at ``j*kv_size + c``), both F16 by default and zeroed. Each cell
records a position and the set of sequences that use it (a bit mask); one cell can serve several
sequences (``seq_cp`` shares a prompt's cells). A ubatch finds cells with llama.cpp's ``find_slot``
(wrapping search from ``head``; in a sliding-window cache, a cell of one sequence whose position fell
out of that sequence's window is reused), writes K/V with SET_ROWS at those cells, and attends over
the first ``n_kv`` cells (a multiple of 256): the mask lets a token see the cells of its own
sequence at positions up to its own (and within its window), nothing of other sequences.

With ``kv_unified`` all sequences share one stream of cells. Otherwise each sequence has a stream of
its own (``n_stream = n_seq_max``, stream s for sequence s): K/V get a third dimension, cell c of
stream s is row ``s*kv_size + c``, a ubatch holds equal runs of tokens of consecutive sequences
(split_equal) and attends per stream, and ``seq_cp`` between streams copies the cells' data.
"""

from __future__ import annotations

import numpy as np

from ..backend.api import (
    backend_buffer_clear,
    backend_buffer_set_usage,
    backend_tensor_alloc,
    backend_tensor_get,
    backend_tensor_set,
)
from ..backend.base import Buffer, BufferType, BufferUsage
from ..context import Context, tensor_overhead
from ..errors import PyGGMLError
from ..ops import builders as B
from ..tensor import Tensor, ggml_pad
from ..types import GGMLType
from .hparams import HParams

KV_PAD = 256
#: LLAMA_MAX_SEQ: sequence ids are bits of a cell's uint64 mask
MAX_SEQ = 64
_ONE = np.uint64(1)


def seq_bit(s: int) -> np.uint64:
    return _ONE << np.uint64(s)



def alloc_layer_tensors(tensors: dict[int, tuple[Tensor, ...]], buft: BufferType | dict[int, BufferType]
                        ) -> list[Buffer]:
    """Allocate each layer's memory tensors (K/V, or a recurrent layer's r/s states) in one zeroed buffer per
    buffer type, the layer's own (``buft`` per layer, or one for all): llama.cpp's memories keep a layer's
    state with its weights."""
    layer_buft = buft if isinstance(buft, dict) else dict.fromkeys(tensors, buft)
    groups: dict[BufferType, list[Tensor]] = {}
    for il, ts in tensors.items():
        groups.setdefault(layer_buft[il], []).extend(ts)
    buffers: list[Buffer] = []
    for bt, group in groups.items():
        align = bt.get_alignment()
        buf = bt.alloc_buffer(sum(ggml_pad(bt.get_alloc_size(t), align) for t in group))
        backend_buffer_set_usage(buf, BufferUsage.ANY)
        addr = buf.get_base()
        for t in group:
            backend_tensor_alloc(buf, t, addr)
            addr += ggml_pad(bt.get_alloc_size(t), align)
        backend_buffer_clear(buf, 0)  # zeroed, so no NaN in a state nobody wrote
        buffers.append(buf)
    return buffers

class KVCacheFullError(PyGGMLError):
    """No free cells left for the tokens of a ubatch (the context is full)."""


#: (stream, cells) for each run of a ubatch's tokens: where find_slot put them
SlotInfo = list[tuple[int, list[int]]]


class KVCache:
    """One cache (llama_kv_cache) over the layers ``layer_ids`` of a model."""

    def __init__(self, hp: HParams, layer_ids: list[int], kv_size: int, buft: BufferType | dict[int, BufferType],
                 type_k: GGMLType = GGMLType.F16, type_v: GGMLType = GGMLType.F16, v_trans: bool = True,
                 n_swa: int = 0, name: str = "", n_seq_max: int = 1, n_stream: int = 1) -> None:
        if not 1 <= n_seq_max <= MAX_SEQ:
            raise PyGGMLError(f"n_seq_max must be 1 to {MAX_SEQ}, got {n_seq_max}")
        if n_stream not in (1, n_seq_max):
            raise PyGGMLError(f"a KV cache has one stream or one per sequence ({n_seq_max}), not {n_stream}")
        self.hp = hp
        self.layer_ids = list(layer_ids)
        self.size = kv_size  # cells per stream
        self.n_stream = n_stream
        self.v_trans = v_trans
        self.n_swa = n_swa  # 0: no sliding window in this cache
        self.name = name
        self.n_seq_max = n_seq_max
        self.ctx = Context((2 * len(layer_ids) + 1) * tensor_overhead(), no_alloc=True)
        self.k: dict[int, Tensor] = {}
        self.v: dict[int, Tensor] = {}
        for il in self.layer_ids:
            self.k[il] = self.ctx.new_tensor(type_k, hp.n_embd_k_gqa(il), kv_size, n_stream).set_name(f"cache_k_l{il}")
            self.v[il] = self.ctx.new_tensor(type_v, hp.n_embd_v_gqa(il), kv_size, n_stream).set_name(f"cache_v_l{il}")
        # each layer's cache lives with the layer (llama.cpp's offload_kqv): one buffer per buffer type
        self.buffers = alloc_layer_tensors({il: (self.k[il], self.v[il]) for il in self.layer_ids}, buft)
        shape = (n_stream, kv_size)
        self.pos = np.full(shape, -1, dtype=np.int64)  # -1: empty cell
        self.seq = np.zeros(shape, dtype=np.uint64)  # bit s: sequence s uses the cell
        # how far each cell's position moved since its K was last rotated (seq_add/seq_div); a K-shift
        # graph (LlamaContext) rotates K by these amounts before the next decode
        self.shift = np.zeros(shape, dtype=np.int64)
        self.head = np.zeros(n_stream, dtype=np.int64)

    # ------------------------------------------------------------------ cell bookkeeping
    def stream_of(self, seq_id: int) -> int:
        """llama.cpp's seq_to_stream: sequence s lives in stream s, or all in stream 0 when unified."""
        return seq_id if self.n_stream > 1 else 0

    def _streams(self, seq_id: int) -> slice | int:
        return slice(None) if seq_id < 0 else self.stream_of(seq_id)

    def clear(self) -> None:
        self.pos.fill(-1)
        self.seq.fill(0)
        self.shift.fill(0)
        self.head.fill(0)
        for buf in self.buffers:
            backend_buffer_clear(buf, 0)

    def state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """A copy of the cells' bookkeeping (positions, sequence sets, shifts, heads)."""
        return self.pos.copy(), self.seq.copy(), self.shift.copy(), self.head.copy()

    def set_state(self, state: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> None:
        self.pos[:], self.seq[:], self.shift[:], self.head[:] = state

    @property
    def used(self) -> int:
        return int(np.count_nonzero(self.pos >= 0))

    def _of(self, seq_id: int) -> np.ndarray:
        """Cells of sequence seq_id (seq_id < 0: every used cell), [n_stream, size]."""
        if seq_id < 0:
            return self.pos >= 0
        return (self.seq & seq_bit(seq_id)) != 0

    def seq_pos_max(self, seq_id: int = 0) -> int:
        """The largest position of the sequence in the cache, or -1 when it has none."""
        sel = self._of(seq_id)
        return int(self.pos[sel].max()) if sel.any() else -1

    def seq_pos_min(self, seq_id: int = 0) -> int:
        sel = self._of(seq_id)
        return int(self.pos[sel].min()) if sel.any() else -1

    def is_masked_swa(self, p0: int | np.ndarray, p1: int | np.ndarray) -> bool | np.ndarray:
        """llama_hparams::is_masked_swa for STANDARD windows: the key at p0 is out of p1's window."""
        if not self.n_swa:
            return False if np.isscalar(p0) else np.zeros(np.shape(p0), dtype=bool)
        return (p1 - p0) >= self.n_swa

    def runs(self, seq_first: np.ndarray, n_seqs: int) -> list[tuple[int, slice]]:
        """The ubatch's runs of tokens and the stream of each: the whole ubatch in stream 0 when unified,
        else n_seqs equal runs (split_equal), each of one sequence."""
        if self.n_stream == 1:
            return [(0, slice(0, len(seq_first)))]
        k = len(seq_first) // n_seqs
        return [(self.stream_of(int(seq_first[g * k])), slice(g * k, (g + 1) * k)) for g in range(n_seqs)]

    def find_slot(self, seq_first: np.ndarray, n_seqs: int = 1) -> SlotInfo:
        """Cells for the tokens of a ubatch (first sequence id of each), as llama.cpp's find_slot."""
        return [(st, self._find_in_stream(st, seq_first[sl])) for st, sl in self.runs(seq_first, n_seqs)]

    def _find_in_stream(self, st: int, seq_first: np.ndarray) -> list[int]:
        """A cell is usable if it is empty, or (sliding-window cache) if it holds one sequence only
        and its position is out of that sequence's window for the sequence's next position."""
        n_tokens = len(seq_first)
        if n_tokens > self.size:
            raise KVCacheFullError(f"{n_tokens} tokens do not fit a KV cache of {self.size} cells")
        pos, seq = self.pos[st], self.seq[st]
        used = int(np.count_nonzero(pos >= 0))
        # as llama.cpp: restart from cell 0 when head ran far past the used cells (or off the end)
        head = int(self.head[st])
        head = 0 if head >= self.size or head > used + 2 * n_tokens else head
        next_pos: dict[int, int] = {}  # a sequence's next position, asked only for sequences met in full cells
        idxs: list[int] = []
        taken: set[int] = set()
        n_tested = 0
        while len(idxs) < n_tokens:
            if n_tested >= self.size:
                where = f"stream {st} of the " if self.n_stream > 1 else "the "
                raise KVCacheFullError(f"{where}{self.name or 'KV'} cache is full ({self.size} cells); "
                                       "start a new context or use a larger --ctx-size")
            i = head
            head = (head + 1) % self.size
            n_tested += 1
            if i in taken:
                continue
            p = int(pos[i])
            ok = p < 0
            if not ok and self.n_swa:
                m = int(seq[i])
                if m and m & (m - 1) == 0:  # exactly one sequence
                    s = m.bit_length() - 1
                    if s not in next_pos:
                        next_pos[s] = self.seq_pos_max(s) + 1
                    ok = bool(self.is_masked_swa(p, next_pos[s]))
            if ok:
                idxs.append(i)
                taken.add(i)
        return idxs

    def apply(self, slots: SlotInfo, positions: np.ndarray, seq_masks: np.ndarray) -> None:
        """apply_ubatch: occupy the cells; sliding-window cells overwritten make their sequence drop
        every older position (each sequence keeps a contiguous position range)."""
        rm_max: dict[int, int] = {}
        t0 = 0
        for st, idxs in slots:
            pos, seq, shift = self.pos[st], self.seq[st], self.shift[st]
            for i in idxs:
                if pos[i] >= 0:
                    s = int(seq[i]).bit_length() - 1
                    rm_max[s] = max(rm_max.get(s, -1), int(pos[i]))
                    pos[i], seq[i], shift[i] = -1, 0, 0
            pos[idxs] = positions[t0 : t0 + len(idxs)]
            seq[idxs] = seq_masks[t0 : t0 + len(idxs)]
            t0 += len(idxs)
        for s, pmax in rm_max.items():
            self.seq_rm(s, -1, pmax + 1)
        for st, idxs in slots:
            if idxs:
                self.head[st] = idxs[-1] + 1

    def n_kv(self, streams: list[int]) -> int:
        """Cells attention spans: the used range padded to 256, at least 256, at most the stream's size
        (the largest over the ubatch's streams)."""
        result = 0
        for st in streams:
            used_cells = np.flatnonzero(self.pos[st] >= 0)
            used_max_p1 = int(used_cells[-1]) + 1 if used_cells.size else 0
            result = max(result, min(self.size, max(KV_PAD, ggml_pad(used_max_p1, KV_PAD))))
        return result

    # ------------------------------------------------------------------ the memory API
    def _range(self, seq_id: int, p0: int, p1: int) -> np.ndarray:
        """Cells of seq_id (< 0: any) holding a position in [p0, p1) (p0 < 0: from 0, p1 < 0: to the end)."""
        hi = np.iinfo(np.int64).max if p1 < 0 else p1
        return self._of(seq_id) & (self.pos >= max(p0, 0)) & (self.pos < hi)

    def _drop_empty(self) -> None:
        gone = (self.seq == 0) & (self.pos >= 0)
        self.pos[gone] = -1
        self.shift[gone] = 0

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> None:
        """llama_memory_seq_rm: the sequence (seq_id < 0: all) forgets positions [p0, p1)."""
        sel = self._range(seq_id, p0, p1)
        if seq_id < 0:
            self.seq[sel] = 0
        else:
            self.seq[sel] &= ~seq_bit(seq_id)
        self._drop_empty()
        self.head[self._streams(seq_id)] = 0

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """llama_memory_seq_cp: dst shares src's cells in [p0, p1) when both live in one stream (no data
        is copied); between streams, dst's stream becomes a copy of src's cells, data included."""
        if src == dst:
            return
        s0, s1 = self.stream_of(src), self.stream_of(dst)
        if s0 == s1:
            self.seq[self._range(src, p0, p1)] |= seq_bit(dst)
            return
        if (0 < p0 < self.size - 1) or (0 < p1 < self.size - 1):  # llama.cpp's is_full rule
            raise PyGGMLError(f"seq_cp({src}, {dst}) between streams copies whole sequences: give p0 = p1 = -1 "
                              f"(got {p0}, {p1}), or use a unified KV cache")
        sel = self._of(src)[s0]
        self.pos[s1], self.seq[s1], self.shift[s1] = -1, 0, 0
        self.pos[s1][sel], self.shift[s1][sel] = self.pos[s0][sel], self.shift[s0][sel]
        self.seq[s1][sel] = seq_bit(dst)
        self.head[s1] = self.head[s0]
        for t in (*self.k.values(), *self.v.values()):
            stride = t.nb[2]
            backend_tensor_set(t, backend_tensor_get(t, offset=s0 * stride, size=stride), s1 * stride, stride)

    def seq_keep(self, seq_id: int) -> None:
        """llama_memory_seq_keep: every other sequence forgets everything."""
        keep = self._of(seq_id)
        self.seq[keep] = seq_bit(seq_id)
        self.seq[~keep] = 0
        self._drop_empty()
        self.head.fill(0)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """llama_memory_seq_add: move the sequence's positions [p0, p1) by delta; cells moved below 0
        are freed. (llama.cpp moves whole cells: a cell shared with another sequence moves for both.)"""
        if delta == 0 or p0 == p1:
            return
        sel = self._range(seq_id, p0, p1)
        self.pos[sel] += delta
        self.shift[sel] += delta
        gone = sel & (self.pos < 0)
        self.pos[gone], self.seq[gone], self.shift[gone] = -1, 0, 0
        self.head[self._streams(seq_id)] = 0

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        """llama_memory_seq_div: integer-divide the sequence's positions [p0, p1) by d (> 1)."""
        if d == 1:
            return
        if d < 1:
            raise PyGGMLError(f"seq_div: the divisor must be >= 1, got {d}")
        sel = self._range(seq_id, p0, p1)
        new = self.pos[sel] // d
        self.shift[sel] += new - self.pos[sel]
        self.pos[sel] = new

    @property
    def has_shift(self) -> bool:
        return bool(self.shift.any())

    # ------------------------------------------------------------------ graph pieces
    def get_k(self, ctx: Context, il: int, n_kv: int, s0: int = 0, ns: int = 1) -> Tensor:
        """K view {d_k, n_head_kv, n_kv, ns} over the first n_kv cells of streams s0 .. s0+ns-1."""
        k = self.k[il]
        d = self.hp.n_embd_head_k
        return B.view_4d(ctx, k, d, self.hp.n_head_kv[il], n_kv, ns, k.type.row_size(d),
                         k.type.row_size(self.hp.n_embd_k_gqa(il)), k.nb[2], s0 * k.nb[2])

    def get_v(self, ctx: Context, il: int, n_kv: int, s0: int = 0, ns: int = 1) -> Tensor:
        """V view: {n_kv, n_head_kv, d_v, ns} when transposed, else like K."""
        v = self.v[il]
        d = self.hp.n_embd_head_v
        nh = self.hp.n_head_kv[il]
        if self.v_trans:
            return B.view_4d(ctx, v, n_kv, nh, d, ns, v.type.row_size(self.size * d),
                             v.type.row_size(self.size), v.nb[2], s0 * v.nb[2])
        return B.view_4d(ctx, v, d, nh, n_kv, ns, v.type.row_size(d),
                         v.type.row_size(self.hp.n_embd_v_gqa(il)), v.nb[2], s0 * v.nb[2])

    def cpy_k(self, ctx: Context, k_cur: Tensor, k_idxs: Tensor, il: int) -> Tensor:
        k = self.k[il]
        # {head_dim, n_head, n_tokens} -> one row per token; a view, since K may be a slice of a fused QKV
        k_cur = B.view_2d(ctx, k_cur, k_cur.ne[0] * k_cur.ne[1], k_cur.ne[2], k_cur.nb[2], 0)
        k_2d = B.view_2d(ctx, k, k.ne[0], self.size * self.n_stream, k.nb[1], 0)
        return B.set_rows(ctx, k_2d, k_cur, k_idxs)

    def cpy_v(self, ctx: Context, v_cur: Tensor, v_idxs: Tensor, il: int) -> Tensor:
        v = self.v[il]
        n_embd_gqa, n_tokens = v_cur.ne[0] * v_cur.ne[1], v_cur.ne[2]
        if not self.v_trans:
            v_cur = B.view_2d(ctx, v_cur, n_embd_gqa, n_tokens, v_cur.nb[2], 0)
            v_2d = B.view_2d(ctx, v, v.ne[0], self.size * self.n_stream, v.nb[1], 0)
            return B.set_rows(ctx, v_2d, v_cur, v_idxs)
        if v_cur.type.row_size(n_embd_gqa) == v_cur.nb[2]:
            v_cur = B.reshape_2d(ctx, v_cur, n_embd_gqa, n_tokens)
        else:  # a slice of a fused QKV: made contiguous first
            v_cur = B.cont_2d(ctx, v_cur, n_embd_gqa, n_tokens)
        # every element becomes its own row: element j of cell c of stream s is row (s*E + j)*kv_size + c
        v_view = B.reshape_2d(ctx, v, 1, v.ne[0] * v.ne[1] * v.ne[2])
        v_cur = B.reshape_2d(ctx, v_cur, 1, v_cur.ne[0] * v_cur.ne[1])
        return B.set_rows(ctx, v_view, v_cur, v_idxs)

    # ------------------------------------------------------------------ input data
    def _rows(self, slots: SlotInfo) -> np.ndarray:
        """Each token's row of the cache viewed as {E, kv_size*n_stream}: stream*kv_size + cell."""
        return np.concatenate([st * self.size + np.asarray(idxs, dtype=np.int64) for st, idxs in slots])

    def k_idxs_data(self, slots: SlotInfo) -> np.ndarray:
        return self._rows(slots)

    def v_idxs_data(self, slots: SlotInfo, il_any: int) -> np.ndarray:
        rows = self._rows(slots)
        if not self.v_trans:
            return rows
        e = self.hp.n_embd_v_gqa(il_any)
        stream, cell = np.divmod(rows, self.size)
        base = stream * self.size * e + cell
        return (np.arange(e, dtype=np.int64)[None, :] * self.size + base[:, None]).reshape(-1)

    def mask_data(self, slots: SlotInfo, positions: np.ndarray, seq_first: np.ndarray, n_kv: int,
                  causal: bool = True) -> np.ndarray:
        """KQ mask [n_stream, n_tokens/n_stream, n_kv]: 0 where token i may attend cell j of its stream (a
        cell of the token's first sequence, at a position up to the token's, or any with ``causal`` off, and
        inside its window), -inf elsewhere. The unified cache has one stream for all tokens."""
        ns = len(slots)
        k = len(positions) // ns
        out = np.empty((ns, k, n_kv), dtype=np.float32)
        for g, (st, _) in enumerate(slots):
            p0 = self.pos[st, :n_kv][None, :]
            p1 = np.asarray(positions[g * k : (g + 1) * k], dtype=np.int64)[:, None]
            bits = np.left_shift(np.uint64(1), np.asarray(seq_first[g * k : (g + 1) * k], dtype=np.uint64))[:, None]
            ok = (p0 >= 0) & ((p0 <= p1) | (not causal)) & ((self.seq[st, :n_kv][None, :] & bits) != 0)
            if self.n_swa:
                ok &= (p1 - p0) < self.n_swa
            out[g] = np.where(ok, np.float32(0.0), np.float32(-np.inf))
        return out
