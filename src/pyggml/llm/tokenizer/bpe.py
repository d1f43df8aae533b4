"""llama.cpp's byte-level BPE tokenizer (``llm_tokenizer_bpe_session``).

Each pre-tokenized word is byte-encoded (GPT-2 table) and starts as one symbol per byte
character. Adjacent pairs listed in the merges go on a heap; the pair of lowest rank (ties:
the leftmost) is merged and new pairs with its neighbours pushed; entries whose two sides
changed since are skipped. A final symbol that is not a token is emitted byte by byte, and a
byte without a token is dropped, as llama.cpp does.

With ``ignore_merges`` (llama3) a word that is itself a token is emitted whole.
"""

from __future__ import annotations

from heapq import heappop, heappush

from .pretokenize import PreTokenizer
from .unicode import byte_encode

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
                ids = cache[word] = self._word(byte_encode(word))
            out.extend(ids)

    def _word(self, word: str) -> list[int]:
        get = self.token_to_id.get
        if self.pre.ignore_merges and (tid := get(word)) is not None:
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
                ids.extend(t for c in sym if (t := get(c)) is not None)
        return ids
