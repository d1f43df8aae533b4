"""numba_inline: numba's inliner copies a callee's IR with one scope copy per copy, and the code is unchanged."""

from __future__ import annotations

import copy

import numba
import numpy as np
import pytest
from numba.core import inline_closurecall
from numba.core.compiler import run_frontend

from pyggml.backend.cpu import jit, numba_inline


def _branchy(x, n):
    """A helper with loops and branches: several IR blocks sharing one scope."""
    acc = np.float32(0.0)
    for i in range(n):
        if i % 3 == 0:
            acc += x * np.float32(i)
        elif i % 3 == 1:
            acc -= x
        else:
            acc = acc * np.float32(0.5)
    return acc


def test_installed_by_the_first_compile() -> None:
    """A kernel that compiles installs the faster copy first (a warm start, loading cached kernels only, does
    not import numba's inliner at all)."""
    jit.JitFunction(f"{__name__}:_twice_compiled", (numba.float32, numba.int64)).compile()
    if not numba_inline._installed:
        pytest.skip("PYGGML_NUMBA_INLINE_COPY=0 in the environment")
    assert inline_closurecall.copy is not copy
    assert inline_closurecall.copy.deepcopy is numba_inline._deepcopy


def test_blocks_of_one_copy_share_one_new_scope() -> None:
    """What the inliner's copy_ir does block by block: each copy equals numba's own deepcopy of the block, and
    the copied blocks share one scope (as the original blocks share theirs), not the original one."""
    func_ir = run_frontend(_branchy)
    blocks = list(func_ir.blocks.values())
    assert len(blocks) > 3
    copies = [numba_inline._deepcopy(b) for b in blocks]
    plain = [copy.deepcopy(b) for b in blocks]
    assert [[str(s) for s in c.body] for c in copies] == [[str(s) for s in p.body] for p in plain]
    scopes = {id(c.scope) for c in copies}
    assert len(scopes) == 1 and id(blocks[0].scope) not in scopes
    assert copies[0].scope.localvars._con.keys() == blocks[0].scope.localvars._con.keys()
    # a second copy of the same blocks gets a scope of its own (the inliner renames variables in a copy's scope)
    again = [numba_inline._deepcopy(b) for b in blocks]
    assert {id(c.scope) for c in again}.isdisjoint(scopes) and len({id(c.scope) for c in again}) == 1


@numba.njit
def _twice_compiled(x, n):
    return _branchy_inlined(x, n) * np.float32(2.0)


_branchy_inlined = numba.njit(inline="always")(_branchy)


def test_inlined_helper_computes_as_python() -> None:
    helper = numba.njit(inline="always")(_branchy)

    @numba.njit
    def twice(x, n):
        return helper(x, n) + helper(x + np.float32(1.0), n + 1)

    for x, n in ((np.float32(1.5), 7), (np.float32(-2.25), 12)):
        want = _branchy(x, n) + _branchy(x + np.float32(1.0), n + 1)
        assert twice(x, n) == want
