"""Token types as stored in GGUF and the attribute bits llama.cpp derives from them.

GGUF stores one ``token_type`` per token (llama.h ``llama_token_type``); llama.cpp turns it
into a bit set (``llama_token_attr``) at load time and then adds bits of its own (CONTROL for
end-of-generation texts, UNUSED for control tokens named "unused", LSTRIP/RSTRIP for some
models). Everything downstream tests the bits, never the stored type.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag


class TokenType(IntEnum):
    """``tokenizer.ggml.token_type`` values."""

    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


class TokenAttr(IntFlag):
    """llama.cpp's ``llama_token_attr`` bits."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8
    SINGLE_WORD = 1 << 9


# plain ints: these are tested once per token in hot loops, where IntFlag arithmetic is slow
UNKNOWN = int(TokenAttr.UNKNOWN)
UNUSED = int(TokenAttr.UNUSED)
NORMAL = int(TokenAttr.NORMAL)
CONTROL = int(TokenAttr.CONTROL)
USER_DEFINED = int(TokenAttr.USER_DEFINED)
BYTE = int(TokenAttr.BYTE)
LSTRIP = int(TokenAttr.LSTRIP)
RSTRIP = int(TokenAttr.RSTRIP)

#: tokens the special-token partition looks for (llama.cpp's cache_special_tokens)
SPECIAL = CONTROL | USER_DEFINED | UNKNOWN
#: tokens whose text is hidden unless asked for (token_to_piece with special=False)
HIDDEN = CONTROL | UNKNOWN

_TYPE_TO_ATTR: dict[int, int] = {
    TokenType.UNDEFINED: 0,
    TokenType.NORMAL: NORMAL,
    TokenType.UNKNOWN: UNKNOWN,
    TokenType.CONTROL: CONTROL,
    TokenType.USER_DEFINED: USER_DEFINED,
    TokenType.UNUSED: UNUSED,
    TokenType.BYTE: BYTE,
}


def attr_from_type(token_type: int) -> int:
    """The attribute bits for a stored token type; types llama.cpp does not know map to UNDEFINED (0)."""
    return _TYPE_TO_ATTR.get(token_type, 0)
