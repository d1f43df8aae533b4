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
from ..errors import PyGGMLError
from ..sched import BackendSched, backend_sched_new, backend_sched_set_eval_callback
from ..tensor import Tensor, ggml_pad
from ..types import GGMLType
from . import state
from .batch import Batch, DecodeError, PreparedBatch, prepare, split_equal, split_seq, split_simple
from .embeddings import mean_weights, no_cache_mask, pooled_rows, pools_last
from .graph import GRAPH_MAX_NODES, GraphBuilder, UbatchGraph, build_k_shift
from .graph_cache import DEFAULT_GRAPH_CACHE, GraphCache
from .hparams import PoolingType
from .kv_cache import KV_PAD, KVCache
from .memory_recurrent import RecurrentMemory
from .model import Model, cpu_device

#: the key of the recurrent memory's bookkeeping in a saved decode state
_RECR = "\0recurrent"

#: ggml's eval callback: called with ask=True to ask whether a node is wanted, then with ask=False
#: once it has been computed; returning False from the second call stops the graph.
EvalCallback = Callable[[Tensor, bool], bool]
#: decode_batch's per-ubatch consumer of logits: (batch indices of the ubatch's outputs, their logits)
LogitsSink = Callable[[np.ndarray, np.ndarray], None]


class DecodeAborted(DecodeError):
    """The abort callback stopped a decode (llama_decode's return value 2)."""


@dataclass
class ContextParams:
    n_ctx: int = 0  # 0: the model's training context
    n_batch: int = 2048
    n_ubatch: int = 512
    n_threads: int = 0  # 0: all cores
    flash_attn: bool | None = False  # None: llama.cpp's auto (on where every device holding layers has it)
    type_k: GGMLType = GGMLType.F16
    type_v: GGMLType = GGMLType.F16
    swa_full: bool = False
    n_seq_max: int = 1  # sequences the memory can hold at once (sequence ids 0 .. n_seq_max-1)
    kv_unified: bool = True  # one stream of cells for all sequences; False: a stream per sequence
    embeddings: bool = False  # also output embeddings (llama_context_params.embeddings)
    pooling_type: PoolingType = PoolingType.UNSPECIFIED  # UNSPECIFIED: the model's ({arch}.pooling_type)
    causal_attn: bool | None = None  # llama_attention_type: None the model's ({arch}.attention.causal)
    n_graph_cache: int = DEFAULT_GRAPH_CACHE  # ubatch graph shapes kept built and planned (graph_cache.py)


def resolve_flash_attn(model: Model) -> bool:
    """llama.cpp's ``-fa auto``: flash attention unless a device holding layers cannot compute FLASH_ATTN_EXT
    (llama_context::resolve_fused_ops turns it off when the op would leave its layer's device). The CPU
    computes it always; another device is asked with a probe of the model's head shapes, one decode step
    over 256 F16 cells."""
    from ..context import Context, tensor_overhead  # deferred: only for the probe
    from ..ops.nn import flash_attn_ext

    hp = model.hparams
    attn = [il for il in range(hp.n_layer) if hp.n_head[il] and hp.n_head_kv[il]]
    if not attn:  # a recurrent model: no attention to run either way
        return True
    n_head, n_head_kv = hp.n_head[attn[0]], hp.n_head_kv[attn[0]]
    for dev in model.devices:
        ctx = Context(8 * tensor_overhead(), no_alloc=True)
        q = ctx.new_tensor(GGMLType.F32, hp.n_embd_head_k, 1, n_head, 1)
        k = ctx.new_tensor(GGMLType.F16, hp.n_embd_head_k, 256, n_head_kv, 1)
        v = ctx.new_tensor(GGMLType.F16, hp.n_embd_head_v, 256, n_head_kv, 1)
        mask = ctx.new_tensor(GGMLType.F16, 256, 1, 1, 1)
        if not dev.supports_op(flash_attn_ext(ctx, q, k, v, mask, 1.0, 0.0, 0.0)):
            return False
    return True


