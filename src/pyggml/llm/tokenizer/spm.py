"""llama.cpp's SentencePiece (SPM) tokenizer: greedy bigram merges by score, byte fallback.

``llm_tokenizer_spm_session``: the text (spaces already escaped to U+2581) starts as one symbol
per character. Every adjacent pair whose concatenation is a token goes on a heap; the pair of
highest score (ties: the leftmost) is merged, and the new pairs with its neighbours are
pushed. Heap entries made stale by an earlier merge are recognised by their length and
skipped. Finally each symbol is emitted as its token, or, if it is not one (only single
characters can be), as one byte token per UTF-8 byte.

llama.cpp also records a ``rev_merge`` map to re-split symbols that are not tokens, but every
merged symbol is a token by construction, so that path never runs and is left out here.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heapify, heappop, heappush


def spm_tokenize(
    text: str,
    token_to_id: dict[str, int],
    scores: list[float],
    byte_to_token: Callable[[int], int],
    out: list[int],
) -> None:
    """Append the SPM tokens of ``text`` (whitespace already escaped) to ``out``.

    The pair lookups are written out in the loop rather than in a helper (a call per pair was half the time
    of tokenizing a long text), and the first pairs are heapified at once: the heap pops the same entries
    in the same order either way (its entries are totally ordered)."""
    n = len(text)
    if n == 0:
        return
    get = token_to_id.get
    length = [1] * n  # symbol i starts at char i; 0 once merged into its left neighbour
    nxt = [*range(1, n), -1]
    prv = list(range(-1, n - 1))
    # (-score, left, right, size): heapq pops the smallest, so the best score first, ties to the leftmost
    heap: list[tuple[float, int, int, int]] = []
    for i in range(n - 1):
        tid = get(text[i : i + 2])
        if tid is not None:
            heap.append((-scores[tid], i, i + 1, 2))
    heapify(heap)

    while heap:
        _, left, right, size = heappop(heap)
        n_left, n_right = length[left], length[right]
        if n_left == 0 or n_right == 0 or n_left + n_right != size:
            continue  # one side was merged since this pair was pushed
        length[left] = size
        length[right] = 0
        after = nxt[right]
        nxt[left] = after
        before = prv[left]
        if after >= 0:
            prv[after] = left
        if before >= 0:  # the new pair with the left neighbour
            both = length[before] + size
            tid = get(text[before : before + both])
            if tid is not None:
                heappush(heap, (-scores[tid], before, left, both))
        if after >= 0:  # and with the right one
            both = size + length[after]
            tid = get(text[left : left + both])
            if tid is not None:
                heappush(heap, (-scores[tid], left, after, both))

    i = 0
    while i != -1:
        piece = text[i : i + length[i]]
        tid = get(piece)
        if tid is not None:
            out.append(tid)
        else:
            out.extend(byte_to_token(b) for b in piece.encode("utf-8", "surrogateescape"))
        i = nxt[i]
