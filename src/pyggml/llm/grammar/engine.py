"""llama.cpp's grammar engine (``struct llama_grammar``): pushdown stacks advanced over code points.

A stack is a tuple of element positions in the flattened rules, its top last; every stack kept
sits at a terminal (a char class or a token element) or is empty (the root rule is complete).
Accepting a code point replaces each stack by the stacks that follow the match
(``llama_grammar_accept``); accepting a token's piece does so per code point, carrying an
unfinished UTF-8 sequence over to the next token (``llama_partial_utf8``). Which tokens may come
next is answered for one token (:meth:`LlamaGrammar.token_allowed`, the cheap check on the sampled
token) or for a whole vocabulary at once (:mod:`.vocab_filter`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .parser import GrammarError, GrammarParser, GreType, Rule

Stack = tuple[int, ...]
#: llama_partial_utf8: (bits so far, bytes still to come); n_remain -1 marks an invalid sequence
Partial = tuple[int, int]
NO_PARTIAL: Partial = (0, 0)

_END, _ALT, _REF = int(GreType.END), int(GreType.ALT), int(GreType.RULE_REF)
_CHAR, _CHAR_NOT, _RNG, _CHAR_ALT, _ANY = (int(GreType.CHAR), int(GreType.CHAR_NOT), int(GreType.CHAR_RNG_UPPER),
                                           int(GreType.CHAR_ALT), int(GreType.CHAR_ANY))
_TOKEN, _TOKEN_NOT = int(GreType.TOKEN), int(GreType.TOKEN_NOT)
_TERMINALS = frozenset({_CHAR, _CHAR_NOT, _ANY, _TOKEN, _TOKEN_NOT})
#: stacks memoized by advance() before the memo is dropped (deeply nested grammars make many)
_ADVANCE_MEMO_MAX = 200_000

#: code points below this are matched through a table per char class
_LUT_SIZE = 0x10000

_UTF8_LEN = (1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4)  # by the high nibble of a first byte


def decode_utf8(piece: bytes, partial: Partial = NO_PARTIAL) -> tuple[list[int], Partial]:
    """llama.cpp's decode_utf8(string, partial_start): the complete code points of ``piece``
    (continuing ``partial``) and the unfinished sequence at its end.

    As in llama.cpp the bytes end at a NUL, continuation bytes are not checked after a first byte
    (only when continuing a previous token's sequence), and an invalid sequence gives no code
    points and n_remain -1.
    """
    nul = piece.find(0)
    if nul >= 0:
        piece = piece[:nul]
    value, n_remain = partial
    if n_remain <= 0 and piece:
        try:  # the common case: whole, valid UTF-8 decodes the same either way
            text = piece.decode("utf-8")
            return [ord(ch) for ch in text], NO_PARTIAL
        except UnicodeDecodeError:
            pass
    cps: list[int] = []
    pos, n = 0, len(piece)
    while pos < n and n_remain > 0:
        b = piece[pos]
        if b >> 6 != 2:
            return [], (0, -1)
        value = (value << 6) + (b & 0x3F)
        pos += 1
        n_remain -= 1
    if partial[1] > 0 and n_remain == 0:
        cps.append(value)
    while pos < n:
        b = piece[pos]
        n_remain = _UTF8_LEN[b >> 4] - 1
        if n_remain < 0:
            return [], (0, -1)
        value = b & ((1 << (7 - n_remain)) - 1)
        pos += 1
        while pos < n and n_remain > 0:
            value = (value << 6) + (piece[pos] & 0x3F)
            pos += 1
            n_remain -= 1
        if n_remain == 0:
            cps.append(value)
    return cps, ((value, n_remain) if n_remain > 0 else (0, n_remain))


@dataclass(frozen=True)
class CharClass:
    """A char element and its CHAR_ALT / CHAR_RNG_UPPER followers, as sorted disjoint intervals."""

    positive: bool  # CHAR or CHAR_ANY (False: CHAR_NOT)
    any: bool  # "."
    starts: np.ndarray  # int64, the merged intervals' first code points
    ends: np.ndarray  # int64, their last code points (inclusive)
    after: int  # the position after the class

    def match(self, cp: int) -> bool:
        """llama_grammar_match_char(...).first."""
        if self.any:
            return True
        i = int(np.searchsorted(self.starts, cp, side="right")) - 1
        found = i >= 0 and cp <= self.ends[i]
        return found == self.positive

    def match_partial(self, partial: Partial) -> bool:
        """llama_grammar_match_partial_char: could some completion of ``partial`` match?"""
        value, n_remain = partial
        if n_remain < 0 or (n_remain == 1 and value < 2):  # invalid, or an overlong 7-bit char
            return False
        low = value << (n_remain * 6)
        high = low | ((1 << (n_remain * 6)) - 1)
        if low == 0:
            low = {2: 1 << 11, 3: 1 << 16}.get(n_remain, low)
        if self.any:
            return True
        j = int(np.searchsorted(self.starts, high, side="right")) - 1
        overlap = j >= 0 and self.ends[j] >= low
        return self.positive if overlap else not self.positive

    def match_many(self, cps: np.ndarray) -> np.ndarray:
        """match() over an array of code points (through a table of the BMP, built on first use)."""
        if self.any:
            return np.ones(cps.shape, dtype=bool)
        lut = self.__dict__.get("_lut")
        if lut is None:
            lut = np.zeros(_LUT_SIZE + 1, dtype=bool)
            for lo, hi in zip(self.starts.tolist(), self.ends.tolist(), strict=True):
                if lo < _LUT_SIZE:
                    lut[lo:min(hi, _LUT_SIZE - 1) + 1] = True
            if not self.positive:
                lut = ~lut
            object.__setattr__(self, "_lut", lut)
        out = lut[np.minimum(cps, _LUT_SIZE)]
        big = cps >= _LUT_SIZE
        if big.any():  # past the BMP: the intervals
            c = cps[big]
            i = np.searchsorted(self.starts, c, side="right") - 1
            found = (i >= 0) & (c <= self.ends[np.maximum(i, 0)])
            out[big] = found if self.positive else ~found
        return out

    def match_partial_many(self, values: np.ndarray, n_remain: np.ndarray) -> np.ndarray:
        """match_partial() over arrays of partial sequences (n_remain > 0)."""
        shift = n_remain.astype(np.int64) * 6
        low = values.astype(np.int64) << shift
        high = low | ((np.int64(1) << shift) - 1)
        low = np.where((low == 0) & (n_remain == 2), 1 << 11, np.where((low == 0) & (n_remain == 3), 1 << 16, low))
        valid = ~((n_remain == 1) & (values < 2))
        if self.any:
            return valid
        j = np.searchsorted(self.starts, high, side="right") - 1
        overlap = (j >= 0) & (self.ends[np.maximum(j, 0)] >= low)
        return valid & (overlap if self.positive else ~overlap)


class LlamaGrammar:
    """Parsed rules, flattened, and the current stacks and partial UTF-8 sequence."""

    def __init__(self, rules: list[Rule], start_rule: int, symbol_ids: dict[str, int] | None = None) -> None:
        self.symbol_ids = dict(symbol_ids or {})
        self.rules = [list(r) for r in rules]
        for i, r in enumerate(self.rules):
            if not r or r[-1][0] != _END:
                self.rules[i] = [*r, (GreType.END, 0)]
        _check_refs(self.rules)
        _check_left_recursion(self.rules)
        self.types: list[int] = []
        self.values: list[int] = []
        self.rule_start: list[int] = []
        for r in self.rules:
            self.rule_start.append(len(self.types))
            self.types += [int(t) for t, _ in r]
            self.values += [int(v) for _, v in r]
        # the END/ALT that closes the alternate each position is in
        self.seq_end = [0] * len(self.types)
        nxt = len(self.types)
        for p in range(len(self.types) - 1, -1, -1):
            if self.types[p] in (_END, _ALT):
                nxt = p
            self.seq_end[p] = nxt
        self.classes: dict[int, CharClass] = {p: self._char_class(p) for p, t in enumerate(self.types)
                                              if t in (_CHAR, _CHAR_NOT, _ANY)}
        self._advance_memo: dict[Stack, tuple[Stack, ...]] = {}
        self.start_rule = start_rule
        self.stacks: list[Stack] = self.initial_stacks()
        self.partial: Partial = NO_PARTIAL

    @classmethod
    def from_text(cls, text: str, root: str = "root",
                  tokenize: Callable[[str], list[int]] | None = None) -> LlamaGrammar:
        """llama_grammar_init_impl from GBNF text: parse, find ``root``, check, build the stacks
        (``tokenize`` turns ``<name>`` token references into ids)."""
        parser = GrammarParser(tokenize)
        parser.parse(text)
        if not parser.rules:
            raise GrammarError("failed to parse grammar (it has no rules)")
        if root not in parser.symbol_ids:
            raise GrammarError(f"grammar does not contain a '{root}' symbol")
        return cls(parser.rules, parser.symbol_ids[root], parser.symbol_ids)

    def _char_class(self, p: int) -> CharClass:
        t = self.types
        positive = t[p] in (_CHAR, _ANY)
        is_any = False
        intervals: list[tuple[int, int]] = []
        while True:
            if t[p + 1] == _RNG:
                intervals.append((self.values[p], self.values[p + 1]))
                p += 2
            elif t[p] == _ANY:
                is_any = True
                p += 1
            else:
                intervals.append((self.values[p], self.values[p]))
                p += 1
            if t[p] != _CHAR_ALT:
                break
        merged: list[list[int]] = []
        for lo, hi in sorted(iv for iv in intervals if iv[0] <= iv[1]):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        starts = np.array([m[0] for m in merged], dtype=np.int64)
        ends = np.array([m[1] for m in merged], dtype=np.int64)
        return CharClass(positive, is_any, starts, ends, p)

    def is_end_of_sequence(self, p: int) -> bool:
        return self.types[p] in (_END, _ALT)

    def initial_stacks(self) -> list[Stack]:
        """The stacks of the start rule's alternates, each advanced to a terminal."""
        out: list[Stack] = []
        seen: set[Stack] = set()
        p = self.rule_start[self.start_rule]
        while True:
            for s in self.advance(() if self.is_end_of_sequence(p) else (p,)):
                if s not in seen:
                    seen.add(s)
                    out.append(s)
            p = self.seq_end[p]
            if self.types[p] != _ALT:
                break
            p += 1
        return out

    def advance(self, stack: Stack) -> tuple[Stack, ...]:
        """llama_grammar_advance_stack: expand rule references at the top until every stack sits at
        a terminal (or is empty)."""
        memo = self._advance_memo.get(stack)
        if memo is not None:
            return memo
        types, values, seq_end, rule_start = self.types, self.values, self.seq_end, self.rule_start
        out: list[Stack] = []
        found: set[Stack] = set()
        seen: set[Stack] = set()
        todo = [stack]
        while todo:
            cur = todo.pop()
            if cur in seen:
                continue
            seen.add(cur)
            if not cur:
                if cur not in found:
                    found.add(cur)
                    out.append(cur)
                continue
            p = cur[-1]
            kind = types[p]
            if kind == _REF:
                base = cur[:-1] if types[p + 1] in (_END, _ALT) else (*cur[:-1], p + 1)
                sub = rule_start[values[p]]
                while True:
                    todo.append(base if types[sub] in (_END, _ALT) else (*base, sub))
                    sub = seq_end[sub]
                    if types[sub] != _ALT:
                        break
                    sub += 1
            elif kind in _TERMINALS:
                if cur not in found:
                    found.add(cur)
                    out.append(cur)
            else:
                raise AssertionError(f"grammar stack left on element type {kind}")
        result = tuple(out)
        if len(self._advance_memo) >= _ADVANCE_MEMO_MAX:
            self._advance_memo.clear()
        self._advance_memo[stack] = result
        return result

    def after_match(self, stack: Stack) -> tuple[Stack, ...]:
        """The stacks after the char class on top of ``stack`` has matched a code point."""
        after = self.classes[stack[-1]].after
        rest = stack[:-1] if self.types[after] in (_END, _ALT) else (*stack[:-1], after)
        return self.advance(rest)

    def after_token(self, stack: Stack) -> tuple[Stack, ...]:
        p = stack[-1] + 1
        return self.advance(stack[:-1] if self.types[p] in (_END, _ALT) else (*stack[:-1], p))

    def match_token(self, p: int, token: int) -> bool:
        return (self.values[p] == token) == (self.types[p] == _TOKEN)

    # ---- accepting ----------------------------------------------------------------------------

    def _accept_chr(self, stack: Stack, cp: int, out: list[Stack], found: set[Stack]) -> None:
        """llama_grammar_accept_chr: the stacks that follow ``stack`` after ``cp``, added to ``out``."""
        if not stack:
            return
        p = stack[-1]
        if self.types[p] in (_TOKEN, _TOKEN_NOT):
            return
        if self.classes[p].match(cp):
            for s in self.after_match(stack):
                if s not in found:
                    found.add(s)
                    out.append(s)

    def accept_chr(self, cp: int) -> None:
        """llama_grammar_accept: advance every stack over one code point (stacks may run out)."""
        out: list[Stack] = []
        found: set[Stack] = set()
        for stack in self.stacks:
            self._accept_chr(stack, cp, out, found)
        self.stacks = out

    def accept_token(self, token: int, piece: bytes) -> None:
        """llama_grammar_accept_token: advance over a token (its id for token elements, its piece's
        code points for char elements); raises GrammarError if no stack survives."""
        cps, partial = decode_utf8(piece, self.partial)
        out: list[Stack] = []
        found: set[Stack] = set()
        for stack in self.stacks:
            if not stack:
                continue
            p = stack[-1]
            if self.types[p] in (_TOKEN, _TOKEN_NOT):
                if self.match_token(p, token):
                    for s in self.after_token(stack):
                        if s not in found:
                            found.add(s)
                            out.append(s)
                continue
            current = [stack]
            for cp in cps:
                nxt: list[Stack] = []
                seen: set[Stack] = set()
                for cur in current:
                    self._accept_chr(cur, cp, nxt, seen)
                current = nxt
                if not current:
                    break
            for s in current:
                if s not in found:
                    found.add(s)
                    out.append(s)
        self.stacks = out
        self.partial = partial
        if not out:
            text = piece.decode("utf-8", "replace")
            raise GrammarError(f"Unexpected empty grammar stack after accepting piece: {text} ({token})")

    def accept_str(self, piece: bytes) -> None:
        """llama_grammar_accept_str: advance over a string's code points (no token elements)."""
        cps, partial = decode_utf8(piece, self.partial)
        for cp in cps:
            self.accept_chr(cp)
        self.partial = partial
        if not self.stacks:
            raise GrammarError(f"Unexpected empty grammar stack after accepting piece: "
                               f"{piece.decode('utf-8', 'replace')}")

    def can_end(self) -> bool:
        """Some stack is empty: the root rule may be complete here (llama.cpp's allow_eog)."""
        return any(not s for s in self.stacks)

    # ---- the candidate check for one token ----------------------------------------------------

    def token_allowed(self, token: int, piece: bytes) -> bool:
        """Whether llama_grammar_apply_impl leaves this (non-EOG) token's logit alone."""
        if not piece or piece[0] == 0:
            return False
        cps, partial = decode_utf8(piece, self.partial)
        return any(self._allowed_from(s, token, cps, 0, partial) for s in self.stacks)

    def _allowed_from(self, stack: Stack, token: int, cps: list[int], i: int, partial: Partial) -> bool:
        """Not rejected by llama_grammar_reject_candidates_for_stack from this stack."""
        if not stack:
            return i == len(cps) and partial[1] == 0
        p = stack[-1]
        if self.types[p] in (_TOKEN, _TOKEN_NOT):
            return partial[1] == 0 if i == len(cps) else self.match_token(p, token)
        cls = self.classes[p]
        if i == len(cps):
            return partial[1] == 0 or cls.match_partial(partial)
        if not cls.match(cps[i]):
            return False
        return any(self._allowed_from(s, token, cps, i + 1, partial) for s in self.after_match(stack))

    def validate(self, text: str) -> tuple[bool, int, str]:
        """test-gbnf-validator's check of a whole string from the current state: (valid, error
        position in code points, error message). The stacks are advanced (use a copy to keep them)."""
        for pos, ch in enumerate(text):
            self.accept_chr(ord(ch))
            if not self.stacks:
                return False, pos, f"Unexpected character '{ch}'"
        if self.can_end():
            return True, -1, ""
        return False, len(text), "Unexpected end of input"

    def copy(self) -> LlamaGrammar:
        """llama_grammar_clone_impl: shares the rules, copies the state."""
        g = object.__new__(LlamaGrammar)
        g.__dict__.update(self.__dict__)
        g.stacks = list(self.stacks)
        return g


def _check_refs(rules: list[Rule]) -> None:
    for i, rule in enumerate(rules):
        for kind, value in rule:
            if kind == _REF and value >= len(rules):
                raise GrammarError(f"invalid grammar: rule {i} references undefined rule {value}")


def _check_left_recursion(rules: list[Rule]) -> None:
    """llama_grammar_detect_left_recursion over every rule, as llama_grammar_init_impl runs it."""
    n = len(rules)
    visited, in_progress, may_be_empty = [False] * n, [False] * n, [False] * n

    def detect(i: int) -> bool:
        if in_progress[i]:
            return True
        in_progress[i] = True
        rule = rules[i]
        at_start = True
        for kind, _ in rule:
            if kind in (_END, _ALT):
                if at_start:
                    may_be_empty[i] = True
                    break
                at_start = True
            else:
                at_start = False
        recurse = True
        for kind, value in rule:
            if kind == _REF and recurse:
                if detect(value):
                    return True
                if not may_be_empty[value]:
                    recurse = False
            elif kind in (_END, _ALT):
                recurse = True
            else:
                recurse = False
        in_progress[i] = False
        visited[i] = True
        return False

    for i in range(n):
        if not visited[i] and detect(i):
            raise GrammarError(f"unsupported grammar, left recursion detected for nonterminal at index {i}")
