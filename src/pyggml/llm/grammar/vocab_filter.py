"""The grammar's candidate filter over a whole vocabulary (llama_grammar_apply_impl), vectorized.

llama.cpp checks each candidate token by walking its code points down the grammar stacks
(llama_grammar_reject_candidates_for_stack). Done token by token in Python that is seconds for a
262k vocabulary, so here the tokens walk together: at each code point depth, the tokens that
reached the same set of stacks form a group, each stack's char class is matched against the
group's next code points at once (numpy), and the tokens that matched the same stacks move on as
one group to the union of those stacks' successors. The verdicts are llama.cpp's, token for token:
a token passes if some stack takes all its code points (a complete end passes; an unfinished UTF-8
end must be able to complete at a char class; a token element matches on the token id).

The vocabulary's pieces (``token_to_piece(special=True)``, llama.cpp's piece cache) are decoded
once per vocabulary, and a verdict is kept per grammar state, since constrained generation keeps
coming back to the same states (inside a string, between JSON values).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any

import numpy as np

from .engine import _TOKEN, _TOKEN_NOT, NO_PARTIAL, LlamaGrammar, Partial, Stack, decode_utf8

#: grammar states whose vocabulary verdicts are kept
_MASK_CACHE_SIZE = 64


class _Tokens:
    """Candidate tokens as ragged code point arrays: token t's code points are
    ``flat[offs[i]:offs[i] + lens[i]]`` for ``ids[i] == t``, then its unfinished UTF-8 end."""

    def __init__(self, ids: list[int], decoded: list[tuple[list[int], Partial]], by_first: bool = False) -> None:
        if by_first:  # ordered by first code point (-1: none), so that each first code point is one run
            order = sorted(range(len(ids)), key=lambda i: decoded[i][0][0] if decoded[i][0] else -1)
            ids = [ids[i] for i in order]
            decoded = [decoded[i] for i in order]
        self.ids = np.asarray(ids, dtype=np.int64)
        self.lens = np.array([len(c) for c, _ in decoded], dtype=np.int64)
        self.offs = np.zeros(len(decoded), dtype=np.int64)
        if len(decoded) > 1:
            np.cumsum(self.lens[:-1], out=self.offs[1:])
        flat = [cp for c, _ in decoded for cp in c]
        self.flat = np.asarray([*flat, 0], dtype=np.int64)  # one pad for empty vocabularies
        self.pval = np.array([p[0] for _, p in decoded], dtype=np.int64)
        self.prem = np.array([p[1] for _, p in decoded], dtype=np.int64)
        self.first_cps: np.ndarray | None = None
        self.exits: OrderedDict[tuple[Any, ...], np.ndarray] = OrderedDict()  # see _exit_offsets
        if by_first:
            first = np.array([c[0] if c else -1 for c, _ in decoded], dtype=np.int64)
            self.first_cps, self.first_start, counts = np.unique(first, return_index=True, return_counts=True)
            self.first_end = self.first_start + counts


class VocabTable:
    """A vocabulary's pieces, decoded for the grammar filter (built once per vocabulary)."""

    def __init__(self, vocab: Any) -> None:
        n = vocab.n_tokens
        self.n_vocab = n
        self.pieces: list[bytes] = [vocab.token_to_piece(t, special=True) for t in range(n)]
        self.eog = np.zeros(n, dtype=bool)
        for t in vocab.eog_ids:
            if 0 <= t < n:
                self.eog[t] = True
        ids: list[int] = []
        decoded: list[tuple[list[int], Partial]] = []
        cont_first: list[int] = []
        for t, piece in enumerate(self.pieces):
            if self.eog[t] or not piece or piece[0] == 0:
                continue  # EOG is decided apart; an empty piece is always refused
            if piece[0] >> 6 == 2:
                cont_first.append(t)  # invalid from a clean start, may continue a partial character
                continue
            cps, partial = decode_utf8(piece)
            if partial[1] < 0:
                continue  # invalid UTF-8 is refused by every stack
            ids.append(t)
            decoded.append((cps, partial))
        self.fresh = _Tokens(ids, decoded, by_first=True)
        self.cont_first = cont_first


#: id(vocab) -> (a weak reference to it, its table); vocabularies are dataclasses, so unhashable
_tables: dict[int, tuple[weakref.ref[Any], VocabTable]] = {}


def vocab_table(vocab: Any) -> VocabTable:
    """The VocabTable of ``vocab``, built on first use and kept while the vocabulary lives."""
    entry = _tables.get(id(vocab))
    if entry is not None and entry[0]() is vocab:
        return entry[1]
    table = VocabTable(vocab)
    key = id(vocab)
    _tables[key] = (weakref.ref(vocab, lambda _ref: _tables.pop(key, None)), table)
    return table


