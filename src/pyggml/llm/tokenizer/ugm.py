"""llama.cpp's Unigram tokenizer (``llm_tokenizer_ugm_session``), T5's SentencePiece model.

Normalization first: at each input position the longest user-defined token prefix is kept as
is; otherwise the longest match in SentencePiece's precompiled character map (a darts-clone
XOR-compressed double array, followed by NUL-terminated replacement strings) replaces it;
otherwise one UTF-8 character passes. Spaces become U+2581 (with a prefix space and merging
of runs as the vocab's flags ask). Then Viterbi over bytes: at each character start, every token
that begins there (NORMAL, USER_DEFINED with score 0, UNUSED) may extend the best path; a
character no single token covers is reachable as UNK with the lowest NORMAL score minus 10.
Consecutive UNKs on the best path collapse into one.
"""

from __future__ import annotations

import numpy as np

from .attrs import NORMAL, UNUSED, USER_DEFINED
from .errors import TokenizeError

_SPACE = "\u2581".encode()
_FLT_MAX = float(np.finfo(np.float32).max)
_UNKNOWN_PENALTY = np.float32(10.0)


def _utf8_len(first: int) -> int:
    return (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[first >> 4]


class _CharsMap:
    """SentencePiece's precompiled_charsmap: longest-prefix lookup of replacement strings."""

    def __init__(self, blob: bytes) -> None:
        size = int.from_bytes(blob[:4], "little")
        self.array = np.frombuffer(blob[4 : 4 + size], dtype="<u4").astype(np.int64).tolist()
        self.replacements = blob[4 + size :]

    def _node(self, i: int) -> int:
        if i >= len(self.array):
            raise TokenizeError("index out of bounds in the UGM precompiled_charsmap's double array")
        return self.array[i]

    def _base(self, i: int) -> int:
        p = self._node(i)
        return (p >> 10) << ((p & (1 << 9)) >> 6)

    def longest(self, data: bytes, start: int) -> tuple[int, bytes]:
        """(length consumed, replacement) of the longest mapped prefix at ``start``; (0, b"") if none."""
        node = self._base(0)
        best_len, best_off = 0, 0
        for k in range(start, len(data)):
            c = data[k]
            if c == 0:
                break
            node ^= c
            p = self._node(node)
            if p & ((1 << 31) | 0xFF) != c:
                break
            leaf = (p >> 8) & 1
            node ^= self._base(node)
            if leaf:
                best_len = k - start + 1
                best_off = self._node(node) & ((1 << 31) - 1)
        if not best_len:
            return 0, b""
        if best_off >= len(self.replacements):
            raise TokenizeError("index out of bounds in the UGM precompiled_charsmap's replacements")
        end = self.replacements.find(b"\0", best_off)
        if end < 0:
            raise TokenizeError("unterminated string in the UGM precompiled_charsmap")
        return best_len, self.replacements[best_off:end]


class UGMTokenizer:
    """Tokenizes raw-text fragments for one Unigram vocabulary."""

    def __init__(
        self,
        tokens: list[str],
        scores: list[float],
        attrs: list[int],
        unk: int,
        charsmap: bytes,
        *,
        escape_whitespaces: bool,
        add_space_prefix: bool,
        remove_extra_whitespaces: bool,
    ) -> None:
        self.matcher: dict[bytes, int] = {}
        self.user_defined_prefixes: set[bytes] = set()
        min_score, max_score = _FLT_MAX, -_FLT_MAX
        for i, (t, s, a) in enumerate(zip(tokens, scores, attrs, strict=True)):
            b = t.encode("utf-8", "surrogateescape")
            if a & NORMAL:
                min_score, max_score = min(min_score, s), max(max_score, s)
            if a & (NORMAL | USER_DEFINED | UNUSED):
                self.matcher[b] = i
            if a & USER_DEFINED:
                self.user_defined_prefixes.update(b[:k] for k in range(1, len(b) + 1))
        self.user_defined = {i for i, a in enumerate(attrs) if a & USER_DEFINED}
        self.scores = scores
        self.max_len = max(map(len, self.matcher), default=0)
        self.unk = unk
        self.unknown_score = float(np.float32(min_score) - _UNKNOWN_PENALTY)  # a float in llama.cpp
        self.charsmap = _CharsMap(charsmap) if charsmap else None
        self.space = _SPACE if escape_whitespaces else b" "
        self.prepend_space = add_space_prefix  # treat_whitespace_as_suffix is never set from GGUF
        self.merge_spaces = remove_extra_whitespaces

    # ---- normalization ---------------------------------------------------------------------

    def _prefix(self, data: bytes, pos: int) -> tuple[bytes, int]:
        # the longest path into the user-defined tokens' trie, whether or not a token ends there
        k = 0
        while pos + k < len(data) and data[pos : pos + k + 1] in self.user_defined_prefixes:
            k += 1
        if k:
            return data[pos : pos + k], k
        if self.charsmap is not None:
            n, repl = self.charsmap.longest(data, pos)
            if n:
                return repl, n
        n = _utf8_len(data[pos])
        if pos + n > len(data):
            return b"\xef\xbf\xbd", 1
        return data[pos : pos + n], n

    def normalize(self, text: str) -> bytes:
        """The text as the Viterbi search sees it: mapped, spaces escaped, maybe a prefix space."""
        data = text.encode("utf-8", "surrogateescape")
        out = bytearray()
        space_prepended = False
        in_word = False
        pos = 0
        while pos < len(data):
            piece, used = self._prefix(data, pos)
            for c in piece:
                if c != 0x20:
                    if not in_word:
                        in_word = True
                        if (self.prepend_space and not space_prepended) or self.merge_spaces:
                            out += self.space
                            space_prepended = True
                    out.append(c)
                else:
                    in_word = False
                    if not self.merge_spaces:
                        out += self.space
            pos += used
        return bytes(out)

    # ---- Viterbi ---------------------------------------------------------------------------

    def tokenize(self, text: str, out: list[int]) -> None:
        """Append the tokens of one raw-text fragment to ``out``."""
        data = self.normalize(text)
        n = len(data)
        if n == 0:
            return
        best_id = [self.unk] * (n + 1)
        best_from = [0] * (n + 1)
        best_score = [-np.inf] * (n + 1)
        best_score[0] = 0.0
        get = self.matcher.get
        pos = 0
        while pos < n:
            char_len = min(_utf8_len(data[pos]), n - pos)
            base = best_score[pos]
            single = False
            for end in range(pos + 1, min(n, pos + self.max_len) + 1):
                tid = get(data[pos:end])
                if tid is None:
                    continue
                if end - pos == char_len:
                    single = True
                score = base + (0.0 if tid in self.user_defined else self.scores[tid])
                if score > best_score[end]:
                    best_id[end], best_from[end], best_score[end] = tid, pos, score
            if not single:
                end = pos + char_len
                score = base + self.unknown_score
                if score > best_score[end]:
                    best_id[end], best_from[end], best_score[end] = self.unk, pos, score
            pos += char_len
        ids: list[int] = []
        prev_unknown = False
        at = n
        while True:
            tid = best_id[at]
            unknown = tid == self.unk
            if not (prev_unknown and unknown):
                ids.append(tid)
            if best_from[at] == 0:
                break
            prev_unknown = unknown
            at = best_from[at]
        out.extend(reversed(ids))
