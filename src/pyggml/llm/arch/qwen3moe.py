"""qwen3moe (src/models/qwen3moe.cpp): qwen3's attention (per-head Q/K norms) with a mixture of
experts in every layer: softmax router, top-k, the chosen probabilities renormalised."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import register
from .base import require
from .qwen3 import Qwen3

if TYPE_CHECKING:
    from ..hparams import KV, HParams


@register
class Qwen3MoE(Qwen3):
    name = "qwen3moe"

    def load_hparams(self, hp: HParams, kv: KV) -> None:
        super().load_hparams(hp, kv)
        require(hp.n_expert > 0, "n_expert must be > 0 for QWEN3MOE")
        require(hp.n_expert_used > 0, "n_expert_used must be > 0 for QWEN3MOE")
        if not hp.n_ff_exp:
            hp.n_ff_exp = hp.n_ff[0] // hp.n_expert_used
