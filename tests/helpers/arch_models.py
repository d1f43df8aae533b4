"""Tiny random-weight GGUF models, one per architecture, written with the independent ``gguf`` package.

Each has 2 layers (smollm3 4, to reach its first layer without RoPE), n_embd 64, 4 query heads and
2 KV heads of 16, an FFN of 96 and a 256-token byte-level vocabulary: small enough to keep in
tests/data, and with every tensor and key the architecture's llama.cpp loader reads. The weights are
drawn from a seeded generator; the files kept in ``tests/data/archs`` were written by
``tests/data/archs/make_reference.py``, which also ran llama.cpp on them. Tests read the kept
files, never regenerate them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from pyggml.llm.tokenizer.unicode import BYTE_TO_CHAR


def _dims() -> tuple[int, ...]:
    """The models' sizes: the tiny ones of the test data, or, for speed runs (bench/arch_speed.py), the ones
    PYGGML_ARCH_MODEL_DIMS gives as "n_embd,n_head,n_head_kv,head,n_ff,n_layer,n_ff_exp"."""
    spec = os.environ.get("PYGGML_ARCH_MODEL_DIMS")
    return tuple(int(v) for v in spec.split(",")) if spec else (64, 4, 2, 16, 96, 2, 64)


N_EMBD, N_HEAD, N_HEAD_KV, HEAD, N_FF, N_LAYER, N_FF_EXP = _dims()
N_VOCAB, N_CTX = 256, 256
Q, KV = N_HEAD * HEAD, N_HEAD_KV * HEAD


@dataclass
class Spec:
    """One architecture's tiny model: its extra keys and its tensors (name -> ggml ne)."""

    arch: str
    keys: dict[str, Any] = field(default_factory=dict)
    layer: Callable[[int], dict[str, tuple[int, ...]]] = lambda il: {}
    globals_: dict[str, tuple[int, ...]] = field(default_factory=dict)
    tied: bool = False
    n_layer: int = N_LAYER
    n_head_kv: int | list[int] = N_HEAD_KV  #: a list: per layer (0 marks a hybrid's recurrent layer)
    quant: str = "q8_0"  #: the quantized variant's llama-quantize type
    head: bool = True  #: output_norm (and output unless tied); encoders end without them
    vocab: str = "gpt2"  #: the tokenizer: "gpt2" (byte-level BPE) or "bert" (WordPiece)
    attention: bool = True  #: False for a model without attention (Mamba): head counts and FFN length 0


def _attn(il: int, bias: bool = False, qk_norm: int = 0, fused: bool = False) -> dict[str, tuple[int, ...]]:
    p = f"blk.{il}."
    t: dict[str, tuple[int, ...]] = {p + "attn_norm.weight": (N_EMBD,), p + "attn_output.weight": (Q, N_EMBD)}
    if fused:
        t[p + "attn_qkv.weight"] = (N_EMBD, Q + 2 * KV)
    else:
        t.update({p + "attn_q.weight": (N_EMBD, Q), p + "attn_k.weight": (N_EMBD, KV),
                  p + "attn_v.weight": (N_EMBD, KV)})
    if bias:
        t.update({p + "attn_q.bias": (Q,), p + "attn_k.bias": (KV,), p + "attn_v.bias": (KV,)})
    if qk_norm:
        t.update({p + "attn_q_norm.weight": (qk_norm,), p + "attn_k_norm.weight": (qk_norm,)})
    return t


def _ffn(il: int, gate: bool = True, norm: bool = True) -> dict[str, tuple[int, ...]]:
    p = f"blk.{il}."
    t = {p + "ffn_up.weight": (N_EMBD, N_FF), p + "ffn_down.weight": (N_FF, N_EMBD)}
    if gate:
        t[p + "ffn_gate.weight"] = (N_EMBD, N_FF)
    if norm:
        t[p + "ffn_norm.weight"] = (N_EMBD,)
    return t


def _biased_norms(il: int) -> dict[str, tuple[int, ...]]:
    p = f"blk.{il}."
    return {p + "attn_norm.bias": (N_EMBD,), p + "ffn_norm.bias": (N_EMBD,), p + "attn_output.bias": (N_EMBD,),
            p + "ffn_up.bias": (N_FF,), p + "ffn_down.bias": (N_EMBD,)}


