"""GGUF's constants and value types: the one place each GGUF fact lives.

Numbers come from ggml's ``gguf.h`` / ``gguf.cpp`` (see section 3 of ggml-internals.md).
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

#: the header constants and types that the gguf package (and pyggml.*) re-exports
__all__ = [
    "GGML_MAX_DIMS",
    "GGML_MAX_NAME",
    "GGUF_DEFAULT_ALIGNMENT",
    "GGUF_KEY_GENERAL_ALIGNMENT",
    "GGUF_MAGIC",
    "GGUF_VERSION",
    "GGUFValueType",
    "Keys",
]

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
GGUF_DEFAULT_ALIGNMENT = 32
GGUF_KEY_GENERAL_ALIGNMENT = "general.alignment"

#: ggml refuses strings and arrays longer than this (gguf.cpp:18-19)
GGUF_MAX_STRING_LENGTH = 1024**3
GGUF_MAX_ARRAY_ELEMENTS = 1024**3

#: a tensor name must be shorter than this many bytes (ggml.h GGML_MAX_NAME)
GGML_MAX_NAME = 64
GGML_MAX_DIMS = 4

INT64_MAX = 2**63 - 1
SIZE_MAX = 2**64 - 1

# ggml bounds the header counts by how many C++ records could be addressed. The record
# sizes are those of a 64-bit libstdc++ build: gguf_tensor_info is a ggml_tensor (336
# bytes) plus a u64 offset; gguf_kv is a std::string, a bool, an enum and two vectors.
_SIZEOF_GGUF_TENSOR_INFO = 336 + 8
_SIZEOF_GGUF_KV = 32 + 8 + 24 + 24
MAX_N_TENSORS = SIZE_MAX // _SIZEOF_GGUF_TENSOR_INFO
MAX_N_KV = SIZE_MAX // _SIZEOF_GGUF_KV


class GGUFValueType(IntEnum):
    """``enum gguf_type``: the type tag of a metadata value (gguf.h:52-67)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12

    @property
    def type_name(self) -> str:
        """ggml's ``gguf_type_name`` (``u8``, ``str``, ``arr`` ...)."""
        return _TYPE_NAME[self]

    @property
    def size(self) -> int:
        """Bytes of one element; 0 for STRING and ARRAY, whose size varies (``gguf_type_size``)."""
        return _TYPE_SIZE[self]

    @property
    def np_dtype(self) -> np.dtype:
        """Little-endian numpy dtype of one element of a fixed-size type."""
        dt = _NP_DTYPE.get(self)
        if dt is None:
            raise ValueError(f"GGUF type {self.type_name} has no fixed-size element")
        return dt

    @property
    def is_fixed_size(self) -> bool:
        return self in _NP_DTYPE


GGUF_TYPE_COUNT = 13

_TYPE_NAME = {
    GGUFValueType.UINT8: "u8",
    GGUFValueType.INT8: "i8",
    GGUFValueType.UINT16: "u16",
    GGUFValueType.INT16: "i16",
    GGUFValueType.UINT32: "u32",
    GGUFValueType.INT32: "i32",
    GGUFValueType.FLOAT32: "f32",
    GGUFValueType.BOOL: "bool",
    GGUFValueType.STRING: "str",
    GGUFValueType.ARRAY: "arr",
    GGUFValueType.UINT64: "u64",
    GGUFValueType.INT64: "i64",
    GGUFValueType.FLOAT64: "f64",
}

# BOOL is stored as one int8 byte; it is read as ``!= 0`` and written as 0/1.
_NP_DTYPE = {
    GGUFValueType.UINT8: np.dtype("u1"),
    GGUFValueType.INT8: np.dtype("i1"),
    GGUFValueType.UINT16: np.dtype("<u2"),
    GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"),
    GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.FLOAT32: np.dtype("<f4"),
    GGUFValueType.BOOL: np.dtype("i1"),
    GGUFValueType.UINT64: np.dtype("<u8"),
    GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT64: np.dtype("<f8"),
}

