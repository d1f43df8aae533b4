"""``llama_context``: decode batches through the KV cache, with llama.cpp's ubatching and graph reuse.

A batch is split into ubatches of at most ``n_ubatch`` tokens (split_simple). For each ubatch the
KV cells are found and applied first, then the graph for its shape is built, or the previous one
reused when llama.cpp would reuse it (same n_tokens, n_outputs and n_kv per cache; ``n_reused``
counts those steps). The backend scheduler places each node by where its weights live, plans the
intermediate memory and runs the splits; inputs are written and logits read through the backend
API, so any backend works. Only positions flagged as outputs get logits.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..backend.api import backend_tensor_get, backend_tensor_set
from ..backend.base import GGMLStatus
from ..backend.cpu.backend import backend_cpu_init
from ..backend.sched import BackendSched, backend_sched_new, backend_sched_set_eval_callback
from ..errors import PyGGMLError
from ..tensor import Tensor, ggml_pad
from ..types import GGMLType
from .graph import GRAPH_MAX_NODES, GraphBuilder, UbatchGraph, build_k_shift
from .kv_cache import KV_PAD, KVCache
from .model import Model

#: ggml's eval callback: called with ask=True to ask whether a node is wanted, then with ask=False
#: once it has been computed; returning False from the second call stops the graph.
EvalCallback = Callable[[Tensor, bool], bool]


class DecodeError(PyGGMLError):
    """A batch that cannot be decoded (bad token ids, positions, too many tokens)."""


class DecodeAborted(DecodeError):
    """The abort callback stopped a decode (llama_decode's return value 2)."""


@dataclass
class ContextParams:
    n_ctx: int = 0  # 0: the model's training context
    n_batch: int = 2048
    n_ubatch: int = 512
    n_threads: int = 0  # 0: all cores
    flash_attn: bool = False
    type_k: GGMLType = GGMLType.F16
    type_v: GGMLType = GGMLType.F16
    swa_full: bool = False


class LlamaContext:
    def __init__(self, model: Model, params: ContextParams | None = None,
                 eval_callback: EvalCallback | None = None) -> None:
        p = params or ContextParams()
        hp = model.hparams
        self.model = model
        self.params = p
        n_ctx_user = p.n_ctx or hp.n_ctx_train
        self.n_batch = min(n_ctx_user, p.n_batch)
        self.n_ubatch = min(self.n_batch, p.n_ubatch)
        self.n_ctx = ggml_pad(n_ctx_user, KV_PAD)
        self.flash_attn = p.flash_attn
        buft = {il: model.layer_buft(il) for il in range(hp.n_layer)}
        v_trans = not p.flash_attn
        if hp.uses_swa:
            base_layers = [il for il in range(hp.n_layer) if not hp.is_swa(il)]
            swa_layers = [il for il in range(hp.n_layer) if hp.is_swa(il)]
            swa_size = self.n_ctx if p.swa_full else ggml_pad(min(self.n_ctx, hp.n_swa + self.n_ubatch), KV_PAD)
            self.caches = {}  # a cache only for the kinds of layers the model has
            if base_layers:
                self.caches["base"] = KVCache(hp, base_layers, self.n_ctx, buft, p.type_k, p.type_v, v_trans, 0,
                                              "base")
            if swa_layers:
                self.caches["swa"] = KVCache(hp, swa_layers, swa_size, buft, p.type_k, p.type_v, v_trans, hp.n_swa,
                                             "swa")
            self.layer_cache = ["swa" if hp.is_swa(il) else "base" for il in range(hp.n_layer)]
        else:
            self.caches = {"base": KVCache(hp, list(range(hp.n_layer)), self.n_ctx, buft, p.type_k, p.type_v,
                                           v_trans, 0, "base")}
            self.layer_cache = ["base"] * hp.n_layer
        self.backend = backend_cpu_init()
        self.backend.set_n_threads(p.n_threads or os.cpu_count() or 1)
        # the devices holding weights first, the CPU last (llama.cpp's order)
        self.backends = [d.init_backend(None) for d in model.devices] + [self.backend]
        self.sched: BackendSched = backend_sched_new(self.backends, None, GRAPH_MAX_NODES, False, True)
        self.eval_callback = eval_callback
        self._graph: UbatchGraph | None = None
        self.n_reused = 0  # ubatches that reused the previous graph (llama.cpp's n_reused)
        self.n_graph_builds = 0
        self.n_past = 0
        self.logits = np.zeros((0, hp.n_vocab), dtype=np.float32)
        self.abort_callback: Callable[[], bool] | None = None

    def set_abort_callback(self, callback: Callable[[], bool] | None) -> None:
        """llama_set_abort_callback: asked after every computed node; True stops the decode, which then
        raises DecodeAborted and leaves the context as it was before the call."""
        self.abort_callback = callback
        for b in self.backends:
            if hasattr(b, "set_abort_callback"):
                b.set_abort_callback(None if callback is None else (lambda _data: bool(callback())))

    # ------------------------------------------------------------------ memory
    def clear(self) -> None:
        """Forget every cached token (llama_memory_clear)."""
        for c in self.caches.values():
            c.clear()
        self.n_past = 0

    def seq_rm(self, p0: int, p1: int = -1) -> None:
        """Forget positions [p0, p1) (p1 < 0: to the end)."""
        for c in self.caches.values():
            c.seq_rm(p0, p1)
        self.n_past = min(self.n_past, p0) if p1 < 0 else self.n_past

    def seq_add(self, p0: int, p1: int, delta: int) -> None:
        """Move positions [p0, p1) by ``delta`` (llama_memory_seq_add); the cached K vectors are
        re-rotated to their new positions before the next decode (the K-shift)."""
        for c in self.caches.values():
            c.seq_add(p0, p1, delta)

    def context_shift(self, n_keep: int) -> int:
        """llama.cpp's context shift when the context is full: keep the first ``n_keep`` positions,
        drop half of the rest (the oldest), move the newer half down; returns the positions dropped."""
        n_left = self.n_past - n_keep
        n_discard = n_left // 2
        if n_keep < 0 or n_discard <= 0:
            raise DecodeError(f"cannot shift the context: {self.n_past} positions, {n_keep} to keep")
        self.seq_rm(n_keep, n_keep + n_discard)
        self.seq_add(n_keep + n_discard, self.n_past, -n_discard)
        self.n_past -= n_discard
        return n_discard

    def _apply_k_shift(self) -> None:
        """Rotate the K of moved cells (llama_kv_cache::update with do_shift), through the scheduler."""
        for cache in self.caches.values():
            if not cache.has_shift:
                continue
            g = build_k_shift(self.model, cache)
            self.sched.reset()
            if not self.sched.alloc_graph(g.gf):
                raise PyGGMLError("failed to allocate the K-shift graph")
            backend_tensor_set(g.shift, cache.shift.astype(np.int32))
            self.sched.graph_compute(g.gf)
            cache.shift.fill(0)
            self._graph = None  # the scheduler's memory was replanned: the next ubatch builds anew

    # ------------------------------------------------------------------ inspection
    @contextmanager
    def capture(self, pattern: str) -> Iterator[dict[str, np.ndarray]]:
        r"""Collect copies of the intermediate tensors whose names fully match ``pattern``.

        Names follow llama.cpp's callback names (``l_out-5`` is layer 5's residual stream,
        ``attn_norm-0``, ``kq_soft_max-3``, ``result_norm``, ``result_output``). Each captured
        array has numpy shape (n_tokens, ne0) for row-major activations; a later ubatch or decode
        overwrites an earlier value of the same name.

            with ctx.capture(r"l_out-\d+") as hidden:
                ctx.decode(tokens)
            hidden["l_out-3"]
        """
        rx = re.compile(pattern)
        found: dict[str, np.ndarray] = {}

        def cb(t: Tensor, ask: bool) -> bool:
            if ask:
                return rx.fullmatch(t.name) is not None
            found[t.name] = tensor_to_numpy(t)
            return True

        previous = self.eval_callback
        self.eval_callback = cb
        try:
            yield found
        finally:
            self.eval_callback = previous

    # ------------------------------------------------------------------ decoding
    def decode(self, tokens: Sequence[int], positions: Sequence[int] | None = None,
               outputs: Sequence[bool] | None = None) -> np.ndarray:
        """Run ``tokens`` through the model; returns the logits of the output tokens, [n_outputs, n_vocab].

        By default positions continue after the cached ones and only the last token is an output.
        """
        toks = np.asarray(tokens, dtype=np.int64).reshape(-1)
        n = toks.size
        if n == 0:
            raise DecodeError("decode: empty batch")
        if n > self.n_batch:
            raise DecodeError(f"decode: {n} tokens exceed n_batch = {self.n_batch}")
        n_vocab = self.model.hparams.n_vocab
        bad = (toks < 0) | (toks >= n_vocab)
        if bad.any():
            raise DecodeError(f"decode: token id {int(toks[bad][0])} is out of range [0, {n_vocab})")
        if positions is None:
            pos = np.arange(self.n_past, self.n_past + n, dtype=np.int64)
        else:
            pos = np.asarray(positions, dtype=np.int64).reshape(-1)
            if pos.size != n:
                raise DecodeError("decode: positions and tokens differ in length")
            if pos[0] != self.n_past or np.any(np.diff(pos) != 1):
                raise DecodeError(f"decode: positions must continue the sequence from {self.n_past} without gaps")
        out_flags = np.zeros(n, dtype=bool)
        if outputs is None:
            out_flags[-1] = True
        else:
            out_flags[:] = np.asarray(outputs, dtype=bool).reshape(-1)
        self._apply_k_shift()
        saved = self._save_state()
        rows = []
        try:
            for s in range(0, n, self.n_ubatch):
                e = min(s + self.n_ubatch, n)
                rows.append(self._process_ubatch(toks[s:e], pos[s:e], out_flags[s:e]))
        except BaseException:  # a failure, an abort or Ctrl-C part-way: the context is as it was
            self._restore_state(saved)
            raise
        self.n_past = int(pos[-1]) + 1
        self.logits = np.concatenate(rows, axis=0) if rows else np.zeros((0, n_vocab), np.float32)
        return self.logits

    def _save_state(self) -> tuple:
        """The cache cells' bookkeeping and counters a decode changes (the K/V data of cells it
        writes is not needed: restored cells hold positions no later token can attend to again)."""
        return self.n_past, {name: (c.pos.copy(), c.shift.copy(), c.head) for name, c in self.caches.items()}

    def _restore_state(self, saved: tuple) -> None:
        self.n_past, cells = saved
        for name, (pos, shift, head) in cells.items():
            c = self.caches[name]
            c.pos[:], c.shift[:], c.head = pos, shift, head
        self._graph = None  # a failure may have left the scheduler half-way: plan the next graph anew

    def _process_ubatch(self, toks: np.ndarray, pos: np.ndarray, out_flags: np.ndarray) -> np.ndarray:
        n_tokens = toks.size
        out_ids = np.flatnonzero(out_flags).astype(np.int32)
        n_outputs = out_ids.size
        cells = {}
        for name, cache in self.caches.items():
            idxs = cache.find_slot(n_tokens)
            cache.apply(idxs, pos)
            cells[name] = idxs
        n_kv = {name: c.n_kv() for name, c in self.caches.items()}
        key = (n_tokens, n_outputs, tuple(sorted(n_kv.items())))
        g = self._graph
        if g is not None and g.key == key and os.environ.get("LLAMA_GRAPH_REUSE_DISABLE") is None:
            self.n_reused += 1
        else:
            b = GraphBuilder(self.model, self.caches, self.layer_cache, n_tokens, n_outputs, n_kv, self.flash_attn)
            g = b.build(key)
            self.sched.reset()
            if not self.sched.alloc_graph(g.gf):
                raise PyGGMLError("failed to allocate the compute graph")
            self._graph = g
            self.n_graph_builds += 1
        # inputs, through the backend API: they may live on any backend
        backend_tensor_set(g.tokens, toks.astype(np.int32))
        backend_tensor_set(g.pos, pos.astype(np.int32))
        if n_outputs:
            backend_tensor_set(g.out_ids, out_ids)
        for name, inp in g.attn.items():
            cache = inp.cache
            idxs = cells[name]
            backend_tensor_set(inp.k_idxs, cache.k_idxs_data(idxs))
            backend_tensor_set(inp.v_idxs, cache.v_idxs_data(idxs, cache.layer_ids[0]))
            mask = cache.mask_data(pos, inp.n_kv)
            backend_tensor_set(inp.kq_mask, mask.astype(np.float16) if inp.kq_mask.type == GGMLType.F16 else mask)
        backend_sched_set_eval_callback(self.sched, self.eval_callback)
        status = self.sched.graph_compute(g.gf)
        if status != GGMLStatus.SUCCESS:
            if status == GGMLStatus.ABORTED:
                raise DecodeAborted("decode aborted by the abort callback")
            raise DecodeError(f"the graph failed to compute: {status.name}")
        if n_outputs == 0:
            return np.zeros((0, self.model.hparams.n_vocab), dtype=np.float32)
        return tensor_to_numpy(g.logits).reshape(n_outputs, -1)


def tensor_to_numpy(t: Tensor) -> np.ndarray:
    """A float32 copy of a tensor's data in numpy order, wherever it lives (host or device)."""
    if t.buffer is None or t.buffer.is_host():
        return np.array(t.to_float(), dtype=np.float32, copy=True)
    from ..convert import rows_to_f32

    if not t.is_contiguous():
        raise PyGGMLError(f"cannot read non-contiguous device tensor {t.name!r}")
    raw = backend_tensor_get(t)
    tr = t.type.traits
    if tr.blck_size == 1:
        dt = tr.np_dtype if t.type != GGMLType.BF16 else np.dtype("<u2")
        rows = raw.view(dt).reshape(t.ne[3], t.ne[2], t.ne[1], t.ne[0])
    else:
        rows = raw.reshape(t.ne[3], t.ne[2], t.ne[1], t.row_size())
    v = rows_to_f32(rows, t.type)
    return np.ascontiguousarray(v.reshape(v.shape[4 - t._np_ndim():]), dtype=np.float32)
