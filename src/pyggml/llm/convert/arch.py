"""What llama.cpp's converter does per architecture: hyper-parameter keys, tensor names, weight fixes.

One ``ConvertSpec`` per architecture (``SPECS``): llama, qwen2, qwen3, gemma, gemma2, gemma3, olmo2, granite,
smollm3 and starcoder2, the ones whose llama.cpp converter class (convert_hf_to_gguf's ``TextModel``
children) does no more than rename tensors, permute Q/K, shift norms and write a few keys:

* llama's Q/K rows are permuted per head so that ggml's adjacent-pair (NORM) RoPE computes what
  HF's rotate-half RoPE computes on the original rows; qwen2 and gemma3 use NEOX RoPE and keep them.
* Gemma's RMSNorm multiplies by ``1 + w``; the converter stores ``w + 1`` so the runner multiplies
  by the stored weight directly.
* llama3-style RoPE scaling is not a key but a precomputed ``rope_freqs`` tensor of per-pair factors.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...gguf.constants import Keys
from .vocab import ConversionError

# HF names inside ``model.layers.N.`` -> GGUF names inside ``blk.N.`` (post_attention_layernorm is the FFN's
# pre-norm except where a spec says otherwise)
_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_POST_NORMS = {"post_attention_layernorm": "post_attention_norm", "post_feedforward_layernorm": "post_ffw_norm"}
_BASE_LAYER = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")


@dataclass(frozen=True)
class ConvertSpec:
    """What llama.cpp's converter class for one architecture does beyond renaming (conversion/*.py)."""

    arch: str
    hf_classes: tuple[str, ...]
    model_types: tuple[str, ...]
    #: HF module names that differ from _LAYER_NAMES
    layer_names: dict[str, str] = field(default_factory=dict)
    #: per-layer GGUF tensors the runner cannot do without
    required: tuple[str, ...] = _BASE_LAYER
    #: NORM RoPE: Q/K rows permuted per head from HF's halves to ggml's pairs (LlamaModel and its children)
    permute_qk: bool = False
    #: norms stored as 1 + w (Gemma's RMSNorm multiplies by 1 + w)
    norm_shift: bool = False
    #: Gemma: lm_head always dropped (the output is the token embeddings), head sizes always written
    gemma: bool = False
    #: gemma3: the vocabulary (and embedding rows) cut to the tokenizer's, RoPE read per layer type
    trim_vocab: bool = False
    #: LayerNorm (with biases; the eps key is layer_norm_epsilon) instead of RMSNorm
    layer_norm: bool = False
    #: the arch's own keys (and refusals) from the config
    extra: Callable[[dict[str, Any]], dict[str, Any]] | None = None


def _llama_extra(config: dict[str, Any]) -> dict[str, Any]:
    return {Keys.arch(Keys.VOCAB_SIZE, "llama"): int(_req(config, "vocab_size")),
            Keys.arch(Keys.ROPE_DIMENSION_COUNT, "llama"): head_dim(config)}


def _qwen2_extra(config: dict[str, Any]) -> dict[str, Any]:
    if config.get("use_sliding_window"):
        raise ConversionError("qwen2 with use_sliding_window=True: llama.cpp's qwen2 graph has no sliding window")
    return {}


def _granite_extra(config: dict[str, Any]) -> dict[str, Any]:
    """GraniteModel: the four multipliers as keys (a missing logits_scaling is llama.cpp's required key)."""
    a = "granite"
    md = {Keys.arch(Keys.LOGIT_SCALE, a): float(_req(config, "logits_scaling"))}
    for hf, key in (("embedding_multiplier", Keys.EMBEDDING_SCALE), ("residual_multiplier", Keys.RESIDUAL_SCALE),
                    ("attention_multiplier", Keys.ATTENTION_SCALE)):
        if config.get(hf) is not None:
            md[Keys.arch(key, a)] = float(config[hf])
    return md


