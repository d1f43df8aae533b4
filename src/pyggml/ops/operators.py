"""Python's operators on tensors: ``a + b``, ``a - b``, ``a * b`` (``a * 2.0`` scales), ``a / b``,
``a @ b`` (ggml_mul_mat) and ``-a``, each building the ggml node in the tensor's context.

tensor.py sits below ops/ and knows nothing of builders; the operators are attached to Tensor
here instead, once, when pyggml is imported (pyggml/__init__.py imports this module). This keeps
the import arrow one way (ops -> tensor) where tensor.py and builders.py used to import each other.
"""

from __future__ import annotations

from collections.abc import Callable

from ..context import Context
from ..tensor import Tensor
from . import builders


def _binary(build: Callable[[Context, Tensor, Tensor], Tensor], doc: str) -> Callable[[Tensor, object], Tensor]:
    def op(self: Tensor, other: object) -> Tensor:
        if not isinstance(other, Tensor):
            return NotImplemented
        return build(self._ctx_for_op(), self, other)

    op.__doc__ = doc
    return op


def _mul(self: Tensor, other: object) -> Tensor:
    """``a * b`` is ggml_mul (broadcasting b); ``a * 2.0`` and ``2.0 * a`` are ggml_scale."""
    if isinstance(other, int | float):
        return builders.scale(self._ctx_for_op(), self, float(other))
    if not isinstance(other, Tensor):
        return NotImplemented
    return builders.mul(self._ctx_for_op(), self, other)


def _neg(self: Tensor) -> Tensor:
    """``-a`` is ggml_neg."""
    return builders.neg(self._ctx_for_op(), self)


def attach() -> None:
    """Give Tensor its arithmetic operators (idempotent)."""
    Tensor.__add__ = _binary(builders.add, "``a + b`` is ggml_add (b broadcast to a's shape).")
    Tensor.__sub__ = _binary(builders.sub, "``a - b`` is ggml_sub.")
    Tensor.__mul__ = _mul
    Tensor.__rmul__ = _mul
    Tensor.__truediv__ = _binary(builders.div, "``a / b`` is ggml_div.")
    Tensor.__matmul__ = _binary(builders.mul_mat, "``a @ b`` is ggml_mul_mat(a, b): rows of a dotted with rows of b.")
    Tensor.__neg__ = _neg


attach()
