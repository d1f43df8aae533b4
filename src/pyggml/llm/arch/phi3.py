"""phi3 (src/models/phi3.cpp): fused QKV and a fused gate/up projection (ffn_up holds both halves,
SwiGLU over it), NEOX RoPE with LongRoPE's short/long frequency factors (long ones when the context
per sequence exceeds the original one), Q pre-scaled. llama.cpp turns Phi's sliding window off
(a warning in its loader), and so does pyggml."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ...gguf.constants import Keys
from ...ops import builders as B
from ..graph import FFNOp
from ..tensors import LLMTensor as T
from . import register
from .base import LLAMA_ROPE_TYPE_NEOX, Arch, load_embd_output, load_qkv

if TYPE_CHECKING:
    from ...tensor import Tensor
    from ..graph import GraphBuilder
    from ..hparams import KV, HParams
    from ..model import Model


@register
class Phi3(Arch):
    name = "phi3"
    rope_type = LLAMA_ROPE_TYPE_NEOX

    def load_hparams(self, hp: HParams, kv: KV) -> None:
        super().load_hparams(hp, kv)
        kv.get(Keys.ATTENTION_SLIDING_WINDOW, 0)  # read and ignored, as llama.cpp does
        hp.n_swa, hp.swa_layers = 0, [False] * hp.n_layer

    def load_tensors(self, m: Model) -> None:
        hp = m.hparams
        load_embd_output(m, output_bias=True)
        for il, layer in enumerate(m.layers):
            layer.attn_norm = m.create_tensor(T.ATTN_NORM, (hp.n_embd,), il)
            load_qkv(m, layer, il)
            layer.ffn_norm = m.create_tensor(T.FFN_NORM, (hp.n_embd,), il)
            layer.ffn_down = m.create_tensor(T.FFN_DOWN, (hp.n_ff[il], hp.n_embd), il)
            layer.ffn_up = m.create_tensor(T.FFN_UP, (hp.n_embd, 2 * hp.n_ff[il]), il)
            layer.rope_long = m.create_tensor(T.ROPE_FACTORS_LONG, (hp.n_rot // 2,), required=False)
            layer.rope_short = m.create_tensor(T.ROPE_FACTORS_SHORT, (hp.n_rot // 2,), required=False)

    def build_graph(self, g: GraphBuilder) -> Tensor:
        m, hp, ctx = g.model, g.hp, g.ctx
        inp = g.inp_embd()
        for il, layer in enumerate(m.layers):
            cur = g.norm(inp, layer.attn_norm, "attn_norm", il)
            q, k, v = g.qkv(layer, cur, il)
            q = g.cb(g.rope(q, il), "Qcur", il)
            k = g.cb(g.rope(k, il), "Kcur", il)
            q = B.scale(ctx, q, 1.0 / math.sqrt(hp.n_embd_head_k))
            cur = g.attn(layer, q, k, v, 1.0, il)
            cur, inp = g.last_layer_rows(il, cur, inp)
            residual = B.add(ctx, cur, inp)
            cur = g.norm(residual, layer.ffn_norm, "ffn_norm", il)
            cur = g.cb(g.ffn(cur, layer.ffn_up, None, layer.ffn_down, FFNOp.SWIGLU, il, parallel=False), "ffn_out", il)
            inp = g.cb(B.add(ctx, residual, cur), "l_out", il)
        return g.finish(inp)
