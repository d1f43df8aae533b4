"""ggml's op constructors, all of them: they check shapes and types, record the node, and compute nothing.

Every function has ggml's name without the ``ggml_`` prefix and ggml's arguments in ggml's
order (``mul_mat(ctx, a, b)`` is ``ggml_mul_mat``). Result types and shapes, src slots,
op_params layouts and view/inplace semantics follow ggml.c; where ggml asserts, pyggml raises
ShapeError or TypeMismatchError with a message naming the problem.

The constructors live by family in the modules beside this one (elementwise, unary, reduce,
shape, rows, mat, nn, conv, recurrent, train, custom), each next to the CPU kernels of the same
family in backend/cpu/ops/<family>.py; ops/table.toml lists every op's row. This module gathers
them into one namespace (``from pyggml.ops import builders as B``), re-exported flat as ``pyggml.*``.
"""

from __future__ import annotations

from ..errors import ShapeError  # noqa: F401  (importable from here as before)
from . import conv as _conv
from . import custom as _custom
from . import elementwise as _elementwise
from . import mat as _mat
from . import nn as _nn
from . import recurrent as _recurrent
from . import reduce as _reduce
from . import rows as _rows
from . import shape as _shape
from . import train as _train
from . import unary as _unary
from .conv import *  # noqa: F403
from .custom import *  # noqa: F403
from .elementwise import *  # noqa: F403
from .mat import *  # noqa: F403
from .nn import *  # noqa: F403
from .recurrent import *  # noqa: F403
from .reduce import *  # noqa: F403
from .rows import *  # noqa: F403
from .shape import *  # noqa: F403
from .train import *  # noqa: F403
from .unary import *  # noqa: F403

# the family modules (bound under private names: ``unary`` is also a builder)
_FAMILIES = (_elementwise, _unary, _reduce, _shape, _rows, _mat, _nn, _conv, _recurrent, _train, _custom)

__all__ = sorted({name for family in _FAMILIES for name in family.__all__})
