"""gpt-oss (src/models/openai-moe.cpp): attention with learned sinks (one extra logit per head that
takes part in the softmax), biased projections, sliding-window attention on every other layer, and a
mixture of experts with a biased router, softmax over the chosen experts' logits, biased experts and
gpt-oss's clamped SwiGLU. Its norm after attention is the FFN's input norm; only the last layer's
output positions reach the head."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ...gguf.constants import Keys
from ...ops import builders as B
from ..graph import FFNOp, Gating
from ..tensors import LLMTensor as T
from . import register
from .base import LLAMA_ROPE_TYPE_NEOX, Arch, load_embd_output, load_moe, load_qkv

if TYPE_CHECKING:
    from ...tensor import Tensor
    from ..graph import GraphBuilder
    from ..hparams import KV, HParams
    from ..model import Model


@register
class OpenAIMoE(Arch):
    name = "gpt-oss"
    rope_type = LLAMA_ROPE_TYPE_NEOX

    def load_hparams(self, hp: HParams, kv: KV) -> None:
        super().load_hparams(hp, kv)
        hp.n_ff_exp = int(kv.get(Keys.EXPERT_FEED_FORWARD_LENGTH))
        hp.n_swa = int(kv.get(Keys.ATTENTION_SLIDING_WINDOW))
        hp.load_swa_pattern(kv, 2)
        hp.rope_freq_base_train_swa = float(kv.get(Keys.ROPE_FREQ_BASE_SWA, hp.rope_freq_base_train))
        hp.rope_freq_scale_train_swa = hp.rope_freq_scale_train

    def load_tensors(self, m: Model) -> None:
        hp = m.hparams
        load_embd_output(m, output_required=True)
        n_ff, n_exp = hp.n_ff_exp, hp.n_expert
        for il, layer in enumerate(m.layers):
            layer.attn_norm = m.create_tensor(T.ATTN_NORM, (hp.n_embd,), il)
            layer.attn_post_norm = m.create_tensor(T.ATTN_POST_NORM, (hp.n_embd,), il)
            load_qkv(m, layer, il)
            layer.bo = m.create_tensor(T.ATTN_OUT, (hp.n_embd,), il, "bias")
            layer.attn_sinks = m.create_tensor(T.ATTN_SINKS, (hp.n_head[il],), il)
            load_moe(m, layer, il, gate_required=True)
            layer.ffn_gate_inp_b = m.create_tensor(T.FFN_GATE_INP, (n_exp,), il, "bias")
            layer.ffn_gate_exps_b = m.create_tensor(T.FFN_GATE_EXPS, (n_ff, n_exp), il, "bias")
            layer.ffn_up_exps_b = m.create_tensor(T.FFN_UP_EXPS, (n_ff, n_exp), il, "bias")
            layer.ffn_down_exps_b = m.create_tensor(T.FFN_DOWN_EXPS, (hp.n_embd, n_exp), il, "bias")

    def build_graph(self, g: GraphBuilder) -> Tensor:
        m, hp, ctx = g.model, g.hp, g.ctx
        inp = g.inp_embd()
        for il, layer in enumerate(m.layers):
            cur = g.norm(inp, layer.attn_norm, "attn_norm", il)
            q, k, v = g.qkv(layer, cur, il)
            q = g.cb(g.rope(q, il), "Qcur", il)
            k = g.cb(g.rope(k, il), "Kcur", il)
            cur = g.cb(g.attn(layer, q, k, v, 1.0 / math.sqrt(hp.n_embd_head_k), il, layer.attn_sinks),
                       "attn_out", il)
            ffn_inp = g.cb(B.add(ctx, cur, inp), "ffn_inp", il)
            cur = g.norm(ffn_inp, layer.attn_post_norm, "attn_post_norm", il)
            cur = g.moe_ffn(cur, layer, FFNOp.SWIGLU_OAI, False, hp.expert_weights_scale, Gating.SOFTMAX_WEIGHT, il)
            inp = g.cb(B.add(ctx, cur, ffn_inp), "l_out", il)
        (inp,) = g.last_layer_rows(hp.n_layer - 1, inp)
        return g.finish(inp)
