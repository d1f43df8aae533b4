"""gpt2 (src/models/gpt2.cpp): starcoder2's block (LayerNorm with biases, biased projections, a plain GELU
FFN) with a fused QKV, and learned absolute positions added to the token embeddings instead of RoPE."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...ops import builders as B
from ..hparams import LLAMA_ROPE_TYPE_NONE
from ..tensors import LLMTensor as T
from . import register
from .base import require
from .starcoder2 import StarCoder2

if TYPE_CHECKING:
    from ...tensor import Tensor
    from ..graph import GraphBuilder
    from ..model import Model


@register
class GPT2(StarCoder2):
    name = "gpt2"
    rope_type = LLAMA_ROPE_TYPE_NONE

    def load_tensors(self, m: Model) -> None:
        super().load_tensors(m)
        m.pos_embd = m.create_tensor(T.POS_EMBD, (m.hparams.n_embd, m.hparams.n_ctx_train))
        for il, layer in enumerate(m.layers):
            require(None not in (layer.wqkv, layer.bqkv, layer.bo),
                    f"gpt2 layer {il} lacks its fused attn_qkv weight and bias or attn_output.bias")

    def embed(self, g: GraphBuilder) -> Tensor:
        pos = g.cb(B.get_rows(g.ctx, g.model.pos_embd, g.pos), "pos_embd")
        return g.cb(B.add(g.ctx, g.inp_embd(), pos), "inpL")

    def rope_qk(self, g: GraphBuilder, q: Tensor, k: Tensor, il: int) -> tuple[Tensor, Tensor]:
        return q, k
