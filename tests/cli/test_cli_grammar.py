"""--grammar, --grammar-file, -j/--json-schema, -jf/--json-schema-file on generate, chat and batched
(the tiny chat model: its text is nonsense, but it must follow the grammar)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pyggml.cli.main import main
from pyggml.llm.grammar import LlamaGrammar

COMMON = ["-c", "256", "-t", "1", "--temp", "0"]
WORDS = 'root ::= [a-z]{1,6} (" " [a-z]{1,6}){2,4} "."'  # at most 35 characters: done within -n 40


def _valid(grammar: str, text: str) -> bool:
    return LlamaGrammar.from_text(grammar).validate(text)[0]


def test_generate_follows_grammar_and_schema(tiny_chat_path: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    m = ["-m", str(tiny_chat_path), "-q", *COMMON]
    assert main(["generate", "-p", "hello", "-n", "40", "--grammar", WORDS, *m]) == 0
    out = capsys.readouterr().out.rstrip("\n")
    assert _valid(WORDS, out), out
    gfile = tmp_path / "g.gbnf"
    gfile.write_text('root ::= "<" [0-9]{3} ">"\n')
    assert main(["generate", "-p", "hello", "-n", "10", "--grammar-file", str(gfile), *m]) == 0
    assert re.fullmatch(r"<[0-9]{3}>", capsys.readouterr().out.rstrip("\n"))
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
              "required": ["ok", "n"], "additionalProperties": False}
    assert main(["generate", "-p", "json", "-n", "60", "-j", json.dumps(schema), *m]) == 0
    value = json.loads(capsys.readouterr().out)
    assert isinstance(value["ok"], bool) and value["n"] in (1, 2, 3) and set(value) == {"ok", "n"}
    sfile = tmp_path / "s.json"
    sfile.write_text(json.dumps({"enum": ["yes", "no"]}))
    assert main(["generate", "-p", "json", "-n", "10", "-jf", str(sfile), *m]) == 0
    assert json.loads(capsys.readouterr().out) in ("yes", "no")


def test_chat_and_batched_follow_the_grammar(tiny_chat_path: Path, capsys: pytest.CaptureFixture) -> None:
    m = ["-m", str(tiny_chat_path), "-q", *COMMON]
    assert main(["chat", "-p", "hi", "-n", "40", "--grammar", WORDS, *m]) == 0
    assert _valid(WORDS, capsys.readouterr().out.rstrip("\n"))
    assert main(["batched", "-p", "hello", "-p", "one two", "-np", "3", "-n", "40", "--grammar", WORDS, *m]) == 0
    out = capsys.readouterr().out
    texts = re.findall(r"sequence \d+:\n\n(hello|one two)(.*)\n", out)
    assert len(texts) == 3
    for _prompt, text in texts:
        assert _valid(WORDS, text), text


def test_grammar_flag_errors(tiny_chat_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    m = ["-m", str(tiny_chat_path), "-q", *COMMON]
    assert main(["generate", "-p", "x", "--grammar", 'root ::= "a" | undefined-rule', *m]) == 1
    assert "error parsing grammar: Undefined rule identifier 'undefined-rule'" in capsys.readouterr().err
    assert main(["generate", "-p", "x", "--grammar", 'start ::= "a"', *m]) == 1
    assert "grammar does not contain a 'root' symbol" in capsys.readouterr().err
    assert main(["generate", "-p", "x", "--grammar-file", str(tmp_path / "none.gbnf"), *m]) == 1
    assert "--grammar-file: cannot read" in capsys.readouterr().err
    assert main(["generate", "-p", "x", "-j", "{not json", *m]) == 1
    assert "--json-schema: the schema is not valid JSON" in capsys.readouterr().err
    assert main(["generate", "-p", "x", "-j", '{"type": "array", "minItems": -2}', *m]) == 1
    assert "minItems must be a non-negative integer" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", "-p", "x", "--grammar", 'root ::= "a"', "-j", "{}", *m])
