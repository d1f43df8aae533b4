"""bert and nomic-bert (src/models/bert.cpp, nomic-bert.cpp): encoders that turn a whole sequence into
embeddings, with no KV cache and no vocabulary projection.

Post-norm blocks: the residual add, then a LayerNorm with bias, after attention and after the FFN. The
input is the token embeddings plus row 0 of the token-type (segment) embeddings ("sentence A": llama.cpp
hard-codes it), plus, for BERT, learned absolute positions, then a LayerNorm. BERT's FFN is up, GELU,
down with biases; nomic-bert has RoPE (NEOX) instead of position embeddings and a SwiGLU FFN.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ...gguf.constants import Keys
from ...ops import builders as B
from ..graph import FFNOp, NormType
from ..tensors import LLMTensor as T
from . import register
from .base import LLAMA_ROPE_TYPE_NEOX, Arch, load_cls_head, load_qkv, require

if TYPE_CHECKING:
    from ...tensor import Tensor
    from ..graph import GraphBuilder
    from ..hparams import KV, HParams
    from ..model import Model


@register
class Bert(Arch):
    name = "bert"
    rope_type = LLAMA_ROPE_TYPE_NEOX  # (llama_model_rope_type's; BERT itself uses position embeddings)
    has_memory = False
    has_logits = False
    #: learned absolute positions added to the input (nomic-bert rotates Q and K instead)
    position_embeddings = True

    def load_hparams(self, hp: HParams, kv: KV) -> None:
        hp.f_norm_eps = float(kv.get(Keys.ATTENTION_LAYERNORM_EPS))

    def load_tensors(self, m: Model) -> None:
        hp = m.hparams
        require(hp.n_token_types > 0, f"{self.name} model needs to define token type count "
                                      f"({Keys.TOKENIZER_TOKEN_TYPE_COUNT})")
        require(hp.n_embd_head_k == hp.n_embd_head_v, f"{self.name}: key and value heads differ in size")
        m.tok_embd = m.create_tensor(T.TOKEN_EMBD, (hp.n_embd, hp.n_vocab))
        m.type_embd = m.create_tensor(T.TOKEN_TYPES, (hp.n_embd, hp.n_token_types), required=False)
        if self.position_embeddings:
            m.pos_embd = m.create_tensor(T.POS_EMBD, (hp.n_embd, hp.n_ctx_train))
            load_cls_head(m)
        m.tok_norm = m.create_tensor(T.TOKEN_EMBD_NORM, (hp.n_embd,))
        m.tok_norm_b = m.create_tensor(T.TOKEN_EMBD_NORM, (hp.n_embd,), suffix="bias")
        for il, layer in enumerate(m.layers):
            load_qkv(m, layer, il)
            layer.attn_out_norm = m.create_tensor(T.ATTN_OUT_NORM, (hp.n_embd,), il)
            layer.attn_out_norm_b = m.create_tensor(T.ATTN_OUT_NORM, (hp.n_embd,), il, "bias")
            n_ff = hp.n_ff[il]
            layer.ffn_up = m.create_tensor(T.FFN_UP, (hp.n_embd, n_ff), il)
            layer.ffn_up_b = m.create_tensor(T.FFN_UP, (n_ff,), il, "bias", required=False)
            layer.ffn_down = m.create_tensor(T.FFN_DOWN, (n_ff, hp.n_embd), il)
            layer.ffn_down_b = m.create_tensor(T.FFN_DOWN, (hp.n_embd,), il, "bias", required=False)
            if not self.position_embeddings:
                layer.ffn_gate = m.create_tensor(T.FFN_GATE, (hp.n_embd, n_ff), il)
            layer.layer_out_norm = m.create_tensor(T.LAYER_OUT_NORM, (hp.n_embd,), il)
            layer.layer_out_norm_b = m.create_tensor(T.LAYER_OUT_NORM, (hp.n_embd,), il, "bias")

    def build_graph(self, g: GraphBuilder) -> Tensor | None:
        m, hp, ctx = g.model, g.hp, g.ctx
        inp = g.inp_embd()
        if m.type_embd is not None:  # token types are all 0 ("sentence A")
            inp = B.add(ctx, inp, B.view_1d(ctx, m.type_embd, hp.n_embd, 0))
        if self.position_embeddings:
            inp = B.add(ctx, B.get_rows(ctx, m.pos_embd, g.pos), inp)
        g.cb(inp, "inp_embd")
        inp = g.norm(inp, m.tok_norm, "inp_norm", 0, m.tok_norm_b, NormType.NORM)
        kq_scale = 1.0 / math.sqrt(hp.n_embd_head_k)
        for il, layer in enumerate(m.layers):
            q, k, v = g.qkv(layer, inp, il)
            if not self.position_embeddings:
                q, k = g.rope(q, il), g.rope(k, il)
            g.cb(q, "Qcur", il)
            g.cb(k, "Kcur", il)
            g.cb(v, "Vcur", il)
            cur = g.attn(layer, q, k, v, kq_scale, il)
            cur, inp = g.last_layer_rows(il, cur, inp)
            cur = B.add(ctx, cur, inp)  # re-add the layer input, then the attention LayerNorm
            cur = g.norm(cur, layer.attn_out_norm, "attn_out_norm", il, layer.attn_out_norm_b, NormType.NORM)
            ffn_inp = g.cb(cur, "ffn_inp", il)
            if self.position_embeddings:
                cur = g.ffn(cur, layer.ffn_up, None, layer.ffn_down, FFNOp.GELU, il, layer.ffn_up_b, None,
                            layer.ffn_down_b)
            else:
                cur = g.ffn_of(layer, cur, FFNOp.SILU, il)
            g.cb(cur, "ffn_out", il)
            cur = B.add(ctx, cur, ffn_inp)
            inp = g.norm(cur, layer.layer_out_norm, "layer_out_norm", il, layer.layer_out_norm_b, NormType.NORM)
        g.finish_embd(inp, "result_embd")
        return None


@register
class NomicBert(Bert):
    name = "nomic-bert"
    position_embeddings = False
