"""pyggml's exception hierarchy: every error a user can cause derives from PyGGMLError."""

from __future__ import annotations


class PyGGMLError(Exception):
    """Base of every error pyggml raises on bad input."""


class ShapeError(PyGGMLError, ValueError):
    """Operands of an op have shapes the op does not accept."""


class TypeMismatchError(PyGGMLError, TypeError):
    """Operands of an op have types the op does not accept."""


class ContextFullError(PyGGMLError, MemoryError):
    """A Context ran out of its mem_size (ggml aborts here; pyggml raises)."""


class GraphFullError(PyGGMLError, OverflowError):
    """A Graph has no room for another node or leaf."""


class NameTooLongError(PyGGMLError, ValueError):
    """A tensor name longer than ggml's 63 characters."""


class UnsupportedOpError(PyGGMLError, NotImplementedError):
    """A backend has no kernel for an op (or for an op with these types)."""
