"""granitehybrid (src/models/granite-hybrid.cpp): Granite 4.0 H. Each layer is a Mamba-2 mixer (the layers
whose head_count_kv is 0: they keep a recurrent state) or attention (on the KV cache), then granite's
scaled residual and a SwiGLU FFN or a mixture of experts with an optional shared expert; granite's
embedding, residual, attention and logit multipliers. RoPE unless ``rope.scaling.finetuned`` is false."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ...gguf.constants import Keys
from ...ops import builders as B
from ..graph import FFNOp, Gating
from ..tensors import LLMTensor as T
from . import register
from .base import Arch, load_embd_output, load_ffn, load_moe, load_qkv
from .mamba_base import build_mamba2_layer, load_mamba2_layer, load_ssm_hparams, require_expansion_2

if TYPE_CHECKING:
    from ...tensor import Tensor
    from ..graph import GraphBuilder
    from ..hparams import KV, HParams
    from ..model import Layer, Model


@register
class GraniteHybrid(Arch):
    name = "granitehybrid"
    recurrent = True
    hybrid = True

    def load_hparams(self, hp: HParams, kv: KV) -> None:
        super().load_hparams(hp, kv)
        hp.f_logit_scale = float(kv.get(Keys.LOGIT_SCALE, 0.0))
        hp.f_residual_scale = float(kv.get(Keys.RESIDUAL_SCALE, 0.0))
        hp.f_embedding_scale = float(kv.get(Keys.EMBEDDING_SCALE, 0.0))
        hp.f_attention_scale = float(kv.get(Keys.ATTENTION_SCALE, 0.0))
        load_ssm_hparams(hp, kv, group=True)
        self.use_rope = bool(kv.get(Keys.ROPE_SCALING_FINETUNED, True))  # granite's switch for RoPE
        hp.recurrent_layers = [n == 0 for n in hp.n_head_kv]  # a layer is recurrent iff head_count_kv is 0

    def load_tensors(self, m: Model) -> None:
        hp = m.hparams
        require_expansion_2(hp)
        load_embd_output(m)
        for il, layer in enumerate(m.layers):
            layer.attn_norm = m.create_tensor(T.ATTN_NORM, (hp.n_embd,), il)
            if hp.is_recurrent(il):
                load_mamba2_layer(m, layer, il, conv_bias_required=False)
            else:
                load_qkv(m, layer, il)
            layer.ffn_norm = m.create_tensor(T.FFN_NORM, (hp.n_embd,), il)
            layer.rope_freqs = m.create_tensor(T.ROPE_FREQS, (hp.n_rot // 2,), required=False)
            if hp.n_expert:
                load_moe(m, layer, il)
            else:
                load_ffn(m, layer, il, biases=True)

    def build_graph(self, g: GraphBuilder) -> Tensor:
        ctx, hp = g.ctx, g.hp
        inp = g.cb(g.inp_embd(), "inp_embd")
        kq_scale = hp.f_attention_scale or 1.0 / math.sqrt(hp.n_embd_head_k)
        for il, layer in enumerate(g.model.layers):
            cur = g.norm(inp, layer.attn_norm, "attn_norm", il)
            if hp.is_recurrent(il):
                cur = build_mamba2_layer(g, layer, cur, il)
            else:
                q, k, v = g.qkv(layer, cur, il)
                if self.use_rope:
                    q, k = g.rope(q, il), g.rope(k, il)
                g.cb(q, "Qcur", il), g.cb(k, "Kcur", il), g.cb(v, "Vcur", il)
                cur = g.cb(g.attn(layer, q, k, v, kq_scale, il), "attn_out", il)
            cur, inp = g.last_layer_rows(il, cur, inp)
            ffn_inp = g.cb(B.add(ctx, self._scaled(g, cur), inp), "ffn_inp", il)
            cur = g.norm(ffn_inp, layer.ffn_norm, "ffn_norm", il)
            cur = self._ffn(g, layer, cur, il)
            inp = g.cb(B.add(ctx, self._scaled(g, cur), ffn_inp), "l_out", il)
        return g.finish(inp)

    @staticmethod
    def _scaled(g: GraphBuilder, cur: Tensor) -> Tensor:
        return B.scale(g.ctx, cur, g.hp.f_residual_scale) if g.hp.f_residual_scale else cur

    @staticmethod
    def _ffn(g: GraphBuilder, layer: Layer, cur: Tensor, il: int) -> Tensor:
        if layer.ffn_gate_inp is None:
            return g.cb(g.ffn_of(layer, cur, FFNOp.SILU, il), "ffn_out", il)
        out = g.moe_ffn(cur, layer, FFNOp.SILU, True, g.hp.expert_weights_scale, Gating.SOFTMAX, il)
        if layer.ffn_up_shexp is not None:
            shexp = g.cb(g.ffn(cur, layer.ffn_up_shexp, layer.ffn_gate_shexp, layer.ffn_down_shexp, FFNOp.SILU, il),
                         "ffn_shexp", il)
            out = g.cb(B.add(g.ctx, out, shexp), "ffn_out", il)
        return out
