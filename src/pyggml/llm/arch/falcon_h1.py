"""falcon-h1 (src/models/falcon-h1.cpp): every layer runs attention (NEOX RoPE, on the KV cache) and a
Mamba-2 mixer (on the recurrent memory) side by side on the same normed input, adds both to the residual,
then a SwiGLU FFN. Every layer is in both memories (llama.cpp's filters for FALCON_H1 are all-true)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ...ops import builders as B
from ..graph import FFNOp
from ..tensors import LLMTensor as T
from . import register
from .base import LLAMA_ROPE_TYPE_NEOX, Arch, load_embd_output, load_ffn, load_qkv
from .mamba_base import build_mamba2_layer, load_mamba2_layer, load_ssm_hparams

if TYPE_CHECKING:
    from ...tensor import Tensor
    from ..graph import GraphBuilder
    from ..hparams import KV, HParams
    from ..model import Model


@register
class FalconH1(Arch):
    name = "falcon-h1"
    rope_type = LLAMA_ROPE_TYPE_NEOX
    recurrent = True
    hybrid = True

    def load_hparams(self, hp: HParams, kv: KV) -> None:
        super().load_hparams(hp, kv)
        load_ssm_hparams(hp, kv, group=True)
        hp.recurrent_layers = [True] * hp.n_layer

    def attn_layers(self, hp: HParams) -> list[int]:
        return list(range(hp.n_layer))

    def load_tensors(self, m: Model) -> None:
        hp = m.hparams
        load_embd_output(m)
        for il, layer in enumerate(m.layers):
            load_mamba2_layer(m, layer, il, norm_required=False, conv_bias_required=False)
            load_qkv(m, layer, il)
            layer.bo = None  # (llama.cpp loads attn_output.bias but its graph does not add it)
            layer.attn_norm = m.create_tensor(T.ATTN_NORM, (hp.n_embd,), il)
            layer.ffn_norm = m.create_tensor(T.FFN_NORM, (hp.n_embd,), il, suffix=None)  # named without .weight
            load_ffn(m, layer, il, biases=True)

    def build_graph(self, g: GraphBuilder) -> Tensor:
        ctx, hp = g.ctx, g.hp
        inp = g.cb(g.inp_embd(), "inp_embd")
        kq_scale = hp.f_attention_scale or 1.0 / math.sqrt(hp.n_embd_head_v)
        for il, layer in enumerate(g.model.layers):
            cur = g.norm(inp, layer.attn_norm, "attn_norm", il)
            q, k, v = g.qkv(layer, cur, il)
            q = g.cb(g.rope(q, il), "Qcur-post-rope", il)
            k = g.cb(g.rope(k, il), "Kcur-post-rope", il)
            attn_out = g.cb(g.attn(layer, q, k, v, kq_scale, il), "attn_out", il)
            ssm_out = g.cb(build_mamba2_layer(g, layer, cur, il), "ssm_out", il)
            cur = g.cb(B.add(ctx, attn_out, ssm_out), "layer_out", il)
            inp_sa = B.add(ctx, cur, inp)
            cur, inp_sa = g.last_layer_rows(il, cur, inp_sa)
            g.cb(inp_sa, "ffn_inp", il)
            cur = g.norm(inp_sa, layer.ffn_norm, "ffn_norm", il)
            cur = g.cb(g.ffn_of(layer, cur, FFNOp.SILU, il), "ffn_out", il)
            inp = g.cb(B.add(ctx, cur, inp_sa), "l_out", il)
        return g.finish(inp)
