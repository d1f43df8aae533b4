"""gemma-embedding (src/models/gemma-embedding.cpp): EmbeddingGemma, gemma3's block as an encoder.

No KV cache and no causal mask: every token attends to every token of its sequence, except that the
sliding-window layers see a window centred on the token (llama.cpp's SYMMETRIC window: n_swa/2 on each
side). The graph stops at result_norm; pooling and, for files converted with sentence-transformers'
dense modules, two dense projections (dense_2, dense_3) follow it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ...gguf.constants import Keys
from ...types import GGMLType
from ..tensors import LLMTensor as T
from . import register
from .base import require
from .gemma3 import Gemma3

if TYPE_CHECKING:
    from ...tensor import Tensor
    from ..graph import GraphBuilder
    from ..hparams import KV, HParams
    from ..model import Model


@register
class GemmaEmbedding(Gemma3):
    name = "gemma-embedding"
    has_memory = False
    has_logits = False

    def load_hparams(self, hp: HParams, kv: KV) -> None:
        hp.swa_type = "symmetric"
        hp.causal_attn = False  # embeddings do not use causal attention
        hp.load_swa_pattern(kv, 6)
        hp.rope_freq_base_train_swa = float(kv.get(Keys.ROPE_FREQ_BASE_SWA, hp.rope_freq_base_train_swa))
        hp.n_swa = int(kv.get(Keys.ATTENTION_SLIDING_WINDOW))
        hp.f_norm_rms_eps = float(kv.get(Keys.ATTENTION_LAYERNORM_RMS_EPS))
        hp.dense_2_feat_in = int(kv.get(Keys.DENSE_2_FEAT_IN, 0))
        hp.dense_2_feat_out = int(kv.get(Keys.DENSE_2_FEAT_OUT, 0))
        hp.dense_3_feat_in = int(kv.get(Keys.DENSE_3_FEAT_IN, 0))
        hp.dense_3_feat_out = int(kv.get(Keys.DENSE_3_FEAT_OUT, 0))
        require(hp.dense_2_feat_in in (0, hp.n_embd), "dense_2_feat_in must be equal to n_embd")
        require(hp.dense_3_feat_out in (0, hp.n_embd), "dense_3_feat_out must be equal to n_embd")
        hp.f_attention_scale = 1.0 / math.sqrt(hp.n_embd_head_k)

    def load_tensors(self, m: Model) -> None:
        super().load_tensors(m)
        hp = m.hparams
        m.dense_2 = m.create_tensor(T.DENSE_2_OUT, (hp.n_embd, hp.dense_2_feat_out), required=False)
        m.dense_3 = m.create_tensor(T.DENSE_3_OUT, (hp.dense_3_feat_in, hp.n_embd), required=False)

    def inp_scale(self, g: GraphBuilder) -> float:
        """Token embeddings are scaled by sqrt(n_embd); embedding rows given directly are not."""
        return 1.0 if g.tokens.type == GGMLType.F32 else float(math.sqrt(g.hp.n_embd))

    def output(self, g: GraphBuilder, cur: Tensor) -> Tensor | None:
        g.finish_embd(g.norm(cur, g.model.output_norm, "result_norm"), "result_norm")
        return None
