"""granite (src/models/granite.cpp): the llama block with four multipliers from the file: the
embeddings scaled (embedding_scale), each residual branch scaled before it is added (residual_scale),
the attention scale given (attention.scale) and the logits divided (logit_scale)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...gguf.constants import Keys
from ...ops import builders as B
from . import register
from .llama import Llama

if TYPE_CHECKING:
    from ...tensor import Tensor
    from ..graph import GraphBuilder
    from ..hparams import KV, HParams


@register
class Granite(Llama):
    name = "granite"

    def load_hparams(self, hp: HParams, kv: KV) -> None:
        super().load_hparams(hp, kv)
        hp.f_logit_scale = float(kv.get(Keys.LOGIT_SCALE))
        hp.f_residual_scale = float(kv.get(Keys.RESIDUAL_SCALE, 0.0))
        hp.f_embedding_scale = float(kv.get(Keys.EMBEDDING_SCALE, 0.0))
        hp.f_attention_scale = float(kv.get(Keys.ATTENTION_SCALE, 0.0))

    def residual(self, g: GraphBuilder, branch: Tensor, stream: Tensor) -> Tensor:
        if g.hp.f_residual_scale:
            branch = B.scale(g.ctx, branch, g.hp.f_residual_scale)
        return B.add(g.ctx, branch, stream)
