"""Tokenizer rules on small hand-made vocabularies, and SentencePiece as an oracle for SPM.

The SentencePiece model is trained here (BPE, byte fallback, no normalization), so SPM merging,
byte fallback, the space prefix and detokenization are checked against the library llama.cpp's
SPM tokenizer reproduces. The other tests build vocabularies whose expected tokens follow
directly from llama.cpp's rules (longest special token first, LSTRIP/RSTRIP, BOS/EOS flags).
"""

from __future__ import annotations

import io
from typing import Any

import pytest
import sentencepiece as spm
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.bpe_build import CORPUS
from pyggml.llm.tokenizer import Vocab
from pyggml.llm.tokenizer.detok import clean_spaces
from pyggml.llm.tokenizer.errors import TokenizeError, UnsupportedTokenizerError, VocabError

K = "tokenizer.ggml."


# ---- SentencePiece oracle ---------------------------------------------------------------


@pytest.fixture(scope="module")
def sp() -> spm.SentencePieceProcessor:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS),
        model_writer=model,
        model_type="bpe",
        vocab_size=900,
        byte_fallback=True,
        normalization_rule_name="identity",
        add_dummy_prefix=True,
        remove_extra_whitespaces=False,
        character_coverage=1.0,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


@pytest.fixture(scope="module")
def sp_vocab(sp: spm.SentencePieceProcessor) -> Vocab:
    """The metadata llama.cpp's converter writes for a SentencePiece model (ids default to unk 0, bos 1, eos 2)."""
    n = sp.get_piece_size()

    def token_type(i: int) -> int:
        return 2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 5 if sp.is_unused(i) else 1

    return Vocab.from_metadata(
        {
            K + "model": "llama",
            K + "tokens": [sp.id_to_piece(i) for i in range(n)],
            K + "scores": [sp.get_score(i) for i in range(n)],
            K + "token_type": [token_type(i) for i in range(n)],
        }
    )


SPM_TEXTS = [
    "",
    "Hello world",
    " Hello  world ",
    "It's 12345 naïve café — déjà vu",
    "日本語のテキスト 😀🎉👍🏽 ∑∫√ \x00\x01 control",
    "tabs\tand\nnewlines\n\n  indented",
    "   ",
]


def _check_spm(sp: spm.SentencePieceProcessor, vocab: Vocab, text: str) -> None:
    expected = sp.encode(text)
    assert vocab.tokenize(text, add_special=False) == expected
    assert vocab.tokenize(text) == [vocab.bos, *expected]  # llama SPM adds BOS, not EOS
    assert vocab.detokenize(expected) == sp.decode(expected)
    # llama.cpp strips the prefix space only when the text comes first: after a removed BOS it stays
    assert vocab.detokenize([vocab.bos, *expected], remove_special=True) == (" " if text else "") + sp.decode(expected)


@pytest.mark.parametrize("text", SPM_TEXTS, ids=repr)
def test_spm_matches_sentencepiece(sp: spm.SentencePieceProcessor, sp_vocab: Vocab, text: str) -> None:
    _check_spm(sp, sp_vocab, text)


@settings(max_examples=300, deadline=None)
@given(
    text=st.lists(
        st.one_of(
            st.sampled_from([*"ab xy'\t\n.,", "the", " world", "123", "é", "日本", "😀", "  "]),
            st.characters(blacklist_categories=("Cs",), blacklist_characters="\u2581"),
        ),
        max_size=30,
    ).map("".join)
)
def test_spm_matches_sentencepiece_random(sp: spm.SentencePieceProcessor, sp_vocab: Vocab, text: str) -> None:
    _check_spm(sp, sp_vocab, text)


# ---- hand-made SPM vocabularies ---------------------------------------------------------

_BASE = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
_BASE_TYPES = [2, 3, 3, *([6] * 256)]


