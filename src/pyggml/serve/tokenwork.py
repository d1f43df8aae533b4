"""Tokenizing request text within a bound, in pieces that stop when the client has gone.

A Python tokenizer takes seconds for text a C++ one does in milliseconds, and one call cannot be
interrupted. So text is tokenized by growing prefixes (16k characters, then 4x each time) until the
whole text is done: between two prefixes the work stops if the client has disconnected, and it stops
as soon as a prefix has clearly more tokens than the limit (a slot's context), since the whole text
has at least the tokens of its prefix but the last, cut, word. The result, when it fits, is the
tokenization of the whole text, exactly as one call would give it; the work is at most a few times
that of tokenizing a slot's worth of text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

FIRST_PREFIX = 1 << 14  # characters
GROWTH = 4
#: tokens a cut word at the end of a prefix may add over the whole text's count
CUT_MARGIN = 64


class ClientGone(Exception):
    """The client disconnected: its work was skipped or stopped."""


def tokenize_bounded(vocab: Any, text: str, max_tokens: int, cancelled: Callable[[], bool],
                     add_special: bool, parse_special: bool) -> list[int] | None:
    """The tokens of ``text``, or None when they are more than ``max_tokens``; raises ClientGone when
    ``cancelled()`` turns true between two pieces of work."""
    size = FIRST_PREFIX
    while size < len(text):
        if cancelled():
            raise ClientGone
        if len(vocab.tokenize(text[:size], add_special=add_special, parse_special=parse_special)) > \
                max_tokens + CUT_MARGIN:
            return None
        size *= GROWTH
    if cancelled():
        raise ClientGone
    tokens = vocab.tokenize(text, add_special=add_special, parse_special=parse_special)
    return tokens if len(tokens) <= max_tokens else None
