"""Gemma 3 (SentencePiece): pyggml's tokenizer against llama.cpp's output in reference.json.

The model package is installed in CI; like the other model tests this module is skipped only
when it is not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers.data import load_json
from pyggml.gguf import GGUFReader
from pyggml.llm.tokenizer import Vocab
from pyggml.llm.tokenizer.attrs import BYTE, CONTROL, USER_DEFINED
from pyggml.llm.tokenizer.errors import InvalidTokenError, TokenizeError

REFERENCE = load_json("gemma3", "reference.json")
TOKENIZE = REFERENCE["tokenize"]
PROMPTS = REFERENCE["prompts"]


@pytest.fixture(scope="module")
def vocab(gemma_path: Path) -> Vocab:
    return Vocab.from_gguf(gemma_path)


@pytest.fixture(scope="module")
def metadata(gemma_path: Path) -> dict[str, Any]:
    with GGUFReader(gemma_path) as r:
        return {kv.key: kv.to_python() for kv in r.kvs() if kv.key.startswith("tokenizer.ggml.")}


@pytest.mark.parametrize("case", TOKENIZE, ids=[repr(c["text"])[:40] for c in TOKENIZE])
def test_reference_tokenize(vocab: Vocab, case: dict[str, Any]) -> None:
    assert vocab.tokenize(case["text"], add_special=True, parse_special=False) == case["ids_bos_nospecial"]
    assert vocab.tokenize(case["text"], add_special=False, parse_special=True) == case["ids_nobos_special"]


@pytest.mark.parametrize("case", PROMPTS, ids=[repr(c["text"])[:40] for c in PROMPTS])
def test_reference_prompts(vocab: Vocab, case: dict[str, Any]) -> None:
    assert vocab.tokenize(case["text"], add_special=True, parse_special=True) == case["tokens"]


@pytest.mark.parametrize("case", TOKENIZE + PROMPTS, ids=lambda c: repr(c["text"])[:40])
def test_detokenize_round_trip(vocab: Vocab, case: dict[str, Any]) -> None:
    text = case["text"]
    with_bos = vocab.tokenize(text, add_special=True, parse_special=True)
    assert vocab.detokenize(with_bos, remove_special=True, unparse_special=True) == text
    # without remove_special the BOS stays, rendered only when special tokens are
    assert vocab.detokenize(with_bos, unparse_special=True) == vocab.tokens[vocab.bos] + text
    plain = vocab.tokenize(text, add_special=False, parse_special=False)
    assert vocab.detokenize(plain) == text
    assert b"".join(vocab.token_to_piece(t) for t in plain) == text.encode()


def test_metadata_interpretation(vocab: Vocab, metadata: dict[str, Any]) -> None:
    md = metadata
    assert vocab.is_spm and len(vocab) == len(md["tokenizer.ggml.tokens"])
    assert vocab.bos == md["tokenizer.ggml.bos_token_id"] and vocab.eos == md["tokenizer.ggml.eos_token_id"]
    assert vocab.unk == md["tokenizer.ggml.unknown_token_id"] and vocab.pad == md["tokenizer.ggml.padding_token_id"]
    assert vocab.add_bos == md["tokenizer.ggml.add_bos_token"] and vocab.add_eos == md["tokenizer.ggml.add_eos_token"]
    assert vocab.add_space_prefix == md["tokenizer.ggml.add_space_prefix"]
    assert not vocab.clean_spaces  # SPM never cleans spaces
    # EOT is found by its text; it and EOS end generation
    assert vocab.eot == md["tokenizer.ggml.tokens"].index("<end_of_turn>")
    assert {vocab.eos, vocab.eot} <= vocab.eog_ids and all(vocab.is_control(t) for t in vocab.eog_ids)
    assert not vocab.is_eog(vocab.bos)
    # the newline token of an SPM vocab is its byte token
    assert vocab.nl == md["tokenizer.ggml.tokens"].index("<0x0A>")


def test_token_attributes(vocab: Vocab, metadata: dict[str, Any]) -> None:
    types = metadata["tokenizer.ggml.token_type"]
    tokens = metadata["tokenizer.ggml.tokens"]
    for i in (0, vocab.bos, vocab.eos, 105, 106, 107, 138, 238, 1000, len(tokens) - 1):
        attr = vocab.token_get_attr(i)
        assert bool(attr & CONTROL) == (types[i] == 3 or i in vocab.eog_ids)
        assert bool(attr & USER_DEFINED) == (types[i] == 4)
        assert bool(attr & BYTE) == (types[i] == 6)
    unused = [i for i, t in enumerate(tokens) if types[i] == 3 and "unused" in t]
    assert unused and all(vocab.is_unused(i) for i in unused)
    # the special-token cache holds every control/user-defined token, longest text first
    assert len(vocab.special_ids) == sum(1 for t in types if t in (2, 3, 4))
    lengths = [len(tokens[i].encode()) for i in vocab.special_ids]
    assert lengths == sorted(lengths, reverse=True)


def test_parse_special(vocab: Vocab) -> None:
    start = vocab.text_to_token("<start_of_turn>")
    assert vocab.is_control(start)
    assert vocab.tokenize("<start_of_turn>", add_special=False, parse_special=True) == [start]
    assert start not in vocab.tokenize("<start_of_turn>", add_special=False, parse_special=False)
    # user-defined tokens ("\n\n", runs of spaces) are cut out even without parse_special
    for text in ("\n\n", "   "):
        tid = vocab.text_to_token(text)
        assert vocab.is_user_defined(tid)
        assert vocab.tokenize(f"a{text}b", add_special=False) == [
            *vocab.tokenize("a", add_special=False),
            tid,
            *vocab.tokenize("b", add_special=False),
        ]


def test_pieces(vocab: Vocab) -> None:
    start = vocab.text_to_token("<start_of_turn>")
    assert vocab.token_to_piece(start, special=False) == b""
    assert vocab.token_to_piece(start, special=True) == b"<start_of_turn>"
    word = vocab.text_to_token("\u2581Hello")
    assert vocab.token_to_piece(word) == b" Hello"
    assert vocab.token_to_piece(word, lstrip=1) == b"Hello"
    assert vocab.token_to_piece(vocab.text_to_token("<0xE2>")) == b"\xe2"
    # a character with no token falls back to one byte token per UTF-8 byte, decodable only as a whole
    rare = next(c for c in map(chr, range(0x20000, 0x20100)) if vocab.text_to_token(c) < 0)
    ids = vocab.tokenize(rare, add_special=False)
    assert [vocab.token_to_byte(t) for t in ids] == list(rare.encode())
    assert vocab.detokenize(ids) == rare and vocab.detokenize(ids[:2]) == "\ufffd"
    with pytest.raises(InvalidTokenError, match="outside the vocabulary"):
        vocab.token_to_piece(len(vocab))
    with pytest.raises(InvalidTokenError):
        vocab.detokenize([-1])


def test_bad_text(vocab: Vocab) -> None:
    with pytest.raises(TokenizeError, match="must be a str"):
        vocab.tokenize(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(TokenizeError, match="not valid Unicode"):
        vocab.tokenize("lone \ud800 surrogate")


def test_long_text_round_trip(vocab: Vocab) -> None:
    """~25k characters of the reference texts survive tokenize + detokenize (speed: bench/tokenizer.py)."""
    text = " ".join(c["text"] for c in TOKENIZE + PROMPTS) * 50
    ids = vocab.tokenize(text)
    round_trip = vocab.detokenize(ids, remove_special=True) == text  # (a failing == on 25k chars diffs for minutes)
    assert round_trip
