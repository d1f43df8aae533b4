"""arwkv7 (src/models/arwkv7.cpp): ARWKV-7, RWKV-7's time mix distilled into a Qwen2-style model.

Each block is an RMSNorm, RWKV-7's time mix (its gate and per-head ln optional) with one token shift, the
residual add, then Qwen2's RMSNorm and SwiGLU FFN. No LN0; the head is an RMSNorm.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import register
from .rwkv7 import load_rwkv7_hparams, load_time_mix7, rwkv7_time_mixer
from .rwkv_common import RwkvQwenBase

if TYPE_CHECKING:
    from ...tensor import Tensor
    from ..graph import GraphBuilder
    from ..hparams import KV, HParams
    from ..model import Model


@register
class Arwkv7(RwkvQwenBase):
    name = "arwkv7"

    def load_hparams(self, hp: HParams, kv: KV) -> None:
        super().load_hparams(hp, kv)
        load_rwkv7_hparams(hp, kv)

    def load_tensors(self, m: Model) -> None:
        self.load_common(m)
        for il, layer in enumerate(m.layers):
            load_time_mix7(m, layer, il, optional=True)

    def build_graph(self, g: GraphBuilder) -> Tensor:
        return self.qwen_layers(g, rwkv7_time_mixer())
