"""Byte-level BPE (llama3 and qwen2 pre-tokenizers) against HF ``tokenizers``.

Small tokenizers are trained here with the models' own tokenizer.json configuration and turned
into GGUF metadata as llama.cpp's converter would (tests/helpers/bpe_build.py); pyggml must then give
the ids HF gives. HF's Qwen2 normalizes to NFC and llama.cpp does not, so Qwen2 texts are
NFC-normalized first.
"""

from __future__ import annotations

import unicodedata

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, models
from tokenizers import pre_tokenizers as hf_pre
from transformers import PreTrainedTokenizerFast

from helpers.bpe_build import BPEFixture, configure, to_metadata, train
from pyggml.llm.tokenizer import Vocab
from pyggml.llm.tokenizer.pretokenize import DEFAULT, GPT2, LLAMA3, QWEN2, pre_tokenizer
from pyggml.llm.tokenizer.unicode import byte_encode

KINDS = ["llama3", "qwen2"]

TEXTS = [
    "",
    "Hello world",
    " Hello  world ",
    "It's what they'd said; we'll see, you're right, I've got it. DON'T! I'M 'LL",
    "numbers 1 12 123 1234 12345 1234567 3.14159 -42 1,000,000",
    "naïve café — déjà vu İstanbul Straße",
    "日本語のテキストと中文文本 한국어 Русский ελληνικά",
    "emoji 😀🎉👍🏽 and symbols ∑∫√ ≤≥ ← →",
    "tabs\tand\nnewlines\r\n\r\n  indented\n\n\n    more   spaces   ",
    "   leading and trailing spaces   ",
    "\u00a0nbsp\u3000ideographic\u2009thin\u200dzwj\ufeffbom\x1cfs\x85nel",
    "def f(x):\n    return x**2  # squares\n",
    "https://example.com/path?q=1&r=2 user@mail.org $100 50%",
    "a<|im_start|>b <|im_end|>\n<custom_tag> x<custom_tag>y",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "combining e\u0301 and \u0915\u094d\u0937 and \u0645\u0631\u062d\u0628\u0627",
]


@pytest.fixture(scope="module", params=KINDS)
def fixture(request: pytest.FixtureRequest) -> BPEFixture:
    return train(request.param)


@pytest.fixture(scope="module")
def bpe(fixture: BPEFixture) -> tuple[BPEFixture, Vocab]:
    return fixture, Vocab.from_metadata(fixture.metadata)


def _prepare(vocab: Vocab, text: str) -> str:
    return unicodedata.normalize("NFC", text) if vocab.pre_name == "qwen2" else text


def _check(bpe: tuple[BPEFixture, Vocab], text: str) -> None:
    fx, vocab = bpe
    text = _prepare(vocab, text)
    expected = fx.hf.encode(text, add_special_tokens=False).ids
    assert vocab.tokenize(text, add_special=False, parse_special=True) == expected
    # HF only re-joins text (no clean-up): qwen2 detokenizes to the text itself
    assert vocab.detokenize(expected, unparse_special=True) == _cleaned(vocab, fx.hf.decode(expected, False))


def _cleaned(vocab: Vocab, text: str) -> str:
    # llama.cpp's clean_spaces is HF's clean_up_tokenization without its " n't" rule
    if not vocab.clean_spaces:
        return text
    hidden = "\ue000"  # a private-use character: the random texts never contain one
    return PreTrainedTokenizerFast.clean_up_tokenization(None, text.replace(" n't", hidden)).replace(hidden, " n't")


@pytest.mark.parametrize("text", TEXTS, ids=lambda t: repr(t)[:30])
def test_matches_hf(bpe: tuple[BPEFixture, Vocab], text: str) -> None:
    _check(bpe, text)


# pieces that exercise every branch of the split regexes, mixed with arbitrary characters
_PIECES = st.sampled_from(
    [*"aZ09 '\t\n\r.,!?-_\"", "'s", "'T", "'re", "'LL", "'d", "  ", "\r\n", "\u00a0", "\u3000", "é", "日本",
     "😀", "👍🏽", "\u0301", "Ⅻ", "½", "٣", "\x1c", "\x85", "\u200d", "123456", "<|im_end|>", "<|eot_id|>",
     "<custom_tag>"]
)  # fmt: skip
_CHARS = st.characters(blacklist_categories=("Cs", "Cn", "Co"))
TEXT = st.lists(st.one_of(_PIECES, _CHARS), max_size=40).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=TEXT)
def test_matches_hf_random(bpe: tuple[BPEFixture, Vocab], text: str) -> None:
    _check(bpe, text)


def test_special_rules(bpe: tuple[BPEFixture, Vocab]) -> None:
    fx, vocab = bpe
    text = "hi " + "".join(fx.specials)
    body = vocab.tokenize(text, add_special=False, parse_special=True)
    if vocab.pre_name == "llama-bpe":  # llama3 adds BOS, never EOS
        assert vocab.add_bos and not vocab.add_eos
        assert vocab.tokenize(text, add_special=True, parse_special=True) == [vocab.bos, *body]
    else:  # qwen2's converter writes add_bos_token = false
        assert not vocab.add_bos
        assert vocab.tokenize(text, add_special=True, parse_special=True) == body
    # without parse_special, control tokens are plain text but user-defined ones still match
    fx.hf.encode_special_tokens = True
    try:
        assert vocab.tokenize(text, add_special=False) == fx.hf.encode(text, add_special_tokens=False).ids
    finally:
        fx.hf.encode_special_tokens = False
    custom = vocab.text_to_token("<custom_tag>")
    assert vocab.is_user_defined(custom) and custom in vocab.tokenize(text, add_special=False)
    assert not any(vocab.is_control(t) for t in vocab.tokenize(text, add_special=False))


