"""olmo2 (src/models/olmo2.cpp): no pre-norms; Q and K RMS-normalised over all heads at once, norms
after attention and after the FFN (before each residual add), NEOX RoPE; optional sliding-window
layers (three in four), whose RoPE keeps the base but drops scaling."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ...gguf.constants import Keys
from ...ops import builders as B
from ..graph import FFNOp, RopeParams
from ..tensors import LLMTensor as T
from . import register
from .base import LLAMA_ROPE_TYPE_NEOX, Arch, load_embd_output, load_ffn, load_qkv

if TYPE_CHECKING:
    from ...tensor import Tensor
    from ..graph import GraphBuilder
    from ..hparams import KV, HParams
    from ..model import Model


@register
class Olmo2(Arch):
    name = "olmo2"
    rope_type = LLAMA_ROPE_TYPE_NEOX

    def load_hparams(self, hp: HParams, kv: KV) -> None:
        super().load_hparams(hp, kv)
        hp.n_swa = int(kv.get(Keys.ATTENTION_SLIDING_WINDOW, 0))
        if hp.n_swa > 0:
            hp.load_swa_pattern(kv, 4)
            hp.rope_freq_base_train_swa = float(kv.get(Keys.ROPE_FREQ_BASE_SWA, hp.rope_freq_base_train))
            hp.rope_freq_scale_train_swa = 1.0

    def load_tensors(self, m: Model) -> None:
        hp = m.hparams
        load_embd_output(m, output_required=True)
        for il, layer in enumerate(m.layers):
            load_qkv(m, layer, il, biases=False)
            layer.attn_q_norm = m.create_tensor(T.ATTN_Q_NORM, (hp.n_embd_head_k * hp.n_head[il],), il)
            layer.attn_k_norm = m.create_tensor(T.ATTN_K_NORM, (hp.n_embd_k_gqa(il),), il)
            layer.attn_post_norm = m.create_tensor(T.ATTN_POST_NORM, (hp.n_embd,), il)
            load_ffn(m, layer, il)
            layer.ffn_post_norm = m.create_tensor(T.FFN_POST_NORM, (hp.n_embd,), il)

    def build_graph(self, g: GraphBuilder) -> Tensor:
        m, hp, ctx, T_ = g.model, g.hp, g.ctx, g.n_tokens
        d = hp.n_embd_head_k
        inp = g.inp_embd()
        for il, layer in enumerate(m.layers):
            q = g.cb(g.mm(layer.wq, inp), "Qcur", il)
            k = g.cb(g.mm(layer.wk, inp), "Kcur", il)
            v = g.cb(g.mm(layer.wv, inp), "Vcur", il)
            q = g.norm(q, layer.attn_q_norm, "Qcur_normed", il)
            k = g.norm(k, layer.attn_k_norm, "Kcur_normed", il)
            q = B.reshape_3d(ctx, q, d, hp.n_head[il], T_)
            k = B.reshape_3d(ctx, k, d, hp.n_head_kv[il], T_)
            v = B.reshape_3d(ctx, v, d, hp.n_head_kv[il], T_)
            rp = None
            if hp.is_swa(il):  # the sliding layers: the global base, no scaling (olmo2.cpp)
                rp = RopeParams(hp.n_ctx_orig_yarn, hp.rope_freq_base_train, 1.0, 0.0, 1.0)
            q = g.cb(g.rope(q, il, rp), "Qcur", il)
            k = g.cb(g.rope(k, il, rp), "Kcur", il)
            cur = g.attn(layer, q, k, v, 1.0 / math.sqrt(d), il)
            cur, inp = g.last_layer_rows(il, cur, inp)
            cur = g.norm(cur, layer.attn_post_norm, "attn_post_norm", il)
            ffn_inp = g.cb(B.add(ctx, cur, inp), "ffn_inp", il)
            cur = g.ffn_of(layer, ffn_inp, FFNOp.SILU, il)
            cur = g.norm(cur, layer.ffn_post_norm, "ffn_post_norm", il)
            inp = g.cb(B.add(ctx, cur, ffn_inp), "l_out", il)
        return g.finish(inp)
