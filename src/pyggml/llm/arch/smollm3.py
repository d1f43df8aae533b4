"""smollm3 (src/models/smollm3.cpp): the llama block without RoPE on every fourth layer (NoPE: those
layers attend by content alone)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import register
from .llama import LlamaLike

if TYPE_CHECKING:
    from ...tensor import Tensor
    from ..graph import GraphBuilder
    from ..model import Layer

N_NO_ROPE_LAYER_STEP = 4  # llama_hparams::n_no_rope_layer_step, fixed by smollm3's loader


@register
class SmolLM3(LlamaLike):
    name = "smollm3"

    def rope_qk(self, g: GraphBuilder, layer: Layer, q: Tensor, k: Tensor, il: int) -> tuple[Tensor, Tensor]:
        if (il + 1) % N_NO_ROPE_LAYER_STEP == 0:
            return g.cb(q, "Qcur", il), g.cb(k, "Kcur", il)
        return super().rope_qk(g, layer, q, k, il)