class VocabFilter:
    """Which tokens of a vocabulary a grammar allows next, with verdicts cached per grammar state."""

    def __init__(self, table: VocabTable) -> None:
        self.table = table
        self._cache: OrderedDict[tuple[tuple[Stack, ...], Partial], np.ndarray] = OrderedDict()

    def cached(self, grammar: LlamaGrammar) -> np.ndarray | None:
        """The mask of :meth:`allowed` if this grammar state's is kept, else None."""
        return self._cache.get((tuple(grammar.stacks), grammar.partial))

    def allowed(self, grammar: LlamaGrammar) -> np.ndarray:
        """A bool mask over the vocabulary: the tokens llama_grammar_apply_impl leaves alone."""
        key = (tuple(grammar.stacks), grammar.partial)
        mask = self._cache.get(key)
        if mask is not None:
            self._cache.move_to_end(key)
            return mask
        t = self.table
        mask = np.zeros(t.n_vocab, dtype=bool)
        if grammar.partial[1] > 0:  # only tokens starting with continuation bytes can go on
            ids, decoded = [], []
            for tok in t.cont_first:
                cps, partial = decode_utf8(t.pieces[tok], grammar.partial)
                if partial[1] >= 0:
                    ids.append(tok)
                    decoded.append((cps, partial))
            tokens = _Tokens(ids, decoded)
        else:
            tokens = t.fresh
        mask[tokens.ids[_walk(grammar, grammar.stacks, tokens)]] = True
        mask[t.eog] = grammar.can_end()
        self._cache[key] = mask
        if len(self._cache) > _MASK_CACHE_SIZE:
            self._cache.popitem(last=False)
        return mask


Work = list[tuple[tuple[Stack, ...], np.ndarray, np.ndarray, np.ndarray]]


def _walk(grammar: LlamaGrammar, stacks: list[Stack], tk: _Tokens) -> np.ndarray:
    """The tokens (positions in ``tk``) that some stack takes whole: llama_grammar_reject_candidates
    inverted, for all tokens at once (see the module docstring).

    A work item is (the stacks, the tokens, where each token's next code point is in ``tk.flat``,
    how many code points each has left); each token is in one item at a time.
    """
    n = tk.ids.size
    ok = np.zeros(n, dtype=bool)
    if n == 0 or not stacks:
        return ok
    types, values = grammar.types, grammar.values
    work: Work = []
    if tk.first_cps is not None:
        _first_step(grammar, tuple(stacks), tk, ok, work)
    else:
        idx = np.arange(n)
        work.append((tuple(stacks), idx, tk.offs.copy(), tk.lens.copy()))
    while work:
        state, idx, pos, left = work.pop()
        ended = left == 0
        if ended.any():
            done = idx[ended]
            rem = tk.prem[done]
            ok[done[rem == 0]] = True  # all code points taken by a live stack: passes
            part = done[rem > 0]
            if part.size:  # an unfinished character: a char class must be able to take it
                for s in state:
                    if s and types[s[-1]] not in (_TOKEN, _TOKEN_NOT):
                        ok[part[grammar.classes[s[-1]].match_partial_many(tk.pval[part], tk.prem[part])]] = True
            keep = ~ended
            idx, pos, left = idx[keep], pos[keep], left[keep]
            if idx.size == 0:
                continue
        char_stacks: list[Stack] = []
        taken = None
        for s in state:
            if not s:
                continue  # an empty stack takes no more code points
            p = s[-1]
            if types[p] in (_TOKEN, _TOKEN_NOT):  # a token element: decided by the token's id
                same = tk.ids[idx] == values[p]
                hit = same if types[p] == _TOKEN else ~same
                ok[idx[hit]] = True
                taken = hit if taken is None else taken | hit
            else:
                char_stacks.append(s)
        if not char_stacks:
            continue
        if taken is not None:
            keep = ~taken
            idx, pos, left = idx[keep], pos[keep], left[keep]
            if idx.size == 0:
                continue
        cps = tk.flat[pos]
        if len(char_stacks) == 1:
            s = char_stacks[0]
            m = grammar.classes[s[-1]].match_many(cps)
            if m.all():
                work.append((grammar.after_match(s), idx, pos + 1, left - 1))
            elif m.any():
                work.append((grammar.after_match(s), idx[m], pos[m] + 1, left[m] - 1))
            continue
        for which, members in _group_by_matches(grammar, char_stacks, cps):
            work.append((_union_after(grammar, char_stacks, which), idx[members], pos[members] + 1,
                         left[members] - 1))
    return ok


