"""gemma2 (src/models/gemma2.cpp): gemma with post-attention and post-FFN norms, soft-capped
attention scores and logits, and sliding-window attention on every other layer (window 4096 unless
the file says otherwise), whose RoPE uses the same base and scale as the global layers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...gguf.constants import Keys
from . import register
from .gemma import Gemma, big_model_attention_scale, load_post_norms

if TYPE_CHECKING:
    from ..hparams import KV, HParams
    from ..model import Model


@register
class Gemma2(Gemma):
    name = "gemma2"

    def load_hparams(self, hp: HParams, kv: KV) -> None:
        hp.n_swa = 4096
        hp.load_swa_pattern(kv, 2)
        hp.attn_soft_cap = True
        hp.rope_freq_base_train_swa = float(kv.get(Keys.ROPE_FREQ_BASE_SWA, hp.rope_freq_base_train))
        hp.rope_freq_scale_train_swa = hp.rope_freq_scale_train
        hp.n_swa = int(kv.get(Keys.ATTENTION_SLIDING_WINDOW, hp.n_swa))
        hp.f_norm_rms_eps = float(kv.get(Keys.ATTENTION_LAYERNORM_RMS_EPS))
        hp.f_attn_logit_softcapping = float(kv.get(Keys.ATTN_LOGIT_SOFTCAPPING, 50.0))
        hp.f_final_logit_softcapping = float(kv.get(Keys.FINAL_LOGIT_SOFTCAPPING, 30.0))
        hp.f_attention_scale = big_model_attention_scale(hp, 46)

    def load_tensors(self, m: Model) -> None:
        super().load_tensors(m)
        load_post_norms(m)
