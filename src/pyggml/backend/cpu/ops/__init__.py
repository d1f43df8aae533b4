"""The CPU backend's op kernels, by family, each in its numpy form (``<family>.py``, registered with
``@kernel``) and, where there is one, its compiled form (``<family>_jit.py``, registered with ``@selector``).

The families are the op constructors' (pyggml/ops/<family>.py): PAD's builder is in pyggml/ops/conv.py and
its kernel in conv.py here. The numpy kernel is every op's reference and fallback; a compiled kernel
gives its bits on the types and layouts its selector accepts. ``fusion.py`` runs consecutive compiled
nodes as one record. Importing this package registers every kernel and selector.
"""

from __future__ import annotations

from . import (
    attn_jit,
    conv,
    custom,
    elementwise,
    elementwise_jit,
    fusion,
    gate_up_jit,
    mat,
    mat_f_jit,
    mat_id_jit,
    mat_jit,
    nn,
    nn_jit,
    recurrent,
    recurrent_jit,
    reduce,
    reduce_jit,
    rows,
    rows_jit,
    shape,
    shape_jit,
    train,
    unary,
    wkv_jit,
)

__all__ = ["attn_jit", "conv", "custom", "elementwise", "elementwise_jit", "fusion", "gate_up_jit", "mat", "mat_f_jit",
           "mat_id_jit", "mat_jit", "nn", "nn_jit", "recurrent", "recurrent_jit", "reduce", "reduce_jit", "rows",
           "rows_jit", "shape", "shape_jit", "train", "unary", "wkv_jit"]
