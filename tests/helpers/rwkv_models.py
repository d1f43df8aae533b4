"""Tiny random-weight RWKV-6 and RWKV-7 GGUF models (and their Qwen2-block variants rwkv6qwen2 and arwkv7),
written with the independent ``gguf`` package.

Each has 2 layers, n_embd 64 in 2 WKV heads of 32 (ggml-cpu's RWKV_WKV7 reads a head in whole steps of
32 floats, so smaller heads would make llama.cpp read past them), an FFN of 96, small LoRA ranks and the
256-token byte-level vocabulary of tests/helpers/arch_models.py. Every tensor and key llama.cpp's loaders
(src/models/rwkv6.cpp, rwkv7.cpp) read is there, with the shapes llama.cpp's converter writes; the
token-shift mixes are drawn in [0, 1] as trained ones are. The files kept in tests/data/archs were written
by tests/data/archs/make_rwkv.py, which also ran llama.cpp on them; tests read the kept files.
"""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np

from helpers.arch_models import add_byte_vocab, write_tensors


def _dims() -> tuple[int, ...]:
    """(n_embd, head_size, n_ff, n_layer): the tiny test sizes, or PYGGML_RWKV_MODEL_DIMS's for speed runs."""
    spec = os.environ.get("PYGGML_RWKV_MODEL_DIMS")
    return tuple(int(v) for v in spec.split(",")) if spec else (64, 32, 96, 2)


N_EMBD, HEAD_SIZE, N_FF, N_LAYER = _dims()
N_VOCAB = 256
#: RWKV-7 LoRA ranks (decay, in-context learning rate, value residual mix, gate)
LORA_DECAY, LORA_ICLR, LORA_VALUE, LORA_GATE = 8, 8, 8, 16
#: RWKV-6's token-shift LoRA (time_mix_extra_dim, per mix) and decay LoRA (time_decay_extra_dim)
TIME_MIX_EXTRA, TIME_DECAY_EXTRA = 8, 16
RESCALE_EVERY = 1


def _common(n: int) -> dict[str, tuple[int, ...]]:
    """The embedding, LN0, the head and each layer's two LayerNorms (all RWKV variants)."""
    t: dict[str, tuple[int, ...]] = {"token_embd.weight": (n, N_VOCAB), "token_embd_norm.weight": (n,),
                                     "token_embd_norm.bias": (n,), "output_norm.weight": (n,),
                                     "output_norm.bias": (n,), "output.weight": (n, N_VOCAB)}
    return t


def _rwkv7_layer(il: int) -> dict[str, tuple[int, ...]]:
    p, n = f"blk.{il}.", N_EMBD
    lora_v = LORA_ICLR if il == 0 else LORA_VALUE  # layer 0's v LoRA is loaded with the iclr rank, and unused
    return {p + "attn_norm.weight": (n,), p + "attn_norm.bias": (n,),
            p + "attn_norm_2.weight": (n,), p + "attn_norm_2.bias": (n,),
            p + "time_mix_w0.weight": (n,), p + "time_mix_w1.weight": (n, LORA_DECAY),
            p + "time_mix_w2.weight": (LORA_DECAY, n),
            p + "time_mix_a0.weight": (n,), p + "time_mix_a1.weight": (n, LORA_ICLR),
            p + "time_mix_a2.weight": (LORA_ICLR, n),
            p + "time_mix_v0.weight": (n,), p + "time_mix_v1.weight": (n, lora_v),
            p + "time_mix_v2.weight": (lora_v, n),
            p + "time_mix_g1.weight": (n, LORA_GATE), p + "time_mix_g2.weight": (LORA_GATE, n),
            p + "time_mix_lerp_fused.weight": (n, 1, 1, 6),
            p + "time_mix_k_k.weight": (n,), p + "time_mix_k_a.weight": (n,), p + "time_mix_r_k.weight": (n,),
            p + "time_mix_key.weight": (n, n), p + "time_mix_value.weight": (n, n),
            p + "time_mix_receptance.weight": (n, n),
            p + "time_mix_ln.weight": (n,), p + "time_mix_ln.bias": (n,), p + "time_mix_output.weight": (n, n),
            p + "channel_mix_lerp_k.weight": (n, 1, 1),
            p + "channel_mix_key.weight": (n, N_FF), p + "channel_mix_value.weight": (N_FF, n)}


