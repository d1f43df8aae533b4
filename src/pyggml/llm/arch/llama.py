"""llama (src/models/llama.cpp): Llama 1-3.x, Mistral-style and other llama-architecture files.

Pre-norm RMSNorm blocks, adjacent-pair (NORM) RoPE with optional llama3 frequency factors
(``rope_freqs``), grouped-query attention with optional biases, and a SwiGLU FFN.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ...ops import builders as B
from ..graph import FFNOp, Gating
from ..tensors import LLMTensor as T
from . import register
from .base import Arch, load_embd_output, load_ffn, load_moe, load_qkv, require

if TYPE_CHECKING:
    from ...tensor import Tensor
    from ..graph import GraphBuilder
    from ..hparams import KV, HParams
    from ..model import Layer, Model


class LlamaLike(Arch):
    """The llama block, which many architectures share with small changes: the graph is here, and
    the hooks (``rope_qk``, ``residual``, ``ffn_block``) are where those architectures differ.
    A file with experts (``{arch}.expert_count``) gets the mixture-of-experts FFN in every layer."""

    #: build_moe_ffn's norm_w: renormalise the chosen experts' probabilities to sum to 1
    moe_norm_w: bool = True

    def load_tensors(self, m: Model) -> None:
        hp = m.hparams
        load_embd_output(m, output_bias=True)
        for il, layer in enumerate(m.layers):
            layer.attn_norm = m.create_tensor(T.ATTN_NORM, (hp.n_embd,), il)
            load_qkv(m, layer, il)
            layer.ffn_norm = m.create_tensor(T.FFN_NORM, (hp.n_embd,), il)
            if hp.n_expert:
                load_moe(m, layer, il)
            else:
                load_ffn(m, layer, il, biases=True)

    def build_graph(self, g: GraphBuilder) -> Tensor:
        m, hp = g.model, g.hp
        inp = g.cb(g.inp_embd(), "inp_embd")
        kq_scale = hp.f_attention_scale or 1.0 / math.sqrt(hp.n_embd_head_k)
        for il, layer in enumerate(m.layers):
            cur = g.norm(inp, layer.attn_norm, "attn_norm", il)
            q, k, v = g.qkv(layer, cur, il)
            q, k = self.rope_qk(g, layer, q, k, il)
            cur = g.cb(g.attn(layer, q, k, v, kq_scale, il), "attn_out", il)
            cur, inp = g.last_layer_rows(il, cur, inp)
            ffn_inp = g.cb(self.residual(g, cur, inp), "ffn_inp", il)
            cur = g.norm(ffn_inp, layer.ffn_norm, "ffn_norm", il)
            cur = g.cb(self.ffn_block(g, layer, cur, il), "ffn_out", il)
            inp = g.cb(self.residual(g, cur, ffn_inp), "l_out", il)
        return g.finish(inp)

    def ffn_block(self, g: GraphBuilder, layer: Layer, cur: Tensor, il: int) -> Tensor:
        """The dense SwiGLU FFN, or, in a layer with a router, the mixture of experts (softmax gating,
        the chosen weights renormalised unless ``moe_norm_w`` is off) plus a shared expert if any."""
        if layer.ffn_gate_inp is None:
            return g.ffn_of(layer, cur, FFNOp.SILU, il)
        out = g.moe_ffn(cur, layer, FFNOp.SILU, self.moe_norm_w, g.hp.expert_weights_scale, Gating.SOFTMAX, il)
        if layer.ffn_up_shexp is not None:
            shexp = g.cb(g.ffn(cur, layer.ffn_up_shexp, layer.ffn_gate_shexp, layer.ffn_down_shexp, FFNOp.SILU, il),
                         "ffn_shexp", il)
            out = B.add(g.ctx, out, shexp)
        return out

    def rope_qk(self, g: GraphBuilder, layer: Layer, q: Tensor, k: Tensor, il: int) -> tuple[Tensor, Tensor]:
        """RoPE on Q and K (qwen3 and others first normalise each head)."""
        return g.cb(g.rope(q, il), "Qcur", il), g.cb(g.rope(k, il), "Kcur", il)

    def residual(self, g: GraphBuilder, branch: Tensor, stream: Tensor) -> Tensor:
        """The residual add (granite scales the branch first)."""
        return B.add(g.ctx, branch, stream)


@register
class Llama(LlamaLike):
    name = "llama"

    def load_hparams(self, hp: HParams, kv: KV) -> None:
        super().load_hparams(hp, kv)
        require(hp.n_rot == hp.n_embd_head_k, f"invalid n_rot: {hp.n_rot}, expected {hp.n_embd_head_k}")

    def load_tensors(self, m: Model) -> None:
        super().load_tensors(m)
        for il in range(m.hparams.n_layer):
            load_rope_factors(m, il)


def load_rope_factors(m: Model, il: int) -> None:
    """The llama3 / LongRoPE frequency factors: one tensor shared by every layer (llama.cpp loads it
    per layer as a duplicate), rope_factors_long/short when the scaling type is longrope."""
    hp, layer = m.hparams, m.layers[il]
    if hp.rope_scaling_type == "longrope":
        layer.rope_long = m.create_tensor(T.ROPE_FACTORS_LONG, (hp.n_rot // 2,), required=False)
        layer.rope_short = m.create_tensor(T.ROPE_FACTORS_SHORT, (hp.n_rot // 2,), required=False)
    else:
        layer.rope_freqs = m.create_tensor(T.ROPE_FREQS, (hp.n_rot // 2,), required=False)
