"""A tiny random-weight LFM2 GGUF model, written with the independent ``gguf`` package.

Three layers (a short-conv layer, an attention layer, a short-conv layer: llama.cpp tells them apart by a
per-layer head_count_kv of 0), n_embd 64, 4 query heads and 2 KV heads of 16, a conv window of 3, an FFN
of 96, the output tied to the token embeddings as in Liquid's releases, and the 256-token byte-level vocabulary
of tests/helpers/arch_models.py. The file kept in tests/data/archs was written by
tests/data/archs/make_lfm2.py, which also ran llama.cpp on it.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from helpers.arch_models import add_byte_vocab, write_tensors

N_EMBD, N_HEAD, HEAD, N_FF, L_CACHE, N_VOCAB = 64, 4, 16, 96, 3, 256
#: per layer: 0 marks a short-conv layer
N_HEAD_KV = [0, 2, 0]


def tensors() -> dict[str, tuple[int, ...]]:
    n = N_EMBD
    t: dict[str, tuple[int, ...]] = {"token_embd.weight": (n, N_VOCAB), "token_embd_norm.weight": (n,)}
    for il, n_kv in enumerate(N_HEAD_KV):
        p = f"blk.{il}."
        t |= {p + "attn_norm.weight": (n,), p + "ffn_norm.weight": (n,), p + "ffn_gate.weight": (n, N_FF),
              p + "ffn_up.weight": (n, N_FF), p + "ffn_down.weight": (N_FF, n)}
        if n_kv == 0:
            t |= {p + "shortconv.conv.weight": (L_CACHE, n), p + "shortconv.in_proj.weight": (n, 3 * n),
                  p + "shortconv.out_proj.weight": (n, n)}
        else:
            t |= {p + "attn_q.weight": (n, N_HEAD * HEAD), p + "attn_k.weight": (n, n_kv * HEAD),
                  p + "attn_v.weight": (n, n_kv * HEAD), p + "attn_output.weight": (N_HEAD * HEAD, n),
                  p + "attn_q_norm.weight": (HEAD,), p + "attn_k_norm.weight": (HEAD,)}
    return t


def _value(name: str, ne: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    shape = tuple(reversed(ne))
    if "norm" in name:
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if "shortconv.conv" in name:
        return (0.5 * rng.standard_normal(shape)).astype(np.float32)
    return (0.15 * rng.standard_normal(shape)).astype(np.float32)


def write(path: Path, seed: int = 0) -> Path:
    """Write the tiny LFM2 model in F32 to ``path``."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "lfm2")
    w.add_context_length(256)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(len(N_HEAD_KV))
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_uint32("lfm2.shortconv.l_cache", L_CACHE)
    w.add_vocab_size(N_VOCAB)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_byte_vocab(w)
    write_tensors(w, tensors(), _value, rng)
    return path
