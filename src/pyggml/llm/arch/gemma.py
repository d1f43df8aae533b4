"""gemma (src/models/gemma.cpp), and the block gemma2 and gemma3 build on.

Embeddings scaled by sqrt(n_embd), NEOX RoPE, Q pre-scaled (the attention itself uses scale 1), a
GELU-gated FFN and the output tied to the token embeddings. gemma2/3 add norms after attention and
after the FFN, gemma3 per-head Q/K norms: the graph applies those when the layer has them. The
converters store every norm weight as 1 + w, so the runner multiplies by it directly.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ...ops import builders as B
from ..graph import FFNOp
from ..tensors import LLMTensor as T
from . import register
from .base import LLAMA_ROPE_TYPE_NEOX, Arch, load_ffn, load_qkv

if TYPE_CHECKING:
    from ...tensor import Tensor
    from ..graph import GraphBuilder
    from ..hparams import KV, HParams
    from ..model import Model


@register
class Gemma(Arch):
    name = "gemma"
    rope_type = LLAMA_ROPE_TYPE_NEOX

    def load_hparams(self, hp: HParams, kv: KV) -> None:
        super().load_hparams(hp, kv)
        hp.f_attention_scale = 1.0 / math.sqrt(hp.n_embd_head_k)

    def load_tensors(self, m: Model) -> None:
        hp = m.hparams
        m.tok_embd = m.create_tensor(T.TOKEN_EMBD, (hp.n_embd, hp.n_vocab))
        m.output_norm = m.create_tensor(T.OUTPUT_NORM, (hp.n_embd,))
        m.output = m.tied_output()  # gemma and gemma2 always tie, even if the file has output.weight
        for il, layer in enumerate(m.layers):
            layer.attn_norm = m.create_tensor(T.ATTN_NORM, (hp.n_embd,), il)
            load_qkv(m, layer, il, biases=False)
            layer.ffn_norm = m.create_tensor(T.FFN_NORM, (hp.n_embd,), il)
            load_ffn(m, layer, il)

    def build_graph(self, g: GraphBuilder) -> Tensor | None:
        m, hp, ctx = g.model, g.hp, g.ctx
        inp = g.cb(B.scale(ctx, g.inp_embd(), self.inp_scale(g)), "inp_scaled")
        for il, layer in enumerate(m.layers):
            cur = g.norm(inp, layer.attn_norm, "attn_norm", il)
            q, k, v = g.qkv(layer, cur, il)
            if layer.attn_q_norm is not None:
                q = g.norm(q, layer.attn_q_norm, "Qcur_normed", il)
                k = g.norm(k, layer.attn_k_norm, "Kcur_normed", il)
            q = g.cb(g.rope(q, il), "Qcur", il)
            k = g.cb(g.rope(k, il), "Kcur", il)
            q = B.scale(ctx, q, hp.f_attention_scale)
            cur = g.attn(layer, q, k, v, 1.0, il)
            cur, inp = g.last_layer_rows(il, cur, inp)
            if layer.attn_post_norm is not None:
                cur = g.norm(cur, layer.attn_post_norm, "attn_post_norm", il)
            sa_out = g.cb(B.add(ctx, cur, inp), "sa_out", il)
            cur = g.norm(sa_out, layer.ffn_norm, "ffn_norm", il)
            cur = g.cb(g.ffn_of(layer, cur, FFNOp.GELU, il), "ffn_out", il)
            if layer.ffn_post_norm is not None:
                cur = g.norm(cur, layer.ffn_post_norm, "ffn_post_norm", il)
            inp = g.cb(B.add(ctx, cur, sa_out), "l_out", il)
        return self.output(g, inp)

    def inp_scale(self, g: GraphBuilder) -> float:
        """The embeddings are scaled by sqrt(n_embd)."""
        return float(math.sqrt(g.hp.n_embd))

    def output(self, g: GraphBuilder, cur: Tensor) -> Tensor | None:
        """The head: result_norm and the tied vocabulary projection (gemma-embedding stops at result_norm)."""
        return g.finish(cur)


def load_post_norms(m: Model) -> None:
    """gemma2/3's post_attention_norm and post_ffw_norm."""
    for il, layer in enumerate(m.layers):
        layer.attn_post_norm = m.create_tensor(T.ATTN_POST_NORM, (m.hparams.n_embd,), il)
        layer.ffn_post_norm = m.create_tensor(T.FFN_POST_NORM, (m.hparams.n_embd,), il)


def big_model_attention_scale(hp: HParams, n_layer_27b: int) -> float:
    """Gemma's query_pre_attn_scalar is not in the file: llama.cpp gives the 27B models (known by their
    layer count) 1/sqrt(n_embd/n_head) and the others 1/sqrt(head_dim)."""
    if hp.n_layer == n_layer_27b:
        return 1.0 / math.sqrt(hp.n_embd / hp.n_head[0])
    return 1.0 / math.sqrt(hp.n_embd_head_k)
