"""olmoe (src/models/olmoe.cpp): the llama block with Q and K RMS-normalised over all heads at once
(as olmo2), NEOX RoPE, and a mixture of experts whose chosen probabilities are not renormalised."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...ops import builders as B
from ..tensors import LLMTensor as T
from . import register
from .base import LLAMA_ROPE_TYPE_NEOX, require
from .llama import LlamaLike

if TYPE_CHECKING:
    from ...tensor import Tensor
    from ..graph import GraphBuilder
    from ..hparams import KV, HParams
    from ..model import Layer, Model


@register
class OLMoE(LlamaLike):
    name = "olmoe"
    rope_type = LLAMA_ROPE_TYPE_NEOX
    moe_norm_w = False

    def load_hparams(self, hp: HParams, kv: KV) -> None:
        super().load_hparams(hp, kv)
        require(hp.n_expert > 0 and hp.n_expert_used > 0, "olmoe needs expert_count and expert_used_count")

    def load_tensors(self, m: Model) -> None:
        super().load_tensors(m)
        for il, layer in enumerate(m.layers):
            layer.attn_q_norm = m.create_tensor(T.ATTN_Q_NORM, (m.hparams.n_embd,), il)
            layer.attn_k_norm = m.create_tensor(T.ATTN_K_NORM, (m.hparams.n_embd,), il)

    def rope_qk(self, g: GraphBuilder, layer: Layer, q: Tensor, k: Tensor, il: int) -> tuple[Tensor, Tensor]:
        ctx = g.ctx
        q2 = g.norm(B.reshape_2d(ctx, q, q.ne[0] * q.ne[1], q.ne[2]), layer.attn_q_norm, "Qcur_normed", il)
        k2 = g.norm(B.reshape_2d(ctx, k, k.ne[0] * k.ne[1], k.ne[2]), layer.attn_k_norm, "Kcur_normed", il)
        q = B.reshape_3d(ctx, q2, q.ne[0], q.ne[1], q.ne[2])
        k = B.reshape_3d(ctx, k2, k.ne[0], k.ne[1], k.ne[2])
        return g.cb(g.rope(q, il), "Qcur", il), g.cb(g.rope(k, il), "Kcur", il)
