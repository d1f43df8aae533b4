"""Batches as llama.cpp's ``llama_batch``: tokens (or embedding rows) with positions, sequence ids and
output flags, checked and completed as ``llama_batch_allocr::init`` does, then cut into ubatches.

Missing fields are filled as llama.cpp fills them: sequence id 0; positions continuing each token's
first sequence from the memory's last position; logits for the last token only. A batch that breaks
a rule raises :class:`DecodeError` naming the token and the rule: a token id out of the vocabulary, a
sequence id of n_seq_max or more, a sequence whose positions do not continue its cached ones or are
not contiguous, decreasing positions, tokens whose sequence sets overlap only in part, coupled
sequences (tokens shared by several) whose cached ranges have diverged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import PyGGMLError


class DecodeError(PyGGMLError):
    """A batch that cannot be decoded (bad token ids, positions, sequence ids, too many tokens)."""


@dataclass
class Batch:
    """llama_batch. Give ``token`` (ids) or ``embd`` (rows of n_embd floats); the rest is optional."""

    token: Sequence[int] | np.ndarray | None = None
    embd: np.ndarray | None = None
    pos: Sequence[int] | np.ndarray | None = None
    seq_id: Sequence[Sequence[int] | int] | None = None
    logits: Sequence[bool] | np.ndarray | None = None

    @property
    def n_tokens(self) -> int:
        if self.token is not None:
            return len(self.token)
        return 0 if self.embd is None else int(np.asarray(self.embd).shape[0])


def batch_get_one(tokens: Sequence[int]) -> Batch:
    """llama_batch_get_one: tokens of sequence 0 continuing the cache, logits for the last one."""
    return Batch(token=list(tokens))


@dataclass
class PreparedBatch:
    """A checked, completed batch (what llama_batch_allocr holds)."""

    token: np.ndarray | None  # int32 [n]
    embd: np.ndarray | None  # float32 [n, n_embd]
    pos: np.ndarray  # int64 [n]
    seq_mask: np.ndarray  # uint64 [n]: bit s set when the token belongs to sequence s
    seq_first: np.ndarray  # int64 [n]: each token's first sequence id (its mask row follows it)
    output: np.ndarray  # bool [n]
    seqs: list[int] = field(default_factory=list)  # the sequences in the batch, ascending
    index: np.ndarray | None = None  # int64 [n]: each token's index in the user's batch
    n_seqs: int = 1  # equal runs of tokens, one per sequence set (split_equal); 1 otherwise

    def __post_init__(self) -> None:
        if self.index is None:
            self.index = np.arange(self.pos.size, dtype=np.int64)

    @property
    def n_tokens(self) -> int:
        return int(self.pos.size)

    @property
    def n_outputs(self) -> int:
        return int(self.output.sum())

    def take(self, idx: np.ndarray | slice, n_seqs: int = 1) -> PreparedBatch:
        """The ubatch of tokens ``idx`` (llama_batch_allocr::ubatch_add), in that order."""
        union = int(np.bitwise_or.reduce(self.seq_mask[idx]))
        seqs = [s for s in self.seqs if union >> s & 1]
        return PreparedBatch(None if self.token is None else self.token[idx],
                             None if self.embd is None else self.embd[idx], self.pos[idx], self.seq_mask[idx],
                             self.seq_first[idx], self.output[idx], seqs, self.index[idx], n_seqs)


def prepare(batch: Batch, n_vocab: int, n_embd: int, n_seq_max: int, seq_pos_min: Callable[[int], int],
            seq_pos_max: Callable[[int], int], output_all: bool = False) -> PreparedBatch:
    """Check ``batch`` against the vocabulary, n_seq_max and the memory's positions; fill what is missing."""
    n = batch.n_tokens
    if n == 0:
        raise DecodeError("decode: the batch is empty")
    token = embd = None
    if batch.token is not None and batch.embd is not None:
        raise DecodeError("decode: give a batch either token ids or embeddings, not both")
    if batch.token is not None:
        token = np.asarray(batch.token, dtype=np.int64).reshape(-1)
        bad = np.flatnonzero((token < 0) | (token >= n_vocab))
        if bad.size:
            i = int(bad[0])
            raise DecodeError(f"decode: invalid token[{i}] = {int(token[i])}: ids are 0 to {n_vocab - 1}")
        token = token.astype(np.int32)
    elif batch.embd is not None:
        embd = np.ascontiguousarray(batch.embd, dtype=np.float32)
        if embd.ndim != 2 or embd.shape[1] != n_embd:
            raise DecodeError(f"decode: embeddings must be rows of n_embd = {n_embd} floats, got shape {embd.shape}")
    else:
        raise DecodeError("decode: the batch has neither token ids nor embeddings")
    # sequence ids
    seq_lists: list[list[int]] = []
    if batch.seq_id is None:
        seq_lists = [[0]] * n
    else:
        if len(batch.seq_id) != n:
            raise DecodeError(f"decode: seq_id has {len(batch.seq_id)} entries for {n} tokens")
        for i, sids in enumerate(batch.seq_id):
            ids = [int(sids)] if isinstance(sids, int | np.integer) else [int(s) for s in sids]
            if not ids:
                raise DecodeError(f"decode: token {i} belongs to no sequence (seq_id[{i}] is empty)")
            for k, s in enumerate(ids):
                if not 0 <= s < n_seq_max:
                    raise DecodeError(f"decode: invalid seq_id[{i}][{k}] = {s} >= n_seq_max = {n_seq_max}"
                                      if s >= 0 else f"decode: invalid seq_id[{i}][{k}] = {s} (negative)")
            seq_lists.append(ids)
    seq_first = np.array([ids[0] for ids in seq_lists], dtype=np.int64)
    seq_mask = np.array([sum(1 << s for s in set(ids)) for ids in seq_lists], dtype=np.uint64)
    # positions: given, or continuing each token's first sequence
    if batch.pos is None:
        nxt = {s: seq_pos_max(s) + 1 for s in set(seq_first.tolist())}
        pos = np.empty(n, dtype=np.int64)
        for i, s in enumerate(seq_first.tolist()):
            pos[i] = nxt[s]
            nxt[s] += 1
    else:
        pos = np.asarray(batch.pos, dtype=np.int64).reshape(-1)
        if pos.size != n:
            raise DecodeError(f"decode: pos has {pos.size} entries for {n} tokens")
    # outputs
    if batch.logits is None:
        output = np.zeros(n, dtype=bool)
        output[-1] = True
    else:
        output = np.asarray(batch.logits, dtype=bool).reshape(-1)
        if output.size != n:
            raise DecodeError(f"decode: logits has {output.size} entries for {n} tokens")
    if output_all:
        output = np.ones(n, dtype=bool)
    seqs = sorted({s for ids in seq_lists for s in ids})
    _check_positions(pos, seq_lists, seqs, seq_pos_min, seq_pos_max)
    return PreparedBatch(token, embd, pos, seq_mask, seq_first, output, seqs)


