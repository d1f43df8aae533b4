"""starcoder2 (src/models/starcoder2.cpp): LayerNorm with biases everywhere, biased projections, NEOX
RoPE and a plain (ungated) GELU FFN; gpt2 is this block with learned positions instead of RoPE."""

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
class StarCoder2(Arch):
    name = "starcoder2"
    rope_type = LLAMA_ROPE_TYPE_NEOX

    def load_hparams(self, hp: HParams, kv: KV) -> None:
        hp.f_norm_eps = float(kv.get(Keys.ATTENTION_LAYERNORM_EPS))

    def load_tensors(self, m: Model) -> None:
        hp = m.hparams
        load_embd_output(m, norm_bias=True)
        for il, layer in enumerate(m.layers):
            layer.attn_norm = m.create_tensor(T.ATTN_NORM, (hp.n_embd,), il)
            layer.attn_norm_b = m.create_tensor(T.ATTN_NORM, (hp.n_embd,), il, "bias")
            load_qkv(m, layer, il)
            layer.ffn_norm = m.create_tensor(T.FFN_NORM, (hp.n_embd,), il)
            layer.ffn_norm_b = m.create_tensor(T.FFN_NORM, (hp.n_embd,), il, "bias")
            load_ffn(m, layer, il, gate=False, biases=True)

    def build_graph(self, g: GraphBuilder) -> Tensor:
        m, hp, ctx = g.model, g.hp, g.ctx
        inp = self.embed(g)
        for il, layer in enumerate(m.layers):
            cur = g.norm(inp, layer.attn_norm, "attn_norm", il, layer.attn_norm_b, LN)
            q, k, v = g.qkv(layer, cur, il)
            q, k = self.rope_qk(g, q, k, il)
            cur = g.attn(layer, q, k, v, 1.0 / math.sqrt(hp.n_embd_head_k), il)
            cur, inp = g.last_layer_rows(il, cur, inp)
            ffn_inp = g.cb(B.add(ctx, cur, inp), "ffn_inp", il)
            cur = g.norm(ffn_inp, layer.ffn_norm, "ffn_norm", il, layer.ffn_norm_b, LN)
            cur = g.cb(g.ffn_of(layer, cur, FFNOp.GELU, il, parallel=False), "ffn_out", il)
            inp = g.cb(B.add(ctx, cur, ffn_inp), "l_out", il)
        return g.finish(inp, LN)

    def embed(self, g: GraphBuilder) -> Tensor:
        """The token embeddings entering the first block (gpt2 adds learned positions)."""
        return g.inp_embd()

    def rope_qk(self, g: GraphBuilder, q: Tensor, k: Tensor, il: int) -> tuple[Tensor, Tensor]:
        """RoPE on Q and K (gpt2 has none)."""
        return g.cb(g.rope(q, il), "Qcur", il), g.cb(g.rope(k, il), "Kcur", il)
