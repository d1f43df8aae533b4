"""pyggml: ggml, the tensor engine under llama.cpp, rebuilt in Python."""

from __future__ import annotations

from .errors import (
    ContextFullError,
    GraphFullError,
    NameTooLongError,
    PyGGMLError,
    ShapeError,
    TypeMismatchError,
    UnsupportedOpError,
)
from .types import GGML_TYPE_COUNT, QK_K, GGMLType, GGMLTypeError, TypeTraits, blck_size, row_size, type_size

__version__ = "0.1.0"
