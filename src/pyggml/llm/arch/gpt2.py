"""gpt2 (src/models/gpt2.cpp): learned absolute positions added to the token embeddings (no RoPE),
LayerNorm with biases, a fused and biased QKV projection and a plain GELU FFN with biases."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ...gguf.constants import Keys
from ...ops import builders as B
from ..graph import FFNOp, NormType
from ..hparams import LLAMA_ROPE_TYPE_NONE
from ..tensors import LLMTensor as T
from . import register
from .base import Arch, load_embd_output, load_ffn

if TYPE_CHECKING:
    from ...tensor import Tensor
    from ..graph import GraphBuilder
    from ..hparams import KV, HParams
    from ..model import Model

LN = NormType.NORM


@register
class GPT2(Arch):
    name = "gpt2"
    rope_type = LLAMA_ROPE_TYPE_NONE

    def load_hparams(self, hp: HParams, kv: KV) -> None:
        hp.f_norm_eps = float(kv.get(Keys.ATTENTION_LAYERNORM_EPS))

    def load_tensors(self, m: Model) -> None:
        hp = m.hparams
        load_embd_output(m, norm_bias=True)
        m.pos_embd = m.create_tensor(T.POS_EMBD, (hp.n_embd, hp.n_ctx_train))
        for il, layer in enumerate(m.layers):
            n_qkv = hp.n_embd_head_k * hp.n_head[il] + hp.n_embd_k_gqa(il) + hp.n_embd_v_gqa(il)
            layer.attn_norm = m.create_tensor(T.ATTN_NORM, (hp.n_embd,), il)
            layer.attn_norm_b = m.create_tensor(T.ATTN_NORM, (hp.n_embd,), il, "bias")
            layer.wqkv = m.create_tensor(T.ATTN_QKV, (hp.n_embd, n_qkv), il)
            layer.bqkv = m.create_tensor(T.ATTN_QKV, (n_qkv,), il, "bias")
            layer.wo = m.create_tensor(T.ATTN_OUT, (hp.n_embd, hp.n_embd), il)
            layer.bo = m.create_tensor(T.ATTN_OUT, (hp.n_embd,), il, "bias")
            layer.ffn_norm = m.create_tensor(T.FFN_NORM, (hp.n_embd,), il)
            layer.ffn_norm_b = m.create_tensor(T.FFN_NORM, (hp.n_embd,), il, "bias")
            load_ffn(m, layer, il, gate=False, biases=True)

    def build_graph(self, g: GraphBuilder) -> Tensor:
        m, hp, ctx = g.model, g.hp, g.ctx
        pos = g.cb(B.get_rows(ctx, m.pos_embd, g.pos), "pos_embd")
        inp = g.cb(B.add(ctx, g.inp_embd(), pos), "inpL")
        for il, layer in enumerate(m.layers):
            cur = g.norm(inp, layer.attn_norm, "attn_norm", il, layer.attn_norm_b, LN)
            q, k, v = g.qkv(layer, cur, il)
            cur = g.attn(layer, q, k, v, 1.0 / math.sqrt(hp.n_embd_head_k), il)
            cur, inp = g.last_layer_rows(il, cur, inp)
            ffn_inp = g.cb(B.add(ctx, cur, inp), "ffn_inp", il)
            cur = g.norm(ffn_inp, layer.ffn_norm, "ffn_norm", il, layer.ffn_norm_b, LN)
            cur = g.cb(g.ffn_of(layer, cur, FFNOp.GELU, il, parallel=False), "ffn_out", il)
            inp = g.cb(B.add(ctx, cur, ffn_inp), "l_out", il)
        return g.finish(inp, LN)
