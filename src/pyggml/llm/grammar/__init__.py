"""Grammar-constrained sampling as llama.cpp does it: GBNF grammars (src/llama-grammar.cpp), the
grammar sampler and its lazy triggers (src/llama-sampler.cpp, common/sampling.cpp), and JSON schemas
turned into grammars (common/json-schema-to-grammar.cpp)."""

from __future__ import annotations

from .engine import LlamaGrammar, decode_utf8
from .parser import GrammarError, GrammarParser, GreType
from .sampler import GrammarSampler, GrammarTrigger
from .vocab_filter import VocabFilter, VocabTable, vocab_table

__all__ = ["GrammarError", "GrammarParser", "GrammarSampler", "GrammarTrigger", "GreType", "LlamaGrammar",
           "VocabFilter", "VocabTable", "decode_utf8", "vocab_table"]
