"""``LlamaGrammar``: llama-cpp-python's grammar object, over pyggml's GBNF engine (llm/grammar).

llama-cpp-python keeps a grammar as its GBNF text and parses it against the model's vocabulary when a
completion starts; so does this one: :meth:`LlamaGrammar.sampler` makes a fresh
:class:`~pyggml.llm.grammar.GrammarSampler` per completion, so one grammar object serves many calls.
The text is parsed once at construction too, so a bad grammar fails where it is written, with the
parser's message, instead of at the first completion.

``from_json_schema`` converts in llama-cpp-python's dialect (:mod:`.json_schema`: a single optional
space after each value and punctuation), not llama.cpp's current one (:mod:`pyggml.llm.grammar.json_schema`,
which pyggml's server uses and which also allows newlines and indentation): a model that pretty-prints
JSON writes different text under the two, and this class must give llama-cpp-python's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..llm.grammar import GrammarSampler
from ..llm.grammar.engine import LlamaGrammar as _Rules
from .json_schema import json_schema_to_gbnf

LLAMA_GRAMMAR_DEFAULT_ROOT = "root"

#: Any JSON value inside an object or array, with llama.cpp's optional whitespace after literal
#: characters (the grammar of llama-cpp-python's ``JSON_GBNF`` and llama.cpp's grammars/json.gbnf):
#: what ``response_format={"type": "json_object"}`` constrains a reply to.
JSON_GBNF = r"""
root ::= object

value ::= object | array | string | number | ("true" | "false" | "null") ws

object ::= "{" ws ( string ":" ws value ( "," ws string ":" ws value )* )? "}" ws

array ::= "[" ws ( value ( "," ws value )* )? "]" ws

string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" ( ["\\bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\"" ws

number ::= ( "-"? ( [0-9] | [1-9] [0-9]{0,15} ) ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9] [1-9]{0,15} )? ws

# optional whitespace, allowed after literal characters
ws ::= | " " | "\n" [ \t]{0,20}
"""


class LlamaGrammar:
    """A GBNF grammar to constrain sampling (``grammar=`` of completions), as llama-cpp-python's."""

    def __init__(self, *, _grammar: str, root: str = LLAMA_GRAMMAR_DEFAULT_ROOT) -> None:
        _Rules.from_text(_grammar, root)  # parse now: a bad grammar fails here, with the parser's message
        self._grammar = _grammar
        self._root = root

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> LlamaGrammar:
        """A grammar from GBNF text (``verbose`` is accepted for llama-cpp-python's signature)."""
        if not isinstance(grammar, str):
            raise TypeError(f"grammar must be GBNF text (str), not {type(grammar).__name__}")
        return cls(_grammar=grammar)

    @classmethod
    def from_file(cls, file: str | Path, verbose: bool = True) -> LlamaGrammar:
        """A grammar from a ``.gbnf`` file."""
        try:
            text = Path(file).read_text(encoding="utf-8")
        except OSError as e:
            raise ValueError(f"cannot read grammar file {file}: {e.strerror or e}") from e
        if not text.strip():
            raise ValueError(f"grammar file {file} is empty")
        return cls.from_string(text, verbose=verbose)

    @classmethod
    def from_json_schema(cls, json_schema: str | dict[str, Any], verbose: bool = True) -> LlamaGrammar:
        """A grammar for the JSON documents a JSON schema allows (given as JSON text, as llama-cpp-python
        takes it, or as a dict)."""
        schema = json.loads(json_schema) if isinstance(json_schema, str) else json_schema
        return cls.from_string(json_schema_to_gbnf(schema), verbose=verbose)

    @property
    def grammar(self) -> str:
        """The GBNF text."""
        return self._grammar

    def sampler(self, vocab: Any) -> GrammarSampler:
        """A grammar sampler over ``vocab`` at the grammar's start (one per completion)."""
        return GrammarSampler(vocab, self._grammar, self._root)

    def __repr__(self) -> str:
        return f"LlamaGrammar(root={self._root!r}, {len(self._grammar)} characters of GBNF)"
