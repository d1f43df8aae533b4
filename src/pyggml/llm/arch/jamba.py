"""jamba (src/models/jamba.cpp): Mamba-1 layers (those with head_count_kv 0, with RMSNorms on dt, B and
C) interleaved with attention layers without RoPE, each followed by a SwiGLU FFN or, where the layer has
a router, a mixture of experts whose chosen weights are not renormalised."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ...ops import builders as B
from ..graph import FFNOp, Gating
from ..hparams import LLAMA_ROPE_TYPE_NONE
from ..tensors import LLMTensor as T
from . import register
from .base import Arch, load_embd_output, load_ffn, load_qkv
from .mamba_base import build_mamba_layer, load_mamba_layer, load_ssm_hparams, require_expansion_2

if TYPE_CHECKING:
    from ...tensor import Tensor
    from ..graph import GraphBuilder
    from ..hparams import KV, HParams
    from ..model import Model


@register
class Jamba(Arch):
    name = "jamba"
    rope_type = LLAMA_ROPE_TYPE_NONE
    recurrent = True
    hybrid = True

    def load_hparams(self, hp: HParams, kv: KV) -> None:
        super().load_hparams(hp, kv)
        load_ssm_hparams(hp, kv, group=False)
        hp.recurrent_layers = [n == 0 for n in hp.n_head_kv]

    def load_tensors(self, m: Model) -> None:
        hp = m.hparams
        require_expansion_2(hp)
        load_embd_output(m)
        for il, layer in enumerate(m.layers):
            layer.attn_norm = m.create_tensor(T.ATTN_NORM, (hp.n_embd,), il)
            if hp.is_recurrent(il):
                load_mamba_layer(m, layer, il)
                layer.ssm_dt_norm = m.create_tensor(T.SSM_DT_NORM, (hp.ssm_dt_rank,), il)
                layer.ssm_b_norm = m.create_tensor(T.SSM_B_NORM, (hp.ssm_d_state,), il)
                layer.ssm_c_norm = m.create_tensor(T.SSM_C_NORM, (hp.ssm_d_state,), il)
            else:
                load_qkv(m, layer, il)  # optional Q/K/V biases, as create_tensor_qkv
                layer.bo = None  # (no attn_output.bias in llama.cpp's jamba)
            layer.ffn_norm = m.create_tensor(T.FFN_NORM, (hp.n_embd,), il)
            layer.ffn_gate_inp = m.create_tensor(T.FFN_GATE_INP, (hp.n_embd, hp.n_expert), il, required=False)
            if layer.ffn_gate_inp is not None:
                n_ff = hp.n_ff[il]
                layer.ffn_gate_exps = m.create_tensor(T.FFN_GATE_EXPS, (hp.n_embd, n_ff, hp.n_expert), il)
                layer.ffn_down_exps = m.create_tensor(T.FFN_DOWN_EXPS, (n_ff, hp.n_embd, hp.n_expert), il)
                layer.ffn_up_exps = m.create_tensor(T.FFN_UP_EXPS, (hp.n_embd, n_ff, hp.n_expert), il)
            else:
                load_ffn(m, layer, il)

    def build_graph(self, g: GraphBuilder) -> Tensor:
        ctx, hp = g.ctx, g.hp
        inp = g.cb(g.inp_embd(), "inp_embd")
        kq_scale = 1.0 / math.sqrt(hp.n_embd_head_v)
        for il, layer in enumerate(g.model.layers):
            cur = g.norm(inp, layer.attn_norm, "attn_norm", il)
            if hp.is_recurrent(il):
                cur = build_mamba_layer(g, layer, cur, il)
            else:
                q, k, v = g.qkv(layer, cur, il)  # no RoPE
                cur = g.attn(layer, q, k, v, kq_scale, il)
            cur, inp = g.last_layer_rows(il, cur, inp)
            ffn_inp = B.add(ctx, inp, cur)
            cur = g.norm(ffn_inp, layer.ffn_norm, "ffn_norm", il)
            if layer.ffn_gate_inp is None:
                cur = g.cb(g.ffn_of(layer, cur, FFNOp.SILU, il), "ffn_out", il)
            else:
                cur = g.cb(g.moe_ffn(cur, layer, FFNOp.SILU, False, hp.expert_weights_scale, Gating.SOFTMAX, il),
                           "ffn_moe_out", il)
            inp = g.cb(B.add(ctx, ffn_inp, cur), "l_out", il)
        return g.finish(inp)