def _olmo2(il: int) -> dict[str, tuple[int, ...]]:
    t = _attn(il) | _ffn(il, norm=False) | _post_norms(il)
    del t[f"blk.{il}.attn_norm.weight"]
    return t | {f"blk.{il}.attn_q_norm.weight": (Q,), f"blk.{il}.attn_k_norm.weight": (KV,)}


def _phi3(il: int) -> dict[str, tuple[int, ...]]:
    p = f"blk.{il}."
    return _attn(il, fused=True) | {p + "ffn_norm.weight": (N_EMBD,), p + "ffn_up.weight": (N_EMBD, 2 * N_FF),
                                    p + "ffn_down.weight": (N_FF, N_EMBD)}


def _gpt2(il: int) -> dict[str, tuple[int, ...]]:
    p = f"blk.{il}."
    return (_attn(il, fused=True) | _ffn(il, gate=False) | _biased_norms(il)
            | {p + "attn_qkv.bias": (Q + 2 * KV,)})


def _stablelm(il: int) -> dict[str, tuple[int, ...]]:
    """StableLM 2 12B's shape: per-head Q/K LayerNorms and no ffn_norm (the parallel block)."""
    p = f"blk.{il}."
    t = _attn(il, bias=True) | _ffn(il, norm=False) | {p + "attn_norm.bias": (N_EMBD,)}
    return t | {p + "attn_q_norm.weight": (HEAD, N_HEAD), p + "attn_k_norm.weight": (HEAD, N_HEAD_KV)}


N_EXPERT, N_EXPERT_USED = 4, 2
MOE_KEYS = {"expert_count": N_EXPERT, "expert_used_count": N_EXPERT_USED}


def _moe(il: int, shared: int = 0) -> dict[str, tuple[int, ...]]:
    """A router over N_EXPERT experts of N_FF_EXP, and a shared expert of ``shared`` if given."""
    p = f"blk.{il}."
    t = {p + "ffn_norm.weight": (N_EMBD,), p + "ffn_gate_inp.weight": (N_EMBD, N_EXPERT),
         p + "ffn_gate_exps.weight": (N_EMBD, N_FF_EXP, N_EXPERT),
         p + "ffn_up_exps.weight": (N_EMBD, N_FF_EXP, N_EXPERT),
         p + "ffn_down_exps.weight": (N_FF_EXP, N_EMBD, N_EXPERT)}
    if shared:
        t.update({p + "ffn_gate_shexp.weight": (N_EMBD, shared), p + "ffn_up_shexp.weight": (N_EMBD, shared),
                  p + "ffn_down_shexp.weight": (shared, N_EMBD)})
    return t


def _olmoe(il: int) -> dict[str, tuple[int, ...]]:
    """OLMoE: as many KV heads as query heads, Q/K norms over the whole width."""
    p = f"blk.{il}."
    return {p + "attn_norm.weight": (N_EMBD,), p + "attn_q.weight": (N_EMBD, Q), p + "attn_k.weight": (N_EMBD, Q),
            p + "attn_v.weight": (N_EMBD, Q), p + "attn_output.weight": (Q, N_EMBD),
            p + "attn_q_norm.weight": (N_EMBD,), p + "attn_k_norm.weight": (N_EMBD,)} | _moe(il)


def _gpt_oss(il: int) -> dict[str, tuple[int, ...]]:
    """gpt-oss: biased attention with sinks, a norm after attention feeding a biased mixture of experts."""
    p = f"blk.{il}."
    t = _attn(il, bias=True) | _moe(il)
    del t[p + "ffn_norm.weight"]
    return t | {p + "post_attention_norm.weight": (N_EMBD,), p + "attn_output.bias": (N_EMBD,),
                p + "attn_sinks.weight": (N_HEAD,), p + "ffn_gate_inp.bias": (N_EXPERT,),
                p + "ffn_gate_exps.bias": (N_FF_EXP, N_EXPERT), p + "ffn_up_exps.bias": (N_FF_EXP, N_EXPERT),
                p + "ffn_down_exps.bias": (N_EMBD, N_EXPERT)}


def _post_norms(il: int) -> dict[str, tuple[int, ...]]:
    return {f"blk.{il}.post_attention_norm.weight": (N_EMBD,), f"blk.{il}.post_ffw_norm.weight": (N_EMBD,)}


