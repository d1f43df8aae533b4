"""mamba2 (src/models/mamba2.cpp): mamba's stack with Mamba-2 layers (multi-head SSM with a scalar decay
per head, grouped B/C, a grouped RMSNorm before the output projection)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..tensors import LLMTensor as T
from . import register
from .base import load_embd_output
from .mamba import Mamba
from .mamba_base import load_mamba2_layer

if TYPE_CHECKING:
    from ..model import Model


@register
class Mamba2(Mamba):
    name = "mamba2"
    mamba2 = True

    def load_tensors(self, m: Model) -> None:
        hp = m.hparams
        load_embd_output(m)
        for il, layer in enumerate(m.layers):
            layer.attn_norm = m.create_tensor(T.ATTN_NORM, (hp.n_embd,), il)
            load_mamba2_layer(m, layer, il)
