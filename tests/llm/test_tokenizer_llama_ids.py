"""pyggml's tokenizers against token ids that llama.cpp 0c1e570 itself produced.

The ids, texts and small vocabularies are in ``tests/data/tokenizers/`` (made by
``tests/helpers/tok_reference.py`` with llama.cpp's ``llama-tokenize``; see tests/data/README.md),
so these tests need no llama.cpp. Every ``tokenizer.ggml.pre`` value llama.cpp accepts is there,
each tokenizing texts with digits, punctuation, whitespace runs, accents, CJK and emoji.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

from helpers.data import load_json
from helpers.tok_reference import bpe_metadata
from pyggml.llm.tokenizer import Vocab
from pyggml.llm.tokenizer.pretokenize import PRE_TOKENIZERS


@cache
def _bpe_reference() -> dict[str, Any]:
    return load_json("tokenizers", "bpe_pre.json")


def _bpe_case(pre: str) -> dict[str, Any]:
    return next(c for c in _bpe_reference()["cases"] if c["pre"] == pre)


def test_reference_covers_every_pre_tokenizer() -> None:
    # the data was made for every name pyggml knows, and pyggml knows every name llama.cpp does
    assert {c["pre"] for c in _bpe_reference()["cases"]} == {"", *PRE_TOKENIZERS}
    assert len(PRE_TOKENIZERS) == 91
    # llama.cpp aborts (a space inside a merge candidate) only for the raw-UTF-8 "whitespace" type
    skipped = {c["pre"] for c in _bpe_reference()["cases"] if None in c["ids"]}
    assert skipped == {"whitespace"}


@pytest.mark.parametrize("pre", ["", *PRE_TOKENIZERS])
def test_bpe_pre_tokenizer_matches_llama_cpp(pre: str) -> None:
    ref = _bpe_reference()
    case = _bpe_case(pre)
    md = bpe_metadata(ref["vocabs"][case["vocab"]], pre)
    if not pre:
        del md["tokenizer.ggml.pre"]  # no name: llama.cpp's "default", with a warning
    vocab = Vocab.from_metadata(md)
    for text, ids in zip(ref["texts"], case["ids"], strict=True):
        if ids is not None:
            assert vocab.tokenize(text, add_special=False) == ids, f"pre={pre!r} text={text[:40]!r}"
