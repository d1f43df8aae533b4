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
from pyggml.llm.tokenizer import UnsupportedTokenizerError, Vocab, VocabError
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


@cache
def _model_reference() -> dict[str, Any]:
    return load_json("tokenizers", "models.json")


def _model_vocab(name: str) -> tuple[Vocab, dict[str, Any]]:
    case = _model_reference()["models"][name]
    md = dict(case["metadata"])
    if "tokenizer.ggml.precompiled_charsmap" in md:
        md["tokenizer.ggml.precompiled_charsmap"] = bytes.fromhex(md["tokenizer.ggml.precompiled_charsmap"])
    return Vocab.from_metadata(md), case


@pytest.mark.parametrize(("name", "vocab_type"), [("wpm", "WPM"), ("ugm", "UGM"), ("rwkv", "RWKV")])
def test_tokenizer_model_matches_llama_cpp(name: str, vocab_type: str) -> None:
    vocab, case = _model_vocab(name)
    assert vocab.type_name == vocab_type
    texts = _model_reference()["texts"]
    assert None not in case["ids"]
    for text, ids in zip(texts, case["ids"], strict=True):
        assert vocab.tokenize(text, add_special=False) == ids, f"{name}: text={text[:40]!r}"


def test_tokenizer_models_add_special() -> None:
    # WPM wraps the text in CLS ... SEP; UGM (T5) ends with EOS and adds no BOS; RWKV adds nothing
    wpm, _ = _model_vocab("wpm")
    body = wpm.tokenize("hello world", add_special=False)
    assert wpm.tokenize("hello world") == [wpm.bos, *body, wpm.sep]
    ugm, _ = _model_vocab("ugm")
    body = ugm.tokenize("hello world", add_special=False)
    assert ugm.tokenize("hello world") == [*body, ugm.eos] and not ugm.add_bos
    rwkv, _ = _model_vocab("rwkv")
    assert rwkv.tokenize("hello world") == rwkv.tokenize("hello world", add_special=False)


@pytest.mark.parametrize("name", ["ugm", "rwkv"])
def test_tokenizer_models_round_trip(name: str) -> None:
    # RWKV covers bytes exactly; UGM's text comes back normalized (fullwidth letters folded, spaces merged,
    # the prefix space removed again)
    vocab, _ = _model_vocab(name)
    text = "Hello  ｗｏｒｌｄ" if name == "ugm" else _model_reference()["texts"][0]
    ids = vocab.tokenize(text, add_special=False)
    assert vocab.unk not in ids
    assert vocab.detokenize(ids) == (text if name == "rwkv" else "Hello world")


def test_only_kimi_k2_may_lack_merges() -> None:
    md = bpe_metadata(_bpe_reference()["vocabs"]["byte_level"], "kimi-k2")
    del md["tokenizer.ggml.merges"]
    kimi = Vocab.from_metadata(md)
    assert kimi.tokenize("ab", add_special=False) == [kimi.text_to_token("a"), kimi.text_to_token("b")]
    with pytest.raises(VocabError, match=r"tokenizer\.ggml\.merges is missing"):
        Vocab.from_metadata({**md, "tokenizer.ggml.pre": "qwen2"})


def test_unknown_pre_tokenizer_is_refused_by_name() -> None:
    md = bpe_metadata(_bpe_reference()["vocabs"]["byte_level"], "klingon-bpe")
    with pytest.raises(UnsupportedTokenizerError, match="'klingon-bpe'"):
        Vocab.from_metadata(md)