def _bert_layer(il: int, fused: bool = False, gate: bool = False, biases: bool = True) -> dict[str, tuple[int, ...]]:
    """A post-norm encoder block: attention, attn_output_norm, the FFN, layer_output_norm (LayerNorms with bias)."""
    p = f"blk.{il}."
    t = _attn(il, bias=biases, fused=fused) | _ffn(il, gate=gate, norm=False)
    del t[p + "attn_norm.weight"]
    for norm in ("attn_output_norm", "layer_output_norm"):
        t |= {f"{p}{norm}.weight": (N_EMBD,), f"{p}{norm}.bias": (N_EMBD,)}
    if biases:
        t |= {p + "attn_output.bias": (N_EMBD,), p + "ffn_up.bias": (N_FF,), p + "ffn_down.bias": (N_EMBD,)}
    return t


N_TOKEN_TYPES, CLS_LABELS = 2, ["yes", "no"]
#: BERT's input side and its classifier head (RANK pooling's cls and cls.output)
BERT_GLOBALS = {"token_types.weight": (N_EMBD, N_TOKEN_TYPES), "position_embd.weight": (N_EMBD, N_CTX),
                "token_embd_norm.weight": (N_EMBD,), "token_embd_norm.bias": (N_EMBD,),
                "cls.weight": (N_EMBD, N_EMBD), "cls.bias": (N_EMBD,), "cls.output.weight": (N_EMBD, len(CLS_LABELS)),
                "cls.output.bias": (len(CLS_LABELS),)}
DENSE_FEAT = 96


