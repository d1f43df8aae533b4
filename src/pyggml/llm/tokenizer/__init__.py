"""Tokenizers as llama.cpp's llama-vocab.cpp runs them, read from GGUF metadata.

``Vocab`` (vocab.py) is the entry point: ``Vocab.from_gguf(path)``, ``tokenize``, ``detokenize``.
Beside it: load.py reads the ``tokenizer.ggml.*`` keys into the vocabulary data, pretokenize.py holds
the per-model pre-tokenizer rules and regex_split.py how llama.cpp runs them, bpe.py, spm.py, wpm.py,
ugm.py and rwkv.py the five tokenizer models, special.py the special-token partition, detok.py the
byte-level decoding, unicode.py and unicode_data.py llama.cpp's code-point tables, attrs.py the token
types and attributes, errors.py the exceptions.
"""

from __future__ import annotations

from .attrs import TokenAttr, TokenType
from .errors import InvalidTokenError, TokenizeError, UnsupportedTokenizerError, VocabError
from .vocab import Vocab

__all__ = [
    "InvalidTokenError",
    "TokenAttr",
    "TokenType",
    "TokenizeError",
    "UnsupportedTokenizerError",
    "Vocab",
    "VocabError",
]