def test_ignore_merges() -> None:
    # "abc" is a token, but the only merge builds "bc": llama3 (ignore_merges) takes the whole word
    alphabet = sorted(hf_pre.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)} | {"bc": len(alphabet), "abc": len(alphabet) + 1}
    results = {}
    for kind, ignore in (("llama3", True), ("qwen2", False)):
        hf = configure(Tokenizer(models.BPE(vocab=vocab, merges=[("b", "c")], ignore_merges=ignore)), kind)
        ours = Vocab.from_metadata(to_metadata(hf, kind))
        assert ours.ignore_merges == ignore
        results[kind] = ours.tokenize("abc abc\n", add_special=False)
        assert results[kind] == hf.encode("abc abc\n", add_special_tokens=False).ids
    assert results["llama3"] != results["qwen2"]


def test_eog(bpe: tuple[BPEFixture, Vocab]) -> None:
    _, vocab = bpe
    eot_text = "<|eot_id|>" if vocab.pre_name == "llama-bpe" else "<|im_end|>"
    assert vocab.eot == vocab.text_to_token(eot_text)
    assert vocab.is_eog(vocab.eot) and vocab.is_eog(vocab.eos)
    assert vocab.nl == vocab.tokenize("\n", add_special=False)[0]


# ---- the pre-tokenizers alone ------------------------------------------------------------


def _hf_split(pattern: str, text: str) -> list[str]:
    return [p for p, _ in hf_pre.Split(Regex(pattern), behavior="isolated").pre_tokenize_str(text)]


@settings(max_examples=300, deadline=None)
@given(text=TEXT)
def test_pretokenizers_match_hf(text: str) -> None:
    from helpers.bpe_build import LLAMA3_REGEX, QWEN2_REGEX

    assert pre_tokenizer("llama-bpe").split(text) == _hf_split(LLAMA3_REGEX, text)
    assert pre_tokenizer("qwen2").split(text) == _hf_split(QWEN2_REGEX, text)
    # GPT-2's regex, as HF's ByteLevel applies it (HF adds a final |\s+ that llama.cpp leaves to the gaps)
    gpt2 = [p for p, _ in hf_pre.ByteLevel(add_prefix_space=False, use_regex=True).pre_tokenize_str(text)]
    assert [byte_encode(w) for w in pre_tokenizer("gpt-2").split(text)] == gpt2


def _regex_oracle(patterns: tuple[str, ...], text: str) -> list[str]:
    """Sequential split with the ``regex`` package and its own \\p{..} classes (llama.cpp's regex text as is)."""
    pieces = [text]
    for p in patterns:
        out = []
        for piece in pieces:
            pos = 0
            for m in regex.finditer(p, piece):
                out += [piece[pos : m.start()], m.group()]
                pos = m.end()
            out.append(piece[pos:])
        pieces = [x for x in out if x]
    return pieces


@settings(max_examples=200, deadline=None)
@given(
    text=st.lists(st.sampled_from([*"aZ9 '\t\n.,!?$+<=>^~|", "123456", "日本", "😀", "'s"]), max_size=30).map("".join)
)
def test_default_and_gpt2_pretokenizers(text: str) -> None:
    assert pre_tokenizer("default").split(text) == _regex_oracle(DEFAULT, text)
    assert pre_tokenizer("gpt-2").split(text) == _regex_oracle((GPT2,), text)
    assert pre_tokenizer("").split(text) == pre_tokenizer("default").split(text)
    assert pre_tokenizer("llama3").patterns == (LLAMA3,) and pre_tokenizer("deepseek-r1-qwen").patterns == (QWEN2,)


def test_byte_level_pieces() -> None:
    # a NORMAL token with a character outside GPT-2's byte table is shown, not dropped (llama_decode_text)
    alphabet = sorted(hf_pre.ByteLevel.alphabet())
    md = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": [*alphabet, "a€", "\u0120hi"],
        "tokenizer.ggml.merges": [],
    }
    vocab = Vocab.from_metadata(md)
    assert vocab.token_to_piece(len(alphabet)) == b"a[UNK_BYTE_0x" + "€".encode().hex().encode() + "a€".encode() + b"]"
    assert vocab.token_to_piece(len(alphabet) + 1) == b" hi"
    # every byte has its one-character token, and decodes back to itself
    assert b"".join(vocab.token_to_piece(vocab.byte_to_token(b)) for b in range(256)) == bytes(range(256))
    # no pre-tokenizer name: llama.cpp's "default", which cleans spaces and adds no BOS
    assert vocab.pre is pre_tokenizer("default") and vocab.clean_spaces and not vocab.add_bos
