"""The inputs of encoder graphs and pooled embeddings, and what llama.cpp's tools do with the vectors.

``no_cache_mask`` is llm_graph_input_attn_no_cache's mask (a model without memory attends over the
ubatch's own tokens); ``mean_weights`` and ``pooled_rows`` are the ``mean`` and ``cls`` inputs of
build_pooling; ``embd_normalize`` and ``similarity_cos`` are common.cpp's common_embd_normalize and
common_embd_similarity_cos, as llama-embedding applies them.
"""

from __future__ import annotations

import numpy as np

from .hparams import PoolingType


def no_cache_mask(pos: np.ndarray, seq_first: np.ndarray, causal: bool, n_swa: int = 0,
                  swa_type: str = "standard") -> np.ndarray:
    """[n_tokens, n_tokens] float32, row i1 the query token, column i0 the key token: 0 where i1 may attend
    to i0 (same first sequence; not in its future when causal; inside the sliding window when n_swa > 0),
    -inf elsewhere."""
    p1, p0 = pos[:, None].astype(np.int64), pos[None, :].astype(np.int64)
    ok = seq_first[:, None] == seq_first[None, :]
    if causal:
        ok &= p0 <= p1
    if n_swa > 0:
        d = p1 - p0
        if swa_type == "symmetric":  # a window of n_swa/2 on each side
            ok &= np.abs(d) <= n_swa // 2
        elif swa_type == "standard":
            ok &= d < n_swa
        else:
            raise ValueError(f"unknown sliding-window type {swa_type!r}")
    return np.where(ok, np.float32(0.0), np.float32(-np.inf)).astype(np.float32)


def seq_index(seq_mask: np.ndarray, seqs: list[int]) -> np.ndarray:
    """[n_seqs, n_tokens] bool: whether each token belongs to each of ``seqs`` (its sequence set's bits)."""
    bits = np.asarray(seqs, dtype=np.uint64)[:, None]
    return (seq_mask[None, :].astype(np.uint64) >> bits) & np.uint64(1) == 1


def mean_weights(seq_mask: np.ndarray, seqs: list[int]) -> np.ndarray:
    """llm_graph_input_mean: [n_seqs, n_tokens] float32 (ggml's [n_tokens, n_seqs]), 1/count at the tokens of
    each sequence, so that mul_mat with the transposed hidden states gives each sequence's mean."""
    member = seq_index(seq_mask, seqs)
    counts = member.sum(axis=1, keepdims=True)
    return np.where(member, 1.0 / np.maximum(counts, 1), 0.0).astype(np.float32)


def pooled_rows(seq_mask: np.ndarray, seqs: list[int], pos: np.ndarray, last: bool) -> np.ndarray:
    """llm_graph_input_cls: int32 [n_seqs], the row of each sequence's first-position token (its CLS token)
    or, with ``last``, of its last-position token (ties: the first such row for first, the last for last)."""
    member = seq_index(seq_mask, seqs)
    rows = np.zeros(len(seqs), dtype=np.int32)
    p = pos.astype(np.int64)
    for s in range(len(seqs)):
        idx = np.flatnonzero(member[s])
        if idx.size:
            ps = p[idx]
            rows[s] = idx[len(ps) - 1 - int(np.argmax(ps[::-1]))] if last else idx[int(np.argmin(ps))]
    return rows


def pools_last(pooling: PoolingType, causal: bool) -> bool:
    """Whether pooling takes each sequence's last token: LAST, or RANK with causal attention."""
    return pooling is PoolingType.LAST or (pooling is PoolingType.RANK and causal)


def embd_normalize(x: np.ndarray, norm: int) -> np.ndarray:
    """common_embd_normalize over the last axis: -1 none, 0 max-absolute scaled to int16 range (32760),
    2 euclidean, any other p the p-norm (1: taxicab); sums in double as llama.cpp; a zero vector stays 0."""
    v = np.asarray(x, dtype=np.float32)
    a = v.astype(np.float64)
    if norm == -1:
        s = np.ones((*a.shape[:-1], 1))
    elif norm == 0:
        s = np.abs(a).max(axis=-1, keepdims=True) / 32760.0
    elif norm == 2:
        s = np.sqrt((a * a).sum(axis=-1, keepdims=True))
    else:
        s = (np.abs(a) ** norm).sum(axis=-1, keepdims=True) ** (1.0 / norm)
    scale = np.where(s > 0.0, 1.0 / np.where(s > 0.0, s, 1.0), 0.0).astype(np.float32)
    return (v * scale).astype(np.float32)


def similarity_cos(a: np.ndarray, b: np.ndarray) -> float:
    """common_embd_similarity_cos: the cosine of two vectors; 1 for two zero vectors, 0 for one."""
    a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    s1, s2 = float((a64 * a64).sum()), float((b64 * b64).sum())
    if s1 == 0.0 or s2 == 0.0:
        return 1.0 if s1 == s2 else 0.0
    return float((a64 * b64).sum() / (np.sqrt(s1) * np.sqrt(s2)))
