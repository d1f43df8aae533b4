"""Model hyper-parameters read from GGUF metadata, as llama.cpp's load_hparams reads them.

The generic part (``llama_model_base::load_hparams``, src/llama-model.cpp) is here; what one
architecture adds (its keys, defaults and SWA pattern: ``load_arch_hparams`` in
src/models/<arch>.cpp) is in that architecture's module under ``llm/arch/``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from ..errors import PyGGMLError
from ..gguf.constants import Keys

if TYPE_CHECKING:
    from .arch.base import Arch

LLAMA_ROPE_TYPE_NONE = -1
LLAMA_ROPE_TYPE_NORM = 0
LLAMA_ROPE_TYPE_NEOX = 2

_REQUIRED: Any = object()


class PoolingType(IntEnum):
    """llama_pooling_type, with llama.cpp's values (``{arch}.pooling_type`` stores them): how the per-token
    embeddings of a sequence become one vector. RANK runs the classifier head (``cls``, ``cls.output``) over
    the CLS token's vector and gives ``n_cls_out`` scores."""

    UNSPECIFIED = -1
    NONE = 0
    MEAN = 1
    CLS = 2
    LAST = 3
    RANK = 4

    @classmethod
    def parse(cls, name: str) -> PoolingType:
        """From a name as llama.cpp's --pooling takes it (none, mean, cls, last, rank)."""
        try:
            return cls[name.upper()]
        except KeyError:
            raise ValueError(f"unknown pooling type {name!r} (none, mean, cls, last or rank)") from None


class ModelLoadError(PyGGMLError):
    """The GGUF file is not a model pyggml can run (unknown architecture, missing key or tensor)."""


