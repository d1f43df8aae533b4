"""The shared blocks of every forward graph, as llama.cpp's ``llm_graph_context`` (src/llama-graph.cpp).

``GraphBuilder`` makes the graph of one ubatch: the inputs (tokens, positions, output ids, per-cache
K/V row indices and KQ masks), then the layers, which the model's architecture module writes
(``llm/arch/<name>.py``, as src/models/<arch>.cpp) out of the blocks here: norms, Q/K/V, RoPE,
attention over the KV cache, the FFN and the output head. Logits are made only for the output
positions. Intermediate tensors get llama.cpp's callback names (``attn_norm-3``, ``l_out-3``,
``result_output`` ...) so eval callbacks can pick them out.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from ..context import Context, tensor_overhead
from ..graph import Graph, graph_overhead_custom, new_graph_custom
from ..ops import builders as B
from ..tensor import Tensor
from ..types import GGMLType
from .hparams import LLAMA_ROPE_TYPE_NONE, HParams, PoolingType
from .kv_cache import KVCache
from .memory_recurrent import RecurrentMemory
from .model import Layer, Model

GRAPH_MAX_NODES = 8192
F32, F16, I32, I64 = GGMLType.F32, GGMLType.F16, GGMLType.I32, GGMLType.I64


@dataclass
class AttnInput:
    cache: KVCache
    n_kv: int
    k_idxs: Tensor
    v_idxs: Tensor
    kq_mask: Tensor


@dataclass
class RSInput:
    """llm_graph_input_rs: the recurrent memory's input of one ubatch. ``s_copy`` (I32 [n_rs], set per
    ubatch from RecurrentMemory.s_copy_data) names, for each cell of the block head .. head+n_rs-1, the
    row its state starts from; the first n_seqs are the ubatch's sequences (``s_copy_main``), the rest
    cells moved by the gather (``s_copy_extra``). ``dst`` (I64 [n_rs], RecurrentMemory.dst_data): the
    rows their new states go to (the memory keeps two rows per cell, see its module doc), split the same
    way."""

    mem: RecurrentMemory
    s_copy_main: Tensor
    s_copy_extra: Tensor | None
    dst_main: Tensor
    dst_extra: Tensor | None
    s_copy: Tensor
    dst: Tensor
    n_rs: int


#: build_rs's get_state_rows: (ctx, states {state_size, mem_size}, ids) -> the ubatch's states, or what the
#: layer computes from them (Mamba's SSM_SCAN reads the states through the ids itself)
GetStateRows = Callable[[Context, Tensor, Tensor], Tensor]


@dataclass
class UbatchGraph:
    """The graph of one ubatch shape; reusable while the shape key is unchanged (llama.cpp's can_reuse)."""

    ctx: Context
    gf: Graph
    tokens: Tensor
    pos: Tensor
    out_ids: Tensor
    attn: dict[str, AttnInput]
    logits: Tensor | None  # None for a model without an output head (an encoder)
    key: tuple
    named: dict[str, Tensor] = field(default_factory=dict)
    embd: Tensor | None = None  # with embeddings: per-token (pooling none) or per-sequence (pooled) vectors
    kq_mask: Tensor | None = None  # without a KV cache: the mask over the ubatch's own tokens
    kq_mask_swa: Tensor | None = None
    inp_mean: Tensor | None = None  # MEAN pooling: [n_tokens, n_seqs] weights
    inp_cls: Tensor | None = None  # CLS / LAST / RANK pooling: the row of each sequence
    rs: RSInput | None = None  # the recurrent memory's s_copy (recurrent and hybrid models)


@dataclass
class RopeParams:
    n_ctx_orig: int
    freq_base: float
    freq_scale: float
    ext_factor: float
    attn_factor: float
    beta_fast: float = 32.0
    beta_slow: float = 1.0


def rope_params(hp: HParams, il: int) -> RopeParams:
    """llama.cpp's cparams for RoPE at layer ``il``: sliding-window layers use their own base and scale
    (llama_model::get_rope_freq_base / get_rope_freq_scale)."""
    ext = 1.0 if hp.rope_scaling_type == "yarn" else 0.0
    if hp.is_swa(il):
        return RopeParams(hp.n_ctx_orig_yarn, hp.rope_freq_base_train_swa, hp.rope_freq_scale_train_swa, ext,
                          hp.rope_attn_factor)
    scale = 1.0 if hp.rope_scaling_type == "none" else hp.rope_freq_scale_train
    return RopeParams(hp.n_ctx_orig_yarn, hp.rope_freq_base_train, scale, ext, hp.rope_attn_factor)


class NormType(Enum):
    """llm_norm_type: LayerNorm (mean and variance) or RMSNorm."""

    NORM = "norm"
    RMS = "rms"


class FFNOp(Enum):
    """llm_ffn_op_type: the FFN's activation."""

    SILU = "silu"
    GELU = "gelu"
    SWIGLU = "swiglu"  # one fused gate-and-up projection, SiLU over its first half (phi3)
    SWIGLU_OAI = "swiglu_oai"


class Gating(Enum):
    """llama_expert_gating_func_type: how router logits become expert probabilities."""

    SOFTMAX = "softmax"
    SOFTMAX_WEIGHT = "softmax_weight"  # softmax over the selected experts' logits only


#: the smallest sum the selected experts' weights are divided by (llama.cpp clamps to 2^-14)
MOE_WEIGHTS_SUM_MIN = 6.103515625e-5


class GraphBuilder:
    def __init__(self, model: Model, caches: dict[str, KVCache], layer_cache: list[str], n_tokens: int,
                 n_outputs: int, n_kv: dict[str, int], flash_attn: bool, embd_input: bool = False, s0: int = 0,
                 ns: int = 1, n_ctx_seq: int = 0, embeddings: bool = False,
                 pooling: PoolingType = PoolingType.NONE, n_seqs_unq: int = 1,
                 recr: RecurrentMemory | None = None, n_seqs: int = 1) -> None:
        self.model = model
        self.hp = model.hparams
        self.caches = caches
        self.layer_cache = layer_cache
        self.n_tokens = n_tokens
        self.n_outputs = n_outputs
        # the ubatch's sequence sets: n_seqs equal runs of n_seq_tokens tokens (llama_ubatch's n_seqs)
        self.n_seqs = n_seqs
        self.n_seq_tokens = n_tokens // n_seqs
        self.flash_attn = flash_attn
        self.n_ctx_seq = n_ctx_seq
        self.s0, self.ns = s0, ns  # attention over streams s0 .. s0+ns-1, n_tokens/ns tokens each
        self.ctx = Context(GRAPH_MAX_NODES * tensor_overhead() + graph_overhead_custom(GRAPH_MAX_NODES),
                           no_alloc=True)
        self.gf = new_graph_custom(self.ctx, GRAPH_MAX_NODES)
        self.named: dict[str, Tensor] = {}
        self.embeddings, self.pooling, self.n_seqs_unq = embeddings, pooling, n_seqs_unq
        #: the hidden states pooling starts from (llm_graph_result's t_embd): result_norm, or an encoder's output
        self.t_embd: Tensor | None = None
        self.inp_mean: Tensor | None = None
        self.inp_cls: Tensor | None = None
        ctx = self.ctx
        # llm_graph_input_embd: token ids looked up in tok_embd, or embedding rows given directly
        if embd_input:
            self.tokens = self._input(ctx.new_tensor(F32, self.hp.n_embd, n_tokens), "inp_embd")
        else:
            self.tokens = self._input(ctx.new_tensor(I32, n_tokens), "inp_tokens")
        self.pos = self._input(ctx.new_tensor(I32, n_tokens), "inp_pos")
        self.out_ids = self._input(ctx.new_tensor(I32, n_outputs), "inp_out_ids")
        self.attn_inputs: dict[str, AttnInput] = {}
        for name, cache in caches.items():
            nk = n_kv[name]
            n_v_idx = n_tokens * self.hp.n_embd_v_gqa(cache.layer_ids[0]) if cache.v_trans else n_tokens
            sfx = f"_{name}" if name != "base" else ""
            self.attn_inputs[name] = AttnInput(
                cache, nk,
                self._input(ctx.new_tensor(I64, n_tokens), f"attn_inp_k_idxs{sfx}"),
                self._input(ctx.new_tensor(I64, n_v_idx), f"attn_inp_v_idxs{sfx}"),
                self._input(ctx.new_tensor(F16 if flash_attn else F32, nk, n_tokens // ns, 1, ns),
                            f"attn_inp_kq_mask{sfx}"),
            )
        # build_rs_inp: the recurrent memory's copy indices, and the rows the new states go to
        self.rs: RSInput | None = None
        if recr is not None:
            s_copy = self._input(ctx.new_tensor(I32, recr.n), "rs_s_copy")
            dst = self._input(ctx.new_tensor(I64, recr.n), "rs_dst")
            extra = recr.n > n_seqs
            self.rs = RSInput(recr, B.view_1d(ctx, s_copy, n_seqs, 0),
                              B.view_1d(ctx, s_copy, recr.n - n_seqs, n_seqs * s_copy.nb[0]) if extra else None,
                              B.view_1d(ctx, dst, n_seqs, 0),
                              B.view_1d(ctx, dst, recr.n - n_seqs, n_seqs * dst.nb[0]) if extra else None,
                              s_copy, dst, recr.n)
        # build_attn_inp_no_cache: a model without memory attends over this ubatch's tokens, one mask for the
        # dense layers and one for the sliding-window ones
        self.kq_mask = self.kq_mask_swa = None
        if not caches and recr is None:
            mask_type = F16 if flash_attn else F32
            self.kq_mask = self._input(ctx.new_tensor(mask_type, n_tokens, n_tokens), "self_kq_mask")
            if self.hp.uses_swa:
                self.kq_mask_swa = self._input(ctx.new_tensor(mask_type, n_tokens, n_tokens), "self_kq_mask_swa")

    def _input(self, t: Tensor, name: str) -> Tensor:
        t.set_name(name)
        t.set_input()
        return t

    def cb(self, t: Tensor, name: str, il: int = -1) -> Tensor:
        """llm_graph_context's cb: name the tensor ``name-il`` (or ``name``) for eval callbacks."""
        full = f"{name}-{il}" if il >= 0 else name
        t.set_name(full)
        self.named[full] = t
        return t

    # ------------------------------------------------------------------ building blocks
    def norm(self, x: Tensor, w: Tensor | None, name: str, il: int = -1, b: Tensor | None = None,
             kind: NormType = NormType.RMS) -> Tensor:
        """build_norm: RMSNorm or LayerNorm, times ``w``, plus ``b``; named ``name``."""
        if kind is NormType.RMS:
            cur = B.rms_norm(self.ctx, x, self.hp.f_norm_rms_eps)
        else:
            cur = B.norm(self.ctx, x, self.hp.f_norm_eps)
        if w is not None:
            cur = B.mul(self.ctx, cur, w)
        if b is not None:
            cur = B.add(self.ctx, cur, b)
        return self.cb(cur, name, il)

    def mm(self, w: Tensor, x: Tensor, b: Tensor | None = None) -> Tensor:
        y = B.mul_mat(self.ctx, w, x)
        return B.add(self.ctx, y, b) if b is not None else y

    def qkv(self, layer: Layer, cur: Tensor, il: int) -> tuple[Tensor, Tensor, Tensor]:
        """build_qkv: Q, K and V as {head_dim, n_head, n_tokens}, from separate or fused weights."""
        hp, ctx, T = self.hp, self.ctx, self.n_tokens
        dk, dv = hp.n_embd_head_k, hp.n_embd_head_v
        if layer.wqkv is not None:
            qkv = self.cb(self.mm(layer.wqkv, cur, layer.bqkv), "wqkv", il)
            n_q, n_k = dk * hp.n_head[il], dk * hp.n_head_kv[il]
            rs = qkv.type.row_size
            q = B.view_3d(ctx, qkv, dk, hp.n_head[il], T, rs(dk), qkv.nb[1], 0)
            k = B.view_3d(ctx, qkv, dk, hp.n_head_kv[il], T, rs(dk), qkv.nb[1], rs(n_q))
            v = B.view_3d(ctx, qkv, dv, hp.n_head_kv[il], T, rs(dv), qkv.nb[1], rs(n_q + n_k))
            return q, k, v
        q = self.cb(self.mm(layer.wq, cur, layer.bq), "Qcur", il)
        k = self.cb(self.mm(layer.wk, cur, layer.bk), "Kcur", il)
        v = self.cb(self.mm(layer.wv, cur, layer.bv), "Vcur", il)
        q = B.reshape_3d(ctx, q, dk, hp.n_head[il], T)
        k = B.reshape_3d(ctx, k, dk, hp.n_head_kv[il], T)
        v = B.reshape_3d(ctx, v, dv, hp.n_head_kv[il], T)
        return q, k, v

    def rope(self, x: Tensor, il: int, rp: RopeParams | None = None) -> Tensor:
        """ggml_rope_ext on Q or K of layer ``il`` with the layer's factors and llama.cpp's cparams."""
        rp = rp or rope_params(self.hp, il)
        factors = self.model.rope_factors(il, self.n_ctx_seq)
        return B.rope_ext(self.ctx, x, self.pos, factors, self.hp.n_rot, self.hp.rope_type, rp.n_ctx_orig,
                          rp.freq_base, rp.freq_scale, rp.ext_factor, rp.attn_factor, rp.beta_fast, rp.beta_slow)

    def attn(self, layer: Layer, q: Tensor, k: Tensor, v: Tensor, kq_scale: float, il: int,
             sinks: Tensor | None = None) -> Tensor:
        """build_attn with a KV cache: store K/V, then attend over the first n_kv cells; soft-capped
        scores when the model asks for it (gemma2), attention sinks when given (gpt-oss). A model without
        a KV cache attends over the ubatch's own K and V (build_attn with llm_graph_input_attn_no_cache)."""
        ctx, gf, hp = self.ctx, self.gf, self.hp
        if not self.caches:
            return self._attn_no_cache(layer, q, k, v, kq_scale, il)
        inp = self.attn_inputs[self.layer_cache[il]]
        cache = inp.cache
        gf.build_forward_expand(cache.cpy_k(ctx, k, inp.k_idxs, il))
        gf.build_forward_expand(cache.cpy_v(ctx, v, inp.v_idxs, il))
        kk = B.permute(ctx, cache.get_k(ctx, il, inp.n_kv, self.s0, self.ns), 0, 2, 1, 3)
        vv = B.permute(ctx, cache.get_v(ctx, il, inp.n_kv, self.s0, self.ns), 0, 2, 1, 3)
        if self.ns > 1:  # {d, n_head, T/ns, ns}: each stream's tokens attend to that stream's cells
            q = B.reshape_4d(ctx, q, q.ne[0], q.ne[1], q.ne[2] // self.ns, self.ns)
        q = B.permute(ctx, q, 0, 2, 1, 3)
        softcap = hp.f_attn_logit_softcapping if hp.attn_soft_cap else 0.0
        if self.flash_attn:
            cur = B.flash_attn_ext(ctx, q, kk, vv, inp.kq_mask, kq_scale, 0.0, softcap)
            if sinks is not None:
                B.flash_attn_ext_add_sinks(cur, sinks)
            B.flash_attn_ext_set_prec(cur, B.GGML_PREC_F32)
            cur = B.reshape_2d(ctx, cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
        else:
            kq = B.mul_mat(ctx, kk, q)
            B.mul_mat_set_prec(kq, B.GGML_PREC_F32)
            self.cb(kq, "kq", il)
            if softcap:
                kq = self.cb(B.scale(ctx, kq, 1.0 / softcap), "kq_scaled_1", il)
                kq = self.cb(B.tanh(ctx, kq), "kq_tanh", il)
                kq = self.cb(B.scale(ctx, kq, softcap), "kq_scaled_2", il)
            kq = B.soft_max_ext(ctx, kq, inp.kq_mask, kq_scale, 0.0)
            if sinks is not None:
                B.soft_max_add_sinks(kq, sinks)
            self.cb(kq, "kq_soft_max", il)
            if not cache.v_trans:
                vv = B.cont(ctx, B.transpose(ctx, vv))
            kqv = B.mul_mat(ctx, vv, kq)
            cur = B.permute(ctx, kqv, 0, 2, 1, 3)
            cur = B.cont_2d(ctx, cur, cur.ne[0] * hp.n_head[il], self.n_tokens)
        self.cb(cur, "kqv_out", il)
        return self.mm(layer.wo, cur, layer.bo)

    def _attn_no_cache(self, layer: Layer, q: Tensor, k: Tensor, v: Tensor, kq_scale: float, il: int) -> Tensor:
        """build_attn_mha over K and V as computed: no cache, so n_kv is the ubatch's token count."""
        ctx, gf, hp = self.ctx, self.gf, self.hp
        for t in (q, k, v):  # added together so they are not reordered (fewer scheduler splits)
            gf.build_forward_expand(t)
        mask = self.kq_mask_swa if hp.is_swa(il) else self.kq_mask
        q = B.permute(ctx, q, 0, 2, 1, 3)
        k = B.permute(ctx, k, 0, 2, 1, 3)
        v = B.permute(ctx, v, 0, 2, 1, 3)
        softcap = hp.f_attn_logit_softcapping if hp.attn_soft_cap else 0.0
        if self.flash_attn:  # flash attention reads F16 K/V, which a cache would have stored
            k = B.cast(ctx, k, F16) if k.type == F32 else k
            v = B.cast(ctx, v, F16) if v.type == F32 else v
            cur = B.flash_attn_ext(ctx, q, k, v, mask, kq_scale, 0.0, softcap)
            B.flash_attn_ext_set_prec(cur, B.GGML_PREC_F32)
            cur = B.reshape_2d(ctx, cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
        else:
            kq = B.mul_mat(ctx, k, q)
            B.mul_mat_set_prec(kq, B.GGML_PREC_F32)
            self.cb(kq, "kq", il)
            kq = self.cb(B.soft_max_ext(ctx, kq, mask, kq_scale, 0.0), "kq_soft_max", il)
            kqv = B.mul_mat(ctx, B.cont(ctx, B.transpose(ctx, v)), kq)
            cur = B.permute(ctx, kqv, 0, 2, 1, 3)
            cur = B.cont_2d(ctx, cur, cur.ne[0] * hp.n_head[il], self.n_tokens)
        self.cb(cur, "kqv_out", il)
        return self.mm(layer.wo, cur, layer.bo)

    def build_rs(self, s: Tensor, state_size: int, n_seqs: int, get_rows: GetStateRows | None = None) -> Tensor:
        """build_rs: the states the ubatch's sequences start from, out of one layer's state tensor ``s`` (r or
        s, {state_size, 2 * mem_size + 1}), gathered by ``get_rows`` (GET_ROWS by default); the other cells of
        the block, which the gather moved, get their states copied to their new rows. (llama.cpp first zeroes
        a row rs_z for new sequences; here they read the memory's zero row.)"""
        ctx, gf, rs = self.ctx, self.gf, self.rs
        if rs is None:
            raise ValueError(f"{self.hp.arch}: build_rs needs a recurrent memory")
        states = B.reshape_2d(ctx, s, state_size, s.ne[1])
        out = (get_rows or B.get_rows)(ctx, states, rs.s_copy_main)
        gf.build_forward_expand(out)
        if rs.s_copy_extra is not None:
            extra = B.get_rows(ctx, states, rs.s_copy_extra)
            gf.build_forward_expand(B.set_rows(ctx, states, extra, rs.dst_extra))
        return out

    def store_rs(self, src: Tensor, states: Tensor) -> None:
        """The ubatch's new states ``src`` (n_seqs rows of the state width, in order; a strided view is made
        contiguous first) to their rows of a layer's state tensor: SET_ROWS at the ``rs_dst`` rows, which the
        CPU backend fuses with the SSM_SCAN that computed them."""
        rs = self.rs
        if rs is None:
            raise ValueError(f"{self.hp.arch}: store_rs needs a recurrent memory")
        width, n_seqs = states.ne[0], rs.dst_main.ne[0]
        if src.nelements() != width * n_seqs:
            raise ValueError(f"{self.hp.arch}: {src.nelements()} new state values for {n_seqs} rows of {width}")
        if not src.is_contiguous():
            src = B.cont(self.ctx, src)
        rows = B.reshape_2d(self.ctx, src, width, n_seqs)
        self.gf.build_forward_expand(B.set_rows(self.ctx, states, rows, rs.dst_main))

    def rs_r(self, il: int) -> Tensor:
        """get_r_l: layer il's r states (Mamba's conv window, RWKV's token shift), {n_embd_r, mem_size + 1} (the
        cells, then the zero row)."""
        if self.rs is None:
            raise ValueError(f"{self.hp.arch}: layer {il} has no recurrent memory")
        return self.rs.mem.r[il]

    def rs_s(self, il: int) -> Tensor:
        """get_s_l: layer il's s states (the SSM or WKV state), {n_embd_s, mem_size + 1} (the cells, the zero row)."""
        if self.rs is None:
            raise ValueError(f"{self.hp.arch}: layer {il} has no recurrent memory")
        return self.rs.mem.s[il]

    def ffn(self, cur: Tensor, up: Tensor | None, gate: Tensor | None, down: Tensor | None, op: FFNOp, il: int,
            up_b: Tensor | None = None, gate_b: Tensor | None = None, down_b: Tensor | None = None,
            parallel: bool = True) -> Tensor:
        """build_ffn: up (and a gate, parallel or after up), the activation, down; biases where given."""
        ctx = self.ctx
        tmp = self.cb(self.mm(up, cur, up_b), "ffn_up", il) if up is not None else cur
        if gate is not None:
            g = self.cb(self.mm(gate, cur if parallel else tmp, gate_b), "ffn_gate", il)
        else:
            g = tmp
        gated = gate is not None and parallel
        if op is FFNOp.SILU:
            cur = self.cb(B.swiglu_split(ctx, g, tmp), "ffn_swiglu", il) if gated else self.cb(
                B.silu(ctx, g), "ffn_silu", il)
        elif op is FFNOp.GELU:
            cur = self.cb(B.geglu_split(ctx, g, tmp), "ffn_geglu", il) if gated else self.cb(
                B.gelu(ctx, g), "ffn_gelu", il)
        elif op is FFNOp.SWIGLU:
            cur = self.cb(B.swiglu(ctx, g), "ffn_swiglu", il)
        else:  # SWIGLU_OAI: gpt-oss's clamped SwiGLU, alpha 1.702 and limit 7 (llama-graph.cpp)
            cur = self.cb(B.swiglu_oai(ctx, g, tmp, 1.702, 7.0), "ffn_swiglu_oai", il)
        if down is not None:
            cur = self.mm(down, cur, down_b)
        return cur

    def ffn_of(self, layer: Layer, cur: Tensor, op: FFNOp, il: int, parallel: bool = True) -> Tensor:
        """build_ffn over a layer's own ffn_up / ffn_gate / ffn_down and their biases."""
        return self.ffn(cur, layer.ffn_up, layer.ffn_gate, layer.ffn_down, op, il, layer.ffn_up_b,
                        layer.ffn_gate_b, layer.ffn_down_b, parallel)

    def moe_ffn(self, cur: Tensor, layer: Layer, op: FFNOp, norm_w: bool, w_scale: float, gating: Gating,
                il: int) -> Tensor:
        """build_moe_ffn: the router picks n_expert_used experts per token (top-k of its probabilities),
        their FFNs run through MUL_MAT_ID, and their outputs
        are summed with the chosen probabilities as weights (renormalised with ``norm_w``, then scaled)."""
        ctx, hp = self.ctx, self.hp
        n_expert, n_used = hp.n_expert, hp.n_expert_used
        n_embd, n_tokens = cur.ne[0], cur.ne[1]
        logits = self.cb(B.mul_mat(ctx, layer.ffn_gate_inp, cur), "ffn_moe_logits", il)
        if layer.ffn_gate_inp_b is not None:
            logits = self.cb(B.add(ctx, logits, layer.ffn_gate_inp_b), "ffn_moe_logits_biased", il)
        probs = self.cb(B.soft_max(ctx, logits) if gating is Gating.SOFTMAX else logits, "ffn_moe_probs", il)
        ranked = self.cb(B.argsort(ctx, probs, B.SortOrder.DESC), "ffn_moe_argsort", il)
        selected = self.cb(B.view_4d(ctx, ranked, n_used, ranked.ne[1], ranked.ne[2], ranked.ne[3], ranked.nb[1],
                                     ranked.nb[2], ranked.nb[3], 0), "ffn_moe_topk", il)
        weights = self.cb(B.get_rows(ctx, B.reshape_3d(ctx, probs, 1, n_expert, n_tokens), selected),
                          "ffn_moe_weights", il)
        if gating is Gating.SOFTMAX_WEIGHT:
            weights = B.soft_max(ctx, B.reshape_2d(ctx, weights, n_used, n_tokens))
            weights = self.cb(B.reshape_3d(ctx, weights, 1, n_used, n_tokens), "ffn_moe_weights_softmax", il)
        if norm_w:
            w2 = B.reshape_2d(ctx, weights, n_used, n_tokens)
            total = self.cb(B.sum_rows(ctx, w2), "ffn_moe_weights_sum", il)
            total = self.cb(B.clamp(ctx, total, MOE_WEIGHTS_SUM_MIN, math.inf), "ffn_moe_weights_sum_clamped", il)
            w2 = self.cb(B.div(ctx, w2, total), "ffn_moe_weights_norm", il)
            weights = B.reshape_3d(ctx, w2, 1, n_used, n_tokens)
        if w_scale not in (0.0, 1.0):
            weights = self.cb(B.scale(ctx, weights, w_scale), "ffn_moe_weights_scaled", il)
        self.gf.build_forward_expand(weights)
        cur = B.reshape_3d(ctx, cur, n_embd, 1, n_tokens)

        def experts(w: Tensor, x: Tensor, b: Tensor | None, name: str) -> Tensor:
            y = self.cb(B.mul_mat_id(ctx, w, x, selected), name, il)
            return y if b is None else self.cb(B.add_id(ctx, y, b, selected), name + "_biased", il)

        up = experts(layer.ffn_up_exps, cur, layer.ffn_up_exps_b, "ffn_moe_up")
        gate = up
        if layer.ffn_gate_exps is not None:
            gate = experts(layer.ffn_gate_exps, cur, layer.ffn_gate_exps_b, "ffn_moe_gate")
        gated = layer.ffn_gate_exps is not None
        if op is FFNOp.SWIGLU_OAI:
            act = self.cb(B.swiglu_oai(ctx, gate, up, 1.702, 7.0), "ffn_moe_swiglu_oai", il)
        else:
            act = self.cb(B.swiglu_split(ctx, gate, up) if gated else B.silu(ctx, gate), "ffn_moe_swiglu", il)
        out = experts(layer.ffn_down_exps, act, layer.ffn_down_exps_b, "ffn_moe_down")
        out = self.cb(B.mul(ctx, out, weights), "ffn_moe_weighted", il)
        self.gf.build_forward_expand(out)
        views = [B.view_2d(ctx, out, n_embd, n_tokens, out.nb[2], i * out.nb[1]) for i in range(n_used)]
        for v in views:
            self.gf.build_forward_expand(v)
        moe_out = views[0]
        for v in views[1:]:
            moe_out = B.add(ctx, moe_out, v)
            self.gf.build_forward_expand(moe_out)
        if n_used == 1:
            moe_out = B.cont(ctx, moe_out)
        return self.cb(moe_out, "ffn_moe_out", il)

    def last_layer_rows(self, il: int, *xs: Tensor) -> tuple[Tensor, ...]:
        """In the last layer only the output positions go on (``ggml_get_rows(cur, inp_out_ids)``)."""
        if il != self.hp.n_layer - 1:
            return xs
        return tuple(B.get_rows(self.ctx, x, self.out_ids) for x in xs)

    def finish(self, cur: Tensor, kind: NormType = NormType.RMS) -> Tensor:
        """The output head: result_norm, the vocabulary projection (with its bias), llama.cpp's logit
        scale (granite) and final soft-capping (gemma2/3) when the hparams set them; named result_output."""
        m, ctx, hp = self.model, self.ctx, self.hp
        cur = self.norm(cur, m.output_norm, "result_norm", b=m.output_norm_b, kind=kind)
        self.t_embd = cur
        cur = self.mm(m.output, cur, m.output_b)
        if hp.f_logit_scale:
            cur = B.scale(ctx, cur, 1.0 / hp.f_logit_scale)
        c = hp.f_final_logit_softcapping
        if c:
            cur = B.scale(ctx, B.tanh(ctx, B.scale(ctx, cur, 1.0 / c)), c)
        cur = self.cb(cur, "result_output")
        cur.set_output()
        self.gf.build_forward_expand(cur)
        return cur

    def inp_embd(self) -> Tensor:
        """build_inp_embd: the ubatch's token embeddings (scaled by the embedding scale, granite's)."""
        cur = self.tokens if self.tokens.type == F32 else B.get_rows(self.ctx, self.model.tok_embd, self.tokens)
        if self.hp.f_embedding_scale:
            cur = B.scale(self.ctx, cur, self.hp.f_embedding_scale)
        return cur

    def finish_embd(self, cur: Tensor, name: str) -> None:
        """An encoder's end: its hidden states are the embeddings (t_embd), and there are no logits."""
        self.t_embd = self.cb(cur, name)
        self.gf.build_forward_expand(cur)

    def build_pooling(self) -> Tensor:
        """build_pooling: the per-token embeddings (NONE), their mean per sequence (MEAN), the row of each
        sequence's first or last token (CLS, LAST), or for RANK that row (or the mean, with a classifier
        pooling type of MEAN) through the classifier head: cls and tanh, then cls.output."""
        m, ctx, hp, inp = self.model, self.ctx, self.hp, self.t_embd
        if inp is None:
            raise ValueError(f"{hp.arch}: the graph has no hidden states to pool (no result_norm)")
        pt = self.pooling
        if pt is PoolingType.NONE:
            cur = inp
        elif pt is PoolingType.MEAN or (pt is PoolingType.RANK and hp.pooling_type_cls is PoolingType.MEAN):
            self.inp_mean = self._input(ctx.new_tensor(F32, self.n_tokens, self.n_seqs_unq), "mean")
            cur = B.mul_mat(ctx, B.cont(ctx, B.transpose(ctx, inp)), self.inp_mean)
        else:
            self.inp_cls = self._input(ctx.new_tensor(I32, self.n_seqs_unq), "cls")
            cur = B.get_rows(ctx, inp, self.inp_cls)
        if pt is PoolingType.RANK:
            if m.cls is not None:
                cur = B.tanh(ctx, self.mm(m.cls, cur, m.cls_b))
            if m.cls_out is not None:
                cur = self.mm(m.cls_out, cur, m.cls_out_b)
            if hp.arch == "qwen3":  # the qwen3 rerankers' scores are a softmax over the labels
                cur = B.soft_max(ctx, cur)
        return self.cb(cur, "result_embd_pooled")

    def build_dense_out(self, cur: Tensor) -> Tensor:
        """build_dense_out: sentence-transformers' dense projections, after pooling (gemma-embedding)."""
        m = self.model
        if m.dense_2 is None and m.dense_3 is None:
            return cur
        if m.dense_2 is not None:
            cur = B.mul_mat(self.ctx, m.dense_2, cur)
        if m.dense_3 is not None:
            cur = B.mul_mat(self.ctx, m.dense_3, cur)
        return self.cb(cur, "result_embd_pooled")

    def build(self, key: tuple) -> UbatchGraph:
        """The architecture's graph, then (with embeddings) pooling and the dense projections."""
        logits = self.model.arch.build_graph(self)
        embd = None
        if self.embeddings:
            embd = self.build_dense_out(self.build_pooling())
            embd.set_output()
            self.gf.build_forward_expand(embd)
        return UbatchGraph(self.ctx, self.gf, self.tokens, self.pos, self.out_ids, self.attn_inputs, logits, key,
                           self.named, embd, self.kq_mask, self.kq_mask_swa, self.inp_mean, self.inp_cls, self.rs)


@dataclass
class ShiftGraph:
    """The K-shift graph of one cache: its K vectors rotated in place by each cell's position shift."""

    ctx: Context
    gf: Graph
    shift: Tensor  # I32 [kv_size*n_stream]: input, how far each cell moved


def build_k_shift(model: Model, cache: KVCache, n_ctx_seq: int = 0) -> ShiftGraph:
    """llama_kv_cache::build_graph_shift: RoPE composes (rotating by p then by d is rotating by p+d),
    so after seq_add moved positions, the first n_rot dims of every cached K are rotated by the shift."""
    hp = model.hparams
    n = len(cache.layer_ids) + 2
    ctx = Context(4 * n * tensor_overhead() + graph_overhead_custom(4 * n), no_alloc=True)
    gf = new_graph_custom(ctx, 4 * n)
    n_cells = cache.size * cache.n_stream
    shift = ctx.new_tensor(I32, n_cells).set_name("k_shift")
    shift.set_input()
    for il in cache.layer_ids if hp.rope_type != LLAMA_ROPE_TYPE_NONE else ():  # nothing to turn without RoPE
        k = cache.k[il]
        view = B.view_3d(ctx, k, hp.n_rot, hp.n_head_kv[il], n_cells, k.type.row_size(hp.n_embd_head_k),
                         k.type.row_size(hp.n_embd_k_gqa(il)), 0)
        rp = rope_params(hp, il)
        factors = model.rope_factors(il, n_ctx_seq)
        gf.build_forward_expand(B.rope_ext_inplace(ctx, view, shift, factors, hp.n_rot, hp.rope_type, rp.n_ctx_orig,
                                                   rp.freq_base, rp.freq_scale, rp.ext_factor, rp.attn_factor,
                                                   rp.beta_fast, rp.beta_slow))
    return ShiftGraph(ctx, gf, shift)