class LlamaContext:
    def __init__(self, model: Model, params: ContextParams | None = None,
                 eval_callback: EvalCallback | None = None) -> None:
        p = params or ContextParams()
        hp = model.hparams
        if not model.arch.has_logits and not p.embeddings:
            raise PyGGMLError(f"{hp.arch} models compute embeddings, not logits (use pyggml embedding, or a "
                              "context with embeddings=True)")
        self.embeddings = p.embeddings
        self.pooling_type = hp.pooling_type if p.pooling_type is PoolingType.UNSPECIFIED else p.pooling_type
        if self.pooling_type is PoolingType.UNSPECIFIED:
            self.pooling_type = PoolingType.NONE
        if not 1 <= p.n_seq_max <= 64:
            raise PyGGMLError(f"n_seq_max must be 1 to 64 (LLAMA_MAX_SEQ), got {p.n_seq_max}")
        self.n_seq_max = p.n_seq_max
        self.kv_unified = p.kv_unified
        self.model = model
        self.params = p
        n_ctx_user = p.n_ctx or hp.n_ctx_train
        #: whether a token attends only to earlier positions (an encoder's batch is always non-causal)
        self.causal_attn = hp.causal_attn if p.causal_attn is None else p.causal_attn
        # with causal attention a batch cannot outgrow the context; without, it is not cached (llama.cpp's rule)
        self.n_batch = min(n_ctx_user, p.n_batch) if self.causal_attn else p.n_batch
        self.n_ubatch = min(self.n_batch, p.n_ubatch)
        self.n_ctx = ggml_pad(n_ctx_user, KV_PAD)
        # cells per sequence: all of them when unified, else an equal stream each (n_ctx rounded to fit)
        self.n_ctx_seq = self.n_ctx if p.kv_unified else ggml_pad(self.n_ctx // p.n_seq_max, KV_PAD)
        self.n_ctx = self.n_ctx_seq * (1 if p.kv_unified else p.n_seq_max)
        n_stream = 1 if p.kv_unified else p.n_seq_max
        self.flash_attn = resolve_flash_attn(model) if p.flash_attn is None else p.flash_attn
        buft = {il: model.layer_buft(il) for il in range(hp.n_layer)}
        v_trans = not self.flash_attn
        #: the recurrent layers' states (llama_memory_recurrent), one cell per sequence; None without them
        self.recr: RecurrentMemory | None = None
        if not model.arch.has_memory:  # an encoder: no KV cache (llama_model::create_memory gives none)
            self.caches = {}
            self.layer_cache = []
        elif model.arch.recurrent:
            # llama_memory_recurrent, or llama_memory_hybrid: the attention layers on a KV cache beside it
            if hp.uses_swa:
                raise PyGGMLError(f"{hp.arch}: a hybrid model with sliding-window layers is not supported yet")
            self.recr = RecurrentMemory(hp, model.arch.recr_layers(hp), max(1, p.n_seq_max), p.n_seq_max, buft)
            attn_layers = model.arch.attn_layers(hp) if model.arch.hybrid else []
            self.caches = {}
            if attn_layers:
                self.caches["base"] = KVCache(hp, attn_layers, self.n_ctx_seq, buft, p.type_k, p.type_v, v_trans, 0,
                                              "base", p.n_seq_max, n_stream)
            self.layer_cache = ["base"] * hp.n_layer
        elif hp.uses_swa:
            base_layers = [il for il in range(hp.n_layer) if not hp.is_swa(il)]
            swa_layers = [il for il in range(hp.n_layer) if hp.is_swa(il)]
            # llama_kv_cache_iswa: the window of every sequence of the stream plus a ubatch
            n_win = hp.n_swa * (p.n_seq_max if p.kv_unified else 1) + self.n_ubatch
            swa_size = self.n_ctx_seq if p.swa_full else ggml_pad(min(self.n_ctx_seq, n_win), KV_PAD)
            self.caches = {}  # a cache only for the kinds of layers the model has
            if base_layers:
                self.caches["base"] = KVCache(hp, base_layers, self.n_ctx_seq, buft, p.type_k, p.type_v, v_trans, 0,
                                              "base", p.n_seq_max, n_stream)
            if swa_layers:
                self.caches["swa"] = KVCache(hp, swa_layers, swa_size, buft, p.type_k, p.type_v, v_trans, hp.n_swa,
                                             "swa", p.n_seq_max, n_stream)
            self.layer_cache = ["swa" if hp.is_swa(il) else "base" for il in range(hp.n_layer)]
        else:
            self.caches = {"base": KVCache(hp, list(range(hp.n_layer)), self.n_ctx_seq, buft, p.type_k, p.type_v,
                                           v_trans, 0, "base", p.n_seq_max, n_stream)}
            self.layer_cache = ["base"] * hp.n_layer
        cpu = cpu_device()
        self.backend = cpu.init_backend(None)
        set_n_threads = cpu.reg.get_proc_address("ggml_backend_set_n_threads") if cpu.reg is not None else None
        if set_n_threads is not None:  # as llama.cpp sets threads: through the registry's proc address
            set_n_threads(self.backend, p.n_threads or os.cpu_count() or 1)
        # the devices holding weights first, the CPU last (llama.cpp's order)
        self.backends = [d.init_backend(None) for d in model.devices] + [self.backend]
        self.sched: BackendSched = backend_sched_new(self.backends, None, GRAPH_MAX_NODES, False, True)
        self.eval_callback = eval_callback
        self._graph: UbatchGraph | None = None  # the graph the scheduler has allocated now
        #: earlier shapes' graphs, built and planned, for when that shape comes back (graph_cache.py)
        self.graph_cache = GraphCache(p.n_graph_cache)
        self.n_reused = 0  # ubatches that reused a built graph (llama.cpp's n_reused, which counts the last one's)
        self.n_graph_builds = 0
        self.n_graph_restores = 0  # of n_reused, those that took an earlier graph back from the cache
        self.logits = np.zeros((0, hp.n_vocab), dtype=np.float32)
        self.output_ids = np.zeros(0, dtype=np.int64)  # batch index -> logits row (-1: not an output)
        self.embd = np.zeros((0, hp.n_embd), dtype=np.float32)  # pooling none: per output token, as logits
        self.embd_seq: dict[int, np.ndarray] = {}  # pooled: sequence id -> its vector (or RANK's scores)
        self.abort_callback: Callable[[], bool] | None = None

    def set_abort_callback(self, callback: Callable[[], bool] | None) -> None:
        """llama_set_abort_callback: asked after every computed node; True stops the decode, which then
        raises DecodeAborted and leaves the context as it was before the call."""
        self.abort_callback = callback
        for b in self.backends:
            if hasattr(b, "set_abort_callback"):
                b.set_abort_callback(None if callback is None else (lambda _data: bool(callback())))

    # ------------------------------------------------------------------ memory (llama_memory_*)
    @property
    def _pos_cache(self) -> KVCache:
        """The cache that answers position queries: the sliding-window one when there is one (it holds
        a subset of the base cache's cells, as llama_kv_cache_iswa answers from kv_swa)."""
        return self.caches.get("swa") or self.caches["base"]

    @property
    def has_memory(self) -> bool:
        """Whether batches leave anything behind (a KV cache, a recurrent memory or both)."""
        return bool(self.caches) or self.recr is not None

    def seq_pos_min(self, seq_id: int = 0) -> int:
        """The smallest position of the sequence in memory, -1 when it has none (always, without memory);
        in a hybrid memory the larger of its two parts' (llama_memory_hybrid::seq_pos_min)."""
        vals = [self._pos_cache.seq_pos_min(seq_id)] if self.caches else []
        if self.recr is not None:
            vals.append(self.recr.seq_pos_min(seq_id))
        return max(vals) if vals else -1

    def seq_pos_max(self, seq_id: int = 0) -> int:
        """The largest position of the sequence in memory, -1 when it has none (always, without memory);
        in a hybrid memory the smaller of its two parts'."""
        vals = [self._pos_cache.seq_pos_max(seq_id)] if self.caches else []
        if self.recr is not None:
            vals.append(self.recr.seq_pos_max(seq_id))
        return min(vals) if vals else -1

    def _need_memory(self, what: str) -> None:
        if not self.has_memory:
            raise PyGGMLError(f"{what}: {self.model.hparams.arch} models keep no memory between batches")

    @property
    def n_past(self) -> int:
        """Sequence 0's next position (its cached token count when it starts at 0)."""
        return self.seq_pos_max(0) + 1

    def _seq(self, seq_id: int, allow_all: bool = False) -> None:
        if not (0 <= seq_id < self.n_seq_max or (allow_all and seq_id < 0)):
            raise DecodeError(f"sequence id {seq_id} is out of range [0, {self.n_seq_max})")

    def clear(self) -> None:
        """Forget every cached token of every sequence (llama_memory_clear)."""
        for c in self.caches.values():
            c.clear()
        if self.recr is not None:
            self.recr.clear()

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """The sequence (seq_id < 0: all) forgets positions [p0, p1) (p0 < 0: from 0, p1 < 0: to the end).

        Returns False, changing nothing, where the memory cannot honour the range (llama_memory_seq_rm): a
        recurrent state can only be dropped whole, so a range that ends the sequence but starts after 0 is
        refused (in a hybrid memory the recurrent part is asked first)."""
        self._seq(seq_id, allow_all=True)
        if self.recr is not None and not self.recr.seq_rm(seq_id, p0, p1):
            return False
        for c in self.caches.values():
            c.seq_rm(seq_id, p0, p1)
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Sequence dst shares src's cells for positions [p0, p1) (the cells, not copies of them); a recurrent
        state is shared whole (copied on the next write)."""
        self._seq(src)
        self._seq(dst)
        for c in self.caches.values():
            c.seq_cp(src, dst, p0, p1)
        if self.recr is not None:
            self.recr.seq_cp(src, dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        """Every sequence but seq_id forgets everything."""
        self._seq(seq_id)
        for c in self.caches.values():
            c.seq_keep(seq_id)
        if self.recr is not None:
            self.recr.seq_keep(seq_id)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Move the sequence's positions [p0, p1) by ``delta`` (llama_memory_seq_add); the cached K
        vectors are re-rotated to their new positions before the next decode (the K-shift)."""
        self._seq(seq_id)
        for c in self.caches.values():
            c.seq_add(seq_id, p0, p1, delta)
        if self.recr is not None:
            self.recr.seq_add(seq_id, p0, p1, delta)

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        """Integer-divide the sequence's positions [p0, p1) by ``d`` (llama_memory_seq_div)."""
        self._seq(seq_id)
        for c in self.caches.values():
            c.seq_div(seq_id, p0, p1, d)
        if self.recr is not None:
            self.recr.seq_div(seq_id, p0, p1, d)

    def context_shift(self, n_keep: int, seq_id: int = 0) -> int:
        """llama.cpp's context shift when the context is full: keep the first ``n_keep`` positions,
        drop half of the rest (the oldest), move the newer half down; returns the positions dropped."""
        n_past = self.seq_pos_max(seq_id) + 1
        n_discard = (n_past - n_keep) // 2
        if n_keep < 0 or n_discard <= 0:
            raise DecodeError(f"cannot shift the context: {n_past} positions, {n_keep} to keep")
        self.seq_rm(seq_id, n_keep, n_keep + n_discard)
        self.seq_add(seq_id, n_keep + n_discard, n_past, -n_discard)
        return n_discard

    def _apply_k_shift(self) -> None:
        """Rotate the K of moved cells (llama_kv_cache::update with do_shift), through the scheduler."""
        for cache in self.caches.values():
            if not cache.has_shift:
                continue
            g = build_k_shift(self.model, cache, self.n_ctx_seq)
            self.sched.reset()
            if not self.sched.alloc_graph(g.gf):
                raise PyGGMLError("failed to allocate the K-shift graph")
            backend_tensor_set(g.shift, cache.shift.astype(np.int32))
            self.sched.graph_compute(g.gf)
            cache.shift.fill(0)
            # the scheduler holds the shift graph now; the cached graphs stay placed unless its plan grew the
            # compute buffers (restoring one checks)
            self._graph = None

    # ------------------------------------------------------------------ sequence state (llama_state_seq_*)
    def state_seq_get_data(self, seq_id: int = 0) -> bytes:
        """The sequence's cells (positions and K/V rows) in llama.cpp's sequence-state format."""
        self._need_memory("state_seq_get_data")
        self._seq(seq_id)
        self._apply_k_shift()  # saved K must be rotated to the saved positions
        return state.seq_state_bytes(self.caches, seq_id, self.recr)

    def state_seq_set_data(self, data: bytes, seq_id: int = 0) -> int:
        """Replace sequence seq_id's cells with a saved state (from any sequence); returns the bytes read.
        Raises StateError if it does not fit this context (the sequence then holds nothing)."""
        self._need_memory("state_seq_set_data")
        self._seq(seq_id)
        return state.set_seq_state(self.caches, seq_id, data, self.recr)

    def state_seq_save_file(self, path: str | os.PathLike, seq_id: int, tokens: Sequence[int]) -> int:
        """llama_state_seq_save_file: the sequence's tokens and cells, written atomically; returns bytes."""
        self._need_memory("state_seq_save_file")
        self._seq(seq_id)
        self._apply_k_shift()
        return state.save_seq_file(path, self.caches, seq_id, list(tokens), self.recr)

    def state_seq_load_file(self, path: str | os.PathLike, seq_id: int) -> list[int]:
        """llama_state_seq_load_file: restore a saved sequence into seq_id; returns its tokens."""
        self._need_memory("state_seq_load_file")
        self._seq(seq_id)
        return state.load_seq_file(path, self.caches, seq_id, self.recr)

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
               outputs: Sequence[bool] | None = None, seq_id: int = 0) -> np.ndarray:
        """Decode ``tokens`` of one sequence; returns the logits of the output tokens, [n_outputs, n_vocab].

        By default positions continue after the sequence's cached ones and only the last token is
        an output. Several sequences at once: :meth:`decode_batch`.
        """
        n = len(tokens)
        return self.decode_batch(Batch(token=tokens, pos=positions, seq_id=[seq_id] * n if seq_id else None,
                                       logits=outputs))

    def decode_batch(self, batch: Batch, logits_sink: LogitsSink | None = None) -> np.ndarray:
        """llama_decode: run a batch of tokens of any sequences; returns the logits of its output tokens
        in batch order, [n_outputs, n_vocab] (``output_ids`` maps batch index -> row), or for a model
        without an output head an empty [n_outputs, 0].

        ``logits_sink`` takes each ubatch's logits as it is computed, with the batch indices of its outputs,
        and the batch's logits are not kept (an empty array is returned): what perplexity and imatrix need,
        where a batch's outputs over a 262k vocabulary would be gigabytes. The array it gets may be a view of
        the graph's output, valid during the call only (copy what must outlive it). Not with embeddings.

        The batch is checked and completed as llama.cpp does (see llm/batch.py), split into ubatches
        of at most n_ubatch tokens, and each ubatch finds its cells, builds (or reuses) its graph
        and computes. A failure, an abort or Ctrl-C part-way leaves the memory as it was.

        With embeddings every token is an output; the embeddings are read with :meth:`get_embeddings_ith`
        (pooling none) or :meth:`get_embeddings_seq` (pooled). A model without memory (an encoder) runs the
        whole batch as one ubatch, as llama_context::encode, so it must fit n_ubatch.
        """
        hp = self.model.hparams
        if batch.n_tokens > self.n_batch:
            raise DecodeError(f"decode: {batch.n_tokens} tokens exceed n_batch = {self.n_batch}")
        ub_all = prepare(batch, hp.n_vocab, hp.n_embd, self.n_seq_max, self.seq_pos_min, self.seq_pos_max,
                         output_all=self.embeddings or not self.has_memory)
        if not self.has_memory:
            if ub_all.n_tokens > self.n_ubatch:  # attention spans the whole batch: it cannot be cut
                raise DecodeError(f"decode: an encoder runs the batch as one ubatch: {ub_all.n_tokens} tokens "
                                  f"exceed n_ubatch = {self.n_ubatch}")
            ubatches = [ub_all]
        # llama.cpp's memory split: consecutive tokens for one stream; with a stream per sequence,
        # equal runs of tokens of consecutive sequences (split_equal), which attend stream by stream
        elif not self.causal_attn and ub_all.n_tokens > self.n_ubatch:
            raise DecodeError(f"decode: non-causal attention needs the batch in one ubatch: {ub_all.n_tokens} tokens "
                              f"exceed n_ubatch = {self.n_ubatch}")
        elif self.recr is not None:
            ubatches = self._split_recurrent(ub_all)
        elif self.kv_unified:
            ubatches = split_simple(ub_all, self.n_ubatch)
        else:
            ubatches = split_equal(ub_all, self.n_ubatch, sequential=True)
        self._apply_k_shift()
        saved = self._save_state()
        # each ubatch's logits go straight to their rows in batch order (split_equal reorders tokens):
        # one copy of what can be a gigabyte (1024 outputs of a 262k vocabulary)
        n_vocab_out = hp.n_vocab if self.model.arch.has_logits else 0
        if logits_sink is not None and self.embeddings:
            raise PyGGMLError("decode_batch: a logits sink cannot be used with embeddings on")
        logits = np.empty((0 if logits_sink else ub_all.n_outputs, n_vocab_out), dtype=np.float32)
        pooled = self.embeddings and self.pooling_type is not PoolingType.NONE
        embd = np.empty((0 if pooled or not self.embeddings else ub_all.n_outputs, hp.n_embd), dtype=np.float32)
        embd_seq: dict[int, np.ndarray] = {}
        row_of = np.cumsum(ub_all.output) - 1  # batch index -> logits row, for outputs
        if self.recr is not None:
            self.recr.begin()
        try:
            for ub in ubatches:
                self._process_ubatch(ub, logits, row_of[ub.index[ub.output]], embd, embd_seq, logits_sink)
        except BaseException:  # a failure, an abort or Ctrl-C part-way: the memory is as it was
            self._restore_state(saved)
            raise
        self.logits = logits
        self.embd, self.embd_seq = embd, embd_seq
        self.output_ids = np.full(ub_all.n_tokens, -1, dtype=np.int64)
        if logits_sink is None:
            self.output_ids[ub_all.output] = np.arange(ub_all.n_outputs)
        return self.logits

    def set_embeddings(self, embeddings: bool) -> None:
        """llama_set_embeddings: whether later decodes also output embeddings (every token an output)."""
        if not embeddings and not self.model.arch.has_logits:
            raise PyGGMLError(f"{self.model.hparams.arch} models only compute embeddings")
        if embeddings != self.embeddings:
            self.embeddings = embeddings
            self._graph = None  # the graph gains or loses its pooling

    def get_embeddings(self) -> np.ndarray:
        """llama_get_embeddings: the per-token embeddings of the last decode's outputs, [n_outputs, n_embd]
        (pooling none; empty when pooled)."""
        return self.embd

    def get_embeddings_ith(self, i: int) -> np.ndarray:
        """llama_get_embeddings_ith: the embedding of batch token i of the last decode (pooling none)."""
        if not self.embeddings:
            raise DecodeError("no embeddings: the context was created without embeddings=True")
        if self.pooling_type is not PoolingType.NONE:
            raise DecodeError(f"no per-token embeddings with pooling {self.pooling_type.name.lower()}: "
                              "use get_embeddings_seq")
        n = self.output_ids.size
        j = i + n if i < 0 else i
        if not 0 <= j < n or self.output_ids[j] < 0:
            raise DecodeError(f"no embeddings for batch token {i}: it was not an output of the last decode")
        return self.embd[self.output_ids[j]]

    def get_embeddings_seq(self, seq_id: int) -> np.ndarray:
        """llama_get_embeddings_seq: the pooled vector of a sequence of the last decode (n_embd floats; with
        RANK pooling its n_cls_out scores: the first n_cls_out values of its pooled row, which is what llama.cpp
        reads when the model has its cls.output head). As in llama.cpp a sequence is pooled within a ubatch: one
        that a causal model's batch splits over several ubatches gets the vector of its last one."""
        if not self.embeddings:
            raise DecodeError("no embeddings: the context was created without embeddings=True")
        if self.pooling_type is PoolingType.NONE:
            raise DecodeError("no sequence embeddings with pooling none: use get_embeddings_ith")
        if seq_id not in self.embd_seq:
            raise DecodeError(f"no embeddings for sequence {seq_id}: it was not in the last decode")
        return self.embd_seq[seq_id]

    def get_logits_ith(self, i: int) -> np.ndarray:
        """llama_get_logits_ith: the logits of batch token i of the last decode (negative: from the end)."""
        n = self.output_ids.size
        j = i + n if i < 0 else i
        if not 0 <= j < n or self.output_ids[j] < 0:
            raise DecodeError(f"no logits for batch token {i}: it was not marked as an output")
        return self.logits[self.output_ids[j]]

    def _save_state(self) -> dict:
        """The cache cells' bookkeeping a decode changes (the K/V data of cells it writes is not
        needed: restored cells hold positions no later token can attend to again; a recurrent state's old
        row is not written by the decode either, see memory_recurrent)."""
        saved: dict = {name: c.state() for name, c in self.caches.items()}
        if self.recr is not None:
            saved[_RECR] = self.recr.state()
        return saved

    def _restore_state(self, saved: dict) -> None:
        for name, cells in saved.items():
            if name == _RECR:
                self.recr.set_state(cells)
            else:
                self.caches[name].set_state(cells)
        self._graph = None  # a failure may have left the scheduler half-way: plan the next graph anew
        self.graph_cache.clear()

    def _split_recurrent(self, ub_all: PreparedBatch) -> list[PreparedBatch]:
        """llama_memory_recurrent / llama_memory_hybrid::init_batch: with embeddings split_seq, else
        split_equal (sequential unless a hybrid's KV cache is unified); every ubatch must find its cells."""
        if self.embeddings:
            ubatches = split_seq(ub_all, self.n_ubatch)
        else:
            sequential = not self.caches or not self.kv_unified
            masks = ub_all.seq_mask
            if sequential and np.any(masks & (masks - np.uint64(1))):
                raise DecodeError("decode: a recurrent memory splits batches sequence by sequence, which does not "
                                  "support tokens shared by several sequences (coupled sequences)")
            ubatches = split_equal(ub_all, self.n_ubatch, sequential)
        runs = [RecurrentMemory.runs_of(ub.seq_mask, ub.seq_first, ub.pos, ub.n_seqs) for ub in ubatches]
        if not self.recr.prepare(runs):
            raise DecodeError(f"decode: the recurrent memory ({self.recr.size} cells, one per sequence) cannot hold "
                              "the batch's sequences")
        return ubatches

    def _process_ubatch(self, ub: PreparedBatch, logits: np.ndarray, rows: np.ndarray, embd: np.ndarray,
                        embd_seq: dict[int, np.ndarray], logits_sink: LogitsSink | None = None) -> None:
        """Decode one ubatch; its output tokens' logits are written to ``logits[rows]`` (or handed to
        ``logits_sink``: a view of the output tensor where it is on the host, read during the call only),
        and with embeddings their embeddings to ``embd[rows]`` (pooling none) or each sequence's vector to
        ``embd_seq``."""
        n_tokens = ub.n_tokens
        out_ids = np.flatnonzero(ub.output).astype(np.int32)
        n_outputs = out_ids.size
        slots = {}
        rs_key: tuple = ()
        if self.recr is not None:  # the recurrent cells first (a hybrid's init_batch prepares them first)
            recr = self.recr
            if not recr.find_slot(RecurrentMemory.runs_of(ub.seq_mask, ub.seq_first, ub.pos, ub.n_seqs)):
                raise DecodeError("decode: the recurrent memory found no cells for the ubatch")
            rs_key = (recr.n, ub.n_seqs)  # (the rows are inputs: any block of cells reuses the graph)
        for name, cache in self.caches.items():
            slots[name] = cache.find_slot(ub.seq_first, ub.n_seqs)
            cache.apply(slots[name], ub.pos, ub.seq_mask)
        # attention runs over ns consecutive streams from s0 (one, stream 0, when unified)
        streams = [st for st, _ in next(iter(slots.values()))] if slots else [0]
        s0, ns = streams[0], len(streams)
        n_kv = {name: c.n_kv(streams) for name, c in self.caches.items()}
        embd_input = ub.embd is not None
        pooling = self.pooling_type if self.embeddings else PoolingType.NONE
        n_seqs_unq = len(ub.seqs)
        # llama.cpp reuses a graph for the same shapes and, with a stream per sequence, the same sequences
        key = (n_tokens, n_outputs, tuple(sorted(n_kv.items())), embd_input, ns, s0, self.embeddings, pooling,
               n_seqs_unq if pooling is not PoolingType.NONE else 0, rs_key)
        g = self._graph
        reuse = os.environ.get("LLAMA_GRAPH_REUSE_DISABLE") is None
        if reuse and g is not None and g.key == key:
            self.n_reused += 1
        elif reuse and (g := self.graph_cache.restore(key, self.sched)) is not None:
            self._graph = g
            self.n_reused += 1
            self.n_graph_restores += 1
        else:
            b = GraphBuilder(self.model, self.caches, self.layer_cache, n_tokens, n_outputs, n_kv, self.flash_attn,
                             embd_input, s0, ns, self.n_ctx_seq, self.embeddings, pooling, n_seqs_unq, self.recr,
                             ub.n_seqs)
            g = b.build(key)
            self.sched.reset()
            if not self.sched.alloc_graph(g.gf):
                raise PyGGMLError("failed to allocate the compute graph")
            self._graph = g
            self.n_graph_builds += 1
            if reuse:
                self.graph_cache.put(key, g, self.sched)
        # inputs, through the backend API: they may live on any backend
        backend_tensor_set(g.tokens, ub.embd if embd_input else ub.token.astype(np.int32))
        if g.pos.buffer is not None:  # (a graph without RoPE or position embeddings never reads it: Mamba)
            backend_tensor_set(g.pos, ub.pos.astype(np.int32))
        if n_outputs:
            backend_tensor_set(g.out_ids, out_ids)
        for name, inp in g.attn.items():
            cache = inp.cache
            sl = slots[name]
            backend_tensor_set(inp.k_idxs, cache.k_idxs_data(sl))
            backend_tensor_set(inp.v_idxs, cache.v_idxs_data(sl, cache.layer_ids[0]))
            mask = cache.mask_data(sl, ub.pos, ub.seq_first, inp.n_kv, self.causal_attn)
            backend_tensor_set(inp.kq_mask, mask.astype(np.float16) if inp.kq_mask.type == GGMLType.F16 else mask)
        if g.rs is not None:
            backend_tensor_set(g.rs.s_copy, self.recr.s_copy_data())
            backend_tensor_set(g.rs.dst, self.recr.dst_data())
        self._set_encoder_inputs(g, ub)
        begin = getattr(self.eval_callback, "begin_graph", None)  # a callback that keeps state per computed graph
        if begin is not None:
            begin()
        backend_sched_set_eval_callback(self.sched, self.eval_callback)
        status = self.sched.graph_compute(g.gf)
        if status != GGMLStatus.SUCCESS:
            if status == GGMLStatus.ABORTED:
                raise DecodeAborted("decode aborted by the abort callback")
            raise DecodeError(f"the graph failed to compute: {status.name}")
        if g.rs is not None:
            self.recr.moved()  # the block's states are in the rows the graph wrote
        if n_outputs == 0:
            return
        if g.logits is not None and logits_sink is not None:
            logits_sink(ub.index[ub.output], _rows_of(g.logits, n_outputs))
        elif g.logits is not None:
            _read_rows(g.logits, n_outputs, logits, rows)
        if g.embd is None:
            return
        if pooling is PoolingType.NONE:
            _read_rows(g.embd, n_outputs, embd, rows)
        else:  # a later ubatch of the same sequence replaces its vector, as llama.cpp's embd_seq
            vecs = tensor_to_numpy(g.embd).reshape(n_seqs_unq, -1)
            width = self.model.hparams.n_cls_out if pooling is PoolingType.RANK else vecs.shape[1]
            for k, seq in enumerate(ub.seqs):
                embd_seq[seq] = vecs[k, :width].copy()

    def _set_encoder_inputs(self, g: UbatchGraph, ub: PreparedBatch) -> None:
        """The inputs caches do not set: the no-cache masks and the pooling weights or rows."""
        hp = self.model.hparams
        for t, n_swa in ((g.kq_mask, 0), (g.kq_mask_swa, hp.n_swa)):
            if t is not None:  # an encoder's attention is never causal (llama_context::encode)
                mask = no_cache_mask(ub.pos, ub.seq_first, False, n_swa, hp.swa_type)
                backend_tensor_set(t, mask.astype(np.float16) if t.type == GGMLType.F16 else mask)
        if g.inp_mean is not None:
            backend_tensor_set(g.inp_mean, mean_weights(ub.seq_mask, ub.seqs))
        if g.inp_cls is not None:
            last = pools_last(self.pooling_type, self.causal_attn and self.has_memory)
            backend_tensor_set(g.inp_cls, pooled_rows(ub.seq_mask, ub.seqs, ub.pos, last))


def _rows_of(t: Tensor, n_rows: int) -> np.ndarray:
    """An output tensor's ``n_rows`` rows as float32: a view of its data when it lives on the host, else a copy."""
    on_host = (t.buffer is None or t.buffer.is_host()) and t.type == GGMLType.F32 and t.is_contiguous()
    return (t.numpy() if on_host else tensor_to_numpy(t)).reshape(n_rows, -1)


def _read_rows(t: Tensor, n_rows: int, out: np.ndarray, rows: np.ndarray) -> None:
    """Copy an output tensor's ``n_rows`` rows to ``out[rows]`` (one slice when the rows are consecutive)."""
    src = _rows_of(t, n_rows)
    if rows[-1] - rows[0] == n_rows - 1 and np.all(np.diff(rows) == 1):
        out[rows[0] : rows[-1] + 1] = src
    else:
        out[rows] = src


def tensor_to_numpy(t: Tensor) -> np.ndarray:
    """A float32 copy of a tensor's data in numpy order, wherever it lives (host or device)."""
    if t.buffer is None or t.buffer.is_host():
        return np.array(t.to_float(), dtype=np.float32, copy=True)
    from ..tensor_data import rows_to_f32  # deferred: loads the quantizers (numba) for a device read only

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
