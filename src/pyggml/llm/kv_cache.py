"""The KV cache as llama.cpp keeps it (src/llama-kv-cache.cpp), for one sequence.

Per layer, K is ``[n_embd_k_gqa, kv_size]`` and V either the same or, without flash attention,
transposed (element j of cell c at ``j*kv_size + c``), both F16 by default and zeroed. A ubatch
finds cells with llama.cpp's ``find_slot`` (wrapping search from ``head``; in a sliding-window
cache, cells whose position fell out of the window are reused), writes K/V with SET_ROWS at those
cells, and attends over the first ``n_kv`` cells (a multiple of 256), masking the rest.
"""

from __future__ import annotations

import numpy as np

from ..backend.api import backend_buffer_clear, backend_buffer_set_usage, backend_tensor_alloc
from ..backend.base import Buffer, BufferType, BufferUsage
from ..context import Context, tensor_overhead
from ..errors import PyGGMLError
from ..ops import builders as B
from ..tensor import Tensor, ggml_pad
from ..types import GGMLType
from .hparams import HParams

KV_PAD = 256


class KVCacheFullError(PyGGMLError):
    """No free cells left for the tokens of a ubatch (the context is full)."""


class KVCache:
    """One cache (llama_kv_cache) over the layers ``layer_ids`` of a model."""

    def __init__(self, hp: HParams, layer_ids: list[int], kv_size: int, buft: BufferType | dict[int, BufferType],
                 type_k: GGMLType = GGMLType.F16, type_v: GGMLType = GGMLType.F16, v_trans: bool = True,
                 n_swa: int = 0, name: str = "") -> None:
        self.hp = hp
        self.layer_ids = list(layer_ids)
        self.size = kv_size
        self.v_trans = v_trans
        self.n_swa = n_swa  # 0: no sliding window in this cache
        self.name = name
        self.ctx = Context((2 * len(layer_ids) + 1) * tensor_overhead(), no_alloc=True)
        self.k: dict[int, Tensor] = {}
        self.v: dict[int, Tensor] = {}
        for il in self.layer_ids:
            self.k[il] = self.ctx.new_tensor(type_k, hp.n_embd_k_gqa(il), kv_size, 1).set_name(f"cache_k_l{il}")
            self.v[il] = self.ctx.new_tensor(type_v, hp.n_embd_v_gqa(il), kv_size, 1).set_name(f"cache_v_l{il}")
        # each layer's cache lives with the layer (llama.cpp's offload_kqv): one buffer per buffer type
        layer_buft = buft if isinstance(buft, dict) else dict.fromkeys(self.layer_ids, buft)
        groups: dict[BufferType, list[Tensor]] = {}
        for il in self.layer_ids:
            groups.setdefault(layer_buft[il], []).extend((self.k[il], self.v[il]))
        self.buffers: list[Buffer] = []
        for bt, tensors in groups.items():
            align = bt.get_alignment()
            buf = bt.alloc_buffer(sum(ggml_pad(bt.get_alloc_size(t), align) for t in tensors))
            backend_buffer_set_usage(buf, BufferUsage.ANY)
            addr = buf.get_base()
            for t in tensors:
                backend_tensor_alloc(buf, t, addr)
                addr += ggml_pad(bt.get_alloc_size(t), align)
            backend_buffer_clear(buf, 0)
            self.buffers.append(buf)
        self.pos = np.full(kv_size, -1, dtype=np.int64)  # -1: empty cell
        # how far each cell's position moved since its K was last rotated (seq_add); a K-shift
        # graph (LlamaContext) rotates K by these amounts before the next decode
        self.shift = np.zeros(kv_size, dtype=np.int64)
        self.head = 0

    # ------------------------------------------------------------------ cell bookkeeping
    def clear(self) -> None:
        self.pos.fill(-1)
        self.shift.fill(0)
        self.head = 0
        for buf in self.buffers:
            backend_buffer_clear(buf, 0)

    @property
    def used(self) -> int:
        return int(np.count_nonzero(self.pos >= 0))

    def seq_pos_max(self) -> int:
        return int(self.pos.max()) if self.size else -1

    def is_masked_swa(self, p0: int | np.ndarray, p1: int | np.ndarray) -> bool | np.ndarray:
        """llama_hparams::is_masked_swa for STANDARD windows: the key at p0 is out of p1's window."""
        if not self.n_swa:
            return False if np.isscalar(p0) else np.zeros(np.shape(p0), dtype=bool)
        return (p1 - p0) >= self.n_swa

    def find_slot(self, n_tokens: int) -> list[int]:
        """Cells for the next ``n_tokens`` tokens, searched as llama.cpp's find_slot (non-contiguous)."""
        if n_tokens > self.size:
            raise KVCacheFullError(f"{n_tokens} tokens do not fit a KV cache of {self.size} cells")
        used = self.used
        # as llama.cpp: restart from cell 0 when head ran far past the used cells (or off the end)
        head = 0 if self.head >= self.size or self.head > used + 2 * n_tokens else self.head
        pos_max = self.seq_pos_max()
        idxs: list[int] = []
        n_tested = 0
        while len(idxs) < n_tokens:
            if n_tested >= self.size:
                raise KVCacheFullError(f"the {self.name or 'KV'} cache is full ({self.size} cells); "
                                       "start a new context or use a larger --ctx-size")
            i = head
            head = (head + 1) % self.size
            n_tested += 1
            p = self.pos[i]
            if p < 0 or bool(self.is_masked_swa(int(p), pos_max + 1)):
                idxs.append(i)
        return idxs

    def apply(self, idxs: list[int], positions: np.ndarray) -> None:
        """apply_ubatch: occupy the cells, purging older positions the sliding window overwrote."""
        overwritten = self.pos[idxs]
        rm_max = int(overwritten.max()) if overwritten.size else -1
        self.pos[idxs] = positions
        if rm_max >= 0:
            # keep a contiguous position range: drop every cell older than the overwritten ones
            stale = (self.pos >= 0) & (self.pos <= rm_max)
            stale[idxs] = False
            self.pos[stale] = -1
        self.head = idxs[-1] + 1 if idxs else self.head

    def n_kv(self) -> int:
        """Cells attention spans: the used range padded to 256, at least 256, at most the cache size."""
        used_cells = np.flatnonzero(self.pos >= 0)
        used_max_p1 = int(used_cells[-1]) + 1 if used_cells.size else 0
        return min(self.size, max(KV_PAD, ggml_pad(used_max_p1, KV_PAD)))

    def _range(self, p0: int, p1: int) -> np.ndarray:
        """Cells holding a position in [p0, p1) (p0 < 0: from 0, p1 < 0: to the end)."""
        hi = np.iinfo(np.int64).max if p1 < 0 else p1
        return (self.pos >= max(p0, 0)) & (self.pos < hi)

    def seq_rm(self, p0: int, p1: int) -> None:
        """Remove positions [p0, p1) (p1 < 0: to the end)."""
        sel = self._range(p0, p1)
        self.pos[sel] = -1
        self.shift[sel] = 0
        self.head = 0

    def seq_add(self, p0: int, p1: int, delta: int) -> None:
        """llama_kv_cache::seq_add: move positions [p0, p1) by delta; cells moved below 0 are freed.
        Their K vectors still carry the old rotation until the K-shift graph runs (has_shift)."""
        if delta == 0 or p0 == p1:
            return
        sel = self._range(p0, p1)
        self.pos[sel] += delta
        self.shift[sel] += delta
        gone = sel & (self.pos < 0)
        self.pos[gone] = -1
        self.shift[gone] = 0
        self.head = 0

    @property
    def has_shift(self) -> bool:
        return bool(self.shift.any())

    # ------------------------------------------------------------------ graph pieces
    def get_k(self, ctx: Context, il: int, n_kv: int) -> Tensor:
        """K view {d_k, n_head_kv, n_kv, 1} over the first n_kv cells."""
        k = self.k[il]
        d = self.hp.n_embd_head_k
        return B.view_4d(ctx, k, d, self.hp.n_head_kv[il], n_kv, 1, k.type.row_size(d),
                                    k.type.row_size(self.hp.n_embd_k_gqa(il)), k.nb[2], 0)

    def get_v(self, ctx: Context, il: int, n_kv: int) -> Tensor:
        """V view: {n_kv, n_head_kv, d_v, 1} when transposed, else like K."""
        v = self.v[il]
        d = self.hp.n_embd_head_v
        nh = self.hp.n_head_kv[il]
        if self.v_trans:
            return B.view_4d(ctx, v, n_kv, nh, d, 1, v.type.row_size(self.size * d),
                                        v.type.row_size(self.size), v.nb[2], 0)
        return B.view_4d(ctx, v, d, nh, n_kv, 1, v.type.row_size(d),
                                    v.type.row_size(self.hp.n_embd_v_gqa(il)), v.nb[2], 0)

    def cpy_k(self, ctx: Context, k_cur: Tensor, k_idxs: Tensor, il: int) -> Tensor:
        k = self.k[il]
        n_tokens = k_cur.ne[2]
        k_cur = B.reshape_2d(ctx, k_cur, k_cur.ne[0] * k_cur.ne[1], n_tokens)
        k_2d = B.view_2d(ctx, k, k.ne[0], self.size, k.nb[1], 0)
        return B.set_rows(ctx, k_2d, k_cur, k_idxs)

    def cpy_v(self, ctx: Context, v_cur: Tensor, v_idxs: Tensor, il: int) -> Tensor:
        v = self.v[il]
        n_tokens = v_cur.ne[2]
        v_cur = B.reshape_2d(ctx, v_cur, v_cur.ne[0] * v_cur.ne[1], n_tokens)
        if not self.v_trans:
            v_2d = B.view_2d(ctx, v, v.ne[0], self.size, v.nb[1], 0)
            return B.set_rows(ctx, v_2d, v_cur, v_idxs)
        # every element becomes its own row: element j of cell c is row j*kv_size + c
        v_view = B.reshape_2d(ctx, v, 1, v.ne[0] * v.ne[1] * v.ne[2])
        v_cur = B.reshape_2d(ctx, v_cur, 1, v_cur.ne[0] * v_cur.ne[1])
        return B.set_rows(ctx, v_view, v_cur, v_idxs)

    # ------------------------------------------------------------------ input data
    def k_idxs_data(self, idxs: list[int]) -> np.ndarray:
        return np.asarray(idxs, dtype=np.int64)

    def v_idxs_data(self, idxs: list[int], il_any: int) -> np.ndarray:
        if not self.v_trans:
            return np.asarray(idxs, dtype=np.int64)
        e = self.hp.n_embd_v_gqa(il_any)
        cells = np.asarray(idxs, dtype=np.int64)
        return (np.arange(e, dtype=np.int64)[None, :] * self.size + cells[:, None]).reshape(-1)

    def mask_data(self, positions: np.ndarray, n_kv: int) -> np.ndarray:
        """KQ mask rows [n_tokens, n_kv]: 0 where token i may attend cell j, -inf elsewhere."""
        p0 = self.pos[:n_kv][None, :]
        p1 = np.asarray(positions, dtype=np.int64)[:, None]
        ok = (p0 >= 0) & (p0 <= p1)
        if self.n_swa:
            ok &= (p1 - p0) < self.n_swa
        return np.where(ok, np.float32(0.0), np.float32(-np.inf)).astype(np.float32)
