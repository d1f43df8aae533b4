"""gemma3 (src/models/gemma3.cpp): gemma2's block with per-head Q/K norms and no attention
soft-capping; five sliding-window layers to one global one (when the file gives a window), the
sliding ones with RoPE base 10000 and scale 1 unless the file says otherwise."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...gguf.constants import Keys
from ..tensors import LLMTensor as T
from . import register
from .gemma import Gemma, big_model_attention_scale, load_post_norms

if TYPE_CHECKING:
    from ..hparams import KV, HParams
    from ..model import Model


@register
class Gemma3(Gemma):
    name = "gemma3"

    def load_hparams(self, hp: HParams, kv: KV) -> None:
        hp.n_swa = int(kv.get(Keys.ATTENTION_SLIDING_WINDOW, 0))
        if hp.n_swa > 0:
            hp.load_swa_pattern(kv, 6)
            hp.rope_freq_base_train_swa = float(kv.get(Keys.ROPE_FREQ_BASE_SWA, hp.rope_freq_base_train_swa))
        hp.f_final_logit_softcapping = float(kv.get(Keys.FINAL_LOGIT_SOFTCAPPING, 0.0))
        super().load_hparams(hp, kv)
        hp.f_attention_scale = big_model_attention_scale(hp, 62)

    def load_tensors(self, m: Model) -> None:
        hp = m.hparams
        super().load_tensors(m)
        m.output = m.create_tensor(T.OUTPUT, (hp.n_embd, hp.n_vocab), required=False) or m.tied_output()
        load_post_norms(m)
        for il, layer in enumerate(m.layers):
            layer.attn_q_norm = m.create_tensor(T.ATTN_Q_NORM, (hp.n_embd_head_k,), il)
            layer.attn_k_norm = m.create_tensor(T.ATTN_K_NORM, (hp.n_embd_head_k,), il)