def _smollm3_extra(config: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp's smollm3 graph skips RoPE on every 4th layer, whatever the file says: refuse other patterns."""
    n_layer = int(_req(config, "num_hidden_layers"))
    flags = config.get("no_rope_layers")
    expected = [int((il + 1) % 4 != 0) for il in range(n_layer)]
    if flags is not None and [int(f) for f in flags] != expected:
        raise ConversionError(f"smollm3: no_rope_layers={list(flags)} but llama.cpp's graph uses RoPE on {expected}")
    return {}


SPECS: dict[str, ConvertSpec] = {s.arch: s for s in (
    ConvertSpec("llama", ("LlamaForCausalLM",), ("llama",), permute_qk=True, extra=_llama_extra),
    ConvertSpec("qwen2", ("Qwen2ForCausalLM",), ("qwen2",), extra=_qwen2_extra),
    ConvertSpec("qwen3", ("Qwen3ForCausalLM",), ("qwen3",), required=(*_BASE_LAYER, "attn_q_norm", "attn_k_norm")),
    ConvertSpec("gemma3", ("Gemma3ForCausalLM",), ("gemma3_text",),
                layer_names={**_POST_NORMS, "pre_feedforward_layernorm": "ffn_norm"},
                required=(*_BASE_LAYER, "attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm"),
                norm_shift=True, gemma=True, trim_vocab=True, extra=lambda c: _gemma3_metadata(c)),
    ConvertSpec("gemma", ("GemmaForCausalLM",), ("gemma",), norm_shift=True, gemma=True),
    ConvertSpec("gemma2", ("Gemma2ForCausalLM",), ("gemma2",),
                layer_names={**_POST_NORMS, "pre_feedforward_layernorm": "ffn_norm"},
                required=(*_BASE_LAYER, "post_attention_norm", "post_ffw_norm"),
                norm_shift=True, gemma=True, extra=lambda c: _gemma2_metadata(c)),
    ConvertSpec("starcoder2", ("Starcoder2ForCausalLM",), ("starcoder2",),
                layer_names={"mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"},
                required=("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_up", "ffn_down"),
                layer_norm=True),
    ConvertSpec("olmo2", ("Olmo2ForCausalLM",), ("olmo2",), layer_names=_POST_NORMS,
                required=("attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
                          "post_attention_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm")),
    ConvertSpec("granite", ("GraniteForCausalLM",), ("granite",), permute_qk=True, extra=_granite_extra),
    ConvertSpec("smollm3", ("SmolLM3ForCausalLM",), ("smollm3",), permute_qk=True, extra=_smollm3_extra),
)}
HF_CLASSES = {c: s.arch for s in SPECS.values() for c in s.hf_classes}
MODEL_TYPES = {t: s.arch for s in SPECS.values() for t in s.model_types}
_GLOBAL_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)$")
_GLOBAL_RE = re.compile(r"(.+)\.(weight|bias)$")
# buffers HF keeps in state dicts that carry no weights
_SKIPPED_SUFFIXES = (".rotary_emb.inv_freq", ".attention.masked_bias", ".attention.bias")


def spec_of(arch: str) -> ConvertSpec:
    if arch not in SPECS:
        raise ConversionError(f"unsupported architecture {arch!r} (the converter knows {', '.join(SPECS)})")
    return SPECS[arch]


def detect_arch(model: Any, config: dict[str, Any]) -> str:
    """The GGUF architecture for a model object (by class) or a config (by ``architectures``/``model_type``)."""
    cls = type(model).__name__
    if cls in HF_CLASSES:
        return HF_CLASSES[cls]
    for name in config.get("architectures") or []:
        if name in HF_CLASSES:
            return HF_CLASSES[name]
    mt = config.get("model_type")
    if mt in MODEL_TYPES:
        return MODEL_TYPES[mt]
    raise ConversionError(
        f"cannot convert model class {cls!r} / model_type {mt!r}: supported are {', '.join(HF_CLASSES)}"
    )


def _req(config: dict[str, Any], key: str) -> Any:
    if config.get(key) is None:
        raise ConversionError(f"the config lacks {key!r}")
    return config[key]