# state-space layers: Mamba's expansion factor 2, a conv of 4, and (Mamba-2) heads of 16 in 2 groups; for speed
# models (PYGGML_ARCH_MODEL_DIMS) the real models' state size 128 and heads of 64
SSM_INNER, SSM_CONV = 2 * N_EMBD, 4
SSM_STATE = 16 if N_EMBD <= 64 else 128
SSM_DT_RANK = -(-N_EMBD // 16)
SSM_GROUPS, SSM_HEAD_DIM = (2, 16) if N_EMBD <= 64 else (1, 64)
SSM_HEADS = SSM_INNER // SSM_HEAD_DIM
MAMBA_KEYS = {"ssm.conv_kernel": SSM_CONV, "ssm.inner_size": SSM_INNER, "ssm.state_size": SSM_STATE,
              "ssm.time_step_rank": SSM_DT_RANK}
MAMBA2_KEYS = MAMBA_KEYS | {"ssm.time_step_rank": SSM_HEADS, "ssm.group_count": SSM_GROUPS}
#: granitehybrid: an attention layer in every 4 (the second), the others Mamba-2; at least 3 layers
GH_LAYERS = max(3, N_LAYER)


def _mamba(il: int) -> dict[str, tuple[int, ...]]:
    """A Mamba-1 layer (src/models/mamba.cpp's tensors)."""
    p = f"blk.{il}."
    return {p + "attn_norm.weight": (N_EMBD,), p + "ssm_in.weight": (N_EMBD, 2 * SSM_INNER),
            p + "ssm_conv1d.weight": (SSM_CONV, SSM_INNER), p + "ssm_conv1d.bias": (SSM_INNER,),
            p + "ssm_x.weight": (SSM_INNER, SSM_DT_RANK + 2 * SSM_STATE), p + "ssm_dt.weight": (SSM_DT_RANK, SSM_INNER),
            p + "ssm_dt.bias": (SSM_INNER,), p + "ssm_a": (SSM_STATE, SSM_INNER), p + "ssm_d": (SSM_INNER,),
            p + "ssm_out.weight": (SSM_INNER, N_EMBD)}


def _mamba2(il: int, norm: bool = True) -> dict[str, tuple[int, ...]]:
    """A Mamba-2 layer: z|x|B|C|dt in one projection, per-head A, D and dt bias, the grouped norm."""
    p = f"blk.{il}."
    conv_dim = SSM_INNER + 2 * SSM_GROUPS * SSM_STATE
    t = {p + "attn_norm.weight": (N_EMBD,), p + "ssm_in.weight": (N_EMBD, SSM_INNER + conv_dim + SSM_HEADS),
         p + "ssm_conv1d.weight": (SSM_CONV, conv_dim), p + "ssm_conv1d.bias": (conv_dim,),
         p + "ssm_dt.bias": (SSM_HEADS,), p + "ssm_a": (1, SSM_HEADS), p + "ssm_d": (1, SSM_HEADS),
         p + "ssm_out.weight": (SSM_INNER, N_EMBD)}
    if norm:
        t[p + "ssm_norm.weight"] = (SSM_INNER // SSM_GROUPS, SSM_GROUPS)
    return t

def _jamba(il: int) -> dict[str, tuple[int, ...]]:
    """Jamba: a Mamba-1 layer with dt/B/C norms and a dense FFN, then an attention layer with experts (the
    FFN length, N_FF_EXP, is the experts')."""
    p = f"blk.{il}."
    if il == 0:
        return _mamba(il) | {p + "ssm_dt_norm.weight": (SSM_DT_RANK,), p + "ssm_b_norm.weight": (SSM_STATE,),
                             p + "ssm_c_norm.weight": (SSM_STATE,), p + "ffn_norm.weight": (N_EMBD,),
                             p + "ffn_gate.weight": (N_EMBD, N_FF_EXP), p + "ffn_up.weight": (N_EMBD, N_FF_EXP),
                             p + "ffn_down.weight": (N_FF_EXP, N_EMBD)}
    return _attn(il) | _moe(il)


SPECS: dict[str, Spec] = {
    "llama": Spec("llama", {"rope.freq_base": 500000.0}, lambda il: _attn(il) | _ffn(il),
                  {"rope_freqs.weight": (HEAD // 2,)}),
    "qwen2": Spec("qwen2", {"rope.freq_base": 1000000.0}, lambda il: _attn(il, bias=True) | _ffn(il), tied=True),
    "qwen3": Spec("qwen3", {"rope.freq_base": 1000000.0}, lambda il: _attn(il, qk_norm=HEAD) | _ffn(il)),
    "gemma": Spec("gemma", {}, lambda il: _attn(il) | _ffn(il), tied=True),
    "gemma2": Spec("gemma2", {"attention.sliding_window": 8, "attn_logit_softcapping": 1.0,
                              "final_logit_softcapping": 2.0},
                   lambda il: _attn(il) | _ffn(il) | _post_norms(il), tied=True),
    "gemma3": Spec("gemma3", {"attention.sliding_window": 8,
                              "attention.sliding_window_pattern": [il % 2 == 0 for il in range(N_LAYER)],
                              "rope.freq_base": 1000000.0},
                   lambda il: _attn(il, qk_norm=HEAD) | _ffn(il) | _post_norms(il), tied=True),
    "granite": Spec("granite", {"logit_scale": 2.5, "residual_scale": 0.4, "embedding_scale": 6.0,
                                "attention.scale": 0.5}, lambda il: _attn(il) | _ffn(il)),
    "olmo2": Spec("olmo2", {"rope.freq_base": 500000.0}, _olmo2),
    "phi3": Spec("phi3", {"rope.scaling.type": "longrope", "rope.scaling.original_context_length": 32,
                          "rope.scaling.attn_factor": 1.19},
                 _phi3, {"rope_factors_long.weight": (HEAD // 2,), "rope_factors_short.weight": (HEAD // 2,)}),
    "starcoder2": Spec("starcoder2", {"rope.freq_base": 100000.0},
                       lambda il: _attn(il, bias=True) | _ffn(il, gate=False) | _biased_norms(il),
                       {"output_norm.bias": (N_EMBD,)}, tied=True),
    "smollm3": Spec("smollm3", {"rope.freq_base": 2000000.0}, lambda il: _attn(il) | _ffn(il), tied=True,
                    n_layer=4),  # layer 3 has no RoPE
    "gpt2": Spec("gpt2", {}, _gpt2, {"output_norm.bias": (N_EMBD,), "position_embd.weight": (N_EMBD, N_CTX)},
                 tied=True),
    "stablelm": Spec("stablelm", {"rope.dimension_count": 4}, _stablelm, {"output_norm.bias": (N_EMBD,)}),
    "qwen3moe": Spec("qwen3moe", MOE_KEYS | {"expert_feed_forward_length": N_FF_EXP},
                     lambda il: _attn(il, qk_norm=HEAD) | _moe(il)),
    "olmoe": Spec("olmoe", MOE_KEYS | {"feed_forward_length": N_FF_EXP}, _olmoe, n_head_kv=N_HEAD),
    "granitemoe": Spec("granitemoe", MOE_KEYS | {"feed_forward_length": N_FF_EXP, "logit_scale": 2.5,
                                                 "residual_scale": 0.4, "embedding_scale": 6.0, "attention.scale": 0.5,
                                                 "expert_shared_feed_forward_length": 32},
                       lambda il: _attn(il) | _moe(il, shared=32), tied=True),
    "mixtral": Spec("llama", MOE_KEYS | {"feed_forward_length": N_FF_EXP}, lambda il: _attn(il) | _moe(il)),
    "gpt-oss": Spec("gpt-oss", MOE_KEYS | {"expert_feed_forward_length": N_FF_EXP, "attention.sliding_window": 8,
                                           "rope.freq_base": 150000.0}, _gpt_oss, quant="mxfp4_moe"),
    # encoders (embeddings, no logits): tests/data/archs/make_embeddings.py
    "bert": Spec("bert", {"attention.causal": False, "pooling_type": 2, "classifier.output_labels": CLS_LABELS},
                 _bert_layer, BERT_GLOBALS, head=False, vocab="bert"),
    "nomic-bert": Spec("nomic-bert", {"attention.causal": False, "pooling_type": 1, "rope.freq_base": 1000.0},
                       lambda il: _bert_layer(il, fused=True, gate=True, biases=False),
                       {k: v for k, v in BERT_GLOBALS.items() if k.startswith(("token_types", "token_embd_norm"))},
                       head=False, vocab="bert"),
    "gemma-embedding": Spec("gemma-embedding",
                            {"attention.sliding_window": 8, "pooling_type": 1, "rope.freq_base": 1000000.0,
                             "attention.sliding_window_pattern": [il % 2 == 0 for il in range(N_LAYER)],
                             "dense_2_feat_in": N_EMBD, "dense_2_feat_out": DENSE_FEAT,
                             "dense_3_feat_in": DENSE_FEAT, "dense_3_feat_out": N_EMBD},
                            lambda il: _attn(il, qk_norm=HEAD) | _ffn(il) | _post_norms(il),
                            {"dense_2.weight": (N_EMBD, DENSE_FEAT), "dense_3.weight": (DENSE_FEAT, N_EMBD)},
                            tied=True),
    "mamba": Spec("mamba", MAMBA_KEYS, _mamba, attention=False, tied=True),
    "mamba2": Spec("mamba2", MAMBA2_KEYS, _mamba2, attention=False),
    "granitehybrid": Spec("granitehybrid", MAMBA2_KEYS | {"logit_scale": 2.5, "residual_scale": 0.4,
                                                          "embedding_scale": 6.0, "attention.scale": 0.25},
                          lambda il: (_attn(il) if il % 4 == 1 else _mamba2(il)) | _ffn(il), n_layer=GH_LAYERS,
                          n_head_kv=[N_HEAD_KV if il % 4 == 1 else 0 for il in range(GH_LAYERS)]),
    "falcon-h1": Spec("falcon-h1", MAMBA2_KEYS | {"rope.freq_base": 10000.0, "attention.key_length": HEAD,
                                                  "attention.value_length": HEAD},
                      lambda il: _mamba2(il) | _attn(il) | _ffn(il, norm=False) | {f"blk.{il}.ffn_norm": (N_EMBD,)}),
    "jamba": Spec("jamba", MAMBA_KEYS | MOE_KEYS | {"feed_forward_length": N_FF_EXP}, _jamba,
                  n_head_kv=[0, N_HEAD_KV]),
}


def tensors(spec: Spec) -> dict[str, tuple[int, ...]]:
    """Every tensor of the model, in file order, as name -> ggml ne."""
    t: dict[str, tuple[int, ...]] = {"token_embd.weight": (N_EMBD, N_VOCAB)}
    if spec.head:
        t["output_norm.weight"] = (N_EMBD,)
    if spec.head and not spec.tied:
        t["output.weight"] = (N_EMBD, N_VOCAB)
    t.update(spec.globals_)
    for il in range(spec.n_layer):
        t.update(spec.layer(il))
    return t


def _value(name: str, ne: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    shape = tuple(reversed(ne))
    if name.startswith(("rope_freqs", "rope_factors")):  # llama3 / LongRoPE: low frequencies stretched
        return np.linspace(1.0, 8.0 if "short" not in name else 2.0, ne[0], dtype=np.float32)
    if name.endswith(".ssm_a"):  # A = -exp(A_log): a decay, as a trained SSM's
        return (-np.exp(0.5 * rng.standard_normal(shape))).astype(np.float32)
    if name.endswith(".bias"):
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    if "norm" in name:
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    return (0.08 * rng.standard_normal(shape)).astype(np.float32)


def write(name: str, path: Path, seed: int = 0) -> Path:
    """Write the tiny model ``name`` (an architecture, or a variant such as mixtral) in F32 to ``path``."""
    spec = SPECS[name]
    arch = spec.arch
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(spec.n_layer)
    if "feed_forward_length" not in spec.keys:
        w.add_feed_forward_length(N_FF if spec.attention else 0)
    w.add_head_count(N_HEAD if spec.attention else 0)
    w.add_head_count_kv(spec.n_head_kv if spec.attention else 0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_layer_norm_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    for key, value in spec.keys.items():
        full = f"{arch}.{key}"
        if isinstance(value, list):
            w.add_array(full, value)
        elif isinstance(value, bool):
            w.add_bool(full, value)
        elif isinstance(value, float):
            w.add_float32(full, value)
        elif isinstance(value, str):
            w.add_string(full, value)
        else:
            w.add_uint32(full, value)
    if spec.vocab == "bert":
        _write_wpm_vocab(w)
    else:
        add_byte_vocab(w)
    write_tensors(w, tensors(spec), _value, rng)
    return path


def add_byte_vocab(w: gguf.GGUFWriter) -> None:
    """The tiny models' byte-level BPE vocabulary: GPT-2's byte tokens and one merged token (so the merge list is
    not empty), BOS 0, EOS 1."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([*BYTE_TO_CHAR[:-1], "ĠĠ"])
    w.add_token_types([gguf.TokenType.NORMAL] * N_VOCAB)
    w.add_token_merges(["Ġ Ġ"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)


def write_tensors(w: gguf.GGUFWriter, shapes: dict[str, tuple[int, ...]],
                  value: Callable[[str, tuple[int, ...], np.random.Generator], np.ndarray],
                  rng: np.random.Generator) -> None:
    """Add each tensor (name -> ggml ne) drawn by ``value``, in order, then write the file and close it."""
    for name, ne in shapes.items():
        w.add_tensor(name, value(name, ne, rng))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


WPM_WORDS = ("the", "is", "on", "of", "and", "to", "in", "cat", "dog", "sat", "mat", "hello", "world", "what",
             "embed", "search", "query", "document", "text", "model", "small", "big", "red", "blue", "sky", "sun",
             "water", "fish", "bird", "tree", "city", "paris", "france", "capital", "food", "good", "bad", "day",
             "night")


def wpm_tokens() -> list[str]:
    """A 256-token WordPiece vocabulary as llama.cpp's converter stores BERT's: words start with U+2581,
    continuations ("##ing") are stored bare; [PAD] [UNK] [CLS] [SEP] [MASK] are ids 0-4."""
    toks = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    toks += ["\u2581" + c for c in "abcdefghijklmnopqrstuvwxyz0123456789.,!?'-:"]
    toks += [*"abcdefghijklmnopqrstuvwxyz", "ing", "ed", "ly", "er"]
    toks += ["\u2581" + w for w in WPM_WORDS]
    toks += [f"[unused{i}]" for i in range(N_VOCAB - len(toks))]
    return toks


def _write_wpm_vocab(w: gguf.GGUFWriter) -> None:
    toks = wpm_tokens()
    special = {t for t in toks if t.startswith("[")}
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in toks])
    w.add_token_type_count(N_TOKEN_TYPES)
    w.add_bos_token_id(2)  # [CLS]
    w.add_sep_token_id(3)
    w.add_unk_token_id(1)
    w.add_pad_token_id(0)
    w.add_mask_token_id(4)
    w.add_add_bos_token(True)
    w.add_add_sep_token(True)