_TYPE_SIZE = {t: (_NP_DTYPE[t].itemsize if t in _NP_DTYPE else 0) for t in GGUFValueType}

#: integer range of each integer value type, for checking values before they are written
INT_RANGES: dict[GGUFValueType, tuple[int, int]] = {
    t: (int(np.iinfo(_NP_DTYPE[t]).min), int(np.iinfo(_NP_DTYPE[t]).max))
    for t in (
        GGUFValueType.UINT8,
        GGUFValueType.INT8,
        GGUFValueType.UINT16,
        GGUFValueType.INT16,
        GGUFValueType.UINT32,
        GGUFValueType.INT32,
        GGUFValueType.UINT64,
        GGUFValueType.INT64,
    )
}


def gguf_type_name(t: int) -> str | None:
    """``gguf_type_name``: the short name of a type id, or None for an unknown id."""
    try:
        return GGUFValueType(t).type_name
    except ValueError:
        return None


def gguf_type_size(t: int) -> int:
    """``gguf_type_size``: bytes of one element, 0 for STRING, ARRAY and unknown ids."""
    try:
        return GGUFValueType(t).size
    except ValueError:
        return 0


class Keys:
    """The one place for every GGUF metadata key pyggml reads or writes.

    Names are llama.cpp's ``LLM_KV_*`` (llama-arch.cpp, and tools/imatrix's ``LLM_KV_IMATRIX_*``)
    without the prefix: ``LLM_KV_ATTENTION_HEAD_COUNT`` is ``Keys.ATTENTION_HEAD_COUNT``. Keys that
    start with ``{arch}`` are per architecture: ``Keys.arch(Keys.BLOCK_COUNT, "gemma3")`` is
    ``"gemma3.block_count"``.
    """

    # general.*
    GENERAL_TYPE = "general.type"
    GENERAL_ARCHITECTURE = "general.architecture"
    GENERAL_QUANTIZATION_VERSION = "general.quantization_version"
    GENERAL_ALIGNMENT = GGUF_KEY_GENERAL_ALIGNMENT
    GENERAL_NAME = "general.name"
    GENERAL_FILE_TYPE = "general.file_type"

    # {arch}.*: the model's shape
    VOCAB_SIZE = "{arch}.vocab_size"
    CONTEXT_LENGTH = "{arch}.context_length"
    EMBEDDING_LENGTH = "{arch}.embedding_length"
    BLOCK_COUNT = "{arch}.block_count"
    FEED_FORWARD_LENGTH = "{arch}.feed_forward_length"
    EXPERT_COUNT = "{arch}.expert_count"
    EXPERT_USED_COUNT = "{arch}.expert_used_count"
    EXPERT_FEED_FORWARD_LENGTH = "{arch}.expert_feed_forward_length"
    EXPERT_SHARED_FEED_FORWARD_LENGTH = "{arch}.expert_shared_feed_forward_length"
    EXPERT_WEIGHTS_SCALE = "{arch}.expert_weights_scale"
    # RWKV: the WKV head size, the token-shift states per layer, the LoRA ranks of RWKV-6 and RWKV-7
    WKV_HEAD_SIZE = "{arch}.wkv.head_size"
    TOKEN_SHIFT_COUNT = "{arch}.token_shift_count"
    RESCALE_EVERY_N_LAYERS = "{arch}.rescale_every_n_layers"
    TIME_MIX_EXTRA_DIM = "{arch}.time_mix_extra_dim"
    TIME_DECAY_EXTRA_DIM = "{arch}.time_decay_extra_dim"
    ATTENTION_DECAY_LORA_RANK = "{arch}.attention.decay_lora_rank"
    ATTENTION_ICLR_LORA_RANK = "{arch}.attention.iclr_lora_rank"
    ATTENTION_VALUE_RESIDUAL_MIX_LORA_RANK = "{arch}.attention.value_residual_mix_lora_rank"
    ATTENTION_GATE_LORA_RANK = "{arch}.attention.gate_lora_rank"
    SHORTCONV_L_CACHE = "{arch}.shortconv.l_cache"
    EXPERT_WEIGHTS_NORM = "{arch}.expert_weights_norm"
    EXPERT_GATING_FUNC = "{arch}.expert_gating_func"
    USE_PARALLEL_RESIDUAL = "{arch}.use_parallel_residual"
    FINAL_LOGIT_SOFTCAPPING = "{arch}.final_logit_softcapping"
    ATTN_LOGIT_SOFTCAPPING = "{arch}.attn_logit_softcapping"
    LOGIT_SCALE = "{arch}.logit_scale"
    RESIDUAL_SCALE = "{arch}.residual_scale"
    EMBEDDING_SCALE = "{arch}.embedding_scale"
    POOLING_TYPE = "{arch}.pooling_type"
    CLASSIFIER_OUTPUT_LABELS = "{arch}.classifier.output_labels"
    CLASSIFIER_POOLING_TYPE = "{arch}.classifier.pooling_type"
    DENSE_2_FEAT_IN = "{arch}.dense_2_feat_in"
    DENSE_2_FEAT_OUT = "{arch}.dense_2_feat_out"
    DENSE_3_FEAT_IN = "{arch}.dense_3_feat_in"
    DENSE_3_FEAT_OUT = "{arch}.dense_3_feat_out"

    ATTENTION_HEAD_COUNT = "{arch}.attention.head_count"
    ATTENTION_HEAD_COUNT_KV = "{arch}.attention.head_count_kv"
    ATTENTION_KEY_LENGTH = "{arch}.attention.key_length"
    ATTENTION_VALUE_LENGTH = "{arch}.attention.value_length"
    ATTENTION_LAYERNORM_EPS = "{arch}.attention.layer_norm_epsilon"
    ATTENTION_LAYERNORM_RMS_EPS = "{arch}.attention.layer_norm_rms_epsilon"
    ATTENTION_SCALE = "{arch}.attention.scale"
    ATTENTION_CAUSAL = "{arch}.attention.causal"
    ATTENTION_SLIDING_WINDOW = "{arch}.attention.sliding_window"
    ATTENTION_SLIDING_WINDOW_PATTERN = "{arch}.attention.sliding_window_pattern"

    # state-space (Mamba) layers
    SSM_CONV_KERNEL = "{arch}.ssm.conv_kernel"
    SSM_INNER_SIZE = "{arch}.ssm.inner_size"
    SSM_STATE_SIZE = "{arch}.ssm.state_size"
    SSM_TIME_STEP_RANK = "{arch}.ssm.time_step_rank"
    SSM_GROUP_COUNT = "{arch}.ssm.group_count"
    SSM_DT_B_C_RMS = "{arch}.ssm.dt_b_c_rms"

    ROPE_DIMENSION_COUNT = "{arch}.rope.dimension_count"
    ROPE_FREQ_BASE = "{arch}.rope.freq_base"
    ROPE_FREQ_BASE_SWA = "{arch}.rope.freq_base_swa"
    ROPE_SCALE_LINEAR = "{arch}.rope.scale_linear"
    ROPE_SCALING_TYPE = "{arch}.rope.scaling.type"
    ROPE_SCALING_FACTOR = "{arch}.rope.scaling.factor"
    ROPE_SCALING_ATTN_FACTOR = "{arch}.rope.scaling.attn_factor"
    ROPE_SCALING_ORIG_CTX_LEN = "{arch}.rope.scaling.original_context_length"
    ROPE_SCALING_FINETUNED = "{arch}.rope.scaling.finetuned"

    # split files (gguf-split)
    SPLIT_NO = "split.no"
    SPLIT_COUNT = "split.count"
    SPLIT_TENSORS_COUNT = "split.tensors.count"

    # tokenizer.*
    TOKENIZER_MODEL = "tokenizer.ggml.model"
    TOKENIZER_PRE = "tokenizer.ggml.pre"
    TOKENIZER_LIST = "tokenizer.ggml.tokens"
    TOKENIZER_TOKEN_TYPE = "tokenizer.ggml.token_type"
    TOKENIZER_TOKEN_TYPE_COUNT = "tokenizer.ggml.token_type_count"
    TOKENIZER_SCORES = "tokenizer.ggml.scores"
    TOKENIZER_MERGES = "tokenizer.ggml.merges"
    TOKENIZER_BOS_ID = "tokenizer.ggml.bos_token_id"
    TOKENIZER_EOS_ID = "tokenizer.ggml.eos_token_id"
    TOKENIZER_EOT_ID = "tokenizer.ggml.eot_token_id"
    TOKENIZER_EOM_ID = "tokenizer.ggml.eom_token_id"
    TOKENIZER_UNK_ID = "tokenizer.ggml.unknown_token_id"
    TOKENIZER_SEP_ID = "tokenizer.ggml.seperator_token_id"  # sic, as llama.cpp spells it
    TOKENIZER_PAD_ID = "tokenizer.ggml.padding_token_id"
    TOKENIZER_CLS_ID = "tokenizer.ggml.cls_token_id"  # written by converters (gguf-py's Keys.Tokenizer.CLS_ID)
    TOKENIZER_MASK_ID = "tokenizer.ggml.mask_token_id"
    TOKENIZER_ADD_BOS = "tokenizer.ggml.add_bos_token"
    TOKENIZER_ADD_EOS = "tokenizer.ggml.add_eos_token"
    TOKENIZER_ADD_SEP = "tokenizer.ggml.add_sep_token"
    TOKENIZER_ADD_PREFIX = "tokenizer.ggml.add_space_prefix"
    TOKENIZER_REMOVE_EXTRA_WS = "tokenizer.ggml.remove_extra_whitespaces"
    TOKENIZER_CHAT_TEMPLATE = "tokenizer.chat_template"
    TOKENIZER_PRECOMPILED_CHARSMAP = "tokenizer.ggml.precompiled_charsmap"
    TOKENIZER_NORMALIZER_LOWERCASE = "tokenizer.ggml.normalizer.lowercase"
    TOKENIZER_NORMALIZER_STRIP_ACCENTS = "tokenizer.ggml.normalizer.strip_accents"
    TOKENIZER_FIM_PRE_ID = "tokenizer.ggml.fim_pre_token_id"
    TOKENIZER_FIM_SUF_ID = "tokenizer.ggml.fim_suf_token_id"
    TOKENIZER_FIM_MID_ID = "tokenizer.ggml.fim_mid_token_id"
    TOKENIZER_FIM_PAD_ID = "tokenizer.ggml.fim_pad_token_id"
    TOKENIZER_FIM_REP_ID = "tokenizer.ggml.fim_rep_token_id"
    TOKENIZER_FIM_SEP_ID = "tokenizer.ggml.fim_sep_token_id"
    # deprecated FIM names, still read (they win over the fim_* ones, as in llama.cpp)
    TOKENIZER_PREFIX_ID = "tokenizer.ggml.prefix_token_id"
    TOKENIZER_SUFFIX_ID = "tokenizer.ggml.suffix_token_id"
    TOKENIZER_MIDDLE_ID = "tokenizer.ggml.middle_token_id"

    # what llama-quantize records about the importance matrix it used
    QUANTIZE_IMATRIX_FILE = "quantize.imatrix.file"
    QUANTIZE_IMATRIX_DATASET = "quantize.imatrix.dataset"
    QUANTIZE_IMATRIX_N_ENTRIES = "quantize.imatrix.entries_count"
    QUANTIZE_IMATRIX_N_CHUNKS = "quantize.imatrix.chunks_count"

    # an imatrix GGUF file (tools/imatrix); its tensors are "<name>.in_sum2" and "<name>.counts"
    IMATRIX_DATASETS = "imatrix.datasets"
    IMATRIX_CHUNK_COUNT = "imatrix.chunk_count"
    IMATRIX_CHUNK_SIZE = "imatrix.chunk_size"

    @staticmethod
    def arch(key: str, arch: str) -> str:
        """A per-architecture key for ``arch``: ``Keys.arch(Keys.BLOCK_COUNT, "llama")`` -> ``"llama.block_count"``."""
        return key.format(arch=arch)
