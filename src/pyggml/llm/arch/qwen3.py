"""qwen3 (src/models/qwen3.cpp): the qwen2 block with each Q and K head RMS-normalised before RoPE
(attn_q_norm / attn_k_norm over the head dimension) and no Q/K/V biases."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..tensors import LLMTensor as T
from . import register
from .base import LLAMA_ROPE_TYPE_NEOX
from .llama import LlamaLike

if TYPE_CHECKING:
    from ...tensor import Tensor
    from ..graph import GraphBuilder
    from ..model import Layer, Model


@register
class Qwen3(LlamaLike):
    name = "qwen3"
    rope_type = LLAMA_ROPE_TYPE_NEOX

    def load_tensors(self, m: Model) -> None:
        super().load_tensors(m)
        d = m.hparams.n_embd_head_k
        for il, layer in enumerate(m.layers):
            layer.attn_q_norm = m.create_tensor(T.ATTN_Q_NORM, (d,), il)
            layer.attn_k_norm = m.create_tensor(T.ATTN_K_NORM, (d,), il)

    def rope_qk(self, g: GraphBuilder, layer: Layer, q: Tensor, k: Tensor, il: int) -> tuple[Tensor, Tensor]:
        q = g.norm(q, layer.attn_q_norm, "Qcur_normed", il)
        k = g.norm(k, layer.attn_k_norm, "Kcur_normed", il)
        return g.cb(g.rope(q, il), "Qcur", il), g.cb(g.rope(k, il), "Kcur", il)
