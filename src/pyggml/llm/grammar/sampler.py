"""The grammar sampler (llama.cpp's ``llama_sampler_grammar``), lazy triggers included.

:class:`GrammarSampler` is what the sampler chain consults: ``allows(token)`` is llama.cpp's check
of the one sampled token, ``apply(logits)`` its filter over every candidate (used only when the
sampled token was refused, as common_sampler_sample does), ``accept(token)`` advances the grammar.

A lazy grammar (llama.cpp's ``grammar_lazy``) constrains nothing until a trigger: a trigger token,
or a regex over the text generated so far (a trigger word is a regex of the escaped word; a
"pattern_full" is anchored at both ends). When one fires, the buffered tokens from the match (from
its first non-empty capture group, if any) are replayed into the grammar and constraining starts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .engine import LlamaGrammar
from .parser import GrammarError
from .vocab_filter import VocabFilter, vocab_table

TRIGGER_KINDS = ("word", "pattern", "pattern_full", "token")
_REGEX_SPECIAL = re.compile(r"[.^$|()*+?\[\]{}\\]")


def regex_escape(text: str) -> str:
    """common's regex_escape: a backslash before each regex special character."""
    return _REGEX_SPECIAL.sub(lambda m: "\\" + m.group(0), text)


@dataclass(frozen=True)
class GrammarTrigger:
    """common_grammar_trigger: what starts a lazy grammar. ``kind`` is "word", "pattern",
    "pattern_full" (value: the text or regex) or "token" (token: its id)."""

    kind: str
    value: str = ""
    token: int = -1

    def __post_init__(self) -> None:
        if self.kind not in TRIGGER_KINDS:
            raise GrammarError(f"unknown grammar trigger kind {self.kind!r} "
                               f"(expected one of {', '.join(TRIGGER_KINDS)})")


