"""Forward graphs for llama, qwen2 and gemma3, built from pyggml ops as llama.cpp builds them.

One ``build_graph`` call makes the graph of one ubatch (llm_graph_context + src/models/<arch>.cpp):
the inputs (tokens, positions, output ids, per-cache K/V row indices and KQ masks), the layers,
and logits only for the output positions. Intermediate tensors get llama.cpp's callback names
(``attn_norm-3``, ``l_out-3``, ``result_output`` ...) so eval callbacks can pick them out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..context import Context, tensor_overhead
from ..graph import Graph, graph_overhead_custom, new_graph_custom
from ..ops import builders as B
from ..tensor import Tensor
from ..types import GGMLType
from .hparams import HParams
from .kv_cache import KVCache
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
class UbatchGraph:
    """The graph of one ubatch shape; reusable while the shape key is unchanged (llama.cpp's can_reuse)."""

    ctx: Context
    gf: Graph
    tokens: Tensor
    pos: Tensor
    out_ids: Tensor
    attn: dict[str, AttnInput]
    logits: Tensor
    key: tuple
    named: dict[str, Tensor] = field(default_factory=dict)


@dataclass
class RopeParams:
    n_ctx_orig: int
    freq_base: float
    freq_scale: float
    ext_factor: float
    attn_factor: float
    beta_fast: float = 32.0
    beta_slow: float = 1.0


def rope_params(hp: HParams, swa: bool) -> RopeParams:
    """llama.cpp's cparams for RoPE; gemma3's sliding-window layers use their own base and scale 1."""
    scale = 1.0 if hp.rope_scaling_type == "none" else hp.rope_freq_scale_train
    ext = 1.0 if hp.rope_scaling_type == "yarn" else 0.0
    if swa:
        return RopeParams(hp.n_ctx_orig_yarn, hp.rope_freq_base_train_swa, hp.rope_freq_scale_train_swa, ext,
                          hp.rope_attn_factor)
    return RopeParams(hp.n_ctx_orig_yarn, hp.rope_freq_base_train, scale, ext, hp.rope_attn_factor)


class GraphBuilder:
    def __init__(self, model: Model, caches: dict[str, KVCache], layer_cache: list[str], n_tokens: int,
                 n_outputs: int, n_kv: dict[str, int], flash_attn: bool, embd_input: bool = False, s0: int = 0,
                 ns: int = 1) -> None:
        self.model = model
        self.hp = model.hparams
        self.caches = caches
        self.layer_cache = layer_cache
        self.n_tokens = n_tokens
        self.n_outputs = n_outputs
        self.flash_attn = flash_attn
        self.s0, self.ns = s0, ns  # attention over streams s0 .. s0+ns-1, n_tokens/ns tokens each
        self.ctx = Context(GRAPH_MAX_NODES * tensor_overhead() + graph_overhead_custom(GRAPH_MAX_NODES),
                           no_alloc=True)
        self.gf = new_graph_custom(self.ctx, GRAPH_MAX_NODES)
        self.named: dict[str, Tensor] = {}
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
    def norm(self, x: Tensor, w: Tensor | None, name: str, il: int = -1) -> Tensor:
        cur = B.rms_norm(self.ctx, x, self.hp.f_norm_rms_eps)
        if w is not None:
            cur = B.mul(self.ctx, cur, w)
        return self.cb(cur, name, il)

    def mm(self, w: Tensor, x: Tensor, b: Tensor | None = None) -> Tensor:
        y = B.mul_mat(self.ctx, w, x)
        return B.add(self.ctx, y, b) if b is not None else y

    def qkv(self, layer: Layer, cur: Tensor, il: int) -> tuple[Tensor, Tensor, Tensor]:
        hp, ctx, T = self.hp, self.ctx, self.n_tokens
        q = self.cb(self.mm(layer.wq, cur, layer.bq), "Qcur", il)
        k = self.cb(self.mm(layer.wk, cur, layer.bk), "Kcur", il)
        v = self.cb(self.mm(layer.wv, cur, layer.bv), "Vcur", il)
        q = B.reshape_3d(ctx, q, hp.n_embd_head_k, hp.n_head[il], T)
        k = B.reshape_3d(ctx, k, hp.n_embd_head_k, hp.n_head_kv[il], T)
        v = B.reshape_3d(ctx, v, hp.n_embd_head_v, hp.n_head_kv[il], T)
        return q, k, v

    def rope(self, x: Tensor, il: int, swa: bool, factors: Tensor | None = None) -> Tensor:
        rp = rope_params(self.hp, swa)
        return B.rope_ext(self.ctx, x, self.pos, factors, self.hp.n_rot, self.hp.rope_type, rp.n_ctx_orig,
                          rp.freq_base, rp.freq_scale, rp.ext_factor, rp.attn_factor, rp.beta_fast, rp.beta_slow)

    def attn(self, layer: Layer, q: Tensor, k: Tensor, v: Tensor, kq_scale: float, il: int) -> Tensor:
        """build_attn with a KV cache: store K/V, then attend over the first n_kv cells."""
        ctx, gf, hp = self.ctx, self.gf, self.hp
        inp = self.attn_inputs[self.layer_cache[il]]
        cache = inp.cache
        gf.build_forward_expand(cache.cpy_k(ctx, k, inp.k_idxs, il))
        gf.build_forward_expand(cache.cpy_v(ctx, v, inp.v_idxs, il))
        kk = B.permute(ctx, cache.get_k(ctx, il, inp.n_kv, self.s0, self.ns), 0, 2, 1, 3)
        vv = B.permute(ctx, cache.get_v(ctx, il, inp.n_kv, self.s0, self.ns), 0, 2, 1, 3)
        if self.ns > 1:  # {d, n_head, T/ns, ns}: each stream's tokens attend to that stream's cells
            q = B.reshape_4d(ctx, q, q.ne[0], q.ne[1], q.ne[2] // self.ns, self.ns)
        q = B.permute(ctx, q, 0, 2, 1, 3)
        if self.flash_attn:
            cur = B.flash_attn_ext(ctx, q, kk, vv, inp.kq_mask, kq_scale, 0.0, 0.0)
            B.flash_attn_ext_set_prec(cur, B.GGML_PREC_F32)
            cur = B.reshape_2d(ctx, cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
        else:
            kq = B.mul_mat(ctx, kk, q)
            B.mul_mat_set_prec(kq, B.GGML_PREC_F32)
            self.cb(kq, "kq", il)
            kq = self.cb(B.soft_max_ext(ctx, kq, inp.kq_mask, kq_scale, 0.0), "kq_soft_max", il)
            if not cache.v_trans:
                vv = B.cont(ctx, B.transpose(ctx, vv))
            kqv = B.mul_mat(ctx, vv, kq)
            cur = B.permute(ctx, kqv, 0, 2, 1, 3)
            cur = B.cont_2d(ctx, cur, cur.ne[0] * hp.n_head[il], self.n_tokens)
        self.cb(cur, "kqv_out", il)
        return self.mm(layer.wo, cur, layer.bo)

    def ffn(self, layer: Layer, cur: Tensor, gelu: bool, il: int) -> Tensor:
        ctx = self.ctx
        up = self.mm(layer.ffn_up, cur, layer.ffn_up_b)
        gate = self.mm(layer.ffn_gate, cur, layer.ffn_gate_b)
        act = B.geglu_split(ctx, gate, up) if gelu else B.swiglu_split(ctx, gate, up)
        self.cb(act, "ffn_gate_par", il)
        return self.mm(layer.ffn_down, act, layer.ffn_down_b)

    def finish(self, cur: Tensor) -> Tensor:
        m, ctx = self.model, self.ctx
        cur = self.norm(cur, m.output_norm, "result_norm")
        cur = B.mul_mat(ctx, m.output, cur)
        if m.output_b is not None:
            cur = B.add(ctx, cur, m.output_b)
        c = self.hp.f_final_logit_softcapping
        if c:
            cur = B.scale(ctx, B.tanh(ctx, B.scale(ctx, cur, 1.0 / c)), c)
        cur = self.cb(cur, "result_output")
        cur.set_output()
        self.gf.build_forward_expand(cur)
        return cur

    # ------------------------------------------------------------------ architectures
    def inp_embd(self) -> Tensor:
        """build_inp_embd: the ubatch's token embeddings."""
        if self.tokens.type == F32:
            return self.tokens
        return B.get_rows(self.ctx, self.model.tok_embd, self.tokens)

    def build_llama_like(self) -> Tensor:
        """llama and qwen2 (qwen2: NEOX rope, q/k/v biases, optional output bias)."""
        m, hp, ctx = self.model, self.hp, self.ctx
        inp = self.cb(self.inp_embd(), "inp_embd")
        kq_scale = 1.0 / math.sqrt(hp.n_embd_head_k)
        for il, layer in enumerate(m.layers):
            inp_sa = inp
            cur = self.norm(inp, layer.attn_norm, "attn_norm", il)
            q, k, v = self.qkv(layer, cur, il)
            q = self.cb(self.rope(q, il, False, m.rope_freqs), "Qcur_rope", il)
            k = self.cb(self.rope(k, il, False, m.rope_freqs), "Kcur_rope", il)
            cur = self.cb(self.attn(layer, q, k, v, kq_scale, il), "attn_out", il)
            if il == hp.n_layer - 1:
                cur = B.get_rows(ctx, cur, self.out_ids)
                inp_sa = B.get_rows(ctx, inp_sa, self.out_ids)
            ffn_inp = self.cb(B.add(ctx, cur, inp_sa), "ffn_inp", il)
            cur = self.norm(ffn_inp, layer.ffn_norm, "ffn_norm", il)
            cur = self.cb(self.ffn(layer, cur, False, il), "ffn_out", il)
            inp = self.cb(B.add(ctx, cur, ffn_inp), "l_out", il)
        return self.finish(inp)

    def build_gemma3(self) -> Tensor:
        m, hp, ctx = self.model, self.hp, self.ctx
        inp = self.cb(B.scale(ctx, self.inp_embd(), float(math.sqrt(hp.n_embd))), "inp_scaled")
        for il, layer in enumerate(m.layers):
            swa = hp.is_swa(il)
            cur = self.norm(inp, layer.attn_norm, "attn_norm", il)
            q, k, v = self.qkv(layer, cur, il)
            q = self.norm(q, layer.attn_q_norm, "Qcur_normed", il)
            q = self.cb(self.rope(q, il, swa), "Qcur_rope", il)
            k = self.norm(k, layer.attn_k_norm, "Kcur_normed", il)
            k = self.cb(self.rope(k, il, swa), "Kcur_rope", il)
            q = B.scale(ctx, q, hp.f_attention_scale)
            cur = self.cb(self.attn(layer, q, k, v, 1.0, il), "attn_out", il)
            if il == hp.n_layer - 1:
                cur = B.get_rows(ctx, cur, self.out_ids)
                inp = B.get_rows(ctx, inp, self.out_ids)
            cur = self.norm(cur, layer.attn_post_norm, "attn_post_norm", il)
            sa_out = self.cb(B.add(ctx, cur, inp), "sa_out", il)
            cur = self.norm(sa_out, layer.ffn_norm, "ffn_norm", il)
            cur = self.cb(self.ffn(layer, cur, True, il), "ffn_out", il)
            cur = self.norm(cur, layer.ffn_post_norm, "ffn_post_norm", il)
            inp = self.cb(B.add(ctx, cur, sa_out), "l_out", il)
        return self.finish(inp)

    def build(self, key: tuple) -> UbatchGraph:
        logits = self.build_gemma3() if self.hp.arch == "gemma3" else self.build_llama_like()
        return UbatchGraph(self.ctx, self.gf, self.tokens, self.pos, self.out_ids, self.attn_inputs, logits, key,
                           self.named)


@dataclass
class ShiftGraph:
    """The K-shift graph of one cache: its K vectors rotated in place by each cell's position shift."""

    ctx: Context
    gf: Graph
    shift: Tensor  # I32 [kv_size*n_stream]: input, how far each cell moved


def build_k_shift(model: Model, cache: KVCache) -> ShiftGraph:
    """llama_kv_cache::build_graph_shift: RoPE composes (rotating by p then by d is rotating by p+d),
    so after seq_add moved positions, the first n_rot dims of every cached K are rotated by the shift."""
    hp = model.hparams
    n = len(cache.layer_ids) + 2
    ctx = Context(4 * n * tensor_overhead() + graph_overhead_custom(4 * n), no_alloc=True)
    gf = new_graph_custom(ctx, 4 * n)
    n_cells = cache.size * cache.n_stream
    shift = ctx.new_tensor(I32, n_cells).set_name("k_shift")
    shift.set_input()
    for il in cache.layer_ids:
        k = cache.k[il]
        view = B.view_3d(ctx, k, hp.n_rot, hp.n_head_kv[il], n_cells, k.type.row_size(hp.n_embd_head_k),
                         k.type.row_size(hp.n_embd_k_gqa(il)), 0)
        swa = hp.is_swa(il) if hp.arch == "gemma3" else False
        rp = rope_params(hp, swa)
        factors = None if hp.arch == "gemma3" else model.rope_freqs
        gf.build_forward_expand(B.rope_ext_inplace(ctx, view, shift, factors, hp.n_rot, hp.rope_type, rp.n_ctx_orig,
                                                   rp.freq_base, rp.freq_scale, rp.ext_factor, rp.attn_factor,
                                                   rp.beta_fast, rp.beta_slow))
    return ShiftGraph(ctx, gf, shift)
