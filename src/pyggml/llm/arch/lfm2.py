"""lfm2 (src/models/lfm2.cpp): Liquid's LFM2, a hybrid of short gated convolutions and attention.

The layers with ``head_count_kv`` 0 are convolution layers: in_proj splits into B, C and x, the product
B * x runs through a depthwise causal conv of ``shortconv.l_cache`` taps (SSM_CONV) whose past
``l_cache - 1`` inputs the recurrent memory keeps, and C gates the result before out_proj. The others are
attention layers (per-head RMSNorms on Q and K, NEOX RoPE) on the KV cache. Every layer is pre-norm with a
SwiGLU FFN; the final norm is stored as ``token_embd_norm``. Callback names are llama.cpp's (which spells
them "model.layers.{}.operator_norm"-style, and names the FFN norm's output ffn_out).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ...gguf.constants import Keys
from ...ops import builders as B
from ..graph import FFNOp
from ..hparams import LLAMA_ROPE_TYPE_NEOX
from ..tensors import LLMTensor as T
from . import register
from .base import Arch, load_ffn, load_qkv, require

if TYPE_CHECKING:
    from ...tensor import Tensor
    from ..graph import GraphBuilder
    from ..hparams import KV, HParams
    from ..model import Layer, Model


@register
class Lfm2(Arch):
    name = "lfm2"
    rope_type = LLAMA_ROPE_TYPE_NEOX
    recurrent = True
    hybrid = True

    def load_hparams(self, hp: HParams, kv: KV) -> None:
        hp.n_shortconv_l_cache = int(kv.get(Keys.SHORTCONV_L_CACHE))
        hp.f_norm_rms_eps = float(kv.get(Keys.ATTENTION_LAYERNORM_RMS_EPS))
        hp.recurrent_layers = [n == 0 for n in hp.n_head_kv]
        require(hp.n_shortconv_l_cache > 1, f"{hp.arch}: shortconv.l_cache must be > 1, got {hp.n_shortconv_l_cache}")
        require(hp.causal_attn, f"{hp.arch}: non-causal (bidirectional) LFM2 models are not supported")
        require(int(kv.get(Keys.ATTENTION_SLIDING_WINDOW, 0)) == 0,
                f"{hp.arch}: LFM2 with sliding-window attention is not supported")

    def load_tensors(self, m: Model) -> None:
        hp = m.hparams
        n = hp.n_embd
        m.tok_embd = m.create_tensor(T.TOKEN_EMBD, (n, hp.n_vocab))
        m.output_norm = m.create_tensor(T.TOKEN_EMBD_NORM, (n,))  # LLM_TENSOR_OUTPUT_NORM_LFM2
        m.output = m.create_tensor(T.OUTPUT, (n, hp.n_vocab), required=False) or m.tied_output()
        for il, layer in enumerate(m.layers):
            layer.ffn_norm = m.create_tensor(T.FFN_NORM, (n,), il)
            load_ffn(m, layer, il)
            layer.attn_norm = m.create_tensor(T.ATTN_NORM, (n,), il)
            if hp.is_recurrent(il):
                layer.shortconv_conv = m.create_tensor(T.SHORTCONV_CONV, (hp.n_shortconv_l_cache, n), il)
                layer.shortconv_in_proj = m.create_tensor(T.SHORTCONV_INPROJ, (n, 3 * n), il)
                layer.shortconv_out_proj = m.create_tensor(T.SHORTCONV_OUTPROJ, (n, n), il)
            else:
                require(hp.n_embd_k_gqa(il) == hp.n_embd_v_gqa(il), f"{hp.arch}: K and V widths differ")
                layer.attn_q_norm = m.create_tensor(T.ATTN_Q_NORM, (hp.n_embd_head_k,), il)
                layer.attn_k_norm = m.create_tensor(T.ATTN_K_NORM, (hp.n_embd_head_k,), il)
                load_qkv(m, layer, il, biases=False)

    def build_graph(self, g: GraphBuilder) -> Tensor:
        hp, ctx = g.hp, g.ctx
        cur = g.cb(g.inp_embd(), "model.embed_tokens")
        g.gf.build_forward_expand(cur)
        for il, layer in enumerate(g.model.layers):
            prev = cur
            cur = g.norm(cur, layer.attn_norm, "model.layers.{}.operator_norm", il)
            cur = shortconv_block(g, layer, cur, il) if hp.is_recurrent(il) else attn_block(g, layer, cur, il)
            cur, prev = g.last_layer_rows(il, cur, prev)
            cur = B.add(ctx, prev, cur)
            ffn = g.norm(cur, layer.ffn_norm, "model.layers.{}.ffn_norm", il)
            out = g.ffn_of(layer, ffn, FFNOp.SILU, il)
            g.cb(ffn, "model.layers.{}.ffn_out", il)  # (llama.cpp names the norm's output, not the FFN's)
            cur = g.cb(B.add(ctx, cur, out), "l_out", il)
        return g.finish(cur)


def attn_block(g: GraphBuilder, layer: Layer, cur: Tensor, il: int) -> Tensor:
    """Q, K, V; an RMSNorm over each head of Q and of K; NEOX RoPE; attention over the KV cache."""
    q, k, v = g.qkv(layer, cur, il)
    q = g.norm(q, layer.attn_q_norm, "model.layers.{}.self_attn.q_layernorm", il)
    k = g.norm(k, layer.attn_k_norm, "model.layers.{}.self_attn.k_layernorm", il)
    q, k = g.rope(q, il), g.rope(k, il)
    cur = g.attn(layer, q, k, v, 1.0 / math.sqrt(g.hp.n_embd_head_v), il)
    return g.cb(cur, "model.layers.{}.self_attn.out_proj", il)


def shortconv_block(g: GraphBuilder, layer: Layer, cur: Tensor, il: int) -> Tensor:
    """in_proj -> (B, C, x); the causal depthwise conv of B * x over the stored past inputs and the run's own
    (whose last l_cache - 1 go back to the memory); C * conv -> out_proj. Returns {n_embd, n_tokens}."""
    ctx, hp = g.ctx, g.hp
    n_seq_tokens, n_seqs = g.n_seq_tokens, g.n_seqs
    d_conv = hp.n_shortconv_l_cache - 1
    cur = B.reshape_3d(ctx, cur, cur.ne[0], n_seq_tokens, n_seqs)
    bcx = g.cb(g.mm(layer.shortconv_in_proj, cur), "model.layers.{}.conv.in_proj", il)
    width = bcx.ne[0] // 3
    b, c, x = (B.view_3d(ctx, bcx, width, bcx.ne[1], bcx.ne[2], bcx.nb[1], bcx.nb[2], i * width * bcx.nb[0])
               for i in range(3))
    bx = B.transpose(ctx, B.mul(ctx, b, x))  # {n_seq_tokens, n_embd, n_seqs}
    state = g.rs_r(il)
    conv = B.reshape_3d(ctx, g.build_rs(state, hp.n_embd_r(), n_seqs), d_conv, hp.n_embd, n_seqs)
    bx = B.concat(ctx, conv, bx, 0)  # the stored past inputs, then the run's
    last = B.view_3d(ctx, bx, d_conv, bx.ne[1], bx.ne[2], bx.nb[1], bx.nb[2], (bx.ne[0] - d_conv) * bx.nb[0])
    g.store_rs(last, state)
    conv_out = g.cb(B.ssm_conv(ctx, bx, layer.shortconv_conv), "model.layers.{}.conv.conv", il)
    y = g.mm(layer.shortconv_out_proj, B.mul(ctx, c, conv_out))
    g.cb(y, "model.layers.{}.conv.out_proj", il)
    return B.reshape_2d(ctx, y, y.ne[0], n_seq_tokens * n_seqs)