def _union_after(grammar: LlamaGrammar, char_stacks: list[Stack], which: list[int]) -> tuple[Stack, ...]:
    """The stacks after a code point matched by the char classes of ``char_stacks[which]``."""
    if len(which) == 1:
        return grammar.after_match(char_stacks[which[0]])
    nxt: list[Stack] = []
    seen: set[Stack] = set()
    for j in which:
        for s2 in grammar.after_match(char_stacks[j]):
            if s2 not in seen:
                seen.add(s2)
                nxt.append(s2)
    return tuple(nxt)


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The positions of the runs [starts[i], ends[i]) concatenated."""
    lengths = ends - starts
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return np.arange(total, dtype=np.int64) + offsets


def _first_step(grammar: LlamaGrammar, state: tuple[Stack, ...], tk: _Tokens, ok: np.ndarray, work: Work) -> None:
    """Depth 0 of _walk over the whole vocabulary, done per distinct first code point: the char
    classes are matched against those (tens of thousands) rather than every token, and the tokens
    of each first code point are one run of ``tk`` (the vocabulary is ordered by first code point)."""
    assert tk.first_cps is not None
    types, values = grammar.types, grammar.values
    firsts, starts, ends = tk.first_cps, tk.first_start, tk.first_end
    has_cp = firsts >= 0
    if not has_cp[0]:  # the tokens without a whole code point: an unfinished character only
        part = np.arange(starts[0], ends[0])
        part = part[tk.prem[part] > 0]
        for s in state:
            if s and types[s[-1]] not in (_TOKEN, _TOKEN_NOT):
                ok[part[grammar.classes[s[-1]].match_partial_many(tk.pval[part], tk.prem[part])]] = True
        firsts, starts, ends = firsts[1:], starts[1:], ends[1:]
    if firsts.size == 0:
        return
    char_stacks: list[Stack] = []
    lo = int(starts[0])
    has_token_element = False
    for s in state:
        if not s:
            continue
        p = s[-1]
        if types[p] in (_TOKEN, _TOKEN_NOT):
            same = tk.ids[lo:] == values[p]
            ok[lo:][same if types[p] == _TOKEN else ~same] = True
            has_token_element = True
        else:
            char_stacks.append(s)
    for which, runs in _group_by_matches(grammar, char_stacks, firsts):
        members = _ranges(starts[runs], ends[runs])
        members = members[~ok[members]]  # taken already by a token element
        nxt = _union_after(grammar, char_stacks, which)
        skip: np.ndarray | int = 1
        if not has_token_element and members.size >= _SKIP_MIN and (nxt == state or set(nxt) == set(state)):
            # back in this state (any character of a JSON string but a quote or a backslash): every
            # following code point matched by the same stacks would bring the token back here again,
            # so it moves on to the first one that is not
            skip = _exit_offsets(grammar, tk, char_stacks, which)[members]
        work.append((nxt, members, tk.offs[members] + skip, tk.lens[members] - skip))


#: a group of tokens at least this big, back in the state it started from, skips ahead (_exit_offsets)
_SKIP_MIN = 4096
#: how many (char classes, matched set) pairs keep their exit offsets
_EXITS_CACHED = 16


def _exit_offsets(grammar: LlamaGrammar, tk: _Tokens, char_stacks: list[Stack], which: list[int]) -> np.ndarray:
    """For each token of ``tk``, the offset of its first code point not matched by exactly the char
    classes ``which`` of ``char_stacks`` (its length if none), kept per set of classes."""
    classes = [grammar.classes[s[-1]] for s in char_stacks]
    key = (tuple((c.positive, c.any, c.starts.tobytes(), c.ends.tobytes()) for c in classes), tuple(which))
    exits = tk.exits.get(key)
    if exits is not None:
        tk.exits.move_to_end(key)
        return exits
    flat = tk.flat[:-1]  # without the pad
    stay = np.ones(flat.size, dtype=bool)
    chosen = set(which)
    for j, c in enumerate(classes):
        m = c.match_many(flat)
        stay &= m if j in chosen else ~m
    leave = np.flatnonzero(~stay)
    token_of = np.searchsorted(tk.offs, leave, side="right") - 1  # offsets ascend: the token of each position
    exits = tk.lens.copy()
    tokens, first = np.unique(token_of, return_index=True)
    exits[tokens] = leave[first] - tk.offs[tokens]
    tk.exits[key] = exits
    if len(tk.exits) > _EXITS_CACHED:
        tk.exits.popitem(last=False)
    return exits


def _group_by_matches(grammar: LlamaGrammar, char_stacks: list[Stack],
                      cps: np.ndarray) -> list[tuple[list[int], np.ndarray]]:
    """Split code points by the set of stacks whose char class matches them: (the stacks' indices,
    the code points' positions) for each non-empty set."""
    matches = [grammar.classes[s[-1]].match_many(cps) for s in char_stacks]
    if len(matches) <= 62:  # the set as the bits of an int64, grouped by counting
        key = np.zeros(cps.shape, dtype=np.int64)
        for j, m in enumerate(matches):
            key |= m.astype(np.int64) << j
        if len(matches) <= 16:
            present = np.flatnonzero(np.bincount(key, minlength=1))
        else:
            present = np.unique(key)
        return [([j for j in range(len(matches)) if (int(v) >> j) & 1], np.flatnonzero(key == v))
                for v in present if v]
    mat = np.stack(matches)
    packed = np.ascontiguousarray(np.packbits(mat, axis=0).T)
    keys = packed.view(np.dtype((np.void, packed.shape[1]))).ravel()
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    return [(list(np.flatnonzero(mat[:, f])), np.flatnonzero(inverse == g))
            for g, f in enumerate(first) if mat[:, f].any()]


__all__ = ["NO_PARTIAL", "VocabFilter", "VocabTable", "vocab_table"]
