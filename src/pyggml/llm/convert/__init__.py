"""Hugging Face causal LMs -> GGUF, as llama.cpp's convert_hf_to_gguf.py writes them.

hf_to_gguf.py drives the conversion (``convert_hf_model``, the ``main`` of the command line),
arch.py maps each architecture's tensor names, shapes and hyperparameters, vocab.py the tokenizer
metadata. Command line: ``python -m pyggml.llm.convert MODEL_DIR -o OUT.gguf --outtype q8_0``.
"""

from __future__ import annotations

from .hf_to_gguf import FTYPES, ConversionError, convert_hf_model, main, tensor_type

__all__ = ["FTYPES", "ConversionError", "convert_hf_model", "main", "tensor_type"]
