"""rwkv6qwen2 (src/models/rwkv6qwen2.cpp): QRWKV6, RWKV-6's time mix distilled into a Qwen2 model.

Each block is an RMSNorm, the RWKV-6 time mix (without time_mix_first: GATED_LINEAR_ATTN, a sigmoid gate,
keys and values of Qwen2's n_head_kv heads repeated to the WKV heads, r/k/v biases) with one token shift,
the residual add, then Qwen2's RMSNorm and SwiGLU FFN. No LN0; the head is an RMSNorm.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import register
from .rwkv6 import load_rwkv6_hparams, load_time_mix6, rwkv6_time_mix
from .rwkv_common import RwkvQwenBase

if TYPE_CHECKING:
    from ...tensor import Tensor
    from ..graph import GraphBuilder
    from ..hparams import KV, HParams
    from ..model import Model


@register
class Rwkv6Qwen2(RwkvQwenBase):
    name = "rwkv6qwen2"

    def load_hparams(self, hp: HParams, kv: KV) -> None:
        super().load_hparams(hp, kv)
        load_rwkv6_hparams(hp, kv)

    def load_tensors(self, m: Model) -> None:
        self.load_common(m)
        for il, layer in enumerate(m.layers):
            load_time_mix6(m, layer, il, qwen=True)

    def build_graph(self, g: GraphBuilder) -> Tensor:
        return self.qwen_layers(g, rwkv6_time_mix)