def spm_metadata(words: dict[str, tuple[int, float]], **extra: Any) -> dict[str, Any]:
    """An SPM vocab: <unk> <s> </s>, the 256 byte tokens, then ``words`` (text -> (type, score))."""
    return {
        K + "model": "llama",
        K + "tokens": [*_BASE, *words],
        K + "scores": [0.0] * len(_BASE) + [s for _, s in words.values()],
        K + "token_type": [*_BASE_TYPES, *(t for t, _ in words.values())],
        **extra,
    }


def ids(vocab: Vocab, *parts: str | int) -> list[int]:
    """Tokens of raw-text parts (tokenized alone, no BOS) and literal ids, concatenated."""
    out: list[int] = []
    for p in parts:
        out += [p] if isinstance(p, int) else vocab.tokenize(p, add_special=False)
    return out


LETTERS = {c: (1, -10.0) for c in "\u2581abcxyz"}


def test_merge_order_by_score() -> None:
    # "abc": the higher-scored pair merges first; on equal scores the leftmost pair does
    for ab, bc, first in ((-1.0, -2.0, "ab"), (-2.0, -1.0, "bc"), (-1.0, -1.0, "ab")):
        v = Vocab.from_metadata(
            spm_metadata({**LETTERS, "ab": (1, ab), "bc": (1, bc)}, **{K + "add_space_prefix": False})
        )
        t = v.token_to_id
        assert v.tokenize("abc", add_special=False) == ([t["ab"], t["c"]] if first == "ab" else [t["a"], t["bc"]])


def test_longest_special_token_wins() -> None:
    # llama.cpp cuts out each special token in turn, longest first, so "abc" wins over "xa"
    # even though "xa" starts earlier in "xabcy"
    v = Vocab.from_metadata(spm_metadata({**LETTERS, "abc": (4, 0.0), "xa": (4, 0.0)}))
    abc, xa = v.text_to_token("abc"), v.text_to_token("xa")
    assert v.tokenize("xabcy", add_special=False) == ids(v, "x", abc, "y")
    # "abc" is cut out first, then "xa" from what is left
    assert v.tokenize("xaxabc", add_special=False) == ids(v, xa, "x", abc)


def test_space_prefix_after_special() -> None:
    v = Vocab.from_metadata(spm_metadata({**LETTERS, "\u2581x": (1, -1.0), "<ctl>": (3, 0.0)}))
    ctl = v.text_to_token("<ctl>")
    # the first fragment and every fragment after a special token get the SPM space prefix
    assert v.tokenize("x", add_special=False) == [v.text_to_token("\u2581x")]
    assert v.tokenize("x<ctl>x", add_special=False, parse_special=True) == ids(v, "x", ctl, "x")
    # without parse_special the control text is ordinary text
    assert ctl not in v.tokenize("x<ctl>x", add_special=False)
    # without add_space_prefix nothing is prepended
    v2 = Vocab.from_metadata(spm_metadata({**LETTERS, "\u2581x": (1, -1.0)}, **{K + "add_space_prefix": False}))
    assert v2.tokenize("x", add_special=False) == [v2.text_to_token("x")]


def test_lstrip_rstrip() -> None:
    # llama.cpp gives Phi-3's special tokens RSTRIP (except <unk> <s> <|endoftext|>)
    words = {**LETTERS, "<|user|>": (3, 0.0), "<|endoftext|>": (3, 0.0)}
    phi3 = Vocab.from_metadata(spm_metadata(words, **{"general.name": "Phi-3 mini"}))
    plain = Vocab.from_metadata(spm_metadata(words))
    user, eot = phi3.text_to_token("<|user|>"), phi3.text_to_token("<|endoftext|>")
    assert phi3.tokenize("<|user|> \n\tab", parse_special=True) == phi3.tokenize("<|user|>ab", parse_special=True)
    assert plain.tokenize("<|user|> \n\tab", parse_special=True) != plain.tokenize("<|user|>ab", parse_special=True)
    assert phi3.tokenize("<|endoftext|> ab", parse_special=True)[:2] == [phi3.bos, eot]
    assert phi3.tokenize("<|endoftext|> ab", parse_special=True) != phi3.tokenize("<|endoftext|>ab", parse_special=True)
    assert user in phi3.special_ids


