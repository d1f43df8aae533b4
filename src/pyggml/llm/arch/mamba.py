"""mamba (src/models/mamba.cpp): a stack of Mamba-1 layers, each RMSNorm, the selective-scan block and a
residual add; no attention, so the model keeps a recurrent memory (one state per sequence) and no KV cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...ops import builders as B
from ..tensors import LLMTensor as T
from . import register
from .base import Arch, load_embd_output
from .mamba_base import (
    build_mamba2_layer,
    build_mamba_layer,
    load_mamba_layer,
    load_ssm_hparams,
    require_expansion_2,
)

if TYPE_CHECKING:
    from ...tensor import Tensor
    from ..graph import GraphBuilder
    from ..hparams import KV, HParams
    from ..model import Model


@register
class Mamba(Arch):
    name = "mamba"
    recurrent = True
    #: Mamba-2 sets it: group count key and the Mamba-2 layer
    mamba2 = False

    def load_hparams(self, hp: HParams, kv: KV) -> None:
        super().load_hparams(hp, kv)
        load_ssm_hparams(hp, kv, group=self.mamba2)
        hp.recurrent_layers = [True] * hp.n_layer  # llm_arch_is_recurrent: every layer

    def load_tensors(self, m: Model) -> None:
        hp = m.hparams
        require_expansion_2(hp)
        load_embd_output(m)
        for il, layer in enumerate(m.layers):
            layer.attn_norm = m.create_tensor(T.ATTN_NORM, (hp.n_embd,), il)
            load_mamba_layer(m, layer, il)

    def build_graph(self, g: GraphBuilder) -> Tensor:
        inp = g.cb(g.inp_embd(), "inp_embd")
        for il, layer in enumerate(g.model.layers):
            cur = g.norm(inp, layer.attn_norm, "attn_norm", il)
            cur = (build_mamba2_layer if self.mamba2 else build_mamba_layer)(g, layer, cur, il)
            cur, inp = g.last_layer_rows(il, cur, inp)
            inp = g.cb(B.add(g.ctx, cur, inp), "l_out", il)
        return g.finish(inp)
