r"""Unicode facts the tokenizers need: GPT-2's byte<->character table and llama.cpp's code point classes.

llama.cpp classifies code points with its own generated tables (``unicode-data.cpp``): one
category per code point (number, letter, separator, accent mark, punctuation, symbol, control or
undefined), a whitespace set, a lower-case map and NFD first characters. Pre-tokenizers split by
these classes, so pyggml reads the same tables (:mod:`.unicode_data`) instead of
:mod:`unicodedata`, whose Unicode version is whatever Python ships.

The tables are expanded lazily into one array of flags per code point (~0.05 s, 2 MiB).
"""

from __future__ import annotations

from bisect import bisect_right
from functools import cache

import numpy as np

from . import unicode_data

# ---- GPT-2 byte-level encoding -------------------------------------------------------------


def _byte_to_char_table() -> list[str]:
    """GPT-2's reversible byte -> printable character map.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes (controls, space, NBSP,
    soft hyphen ...) are moved, in ascending order, to U+0100, U+0101, ... so that no byte
    becomes whitespace or an invisible character inside a token string.
    """
    keep = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table: list[str] = []
    moved = 0
    for b in range(256):
        if b in keep:
            table.append(chr(b))
        else:
            table.append(chr(0x100 + moved))
            moved += 1
    return table


BYTE_TO_CHAR: list[str] = _byte_to_char_table()
CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
# str.translate table: a text decoded as Latin-1 (one char per byte) -> byte-level characters
_LATIN1_TO_BYTE_CHAR = {b: c for b, c in enumerate(BYTE_TO_CHAR)}


def byte_encode(text: str) -> str:
    """The byte-level form of ``text``: one printable character per UTF-8 byte."""
    return text.encode("utf-8", "surrogateescape").decode("latin-1").translate(_LATIN1_TO_BYTE_CHAR)


# ---- code point flags (unicode_cpt_flags) ----------------------------------------------------

UNDEFINED = 0x0001
NUMBER = 0x0002  #: \p{N}
LETTER = 0x0004  #: \p{L}
SEPARATOR = 0x0008  #: \p{Z}
ACCENT_MARK = 0x0010  #: \p{M}
PUNCTUATION = 0x0020  #: \p{P}
SYMBOL = 0x0040  #: \p{S}
CONTROL = 0x0080  #: \p{C}
MASK_CATEGORIES = 0x00FF
WHITESPACE = 0x0100  #: \s

MAX_CODEPOINTS = 0x110000


def _groups(packed: str) -> list[list[int]]:
    return [[int(x, 16) for x in g.split(",")] for g in packed.split(";") if g]


@cache
def cpt_flags_table() -> np.ndarray:
    """uint16 flags for every code point (categories and WHITESPACE), as llama.cpp builds them."""
    ranges = _groups(unicode_data.FLAGS_RANGES)
    starts = np.array([r[0] for r in ranges], dtype=np.int64)
    flags = np.array([r[1] for r in ranges], dtype=np.uint16)
    table = np.repeat(flags[:-1], np.diff(starts))
    assert len(table) == MAX_CODEPOINTS, "unicode_data.FLAGS_RANGES must end at 0x110000"
    for (cpt,) in _groups(unicode_data.WHITESPACE):
        table[cpt] |= WHITESPACE
    return table


def cpt_flags(cpt: int) -> int:
    """The flags of one code point (UNDEFINED beyond U+10FFFF)."""
    return int(cpt_flags_table()[cpt]) if 0 <= cpt < MAX_CODEPOINTS else UNDEFINED


@cache
def _lower_map() -> dict[int, int]:
    return {a: b for a, b in _groups(unicode_data.LOWERCASE)}


def tolower(cpt: int) -> int:
    """llama.cpp's ``unicode_tolower``: one code point to one code point (no multi-character forms)."""
    return _lower_map().get(cpt, cpt)


@cache
def _nfd_ranges() -> tuple[list[int], list[tuple[int, int]]]:
    rows = _groups(unicode_data.NFD)
    return [r[0] for r in rows], [(r[1], r[2]) for r in rows]


def nfd_first(cpt: int) -> int:
    """llama.cpp's ``unicode_cpts_normalize_nfd`` for one code point: its decomposition's first character.

    llama.cpp keeps only the base character (combining marks are dropped, not appended), which
    is what BERT's accent stripping wants.
    """
    firsts, rest = _nfd_ranges()
    i = bisect_right(firsts, cpt) - 1
    if i >= 0:
        last, nfd = rest[i]
        if cpt <= last:
            return nfd
    return cpt


def is_han(cpt: int) -> bool:
    """llama.cpp's ``unicode_cpt_is_han``: the CJK ideograph blocks (unified, extensions A-F, compatibility)."""
    return any(lo <= cpt <= hi for lo, hi in _HAN_RANGES)


_HAN_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF), (0x2CEB0, 0x2EBEF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)  # fmt: skip
