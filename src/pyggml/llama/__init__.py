"""llama-cpp-python's high-level API on pyggml: ``from pyggml import Llama`` runs code written for
``from llama_cpp import Llama`` (see :mod:`.api`)."""

from __future__ import annotations

from .api import (
    Llama,
    LlamaState,
    LlamaTokenizer,
    LogitsProcessor,
    LogitsProcessorList,
    MinTokensLogitsProcessor,
    StoppingCriteria,
    StoppingCriteriaList,
)
from .chat_format import ChatFormatterResponse, Jinja2ChatFormatter
from .grammar import JSON_GBNF, LlamaGrammar

__all__ = ["JSON_GBNF", "ChatFormatterResponse", "Jinja2ChatFormatter", "Llama", "LlamaGrammar", "LlamaState",
           "LlamaTokenizer", "LogitsProcessor", "LogitsProcessorList", "MinTokensLogitsProcessor", "StoppingCriteria",
           "StoppingCriteriaList"]