def _rope(config: dict[str, Any], layer_type: str | None = None) -> dict[str, Any]:
    """RoPE parameters: transformers >= 4.56 nests them in ``rope_parameters`` (per layer type for gemma3)."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        params = params[layer_type]
    out = dict(params)
    out.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    return out


def head_dim(config: dict[str, Any]) -> int:
    return int(config.get("head_dim") or _req(config, "hidden_size") // _req(config, "num_attention_heads"))


def hparams_metadata(arch: str, config: dict[str, Any]) -> dict[str, Any]:
    """The ``{arch}.*`` keys (TextModel.set_gguf_parameters plus the arch's additions)."""
    a, spec = arch, spec_of(arch)
    n_head = int(_req(config, "num_attention_heads"))
    md: dict[str, Any] = {
        Keys.arch(Keys.BLOCK_COUNT, a): int(_req(config, "num_hidden_layers")),
        Keys.arch(Keys.CONTEXT_LENGTH, a): int(_req(config, "max_position_embeddings")),
        Keys.arch(Keys.EMBEDDING_LENGTH, a): int(_req(config, "hidden_size")),
        Keys.arch(Keys.FEED_FORWARD_LENGTH, a): int(_req(config, "intermediate_size")),
        Keys.arch(Keys.ATTENTION_HEAD_COUNT, a): n_head,
        Keys.arch(Keys.ATTENTION_HEAD_COUNT_KV, a): int(config.get("num_key_value_heads") or n_head),
    }
    if spec.layer_norm:
        md[Keys.arch(Keys.ATTENTION_LAYERNORM_EPS, a)] = float(_req(config, "norm_epsilon"))
    else:
        md[Keys.arch(Keys.ATTENTION_LAYERNORM_RMS_EPS, a)] = float(_req(config, "rms_norm_eps"))
    if config.get("head_dim") is not None or spec.gemma:
        md[Keys.arch(Keys.ATTENTION_KEY_LENGTH, a)] = head_dim(config)
        md[Keys.arch(Keys.ATTENTION_VALUE_LENGTH, a)] = head_dim(config)
    rope = _rope(config, "full_attention" if spec.trim_vocab else None)
    md[Keys.arch(Keys.ROPE_FREQ_BASE, a)] = float(rope["rope_theta"])
    rope_type = str(rope.get("rope_type") or rope.get("type") or "default").lower()
    if rope_type == "linear":
        md[Keys.arch(Keys.ROPE_SCALING_TYPE, a)] = "linear"
        md[Keys.arch(Keys.ROPE_SCALING_FACTOR, a)] = float(rope["factor"])
    elif rope_type not in ("default", "llama3") or (rope_type == "llama3" and not spec.permute_qk):
        raise ConversionError(f"{arch}: RoPE scaling type {rope_type!r} is not supported by this converter")
    if spec.extra is not None:
        md.update(spec.extra(config))
    return md


def _check_query_scalar(arch: str, config: dict[str, Any], n_layer_27b: int) -> None:
    """llama.cpp does not store query_pre_attn_scalar: it assumes head_dim (n_embd/n_head for the 27B)."""
    n_layer = int(config["num_hidden_layers"])
    scalar = config.get("query_pre_attn_scalar")
    assumed = config["hidden_size"] / config["num_attention_heads"] if n_layer == n_layer_27b else head_dim(config)
    if scalar is not None and not math.isclose(float(scalar), float(assumed)):
        raise ConversionError(
            f"{arch}: query_pre_attn_scalar={scalar} but llama.cpp's {arch} graph scales queries by 1/sqrt({assumed})"
        )


def _gemma2_metadata(config: dict[str, Any]) -> dict[str, Any]:
    """Gemma2Model: both soft-caps and the window (every other layer slides, llama.cpp's fixed pattern)."""
    _check_query_scalar("gemma2", config, 46)
    types = config.get("layer_types")
    if types and [t == "sliding_attention" for t in types] != [il % 2 == 0 for il in range(len(types))]:
        raise ConversionError("gemma2: llama.cpp slides every other layer, starting with the first; this config "
                              f"has layer_types={types}")
    a = "gemma2"
    md = {Keys.arch(Keys.ATTENTION_SLIDING_WINDOW, a): int(_req(config, "sliding_window"))}
    if config.get("attn_logit_softcapping") is not None:
        md[Keys.arch(Keys.ATTN_LOGIT_SOFTCAPPING, a)] = float(config["attn_logit_softcapping"])
    if config.get("final_logit_softcapping") is not None:
        md[Keys.arch(Keys.FINAL_LOGIT_SOFTCAPPING, a)] = float(config["final_logit_softcapping"])
    return md


def _gemma3_metadata(config: dict[str, Any]) -> dict[str, Any]:
    md: dict[str, Any] = {}
    n_layer = int(config["num_hidden_layers"])
    _check_query_scalar("gemma3", config, 62)
    if config.get("attn_logit_softcapping") is not None:
        raise ConversionError("gemma3: attn_logit_softcapping is not supported (Gemma 3 does not use it)")
    if config.get("final_logit_softcapping"):
        md[Keys.arch(Keys.FINAL_LOGIT_SOFTCAPPING, "gemma3")] = float(config["final_logit_softcapping"])
    local = _rope(config, "sliding_attention")
    if "rope_parameters" in config and "sliding_attention" in (config.get("rope_parameters") or {}):
        md[Keys.arch(Keys.ROPE_FREQ_BASE_SWA, "gemma3")] = float(local["rope_theta"])
    elif config.get("rope_local_base_freq") is not None:
        md[Keys.arch(Keys.ROPE_FREQ_BASE_SWA, "gemma3")] = float(config["rope_local_base_freq"])
    if config.get("sliding_window_pattern") != 1 and config.get("sliding_window"):
        md[Keys.arch(Keys.ATTENTION_SLIDING_WINDOW, "gemma3")] = int(config["sliding_window"])
        types = config.get("layer_types")
        if types:
            flags = [t == "sliding_attention" for t in types]
            # the runner's default is a period of 6 (every 6th layer global); write the pattern only if it differs
            if flags != [(il % 6) < 5 for il in range(n_layer)]:
                md[Keys.arch(Keys.ATTENTION_SLIDING_WINDOW_PATTERN, "gemma3")] = flags
    return md


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Reorder each head's rows from HF's halves [x0..x(d/2-1), y0..] to ggml's pairs [x0, y0, x1, y1, ...]."""
    shape = w.shape
    return w.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def llama3_rope_factors(config: dict[str, Any]) -> np.ndarray | None:
    """The ``rope_freqs`` tensor for llama3 RoPE scaling: a divisor for each rotated pair's frequency."""
    rope = _rope(config)
    if str(rope.get("rope_type") or rope.get("type") or "").lower() != "llama3":
        return None
    dim = head_dim(config)
    freqs = 1.0 / (float(rope["rope_theta"]) ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    factor = float(rope.get("factor", 8.0))
    low, high = float(rope.get("low_freq_factor", 1.0)), float(rope.get("high_freq_factor", 4.0))
    # HF reads the original context from the rope parameters (llama.cpp from the top level, default 8192)
    old_ctx = float(rope.get("original_max_position_embeddings") or config.get("original_max_position_embeddings")
                    or 8192)
    wavelen = 2 * math.pi / freqs
    smooth = (old_ctx / wavelen - low) / (high - low)
    out = np.where(wavelen < old_ctx / high, 1.0,
                   np.where(wavelen > old_ctx / low, factor, 1.0 / ((1 - smooth) / factor + smooth)))
    return out.astype(np.float32)


@dataclass
class MappedTensor:
    name: str
    data: np.ndarray


def map_tensors(arch: str, config: dict[str, Any], items: Iterator[tuple[str, np.ndarray]],
                n_vocab_real: int | None = None) -> Iterator[MappedTensor]:
    """HF (name, float32 array) pairs -> GGUF tensors with llama.cpp's names and fixes, in HF order."""
    spec = spec_of(arch)
    tied = bool(config.get("tie_word_embeddings", spec.gemma))
    n_head = int(config["num_attention_heads"])
    n_head_kv = int(config.get("num_key_value_heads") or n_head)
    layer_names = {**_LAYER_NAMES, **spec.layer_names}
    fixes: list[Callable[[str, np.ndarray], np.ndarray]] = []
    if spec.permute_qk:
        def permute_qk(gname: str, x: np.ndarray) -> np.ndarray:
            if ".attn_q." in gname:
                return llama_permute(x, n_head)
            if ".attn_k." in gname:
                return llama_permute(x, n_head_kv)
            return x
        fixes.append(permute_qk)
    if spec.norm_shift:
        fixes.append(lambda g, x: x + np.float32(1.0) if g.endswith("norm.weight") else x)
    factors = llama3_rope_factors(config) if spec.permute_qk else None
    if factors is not None:
        yield MappedTensor("rope_freqs.weight", factors)
    for hf_name, data in items:
        if hf_name.endswith(_SKIPPED_SUFFIXES):
            continue
        if hf_name.startswith("lm_head.") and (tied or spec.gemma):
            continue  # tied: the runner reuses token_embd (llama.cpp's gemma3 converter always drops lm_head)
        gname = _gguf_name(hf_name, layer_names)
        if gname is None:
            raise ConversionError(f"{arch}: cannot map tensor {hf_name!r} to a GGUF name")
        if gname == "token_embd.weight" and n_vocab_real is not None and spec.trim_vocab:
            data = data[:n_vocab_real]  # gemma3 drops the embedding rows past the tokenizer's vocabulary
        for fix in fixes:
            data = fix(gname, data)
        yield MappedTensor(gname, np.ascontiguousarray(data, dtype=np.float32))


def required_tensors(arch: str, config: dict[str, Any]) -> list[str]:
    """The tensors the runner cannot load a model without (its ``_build_layers``), in GGUF names."""
    per_layer = spec_of(arch).required
    names = ["token_embd.weight", "output_norm.weight"]
    for il in range(int(config["num_hidden_layers"])):
        names += [f"blk.{il}.{n}.weight" for n in per_layer]
    return names


def _gguf_name(hf_name: str, layer_names: dict[str, str]) -> str | None:
    m = _LAYER_RE.match(hf_name)
    if m:
        il, mod, kind = m.groups()
        g = layer_names.get(mod)
        return None if g is None else f"blk.{il}.{g}.{kind}"
    m = _GLOBAL_RE.match(hf_name)
    if m and m.group(1) in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[m.group(1)]}.{m.group(2)}"
    return None
