"""Cutting special tokens out of raw text before tokenization (``tokenizer_st_partition``).

llama.cpp takes the special tokens one at a time, longest text first, and splits every
remaining raw-text fragment at each occurrence (leftmost first) of that token's text. So a
longer token always wins over a shorter one it overlaps, wherever they are in the text.
CONTROL and UNKNOWN tokens are only looked for when ``parse_special`` is set; USER_DEFINED
tokens always are. A token with LSTRIP/RSTRIP also eats the whitespace to its left/right.
"""

from __future__ import annotations

from .attrs import HIDDEN, LSTRIP, RSTRIP

Fragment = str | int  #: raw text still to tokenize, or a token id already decided

#: C ``isspace`` in the C locale, which llama.cpp uses for LSTRIP/RSTRIP
_C_SPACE = " \t\n\v\f\r"


def partition(
    text: str, special_ids: list[int], texts: list[str], attrs: list[int], parse_special: bool
) -> list[Fragment]:
    """``text`` as a list of raw-text fragments and special-token ids, in order."""
    if not text:
        return []
    frags: list[Fragment] = [text]
    for tid in special_ids:
        attr = attrs[tid]
        if not parse_special and attr & HIDDEN:
            continue
        tok = texts[tid]
        if tok not in text:  # cheap filter: most special tokens never occur
            continue
        out: list[Fragment] = []
        for frag in frags:
            if isinstance(frag, int) or tok not in frag:
                out.append(frag)
            else:
                _split(frag, tok, tid, attr, out)
        frags = out
    return frags


def _split(frag: str, tok: str, tid: int, attr: int, out: list[Fragment]) -> None:
    pos = 0
    end = len(frag)
    while (m := frag.find(tok, pos)) >= 0:
        left = frag[pos:m]
        if attr & LSTRIP:
            left = left.rstrip(_C_SPACE)
        if left:
            out.append(left)
        out.append(tid)
        pos = m + len(tok)
        if attr & RSTRIP:
            while pos < end and frag[pos] in _C_SPACE:
                pos += 1
    if pos < end:
        out.append(frag[pos:])
