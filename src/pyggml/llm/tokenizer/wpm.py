"""llama.cpp's WordPiece tokenizer (``llm_tokenizer_wpm_session``), the BERT family's.

The text is normalized the BertNormalizer way with llama.cpp's tables: optionally reduced to
the first character of each code point's NFD form and stripped of accent marks, lower-cased,
cut at whitespace, with punctuation, ASCII symbols and CJK ideographs as one-character words
and control characters dropped. Each word gets the phantom space U+2581 in front and is covered
greedily by the longest tokens (on UTF-8 bytes, as llama.cpp does); a word with any part no
token covers becomes one UNK.
"""

from __future__ import annotations

from .unicode import ACCENT_MARK, CONTROL, PUNCTUATION, SYMBOL, WHITESPACE, cpt_flags, nfd_first, tolower

_PHANTOM_SPACE = "\u2581".encode()


def _is_chinese_char(cpt: int) -> bool:
    # llama.cpp's ranges (from HF's Rust code, whose extension-E start is 0x2B920, not 0x2B820)
    return (0x4E00 <= cpt <= 0x9FFF or 0x3400 <= cpt <= 0x4DBF or 0x20000 <= cpt <= 0x2A6DF
            or 0x2A700 <= cpt <= 0x2B73F or 0x2B740 <= cpt <= 0x2B81F or 0x2B920 <= cpt <= 0x2CEAF
            or 0xF900 <= cpt <= 0xFAFF or 0x2F800 <= cpt <= 0x2FA1F)  # fmt: skip


def preprocess(text: str, lowercase: bool, strip_accents: bool) -> list[str]:
    """The words WordPiece covers with tokens."""
    words = [""]
    for ch in text:
        cpt = ord(ch)
        if strip_accents:
            cpt = nfd_first(cpt)
        flags = cpt_flags(cpt)
        if flags & WHITESPACE:
            if words[-1]:
                words.append("")
            continue
        if cpt in (0, 0xFFFD) or flags & CONTROL:
            continue
        if strip_accents and flags & ACCENT_MARK:
            continue
        s = chr(tolower(cpt) if lowercase else cpt)
        if flags & PUNCTUATION or (cpt < 0x7F and flags & SYMBOL) or _is_chinese_char(cpt):
            if words[-1]:
                words.append("")
            words[-1] = s
            words.append("")
        else:
            words[-1] += s
    if not words[-1]:
        words.pop()
    return words


class WPMTokenizer:
    """Tokenizes raw-text fragments for one WordPiece vocabulary."""

    def __init__(self, tokens: list[str], unk: int, lowercase: bool, strip_accents: bool) -> None:
        self.by_bytes = {t.encode("utf-8", "surrogateescape"): i for i, t in enumerate(tokens)}
        self.max_len = max(map(len, self.by_bytes), default=0)
        self.unk = unk
        self.lowercase = lowercase
        self.strip_accents = strip_accents

    def tokenize(self, text: str, out: list[int]) -> None:
        """Append the tokens of one raw-text fragment to ``out``."""
        get = self.by_bytes.get
        for word in preprocess(text, self.lowercase, self.strip_accents):
            b = _PHANTOM_SPACE + word.encode("utf-8", "surrogateescape")
            n = len(b)
            ids: list[int] = []
            i = 0
            while i < n:
                for j in range(min(n, i + self.max_len + 1), i, -1):
                    tid = get(b[i:j])
                    if tid is not None:
                        ids.append(tid)
                        i = j
                        break
                else:
                    ids = []  # a part no token covers: the whole word is unknown
                    break
            out.extend(ids if ids else [self.unk])
