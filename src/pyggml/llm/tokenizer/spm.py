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
from heapq import heappop, heappush


def spm_tokenize(
    text: str,
    token_to_id: dict[str, int],
    scores: list[float],
    byte_to_token: Callable[[int], int],
    out: list[int],
) -> None:
    """Append the SPM tokens of ``text`` (whitespace already escaped) to ``out``."""
    n = len(text)
    if n == 0:
        return
    get = token_to_id.get
    length = [1] * n  # symbol i starts at char i; 0 once merged into its left neighbour
    nxt = [*range(1, n), -1]
    prv = list(range(-1, n - 1))
    heap: list[tuple[float, int, int, int]] = []

    def try_add(left: int, right: int) -> None:
        if left < 0 or right < 0:
            return
        size = length[left] + length[right]
        tid = get(text[left : left + size])
        if tid is not None:
            # heapq pops the smallest: negate the score; ties go to the smaller left index
            heappush(heap, (-scores[tid], left, right, size))

    for i in range(n - 1):
        try_add(i, i + 1)

    while heap:
        _, left, right, size = heappop(heap)
        if length[left] == 0 or length[right] == 0 or length[left] + length[right] != size:
            continue  # one side was merged since this pair was pushed
        length[left] = size
        length[right] = 0
        after = nxt[right]
        nxt[left] = after
        if after >= 0:
            prv[after] = left
        try_add(prv[left], left)
        try_add(left, after)

    i = 0
    while i != -1:
        piece = text[i : i + length[i]]
        tid = get(piece)
        if tid is not None:
            out.append(tid)
        else:
            out.extend(byte_to_token(b) for b in piece.encode("utf-8", "surrogateescape"))
        i = nxt[i]