def _check_positions(pos: np.ndarray, seq_lists: list[list[int]], seqs: list[int],
                     seq_pos_min: Callable[[int], int], seq_pos_max: Callable[[int], int]) -> None:
    """llama_batch_allocr's consistency checks (llama-batch.cpp: non-M-RoPE branch and after)."""
    by_seq: dict[int, set[int]] = {s: set() for s in seqs}
    coupled: set[tuple[int, int]] = set()
    for i, ids in enumerate(seq_lists):
        for k, s in enumerate(ids):
            by_seq[s].add(int(pos[i]))
            if k > 0:
                coupled.add((s, ids[0]))
    for s in seqs:
        ps = by_seq[s]
        lo, hi = min(ps), max(ps)
        p0 = seq_pos_max(s)
        if p0 >= 0 and lo != p0 + 1:
            raise DecodeError(
                f"decode: the tokens of sequence {s} have inconsistent positions: the cache's last position for "
                f"sequence {s} is X = {p0}, the batch starts it at Y = {lo}; positions must continue: Y = X + 1")
        if hi - lo + 1 > len(ps):
            raise DecodeError(f"decode: sequence {s} positions are not continuous ({lo} to {hi}, {len(ps)} given)")
    for s0, s1 in coupled:
        if seq_pos_min(s0) != seq_pos_min(s1) or seq_pos_max(s0) != seq_pos_max(s1):
            raise DecodeError(f"decode: sequence {s0} is coupled to {s1} in the batch, but their cached "
                              "positions have diverged")
    full = (1 << 64) - 1
    cur_set = dict.fromkeys(seqs, full)
    cur_pos = dict.fromkeys(seqs, -1)
    for i, ids in enumerate(seq_lists):
        mask = sum(1 << s for s in set(ids))
        for s in ids:
            cur_set[s] &= mask
            if cur_set[s] == 0:
                raise DecodeError(f"decode: sequence {s} belongs to incompatible sequence sets (token {i})")
            if pos[i] < cur_pos[s]:
                raise DecodeError(f"decode: sequence {s} positions are decreasing at token {i}")
            cur_pos[s] = int(pos[i])


