r"""llama.cpp's ``unicode_regex_split``: cutting text into words with a list of regexes.

Each regex refines the previous split: every piece is cut into its matches and the unmatched
gaps between them, all kept in order. How a regex runs decides its results at the edges of
Unicode, so pyggml follows llama.cpp's three ways:

* **custom**: a few regexes (GPT-2, Llama 3, Qwen2, Qwen3.5, Kimi-K2, AFMoE digits, newlines)
  have hand-written splitters in llama.cpp that classify code points by its tables: ``\s`` is
  the whitespace set, ``\p{L}`` a letter of any case, and so on. Here the text is mapped to
  stand-in characters per class (ASCII kept) and an equivalent :mod:`re` pattern runs on that.
* **collapsed**: other regexes that use ``\p{..}`` run in ``std::regex`` on a copy of the
  text where every non-ASCII code point became one byte for its category (0xD1 number, 0xD2
  letter, 0xD3 punctuation, 0xD4 mark, 0xD5 symbol, 0xD0 other, 0x0B whitespace), and each
  ``\p{X}`` became that byte plus its ASCII members. So ``\p{Lu}`` matches any non-ASCII letter
  but only ASCII ``A-Za-z`` of either case, exactly as in llama.cpp.
* **wide**: regexes without ``\p{..}`` run in ``std::wregex`` on the code points, non-ASCII
  whitespace replaced by 0x0B.

``std::regex`` (ECMAScript, C locale) and :mod:`re` with ``re.ASCII`` agree on ``\s \d \w \b``
and on leftmost-first backtracking; ECMAScript's ``$`` is end-of-input, written ``\Z`` here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache

from .errors import VocabError
from .unicode import ACCENT_MARK, LETTER, NUMBER, PUNCTUATION, SYMBOL, WHITESPACE, cpt_flags, is_han

Step = Callable[[str], list[str]]  #: one regex: a piece -> its sub-pieces (non-empty, in order)

# ---- the collapsed (std::regex) form ---------------------------------------------------------

#: category -> the byte llama.cpp puts in the collapsed text, and the ASCII members of the class
_UCAT = {
    NUMBER: ("\xd1", "0-9"),
    LETTER: ("\xd2", "A-Za-z"),
    PUNCTUATION: ("\xd3", r"!-#%-*,-/:-;?-@\[-\]_\{\}"),
    ACCENT_MARK: ("\xd4", ""),
    SYMBOL: ("\xd5", r"\$\+<->\^`\|~"),
}
_UCAT_NAMES = {"N": NUMBER, "L": LETTER, "P": PUNCTUATION, "M": ACCENT_MARK, "S": SYMBOL,
               "Lu": LETTER, "Ll": LETTER, "Lt": LETTER, "Lm": LETTER, "Lo": LETTER}  # fmt: skip


class _CharMap(dict[int, str]):
    """A ``str.translate`` table that fills itself: code point -> replacement, computed once."""

    def __init__(self, fn: Callable[[int], str]) -> None:
        super().__init__()
        self._fn = fn

    def __missing__(self, cpt: int) -> str:
        v = self[cpt] = self._fn(cpt)
        return v


def _collapsed_char(cpt: int) -> str:
    if cpt < 128:
        return chr(cpt)
    flags = cpt_flags(cpt)
    if flags & WHITESPACE:
        return "\x0b"
    cat = _UCAT.get(flags & 0xFF)
    return cat[0] if cat else "\xd0"


def _wide_char(cpt: int) -> str:
    return "\x0b" if cpt >= 128 and cpt_flags(cpt) & WHITESPACE else chr(cpt)


# stand-ins for the custom splitters' classes (private-use code points, never in the patterns)
_WS, _LET, _HAN, _NUM, _MARK, _OTHER = "\ue000", "\ue001", "\ue002", "\ue003", "\ue004", "\ue007"


def _custom_char(cpt: int) -> str:
    if cpt < 128:
        return chr(cpt)
    flags = cpt_flags(cpt)
    if flags & WHITESPACE:
        return _WS
    if flags & LETTER:
        return _HAN if is_han(cpt) else _LET
    if flags & NUMBER:
        return _NUM
    if flags & ACCENT_MARK:
        return _MARK
    return _OTHER


_COLLAPSED = _CharMap(_collapsed_char)
_WIDE = _CharMap(_wide_char)
_CUSTOM = _CharMap(_custom_char)

#: class bodies of the custom splitters
_CUSTOM_CLASSES = {"L": "A-Za-z" + _LET + _HAN, "N": "0-9" + _NUM, "M": _MARK, "s": "\t\n\x0b\x0c\r " + _WS}


def _translate(regex: str, classes: dict[str, str], custom: bool) -> str:
    r"""``regex`` for :mod:`re`: each ``\p{X}`` (and, for custom splitters, ``\s``/``\S``) replaced by its class.

    Inside ``[...]`` the class body is inserted, outside it is wrapped in brackets, as llama.cpp
    does when it collapses a regex. An unescaped ``$`` outside brackets becomes ``\Z``.
    """
    out: list[str] = []
    inside = False
    i = 0
    n = len(regex)
    while i < n:
        c = regex[i]
        if c == "\\" and i + 1 < n:
            nxt = regex[i + 1]
            if nxt == "p" and i + 2 < n and regex[i + 2] == "{":
                close = regex.find("}", i + 3)
                name = regex[i + 3 : close] if close > 0 else ""
                if name not in classes:
                    raise VocabError(f"pre-tokenizer regex uses \\p{{{name}}}, which llama.cpp does not collapse")
                body = classes[name]
                out.append(body if inside else f"[{body}]")
                i = close + 1
                continue
            if custom and nxt in "sS":
                body = classes["s"]
                if nxt == "s":
                    out.append(body if inside else f"[{body}]")
                else:  # \S appears only outside brackets in these regexes
                    out.append(f"[^{body}]")
                i += 2
                continue
            out.append(regex[i : i + 2])
            i += 2
            continue
        if c == "[":
            inside = True
        elif c == "]" and inside:
            inside = False
        elif c == "$" and not inside:
            c = r"\Z"
        out.append(c)
        i += 1
    return "".join(out)


def _regex_step(pattern: re.Pattern[str], table: dict[int, str] | None) -> Step:
    """A step that matches ``pattern`` on the mapped piece and cuts the original piece at the same places."""

    def step(piece: str) -> list[str]:
        subject = piece.translate(table) if table is not None else piece
        out: list[str] = []
        pos = 0
        for m in pattern.finditer(subject):
            start, end = m.span()
            if start > pos:
                out.append(piece[pos:start])
            if end > start:
                out.append(piece[start:end])
            pos = end
        if pos < len(piece):
            out.append(piece[pos:])
        return out

    return step


# ---- the custom splitters --------------------------------------------------------------------

_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}" + _TAIL
_LLAMA3_HF = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}" + _TAIL  # tokenizer.json's spelling
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}" + _TAIL
_QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")  # fmt: skip
# Kimi-K2's splitter, written as a regex: Han runs, then llama3-like words of non-Han letters (\p{K})
_KIMI = r"\p{H}+|[^\r\n\p{L}\p{N}]?\p{K}+" + _CONTRACTIONS + r"?|\p{N}{1,3}" + _TAIL

#: llama.cpp regex text -> a pattern equivalent to its hand-written splitter (unicode_regex_split_custom_*)
_CUSTOM_EQUIVALENTS = {
    _GPT2: _GPT2,
    _LLAMA3: _LLAMA3,
    _LLAMA3_HF: _LLAMA3,
    _QWEN2: _QWEN2,
    _QWEN35: _QWEN35,
    r"\p{Han}+": _KIMI,
}

_KIMI_CLASSES = {**_CUSTOM_CLASSES, "H": _HAN, "K": "A-Za-z" + _LET}

#: regexes llama.cpp replaces by its digit-grouping splitter (unicode_regex_split_custom_afmoe)
_DIGIT_GROUPS = (r"\p{AFMoE_digits}", r"\d{1,3}(?=(?:\d{3})*\b)")


def _digit_groups(piece: str) -> list[str]:
    """Runs of numbers cut into groups of three from the right; the text before a run sticks to its first group.

    llama.cpp's splitter only closes a word when it emits a digit group, so a non-digit stretch
    becomes the head of the next group, and a trailing one a word of its own.
    """
    out: list[str] = []
    prev = 0
    pos = 0
    n = len(piece)
    while pos < n:
        if not cpt_flags(ord(piece[pos])) & NUMBER:
            pos += 1
            continue
        start = pos
        while pos < n and cpt_flags(ord(piece[pos])) & NUMBER:
            pos += 1
        cut = start + (pos - start) % 3
        if cut == start:
            cut += 3
        while cut <= pos:
            out.append(piece[prev:cut])
            prev = cut
            cut += 3
    if prev < n:
        out.append(piece[prev:])
    return out


@cache
def compile_step(regex: str) -> Step:
    """The splitting step for one of llama.cpp's pre-tokenizer regexes, run the way llama.cpp runs it."""
    if regex in _DIGIT_GROUPS:
        return _digit_groups
    if regex in _CUSTOM_EQUIVALENTS:
        classes = _KIMI_CLASSES if regex == r"\p{Han}+" else _CUSTOM_CLASSES
        return _regex_step(re.compile(_translate(_CUSTOM_EQUIVALENTS[regex], classes, True), re.ASCII), _CUSTOM)
    try:
        if r"\p{" in regex:
            if any(ord(c) >= 128 for c in regex):
                raise VocabError("pre-tokenizer regex mixes \\p{..} classes and non-ASCII characters")
            classes = {name: _UCAT[cat][0] + _UCAT[cat][1] for name, cat in _UCAT_NAMES.items()}
            return _regex_step(re.compile(_translate(regex, classes, False), re.ASCII), _COLLAPSED)
        return _regex_step(re.compile(_translate(regex, {}, False), re.ASCII), _WIDE)
    except re.error as e:
        raise VocabError(f"pre-tokenizer regex {regex!r} does not compile: {e}") from None


def regex_split(text: str, steps: tuple[Step, ...]) -> list[str]:
    """The words of ``text`` after every step in turn (empty words dropped)."""
    pieces = [text] if text else []
    for step in steps:
        out: list[str] = []
        for piece in pieces:
            out.extend(step(piece))
        pieces = out
    return pieces
