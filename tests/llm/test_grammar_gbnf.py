"""GBNF grammars against llama.cpp: the same strings accepted and refused, the same error for a bad
grammar (reference: tests/data/grammar/gbnf_validator.json, made by make_gbnf_reference.py with
llama.cpp's test-gbnf-validator)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pyggml.llm.grammar import GrammarError, GrammarParser, LlamaGrammar, decode_utf8

DATA = Path(__file__).parent.parent / "data" / "grammar"
CASES = json.loads((DATA / "gbnf_validator.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_validator_verdicts_match_llama_cpp(case: dict) -> None:
    if "init_error" in case:
        with pytest.raises(GrammarError) as e:
            LlamaGrammar.from_text(case["grammar"])
        msg = str(e.value)
        assert msg == case["init_error"] or msg.startswith(case["init_error"] + " ("), msg
        return
    grammar = LlamaGrammar.from_text(case["grammar"])
    for s in case["strings"]:
        valid, pos, err = grammar.copy().validate(s["text"])
        assert valid == s["valid"], s
        if not valid:
            assert (pos, err) == (s["error_pos"], s["error"]), s


def test_rule_numbering_and_rewrites_as_llama_cpp() -> None:
    p = GrammarParser()
    p.parse('root ::= ("a" | b)+ c?\nb ::= [^x-z]\nc ::= "c"{1,2}')
    assert p.symbol_ids == {"root": 0, "root_1": 1, "b": 2, "root_3": 3, "c": 4, "root_5": 5, "c_6": 6}
    text = p.format()
    assert "root ::= root_1 root_3 root_5 \n" in text
    assert "root_3 ::= root_1 root_3 | \n" in text  # S+ -> S S', S' ::= S S' |
    assert "root_5 ::= c | \n" in text  # S? -> S', S' ::= S |
    assert "c ::= [c] c_6 \n" in text  # S{1,2} -> S S'(1), S'(1) ::= S |
    assert "b ::= [^x-z] \n" in text


def test_token_references_need_a_tokenizer_for_names() -> None:
    seen: list[str] = []

    def tokenize(text: str) -> list[int]:
        seen.append(text)
        return [42] if text == "<think>" else [1, 2]

    p = GrammarParser(tokenize)
    p.parse('root ::= <think> !<[7]> "x"')
    assert seen == ["<think>"]
    assert p.rules[0][:2] == [(8, 42), (9, 7)]
    with pytest.raises(GrammarError, match="invalid token '<two>'"):
        GrammarParser(tokenize).parse("root ::= <two>")


def test_decode_utf8_partial_sequences_across_pieces() -> None:
    e_acute = "é".encode()
    cps, partial = decode_utf8(b"a" + e_acute[:1])
    assert cps == [ord("a")] and partial == (e_acute[0] & 0x1F, 1)
    cps, partial = decode_utf8(e_acute[1:] + b"b", partial)
    assert cps == [ord("é"), ord("b")] and partial == (0, 0)
    assert decode_utf8(b"\x80abc") == ([], (0, -1))  # a continuation byte first is invalid
    assert decode_utf8(b"ab", (0x3, 1)) == ([], (0, -1))  # a continuation was due
    assert decode_utf8(b"ab\x00cd") == ([97, 98], (0, 0))  # the C string ends at a NUL


def test_grammar_accepts_a_partial_char_only_if_it_can_complete() -> None:
    g = LlamaGrammar.from_text('root ::= "x" [é-ê] "y"')
    e = "é".encode()
    assert g.token_allowed(1, b"x" + e[:1])  # 0xC3 may complete to é
    assert not g.token_allowed(1, b"x\xc4")  # 0xC4 completes to U+0100..U+013F: outside [é-ê]
    g.accept_token(1, b"x" + e[:1])
    assert g.partial[1] == 1
    assert g.token_allowed(2, e[1:] + b"y") and not g.token_allowed(2, b"\xa0y")
    g.accept_token(2, e[1:] + b"y")
    assert g.can_end()
    with pytest.raises(GrammarError, match="Unexpected empty grammar stack"):
        g.accept_token(3, b"z")
