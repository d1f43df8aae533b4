r"""Unicode facts the BPE tokenizers need: GPT-2's byte<->character table and character classes.

The classes are llama.cpp's code point flags (``unicode_cpt_flags``), which llama.cpp generates
with a Python script from the general categories (L*, N*, P*) and ``\s``. Deriving them here
from :mod:`unicodedata` gives the same sets up to the Unicode version: characters assigned after
the running Python's Unicode version (14.0 for Python 3.11) count as unassigned, i.e. neither
letters nor numbers. Whitespace is the Unicode White_Space property, which is exactly the
separators (Z*) plus TAB..CR and NEL.

The classes are built once, lazily: scanning the code points costs ~0.1 s and only BPE
vocabularies need them.
"""

from __future__ import annotations

import unicodedata
from functools import cache

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
    return text.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_BYTE_CHAR)


# ---- character classes ---------------------------------------------------------------------

#: code points above this are private use, tags and variation selectors: never L, N, P or Z
_SCAN_LIMIT = 0x40000


@cache
def _classes() -> dict[str, str]:
    """Regex character-class bodies (ranges, escaped) for \\p{L}, \\p{N}, \\p{P} and White_Space."""
    members: dict[str, list[int]] = {"L": [], "N": [], "P": [], "Z": []}
    category = unicodedata.category
    for cp in range(_SCAN_LIMIT):
        major = category(chr(cp))[0]
        if major in members:
            members[major].append(cp)
    members["S"] = sorted([*members.pop("Z"), *range(0x09, 0x0E), 0x85])  # White_Space
    return {name: _ranges(cps) for name, cps in members.items()}


def _ranges(cps: list[int]) -> str:
    parts: list[str] = []
    i = 0
    while i < len(cps):
        j = i
        while j + 1 < len(cps) and cps[j + 1] == cps[j] + 1:
            j += 1
        lo, hi = _esc(cps[i]), _esc(cps[j])
        parts.append(lo if i == j else f"{lo}-{hi}")
        i = j + 1
    return "".join(parts)


def _esc(cp: int) -> str:
    return f"\\U{cp:08x}"


def expand_classes(pattern: str) -> str:
    """Replace ``{L}``, ``{N}``, ``{P}`` and ``{S}`` (whitespace) by class bodies for :mod:`re`.

    Python's ``\\s`` also matches U+001C..U+001F, which are not White_Space (and not ``\\s`` in
    the regex engines llama.cpp and HF tokenizers use), so patterns must say ``{S}`` instead.
    """
    classes = _classes()
    for name, body in classes.items():
        pattern = pattern.replace("{" + name + "}", body)
    return pattern