class _TriggerPattern:
    """llama_grammar_trigger_pattern: a regex over the bytes generated so far."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        try:
            self.regex = re.compile(pattern.encode("utf-8"))
        except re.error as e:
            raise GrammarError(f"invalid grammar trigger pattern {pattern!r}: {e}") from None

    def find(self, text: bytes) -> int:
        """Where the constrained text starts (the first non-empty group, else the match), or -1."""
        m = None
        if self.pattern.startswith("^") and self.pattern.endswith("$"):
            m = self.regex.fullmatch(text)
        if m is None:
            m = self.regex.search(text)
        if m is None:
            return -1
        for i in range(1, (m.re.groups or 0) + 1):
            if m.start(i) >= 0 and m.end(i) > m.start(i):
                return m.start(i)
        return m.start(0)


class GrammarSampler:
    """A grammar over a vocabulary's tokens: llama_sampler_init_grammar(_lazy_patterns)."""

    def __init__(self, vocab: Any, grammar: str, root: str = "root", lazy: bool = False,
                 triggers: Iterable[GrammarTrigger] = ()) -> None:
        self.vocab = vocab
        self.text, self.root = grammar, root
        patterns: list[str] = []
        tokens: list[int] = []
        for t in triggers:  # common_sampler_init's translation of the triggers
            if t.kind == "word":
                patterns.append(regex_escape(t.value))
            elif t.kind == "pattern":
                patterns.append(t.value)
            elif t.kind == "pattern_full":
                p = t.value
                anchored = ("" if p.startswith("^") else "^") + p + ("" if p.endswith("$") else "$")
                patterns.append(anchored if p else "^$")
            else:
                tokens.append(int(t.token))
        if lazy and not patterns and not tokens:
            raise GrammarError("a lazy grammar needs at least one trigger (word, pattern or token)")
        self.lazy = lazy
        self.trigger_patterns = [_TriggerPattern(p) for p in patterns]
        self.trigger_tokens = frozenset(tokens)
        self.grammar = LlamaGrammar.from_text(grammar, root, tokenize=self._tokenize)
        self._filter = VocabFilter(vocab_table(vocab))
        self.reset()

    def _tokenize(self, text: str) -> list[int]:
        return self.vocab.tokenize(text, add_special=False, parse_special=True)

    def reset(self) -> None:
        """Back to the grammar's start (a lazy one waits for its trigger again)."""
        self.grammar.stacks = self.grammar.initial_stacks()
        self.grammar.partial = (0, 0)
        self.awaiting_trigger = self.lazy
        self.trigger_buffer = b""
        self.trigger_positions: list[tuple[int, int, int]] = []  # (token, start, end) in the buffer

    def clone(self) -> GrammarSampler:
        """A copy with its own state (llama_sampler_clone), sharing the parsed rules and caches."""
        c = object.__new__(GrammarSampler)
        c.__dict__.update(self.__dict__)
        c.grammar = self.grammar.copy()
        c.trigger_positions = list(self.trigger_positions)
        return c

    # ---- the filter ---------------------------------------------------------------------------

    def allows(self, token: int) -> bool:
        """Whether llama_grammar_apply_impl would leave ``token`` as a candidate."""
        if self.awaiting_trigger:
            return True
        if self.vocab.is_eog(token):
            return self.grammar.can_end()
        return self.grammar.token_allowed(token, self._filter.table.pieces[token])

    def allowed_mask(self) -> np.ndarray:
        """A bool mask over the vocabulary of the tokens that may come next."""
        if self.awaiting_trigger:
            return np.ones(self._filter.table.n_vocab, dtype=bool)
        return self._filter.allowed(self.grammar)

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """A copy of ``logits`` with the tokens the grammar refuses at -inf."""
        out = np.array(logits, dtype=np.float32).reshape(-1)
        if self.awaiting_trigger:
            return out
        mask = self.allowed_mask()
        if not mask.any():
            raise GrammarError("no token of the vocabulary can continue the grammar here")
        n = min(out.size, mask.size)
        out[:n][~mask[:n]] = -np.inf
        out[n:] = -np.inf  # rows past the vocabulary (padded output layers) are never tokens
        return out

    def best_allowed(self, logits: np.ndarray, n_scan: int = 24) -> int:
        """The first maximum of ``logits`` among the tokens the grammar allows: what greedy sampling
        picks after :meth:`apply`, found by checking the best tokens one by one (the allowed one is
        nearly always among them) before falling back to the filter over the whole vocabulary.

        The tokens are taken in bands of logits below the maximum (1, 4, 16 ... wide), each in
        order of logit then id, so the scan visits them in the order of a full sort."""
        flat = np.asarray(logits, dtype=np.float32).reshape(-1)[: self._filter.table.n_vocab]
        if not self.awaiting_trigger and self._filter.cached(self.grammar) is not None:
            return int(np.argmax(self.apply(logits)))  # this state's verdicts are kept: no need to scan
        if flat.size and np.isfinite(top := float(flat.max())):
            lowest = float(flat.min())
            hi, delta, scanned = np.inf, 1.0, 0
            while scanned < n_scan and hi > lowest:
                lo = top - delta
                band = np.flatnonzero(flat >= lo) if hi == np.inf else np.flatnonzero((flat >= lo) & (flat < hi))
                for t in band[np.lexsort((band, -flat[band]))][: n_scan - scanned]:
                    if self.allows(int(t)):
                        return int(t)
                scanned += band.size
                hi, delta = lo, delta * 4.0
        return int(np.argmax(self.apply(logits)))

    # ---- accepting ----------------------------------------------------------------------------

    def accept(self, token: int) -> None:
        """llama_grammar_accept_impl: record a generated token (it must be allowed)."""
        piece = self._filter.table.pieces[token]
        if self.awaiting_trigger:
            if token in self.trigger_tokens:
                self.awaiting_trigger = False
                self.trigger_buffer = b""
                self.grammar.accept_token(token, piece)
                return
            start = len(self.trigger_buffer)
            self.trigger_positions.append((token, start, start + len(piece)))
            self.trigger_buffer += piece
            for pattern in self.trigger_patterns:
                at = pattern.find(self.trigger_buffer)
                if at < 0:
                    continue
                self.awaiting_trigger = False
                for tok, tok_start, tok_end in self.trigger_positions:  # replay from the match on
                    if tok_end <= at:
                        continue
                    self.grammar.accept_token(tok, self.trigger_buffer[max(tok_start, at):tok_end])
                self.trigger_buffer = b""
                self.trigger_positions = []
                return
            return
        if self.vocab.is_eog(token):
            if self.grammar.can_end():
                return
            raise GrammarError(f"end-of-generation token {token} accepted where the grammar is not complete")
        self.grammar.accept_token(token, piece)
