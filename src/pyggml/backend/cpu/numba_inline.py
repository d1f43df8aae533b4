"""A faster copy of inlined IR in numba's ``inline="always"`` pass: the same compiled code, a third of the time.

pyggml's kernels are built from small helpers that numba inlines at the IR level (``@njit(inline="always")``:
record readers, ggml's expf, fp16 rounding, the quantized dot products' inner steps). For every call site,
numba's InlineWorker copies the callee's IR block by block with ``copy.deepcopy``. Every variable of a block
points at the function's one ``Scope``, which lists every variable of the function, so each block's deepcopy
copies the whole scope again: the cost grows with blocks times variables, and the flash-attention kernel
spent about two thirds of its 6-20 s compile deep-copying scopes (cProfile: ``copy_ir`` 24.7 s of 36.7 s).

:func:`install` makes the blocks of one copy share one copy of their scope, as the original blocks share the
original scope. Only the copying changes: the callee's variables are renamed into the caller's scope right
after the copy, and the machine code is the same byte for byte (the flash-attention kernel's assembly,
compiled with and without the change, compares equal; tests/backend/test_numba_inline.py checks the copy).
It patches a numba internal, so it checks the shape it expects and leaves numba alone when that differs;
``PYGGML_NUMBA_INLINE_COPY=0`` in the environment leaves it alone too.
"""

from __future__ import annotations

import copy
import os
import types
from typing import Any

_installed = False
#: the scope being copied, its copy, and the blocks copied with it (``copy_ir`` copies a function's blocks one
#: after another; a block met again means a new copy of the same IR has begun, which gets a scope of its own)
_last: tuple[Any, Any, set[int]] | None = None


def _deepcopy(obj: Any, memo: dict | None = None) -> Any:
    """``copy.deepcopy`` that copies an IR block's scope once for all the blocks of one copy sharing it."""
    global _last
    from numba.core import ir

    if memo is None and isinstance(obj, ir.Block) and obj.scope is not None:
        scope = obj.scope
        if _last is None or _last[0] is not scope or id(obj) in _last[2]:
            _last = (scope, copy.deepcopy(scope), set())
        _last[2].add(id(obj))
        memo = {id(scope): _last[1]}
    return copy.deepcopy(obj, memo)


def install() -> bool:
    """Route numba's inliner's block copies through :func:`_deepcopy`; False when numba's inliner does not
    look as expected (a numba version that copies differently): then nothing changes."""
    global _installed
    if _installed:
        return True
    if os.environ.get("PYGGML_NUMBA_INLINE_COPY") == "0":
        return False
    from numba.core import inline_closurecall as icc
    from numba.core import ir

    worker = getattr(icc, "InlineWorker", None)
    if getattr(icc, "copy", None) is not copy or worker is None or not hasattr(ir, "Scope"):
        return False
    icc.copy = types.SimpleNamespace(deepcopy=_deepcopy, copy=copy.copy)
    _installed = True
    return True


def uninstall() -> None:
    """Put numba's own ``copy`` back (tests compare both)."""
    global _installed, _last
    from numba.core import inline_closurecall as icc

    if _installed:
        icc.copy = copy
        _installed, _last = False, None