def split_simple(batch: PreparedBatch, n_ubatch: int) -> list[PreparedBatch]:
    """llama_batch_allocr::split_simple: consecutive tokens, at most n_ubatch each (the unified cache's split)."""
    return [batch.take(slice(s, min(s + n_ubatch, batch.n_tokens))) for s in range(0, batch.n_tokens, n_ubatch)]


def split_equal(batch: PreparedBatch, n_ubatch: int, sequential: bool) -> list[PreparedBatch]:
    """llama_batch_allocr::split_equal: each ubatch takes the same number of tokens from each of several
    disjoint sequence sets (with ``sequential``, sets whose first ids count up by one: consecutive
    streams), as many as fit n_ubatch, and lists them set after set. The split of caches with a
    stream per sequence, whose attention then runs stream by stream."""
    masks = batch.seq_mask.tolist()
    first = batch.seq_first.tolist()
    if sequential:
        for i, m in enumerate(masks):
            if m & (m - 1):
                raise DecodeError(f"decode: token {i} belongs to several sequences, which a KV cache with a stream "
                                  "per sequence cannot hold (use a unified KV cache)")
    by_set: dict[int, list[int]] = {}
    for i, m in enumerate(masks):
        by_set.setdefault(m, []).append(i)
    n = len(masks)
    used = np.zeros(n, dtype=bool)
    n_used = 0
    out = []
    while n_used < n:
        cur: list[int] = []
        last = -1
        for i in range(n):  # the sequence sets of this ubatch
            if used[i] or any(masks[i] & c for c in cur):
                continue
            if sequential and cur and first[i] != last + 1:
                continue
            cur.append(masks[i])
            last = first[i]
            if len(cur) > n_ubatch:
                break
        pending = [[j for j in by_set[m] if not used[j]] for m in cur]
        take = len(pending[0])
        for p in pending:
            take = min(take, len(p))
        take = max(1, min(take, n_ubatch // len(cur)))  # (k + 1) * n_seqs > n_ubatch stops at k
        idx = np.concatenate([np.asarray(p[:take], dtype=np.int64) for p in pending])
        used[idx] = True
        n_used += idx.size
        out.append(batch.take(idx, len(cur)))
    return out


def split_seq(batch: PreparedBatch, n_ubatch: int) -> list[PreparedBatch]:
    """llama_batch_allocr::split_seq: from the first unused token, take tokens in batch order whose sequence
    set is a subset of the last one taken (a shared prompt, then one of its sequences), up to n_ubatch.

    llama.cpp splits this way for recurrent and hybrid memories, whose state is per sequence; pyggml's
    architectures all use KV caches (split_simple / split_equal), so nothing in the runner calls it.
    """
    masks = batch.seq_mask.tolist()
    n = len(masks)
    used = [False] * n
    out = []
    start = 0
    while True:
        while start < n and used[start]:
            start += 1
        if start >= n:
            return out
        cur, cur_set, idxs = start, masks[start], []
        while True:
            idxs.append(cur)
            used[cur] = True
            if len(idxs) >= n_ubatch:
                break
            cur += 1
            while cur < n and (used[cur] or cur_set & masks[cur] != masks[cur]):
                cur += 1
            if cur == n:
                break
            cur_set = masks[cur]
        out.append(batch.take(np.asarray(idxs, dtype=np.int64), 1))
