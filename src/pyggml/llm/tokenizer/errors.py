"""Errors raised while loading a vocabulary or tokenizing.

They are separate classes so that callers (and the CLI) can tell a bad model file from bad
input text: a model whose metadata llama.cpp would reject raises :class:`VocabError`, a
model llama.cpp could load but pyggml cannot tokenize raises :class:`UnsupportedTokenizerError`.
"""

from __future__ import annotations

from ...errors import PyGGMLError


class VocabError(PyGGMLError, ValueError):
    """The tokenizer metadata is missing a key, has a wrong type, or contradicts itself."""


class UnsupportedTokenizerError(VocabError, NotImplementedError):
    """A tokenizer model or pre-tokenizer that llama.cpp knows but pyggml does not implement."""


class TokenizeError(PyGGMLError, ValueError):
    """Text that cannot be tokenized with this vocabulary (e.g. a byte with no token)."""


class InvalidTokenError(PyGGMLError, IndexError):
    """A token id outside the vocabulary."""
