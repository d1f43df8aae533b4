"""Detokenization helpers: GPT-2 byte decoding and llama.cpp's ``clean_spaces`` passes."""

from __future__ import annotations

from .unicode import CHAR_TO_BYTE


def decode_byte_level(text: str) -> bytes:
    """Bytes of a byte-level BPE token (``llama_decode_text``).

    A character outside the GPT-2 table cannot come from a byte-level tokenizer; llama.cpp
    keeps it visible as ``[UNK_BYTE_0x<utf8 hex><token text>]`` rather than dropping it.
    """
    out = bytearray()
    for c in text:
        b = CHAR_TO_BYTE.get(c)
        if b is not None:
            out.append(b)
        else:
            raw = c.encode("utf-8", "surrogateescape")
            out += b"[UNK_BYTE_0x" + raw.hex().encode() + text.encode("utf-8", "surrogateescape") + b"]"
    return bytes(out)


_SP, _QUOTE = 0x20, 0x27


def clean_spaces(text: bytes) -> bytes:
    """llama.cpp's three clean-up passes over detokenized bytes (BPE vocabularies that want them).

    1. drop a space before ``? ! . ,``;
    2. turn `` ' `` (a quote between two spaces) into ``'``;
    3. drop the space before ``'s 'm 're 've`` (but not ``'t 'd 'll``).
    """
    return _contractions(_lone_quotes(_punctuation(text)))


def _punctuation(t: bytes) -> bytes:
    out = bytearray(t[:1])
    for i in range(1, len(t)):
        x = t[i]
        if t[i - 1] == _SP and x in b"?!.,":
            out.pop()
        out.append(x)
    return bytes(out)


def _lone_quotes(t: bytes) -> bytes:
    src = bytearray(t)  # a skipped space becomes NUL, as llama.cpp overwrites it in place
    out = bytearray(src[:1])
    n = len(src)
    i = 1
    while i < n:
        x = src[i]
        if x == _QUOTE and i + 1 < n and src[i - 1] == _SP and src[i + 1] == _SP:
            out.pop()
            i += 1
            src[i] = 0
        out.append(x)
        i += 1
    return bytes(out)


def _contractions(t: bytes) -> bytes:
    out = bytearray(t[:1])
    n = len(t)
    for i in range(1, n):
        x = t[i]
        if t[i - 1] == _SP and x == _QUOTE and i + 1 < n:
            x1 = t[i + 1]
            if x1 in b"sm" or (x1 not in b"td" and i + 2 < n and bytes(t[i + 1 : i + 3]) in (b"re", b"ve")):
                out.pop()
        out.append(x)
    return bytes(out)