def test_bos_eos_flags() -> None:
    words = {**LETTERS}
    v = Vocab.from_metadata(spm_metadata(words, **{K + "add_eos_token": True, K + "add_bos_token": False}))
    body = v.tokenize("ab", add_special=False)
    assert v.tokenize("ab") == [*body, v.eos]
    assert v.tokenize("") == [v.eos]
    assert v.detokenize(v.tokenize("ab"), remove_special=True) == v.detokenize(body)
    v = Vocab.from_metadata(spm_metadata(words, **{K + "bos_token_id": 2, K + "eos_token_id": 1}))
    assert v.tokenize("ab") == [2, *body] and v.tokenize("") == [2]
    # an id outside the vocab is ignored (llama.cpp warns and keeps the default)
    v = Vocab.from_metadata(spm_metadata(words, **{K + "bos_token_id": 10**6}))
    assert v.bos == 1
    with pytest.raises(VocabError, match="add_bos_token is true, but the bos token id is not set"):
        Vocab.from_metadata({**spm_metadata({}), K + "tokens": ["a"], K + "scores": [0.0], K + "token_type": [1]})


def test_byte_fallback_impossible() -> None:
    v = Vocab.from_metadata({K + "model": "llama", K + "tokens": ["<unk>", "<s>", "</s>", "\u2581a"]})
    assert v.tokenize("a", add_special=False) == [3]
    with pytest.raises(TokenizeError, match="no token for byte 0xE2"):  # the first byte of "\u2581"
        v.tokenize("b")


def test_clean_spaces_rules() -> None:
    assert clean_spaces(b"Hello , world . Yes ! No ?") == b"Hello, world. Yes! No?"
    assert clean_spaces(b"a ' b") == b"a'b"
    assert clean_spaces(b"it 's I 'm we 're they 've") == b"it's I'm we're they've"
    assert clean_spaces(b"don 't I 'd we 'll") == b"don 't I 'd we 'll"  # llama.cpp keeps these
    assert clean_spaces(b"") == b"" and clean_spaces(b" ") == b" "


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({K + "model": None}, VocabError, "tokenizer.ggml.model is missing"),
        ({K + "model": "sentencepiece"}, UnsupportedTokenizerError, "'sentencepiece' is unknown"),
        ({K + "model": "plamo2"}, UnsupportedTokenizerError, "'plamo2' is not implemented"),
        ({K + "model": 5}, VocabError, "must be a string"),
        ({K + "tokens": None}, VocabError, "tokens is missing"),
        ({K + "tokens": "abc"}, VocabError, "must be an array"),
        ({K + "tokens": ["a", "b", "a"], K + "scores": None, K + "token_type": None}, VocabError, "duplicate token"),
        ({K + "scores": [0.0]}, VocabError, "scores has 1 entries, fewer than"),
        ({K + "token_type": [1, 2]}, VocabError, "token_type has 2 entries"),
        ({K + "scores": ["x"] * 300}, VocabError, "scores must hold numbers"),
        ({K + "add_bos_token": "yes"}, VocabError, "add_bos_token must be a bool"),
        ({K + "bos_token_id": "1"}, VocabError, "bos_token_id must be an integer"),
        ({K + "model": "gpt2", K + "pre": "qwen2"}, VocabError, "merges is missing"),
        ({K + "model": "gpt2", K + "pre": "klingon", K + "merges": []}, UnsupportedTokenizerError, "'klingon'"),
    ],
)
def test_bad_metadata(change: dict[str, Any], error: type[Exception], message: str) -> None:
    md = spm_metadata(dict(LETTERS))
    md.update(change)
    md = {k: v for k, v in md.items() if v is not None}
    with pytest.raises(error, match=message):
        Vocab.from_metadata(md)
