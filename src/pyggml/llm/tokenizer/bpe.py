"""llama.cpp's byte-level BPE tokenizer (``llm_tokenizer_bpe_session``).

Each pre-tokenized word is byte-encoded (GPT-2 table) and starts as one symbol per byte
character. Adjacent pairs listed in the merges go on a heap; the pair of lowest rank (ties:
the leftmost) is merged and new pairs with its neighbours pushed; entries whose two sides
changed since are skipped. A final symbol that is not a token is emitted byte by byte: each
byte of its UTF-8 text as a one-byte token (so only ASCII can match), or ``<0xXX>`` for the
SentencePiece-style vocabularies that skip the byte-level encoding (Gemma 4). A byte without a
token is dropped, as llama.cpp does.

With ``ignore_merges`` (llama3) a word that is itself a token is emitted whole; Gemma 4 does
the same for a run of newlines.
"""

from __future__ import annotations

from heapq import heappop, heappush

from .pretokenize import PreTokenizer
from .unicode import byte_encode

_SURROGATE_BASE = 0xDC00  # how a lone non-ASCII byte appears in a token string read with surrogateescape

#: words remembered per tokenizer; cleared when full (tokenization is a pure function of the word)
_CACHE_LIMIT = 1 << 16


class BPETokenizer:
    """Tokenizes raw-text fragments for one BPE vocabulary."""

    def __init__(self, token_to_id: dict[str, int], ranks: dict[tuple[str, str], int], pre: PreTokenizer) -> None:
        self.token_to_id = token_to_id
        self.ranks = ranks
        self.pre = pre
        self._cache: dict[str, list[int]] = {}

    def tokenize(self, text: str, out: list[int]) -> None:
        """Append the tokens of one raw-text fragment to ``out``."""
        cache = self._cache
        for word in self.pre.split(text):
            ids = cache.get(word)
            if ids is None:
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                ids = cache[word] = self._word(byte_encode(word) if self.pre.byte_encode else word)
            out.extend(ids)

    def _word(self, word: str) -> list[int]:
        get = self.token_to_id.get
        if self.pre.ignore_merges and (tid := get(word)) is not None:
            return [tid]
        if self.pre.kind == "gemma4" and not word.strip("\n") and (tid := get(word)) is not None:
            return [tid]
        syms = list(word)
        n = len(syms)
        ranks = self.ranks
        nxt = [*range(1, n), -1]
        prv = list(range(-1, n - 1))
        heap: list[tuple[int, int, int, str]] = []

        def add(left: int, right: int) -> None:
            rank = ranks.get((syms[left], syms[right]))
            if rank is not None:
                heappush(heap, (rank, left, right, syms[left] + syms[right]))

        for i in range(n - 1):
            add(i, i + 1)
        while heap:
            _, left, right, merged = heappop(heap)
            a, b = syms[left], syms[right]
            if not a or not b or a + b != merged:
                continue  # outdated
            syms[left] = merged
            syms[right] = ""
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prv[after] = left
            if prv[left] >= 0:
                add(prv[left], left)
            if after >= 0:
                add(left, after)

        ids: list[int] = []
        for sym in syms:  # merged-away symbols are empty; the rest are in text order
            if not sym:
                continue
            tid = get(sym)
            if tid is not None:
                ids.append(tid)
            else:
                ids.extend(
                    t for b in sym.encode("utf-8", "surrogateescape") if (t := get(self._byte_text(b))) is not None
                )
        return ids

    def _byte_text(self, b: int) -> str:
        """The token text llama.cpp looks up for one byte of a symbol that is not a token."""
        if not self.pre.byte_encode:
            return f"<0x{b:02X}>"
        return chr(b) if b < 0x80 else chr(_SURROGATE_BASE + b)
