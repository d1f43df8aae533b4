"""Model hyper-parameters read from GGUF metadata, as llama.cpp's load_hparams reads them.

Only the three architectures pyggml runs are known here (llama, qwen2, gemma3); the key names
and defaults are llama.cpp's (src/llama-model.cpp load_hparams and src/models/<arch>.cpp).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import PyGGMLError
from ..gguf.constants import Keys

LLAMA_ROPE_TYPE_NORM = 0
LLAMA_ROPE_TYPE_NEOX = 2

SUPPORTED_ARCHS = ("llama", "qwen2", "gemma3")


class ModelLoadError(PyGGMLError):
    """The GGUF file is not a model pyggml can run (unknown architecture, missing key or tensor)."""


@dataclass
class HParams:
    arch: str
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_ff: list[int]
    n_head: list[int]
    n_head_kv: list[int]
    n_embd_head_k: int
    n_embd_head_v: int
    n_rot: int
    f_norm_rms_eps: float
    rope_type: int
    rope_freq_base_train: float = 10000.0
    rope_freq_scale_train: float = 1.0
    rope_scaling_type: str = "linear"
    rope_attn_factor: float = 1.0
    n_ctx_orig_yarn: int = 0
    n_vocab: int = 0
    # gemma3
    n_swa: int = 0
    swa_layers: list[bool] = field(default_factory=list)
    rope_freq_base_train_swa: float = 10000.0
    rope_freq_scale_train_swa: float = 1.0
    f_final_logit_softcapping: float = 0.0
    f_attention_scale: float = 0.0

    def n_embd_k_gqa(self, il: int) -> int:
        return self.n_embd_head_k * self.n_head_kv[il]

    def n_embd_v_gqa(self, il: int) -> int:
        return self.n_embd_head_v * self.n_head_kv[il]

    def is_swa(self, il: int) -> bool:
        return bool(self.swa_layers) and self.swa_layers[il]

    @property
    def uses_swa(self) -> bool:
        return self.n_swa > 0 and any(self.swa_layers)

    @classmethod
    def from_metadata(cls, md: Any) -> HParams:
        """``md`` maps GGUF keys to values (a GGUFReader works)."""

        def get(key: str, default: Any = KeyError) -> Any:
            if key in md:
                return md[key]
            if default is KeyError:
                raise ModelLoadError(f"model metadata is missing the required key {key!r}")
            return default

        arch = get(Keys.GENERAL_ARCHITECTURE)
        if arch not in SUPPORTED_ARCHS:
            raise ModelLoadError(f"unsupported architecture {arch!r} (pyggml runs {', '.join(SUPPORTED_ARCHS)})")
        n_layer = int(get(Keys.arch(Keys.BLOCK_COUNT, arch)))
        if not 0 < n_layer <= 512:
            raise ModelLoadError(f"{Keys.arch(Keys.BLOCK_COUNT, arch)} = {n_layer} is out of range")

        def per_layer(key: str, default: Any = KeyError) -> list[int]:
            v = get(key, default)
            if hasattr(v, "__len__") and not isinstance(v, str):
                vals = [int(x) for x in v]
                if len(vals) != n_layer:
                    raise ModelLoadError(f"{key} has {len(vals)} entries, expected {n_layer}")
                return vals
            return [int(v)] * n_layer

        n_embd = int(get(Keys.arch(Keys.EMBEDDING_LENGTH, arch)))
        n_head = per_layer(Keys.arch(Keys.ATTENTION_HEAD_COUNT, arch))
        n_head_kv = per_layer(Keys.arch(Keys.ATTENTION_HEAD_COUNT_KV, arch), n_head)
        head_k = int(get(Keys.arch(Keys.ATTENTION_KEY_LENGTH, arch), n_embd // n_head[0]))
        head_v = int(get(Keys.arch(Keys.ATTENTION_VALUE_LENGTH, arch), n_embd // n_head[0]))
        n_rot = int(get(Keys.arch(Keys.ROPE_DIMENSION_COUNT, arch), head_k))
        if arch == "llama" and n_rot != head_k:
            raise ModelLoadError(f"invalid n_rot: {n_rot}, expected {head_k}")
        scale_linear = get(Keys.arch(Keys.ROPE_SCALE_LINEAR, arch), 0.0)
        factor = float(get(Keys.arch(Keys.ROPE_SCALING_FACTOR, arch), scale_linear))
        tokens = md.get(Keys.TOKENIZER_LIST, [])
        hp = cls(
            arch=arch,
            n_ctx_train=int(get(Keys.arch(Keys.CONTEXT_LENGTH, arch))),
            n_embd=n_embd,
            n_layer=n_layer,
            n_ff=per_layer(Keys.arch(Keys.FEED_FORWARD_LENGTH, arch)),
            n_head=n_head,
            n_head_kv=n_head_kv,
            n_embd_head_k=head_k,
            n_embd_head_v=head_v,
            n_rot=n_rot,
            f_norm_rms_eps=float(get(Keys.arch(Keys.ATTENTION_LAYERNORM_RMS_EPS, arch))),
            rope_type=LLAMA_ROPE_TYPE_NORM if arch == "llama" else LLAMA_ROPE_TYPE_NEOX,
            rope_freq_base_train=float(get(Keys.arch(Keys.ROPE_FREQ_BASE, arch), 10000.0)),
            rope_freq_scale_train=1.0 / factor if factor else 1.0,
            rope_scaling_type=str(get(Keys.arch(Keys.ROPE_SCALING_TYPE, arch), "linear")),
            rope_attn_factor=float(get(Keys.arch(Keys.ROPE_SCALING_ATTN_FACTOR, arch), 1.0)),
            n_vocab=len(tokens),
        )
        hp.n_ctx_orig_yarn = int(get(Keys.arch(Keys.ROPE_SCALING_ORIG_CTX_LEN, arch), hp.n_ctx_train))
        if arch == "gemma3":
            hp.n_swa = int(get(Keys.arch(Keys.ATTENTION_SLIDING_WINDOW, arch), 0))
            if hp.n_swa > 0:
                pattern = get(Keys.arch(Keys.ATTENTION_SLIDING_WINDOW_PATTERN, arch), 6)
                if hasattr(pattern, "__len__"):
                    hp.swa_layers = [bool(x) for x in pattern]
                else:
                    p = int(pattern)
                    hp.swa_layers = [(il % p) < p - 1 for il in range(n_layer)] if p > 1 else [False] * n_layer
            hp.rope_freq_base_train_swa = float(get(Keys.arch(Keys.ROPE_FREQ_BASE_SWA, arch), 10000.0))
            hp.f_final_logit_softcapping = float(get(Keys.arch(Keys.FINAL_LOGIT_SOFTCAPPING, arch), 0.0))
            # query_pre_attn_scalar is not in the file; llama.cpp hard-codes it by model size
            if n_layer == 62:
                hp.f_attention_scale = 1.0 / math.sqrt(n_embd / n_head[0])
            else:
                hp.f_attention_scale = 1.0 / math.sqrt(head_k)
        return hp