def _rwkv6_layer(il: int) -> dict[str, tuple[int, ...]]:
    p, n = f"blk.{il}.", N_EMBD
    return {p + "attn_norm.weight": (n,), p + "attn_norm.bias": (n,),
            p + "attn_norm_2.weight": (n,), p + "attn_norm_2.bias": (n,),
            p + "time_mix_w1.weight": (n, TIME_MIX_EXTRA * 5), p + "time_mix_w2.weight": (TIME_MIX_EXTRA, n, 5),
            p + "time_mix_lerp_x.weight": (n, 1, 1), p + "time_mix_lerp_fused.weight": (n, 1, 1, 5),
            p + "time_mix_first.weight": (HEAD_SIZE, n // HEAD_SIZE), p + "time_mix_decay.weight": (n,),
            p + "time_mix_decay_w1.weight": (n, TIME_DECAY_EXTRA),
            p + "time_mix_decay_w2.weight": (TIME_DECAY_EXTRA, n),
            p + "time_mix_key.weight": (n, n), p + "time_mix_value.weight": (n, n),
            p + "time_mix_receptance.weight": (n, n), p + "time_mix_gate.weight": (n, n),
            p + "time_mix_ln.weight": (n,), p + "time_mix_ln.bias": (n,), p + "time_mix_output.weight": (n, n),
            p + "channel_mix_lerp_k.weight": (n, 1, 1), p + "channel_mix_lerp_r.weight": (n, 1, 1),
            p + "channel_mix_key.weight": (n, N_FF), p + "channel_mix_value.weight": (N_FF, n),
            p + "channel_mix_receptance.weight": (n, n)}


#: rwkv6qwen2's key/value heads (GQA: its K and V are n_head_kv * head_size wide, repeated to the heads)
N_HEAD_KV = 1


def _qwen_ffn(il: int) -> dict[str, tuple[int, ...]]:
    """The Qwen2-style blocks of rwkv6qwen2 and arwkv7 (RMSNorm without bias, SwiGLU FFN)."""
    p, n = f"blk.{il}.", N_EMBD
    return {p + "attn_norm.weight": (n,), p + "ffn_norm.weight": (n,), p + "ffn_gate.weight": (n, N_FF),
            p + "ffn_up.weight": (n, N_FF), p + "ffn_down.weight": (N_FF, n)}


def _rwkv6qwen2_layer(il: int) -> dict[str, tuple[int, ...]]:
    """QRWKV6: no time_mix_first (the GATED_LINEAR_ATTN path), no ln, biased r/k/v, GQA keys and values."""
    p, n, kv = f"blk.{il}.", N_EMBD, N_HEAD_KV * HEAD_SIZE
    t = {k: v for k, v in _rwkv6_layer(il).items()
         if "channel_mix" not in k and "norm" not in k and "time_mix_first" not in k and "time_mix_ln" not in k}
    t |= {p + "time_mix_key.weight": (n, kv), p + "time_mix_value.weight": (n, kv),
          p + "time_mix_key.bias": (kv,), p + "time_mix_value.bias": (kv,), p + "time_mix_receptance.bias": (n,)}
    return t | _qwen_ffn(il)


def _arwkv7_layer(il: int) -> dict[str, tuple[int, ...]]:
    """ARWKV-7: RWKV-7's time mix without the gate (5 mixes) and without ln, a SwiGLU FFN."""
    p = f"blk.{il}."
    t = {k: v for k, v in _rwkv7_layer(il).items()
         if "channel_mix" not in k and "norm" not in k and "_g1" not in k and "_g2" not in k and "time_mix_ln" not in k}
    return t | {p + "time_mix_lerp_fused.weight": (N_EMBD, 1, 1, 5)} | _qwen_ffn(il)


def _keys(arch: str) -> dict[str, int]:
    if arch == "rwkv6qwen2":
        return {"time_mix_extra_dim": TIME_MIX_EXTRA, "time_decay_extra_dim": TIME_DECAY_EXTRA,
                "token_shift_count": 1, "attention.head_count_kv": N_HEAD_KV}
    if arch == "arwkv7":
        return {"attention.decay_lora_rank": LORA_DECAY, "attention.iclr_lora_rank": LORA_ICLR,
                "attention.value_residual_mix_lora_rank": LORA_VALUE, "token_shift_count": 1}
    if arch == "rwkv7":
        return {"attention.decay_lora_rank": LORA_DECAY, "attention.iclr_lora_rank": LORA_ICLR,
                "attention.value_residual_mix_lora_rank": LORA_VALUE, "attention.gate_lora_rank": LORA_GATE}
    return {"time_mix_extra_dim": TIME_MIX_EXTRA, "time_decay_extra_dim": TIME_DECAY_EXTRA,
            "rescale_every_n_layers": RESCALE_EVERY}


LAYERS = {"rwkv7": _rwkv7_layer, "rwkv6": _rwkv6_layer, "rwkv6qwen2": _rwkv6qwen2_layer, "arwkv7": _arwkv7_layer}


def tensors(arch: str) -> dict[str, tuple[int, ...]]:
    t = _common(N_EMBD)
    if arch in ("rwkv6qwen2", "arwkv7"):  # no LN0, an RMSNorm head without bias
        t = {k: v for k, v in t.items() if "token_embd_norm" not in k and k != "output_norm.bias"}
    for il in range(N_LAYER):
        t.update(LAYERS[arch](il))
    return t


def _value(name: str, ne: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    shape = tuple(reversed(ne))
    if "lerp" in name:
        return rng.uniform(0.0, 1.0, shape).astype(np.float32)
    if name.endswith(".bias"):
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    if "norm" in name or "_ln." in name or name.endswith(("k_k.weight", "k_a.weight", "r_k.weight")):
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith(("time_mix_first.weight", "time_mix_decay.weight", "_w0.weight", "_a0.weight",
                      "_v0.weight")):
        return (0.5 * rng.standard_normal(shape)).astype(np.float32)
    if name == "token_embd.weight":
        return (0.5 * rng.standard_normal(shape)).astype(np.float32)
    return (0.2 * rng.standard_normal(shape)).astype(np.float32)


def write(arch: str, path: Path, seed: int = 0) -> Path:
    """Write the tiny ``arch`` model (a key of LAYERS) in F32 to ``path``."""
    if arch not in LAYERS:
        raise ValueError(f"no tiny RWKV model for {arch!r} (have {sorted(LAYERS)})")
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(1048576)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(0)  # as llama.cpp's converter: required, unused (the heads are n_embd / wkv.head_size)
    w.add_layer_norm_eps(1e-5)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_uint32(f"{arch}.wkv.head_size", HEAD_SIZE)
    for key, value in _keys(arch).items():
        w.add_uint32(f"{arch}.{key}", value)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_byte_vocab(w)
    write_tensors(w, tensors(arch), _value, rng)
    return path