class KV:
    """The per-architecture keys of one file (llama_model_loader::get_key / get_key_or_arr)."""

    def __init__(self, md: Mapping[str, Any], arch: str) -> None:
        self.md = md
        self.arch = arch

    def get(self, key: str, default: Any = _REQUIRED) -> Any:
        """The value of ``key`` (a ``Keys`` format like ``"{arch}.block_count"``); without a default a
        missing key is a ModelLoadError naming it."""
        full = Keys.arch(key, self.arch)
        if full in self.md:
            return self.md[full]
        if default is _REQUIRED:
            raise ModelLoadError(f"model metadata is missing the required key {full!r}")
        return default

    def per_layer(self, key: str, n_layer: int, default: Any = _REQUIRED) -> list[int]:
        """A scalar for every layer, or an array of one value per layer."""
        v = self.get(key, default)
        if hasattr(v, "__len__") and not isinstance(v, str):
            vals = [int(x) for x in v]
            if len(vals) != n_layer:
                raise ModelLoadError(f"{Keys.arch(key, self.arch)} has {len(vals)} entries, expected {n_layer}")
            return vals
        return [int(v)] * n_layer


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
    rope_type: int = LLAMA_ROPE_TYPE_NORM
    f_norm_eps: float = 0.0
    f_norm_rms_eps: float = 0.0
    rope_freq_base_train: float = 10000.0
    rope_freq_scale_train: float = 1.0
    rope_scaling_type: str = "linear"
    rope_attn_factor: float = 1.0
    n_ctx_orig_yarn: int = 0
    n_vocab: int = 0
    # sliding-window attention (llama_hparams: swa_type STANDARD, n_swa, is_swa_impl)
    n_swa: int = 0
    swa_layers: list[bool] = field(default_factory=list)
    rope_freq_base_train_swa: float = 10000.0
    rope_freq_scale_train_swa: float = 1.0
    # soft-capping and scales (0: unused)
    attn_soft_cap: bool = False
    f_attn_logit_softcapping: float = 50.0
    f_final_logit_softcapping: float = 0.0
    f_attention_scale: float = 0.0
    f_embedding_scale: float = 0.0
    f_residual_scale: float = 0.0
    f_logit_scale: float = 0.0
    # mixture of experts
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0
    expert_weights_scale: float = 0.0
    # RWKV-6 (token-shift and decay LoRA sizes, the halving of the residual stream every n layers) and RWKV-7
    # (LoRA ranks of the decay, in-context learning rate, value residual mix and gate)
    time_mix_extra_dim: int = 0
    time_decay_extra_dim: int = 0
    rescale_every_n_layers: int = 0
    n_lora_decay: int = 0
    n_lora_iclr: int = 0
    n_lora_value_res_mix: int = 0
    n_lora_gate: int = 0
    # LFM2's short convolutions: the conv window (its state keeps l_cache - 1 past inputs)
    n_shortconv_l_cache: int = 0
    # encoders and embeddings: attention over the whole sequence, the default pooling, the classifier head
    causal_attn: bool = True
    swa_type: str = "standard"  # llama_swa_type: "standard" (a window behind) or "symmetric" (half each side)
    pooling_type: PoolingType = PoolingType.NONE
    pooling_type_cls: PoolingType = PoolingType.UNSPECIFIED  # the pooling before the classifier head (RANK)
    n_cls_out: int = 1
    cls_labels: list[str] = field(default_factory=list)
    n_token_types: int = 0
    # sentence-transformers' dense projections after pooling (gemma-embedding), 0 when absent
    dense_2_feat_in: int = 0
    dense_2_feat_out: int = 0
    dense_3_feat_in: int = 0
    dense_3_feat_out: int = 0
    # recurrent layers (llama_hparams' ssm_* for Mamba, token_shift_count / wkv_head_size for RWKV):
    # recurrent_layers[il] is llama.cpp's recurrent_layer_arr, the state sizes follow n_embd_r / n_embd_s
    recurrent_layers: list[bool] = field(default_factory=list)
    ssm_d_conv: int = 0
    ssm_d_inner: int = 0
    ssm_d_state: int = 0
    ssm_dt_rank: int = 0
    ssm_n_group: int = 0
    ssm_dt_b_c_rms: bool = False
    token_shift_count: int = 2
    wkv_head_size: int = 0

    def is_recurrent(self, il: int) -> bool:
        """llama_hparams::is_recurrent: whether layer il keeps a recurrent state instead of KV rows."""
        return bool(self.recurrent_layers) and self.recurrent_layers[il]

    def n_embd_r(self) -> int:
        """llama_hparams::n_embd_r: the width of a layer's r state (RWKV's token shift, or Mamba's conv
        window: d_conv - 1 columns of the conv input, x and, for Mamba-2, B and C)."""
        if self.wkv_head_size:
            return self.token_shift_count * self.n_embd
        if self.n_shortconv_l_cache:  # LFM2: the conv window's l_cache - 1 past inputs
            return self.n_embd * (self.n_shortconv_l_cache - 1)
        return max(self.ssm_d_conv - 1, 0) * (self.ssm_d_inner + 2 * self.ssm_n_group * self.ssm_d_state)

    def n_embd_s(self) -> int:
        """llama_hparams::n_embd_s: the width of a layer's s state (RWKV's WKV state, Mamba's SSM state)."""
        if self.wkv_head_size:
            return self.n_embd * self.wkv_head_size
        return self.ssm_d_state * self.ssm_d_inner

    def n_embd_k_gqa(self, il: int) -> int:
        return self.n_embd_head_k * self.n_head_kv[il]

    def n_embd_v_gqa(self, il: int) -> int:
        return self.n_embd_head_v * self.n_head_kv[il]

    def is_swa(self, il: int) -> bool:
        return bool(self.swa_layers) and self.swa_layers[il]

    @property
    def uses_swa(self) -> bool:
        return self.n_swa > 0 and any(self.swa_layers)

    def set_swa_pattern(self, n_pattern: int, dense_first: bool = False) -> None:
        """llama_hparams::set_swa_pattern: in every group of n_pattern layers one is dense (the last, or
        the first with ``dense_first``) and the others slide; a period of 0 makes every layer slide."""
        if dense_first:
            self.swa_layers = [n_pattern == 0 or il % n_pattern != 0 for il in range(self.n_layer)]
        else:
            self.swa_layers = [n_pattern == 0 or il % n_pattern < n_pattern - 1 for il in range(self.n_layer)]

    def load_swa_pattern(self, kv: KV, n_pattern: int, dense_first: bool = False) -> None:
        """llama_model_base::load_swa_pattern: a per-layer array in the file wins over the period."""
        pattern = kv.get(Keys.ATTENTION_SLIDING_WINDOW_PATTERN, n_pattern)
        if hasattr(pattern, "__len__"):
            if len(pattern) != self.n_layer:
                raise ModelLoadError(f"sliding_window_pattern has {len(pattern)} entries, expected {self.n_layer}")
            self.swa_layers = [bool(x) for x in pattern]
        else:
            self.set_swa_pattern(int(pattern), dense_first)

    @classmethod
    def load(cls, md: Mapping[str, Any], arch: Arch) -> HParams:
        """The hyper-parameters of ``arch`` from ``md`` (GGUF keys to values; a GGUFReader works)."""
        kv = KV(md, arch.name)
        n_layer = int(kv.get(Keys.BLOCK_COUNT))
        if not 0 < n_layer <= 512:
            raise ModelLoadError(f"{Keys.arch(Keys.BLOCK_COUNT, arch.name)} = {n_layer} is out of range")
        n_embd = int(kv.get(Keys.EMBEDDING_LENGTH))
        n_head = kv.per_layer(Keys.ATTENTION_HEAD_COUNT, n_layer, 0 if arch.recurrent else _REQUIRED)
        n_head_kv = kv.per_layer(Keys.ATTENTION_HEAD_COUNT_KV, n_layer, n_head)
        if n_head[0] <= 0 and not arch.recurrent:  # a recurrent model's first layers may have no attention
            raise ModelLoadError(f"{Keys.arch(Keys.ATTENTION_HEAD_COUNT, arch.name)} must be positive")
        head_default = n_embd // n_head[0] if n_head[0] > 0 else 0
        head_k = int(kv.get(Keys.ATTENTION_KEY_LENGTH, head_default))
        head_v = int(kv.get(Keys.ATTENTION_VALUE_LENGTH, head_default))
        factor = float(kv.get(Keys.ROPE_SCALING_FACTOR, kv.get(Keys.ROPE_SCALE_LINEAR, 0.0)))
        n_ctx_train = int(kv.get(Keys.CONTEXT_LENGTH))
        hp = cls(
            arch=arch.name,
            n_ctx_train=n_ctx_train,
            n_embd=n_embd,
            n_layer=n_layer,
            n_ff=kv.per_layer(Keys.FEED_FORWARD_LENGTH, n_layer, 0),
            n_head=n_head,
            n_head_kv=n_head_kv,
            n_embd_head_k=head_k,
            n_embd_head_v=head_v,
            n_rot=int(kv.get(Keys.ROPE_DIMENSION_COUNT, head_k)),
            rope_freq_base_train=float(kv.get(Keys.ROPE_FREQ_BASE, 10000.0)),
            rope_freq_scale_train=1.0 / factor if factor else 1.0,
            rope_scaling_type=str(kv.get(Keys.ROPE_SCALING_TYPE, "linear")),
            rope_attn_factor=float(kv.get(Keys.ROPE_SCALING_ATTN_FACTOR, 1.0)),
            n_ctx_orig_yarn=int(kv.get(Keys.ROPE_SCALING_ORIG_CTX_LEN, n_ctx_train)),
            n_vocab=len(md.get(Keys.TOKENIZER_LIST, [])),
            n_expert=int(kv.get(Keys.EXPERT_COUNT, 0)),
            n_expert_used=int(kv.get(Keys.EXPERT_USED_COUNT, 0)),
            n_ff_exp=int(kv.get(Keys.EXPERT_FEED_FORWARD_LENGTH, 0)),
            n_ff_shexp=int(kv.get(Keys.EXPERT_SHARED_FEED_FORWARD_LENGTH, 0)),
            expert_weights_scale=float(kv.get(Keys.EXPERT_WEIGHTS_SCALE, 0.0)),
            causal_attn=bool(kv.get(Keys.ATTENTION_CAUSAL, True)),
            pooling_type=_pooling(kv, Keys.POOLING_TYPE, PoolingType.NONE),
            pooling_type_cls=_pooling(kv, Keys.CLASSIFIER_POOLING_TYPE, PoolingType.UNSPECIFIED),
            n_token_types=int(md.get(Keys.TOKENIZER_TOKEN_TYPE_COUNT, 0)),
        )
        labels = kv.get(Keys.CLASSIFIER_OUTPUT_LABELS, [])
        if len(labels):
            hp.cls_labels = [str(x) for x in labels]
            hp.n_cls_out = len(hp.cls_labels)
        if hp.rope_scaling_type not in ("none", "linear", "yarn", "longrope"):
            raise ModelLoadError(f"unknown rope scaling type {hp.rope_scaling_type!r}")
        hp.rope_type = arch.rope_type
        arch.load_hparams(hp, kv)
        return hp


def _pooling(kv: KV, key: str, default: PoolingType) -> PoolingType:
    """A pooling-type key; a value llama.cpp does not define is a ModelLoadError naming it."""
    v = int(kv.get(key, int(default)))
    try:
        return PoolingType(v)
    except ValueError:
        raise ModelLoadError(f"{Keys.arch(key, kv.arch)} = {v} is not a pooling type (-1 to 4)") from None
