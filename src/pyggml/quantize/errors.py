"""The quantize package's exception: one type for every bad input to the quantization tools."""

from __future__ import annotations

from ..errors import PyGGMLError


class QuantizeError(PyGGMLError, ValueError):
    """Bad input to ``quantize_model``, ``pyggml quantize`` or ``pyggml imatrix``: the message names the problem."""
