"""The CPU backend's numpy kernels, by family: each module registers its ops' kernels (``@kernel``).

The families are the same as the op constructors' (pyggml/ops/<family>.py): PAD's builder is in
ops/conv.py and its kernel in kernels/conv.py, ROLL's in ops/shape.py and kernels/shape.py.
ops/table.toml lists every op's row; importing this package registers every kernel.
"""

from __future__ import annotations

from . import conv, custom, elementwise, mat, nn, recurrent, reduce, rows, shape, train, unary

__all__ = ["conv", "custom", "elementwise", "mat", "nn", "recurrent", "reduce", "rows", "shape", "train", "unary"]
