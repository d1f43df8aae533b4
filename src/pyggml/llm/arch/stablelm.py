"""stablelm (src/models/stablelm.cpp): LayerNorm with biases, NEOX RoPE over part of each head
(rope.dimension_count), optional per-head Q/K LayerNorms, and, in files without an ffn_norm
(StableLM 2 12B), a parallel block whose FFN reads the attention's input norm."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ...gguf.constants import Keys
from ...ops import builders as B
from ..graph import FFNOp, NormType
from ..tensors import LLMTensor as T
from . import register
from .base import LLAMA_ROPE_TYPE_NEOX, Arch, load_embd_output, load_ffn, load_qkv

if TYPE_CHECKING:
    from ...tensor import Tensor
    from ..graph import GraphBuilder
    from ..hparams import KV, HParams
    from ..model import Model

LN = NormType.NORM


@register
class StableLM(Arch):
    name = "stablelm"
    rope_type = LLAMA_ROPE_TYPE_NEOX

    def load_hparams(self, hp: HParams, kv: KV) -> None:
        hp.f_norm_eps = float(kv.get(Keys.ATTENTION_LAYERNORM_EPS))

    def load_tensors(self, m: Model) -> None:
        hp = m.hparams
        load_embd_output(m, output_required=True, norm_bias=True)
        for il, layer in enumerate(m.layers):
            layer.attn_norm = m.create_tensor(T.ATTN_NORM, (hp.n_embd,), il)
            layer.attn_norm_b = m.create_tensor(T.ATTN_NORM, (hp.n_embd,), il, "bias")
            load_qkv(m, layer, il)
            d = hp.n_embd_head_k
            layer.attn_q_norm = m.create_tensor(T.ATTN_Q_NORM, (d, hp.n_head[il]), il, required=False)
            layer.attn_k_norm = m.create_tensor(T.ATTN_K_NORM, (d, hp.n_head_kv[il]), il, required=False)
            layer.ffn_norm = m.create_tensor(T.FFN_NORM, (hp.n_embd,), il, required=False)
            layer.ffn_norm_b = m.create_tensor(T.FFN_NORM, (hp.n_embd,), il, "bias", required=False)
            load_ffn(m, layer, il)

    def build_graph(self, g: GraphBuilder) -> Tensor:
        m, hp, ctx = g.model, g.hp, g.ctx
        inp = g.inp_embd()
        for il, layer in enumerate(m.layers):
            cur = g.norm(inp, layer.attn_norm, "attn_norm", il, layer.attn_norm_b, LN)
            inp_sa = cur
            q, k, v = g.qkv(layer, cur, il)
            if layer.attn_q_norm is not None:
                q = g.norm(q, layer.attn_q_norm, "Qcur_normed", il, kind=LN)
            if layer.attn_k_norm is not None:
                k = g.norm(k, layer.attn_k_norm, "Kcur_normed", il, kind=LN)
            q = g.cb(g.rope(q, il), "Qcur", il)
            k = g.cb(g.rope(k, il), "Kcur", il)
            cur = g.attn(layer, q, k, v, 1.0 / math.sqrt(hp.n_embd_head_k), il)
            cur, inp, inp_sa = g.last_layer_rows(il, cur, inp, inp_sa)
            ffn_inp = g.cb(B.add(ctx, cur, inp), "ffn_inp", il)
            if layer.ffn_norm is not None:
                cur = g.norm(ffn_inp, layer.ffn_norm, "ffn_norm", il, layer.ffn_norm_b, LN)
            else:  # parallel: the FFN reads the attention's input norm
                cur = inp_sa
            cur = g.cb(g.ffn_of(layer, cur, FFNOp.SILU, il), "ffn_out", il)
            inp = g.cb(B.add(ctx, cur, ffn_inp), "l_out", il)
        return g.finish(inp, LN)
