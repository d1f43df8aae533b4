"""Op kernels compiled with numba for the CPU backend's graph plans (plan.py).

Each op here has a *selector* (Python, run once when a plan is built) and one or more *kernels*
(numba ``cfunc``s with ggml's calling shape: ``void kernel(node record, ith, nth, ctrl)``). The
selector checks the node's types and layout and returns a :class:`Choice` (the kernel, extra
record words, scratch bytes), or None when the op's Python kernel should run instead (types or
layouts the compiled kernels do not cover). The numerics are those of the Python kernels in
``kernels_*.py``, which stay the reference: tests compare the two.

Kernels compile on first use and are cached on disk by numba, so a model only compiles what its
graphs use. ``PYGGML_JIT=0`` in the environment turns the compiled kernels off.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numba
from numba import types

from ....ops.enums import Op
from ....tensor import Tensor

#: the C signature of every compiled kernel (see native.call_kernel)
KERNEL_SIG = types.void(types.int64, types.int64, types.int64, types.int64)

_compile_lock = threading.RLock()
#: seconds a compile may take before the user is told what is happening
COMPILE_NOTICE_S = 1.0
_noticed = False


def _notice() -> None:
    global _noticed
    if not _noticed:
        _noticed = True
        print("pyggml: compiling CPU kernels (first run only; cached afterwards)...", file=sys.stderr, flush=True)


class JitKernel:
    """A kernel function compiled to a cfunc the first time its address is asked for."""

    def __init__(self, fn: Callable[..., None]) -> None:
        self.fn = fn
        self.name = fn.__name__
        self._cfunc = None

    @property
    def address(self) -> int:
        if self._cfunc is None:
            with _compile_lock:
                if self._cfunc is None:
                    timer = threading.Timer(COMPILE_NOTICE_S, _notice)
                    timer.daemon = True
                    timer.start()
                    try:
                        self._cfunc = numba.cfunc(KERNEL_SIG, nopython=True, cache=True, error_model="numpy")(self.fn)
                    finally:
                        timer.cancel()
        return self._cfunc.address

    def __repr__(self) -> str:
        return f"<JitKernel {self.name}>"


def jit_kernel(fn: Callable[..., None]) -> JitKernel:
    """Declare a compiled kernel: ``fn(node, ith, nth, ctrl)`` in numba's nopython subset."""
    return JitKernel(fn)


@dataclass
class Choice:
    """What a selector picked for one node."""

    kernel: JitKernel
    ints: Sequence[int] = ()  # record words AUX.. (at most 8)
    floats: Sequence[float] = ()  # float32 values from record word AUX+8 on (at most 14)
    wsize: int = 0  # bytes of the shared work buffer the kernel uses
    notes: dict = field(default_factory=dict)  # objects the record points into (the plan keeps them)


Selector = Callable[[Tensor], "Choice | None"]
SELECTORS: dict[Op, Selector] = {}


def selector(*ops: Op) -> Callable[[Selector], Selector]:
    def register(fn: Selector) -> Selector:
        for op in ops:
            if op in SELECTORS:
                raise RuntimeError(f"two compiled-kernel selectors registered for {op.name}")
            SELECTORS[op] = fn
        return fn

    return register


def enabled() -> bool:
    return os.environ.get("PYGGML_JIT", "1") != "0"


def select(node: Tensor) -> Choice | None:
    """The compiled kernel for ``node``, or None (its Python kernel runs)."""
    sel = SELECTORS.get(node.op)
    return None if sel is None else sel(node)


# importing the kernel modules registers their selectors
from . import elementwise, matmul, nn, rows  # noqa: E402

__all__ = ["SELECTORS", "Choice", "JitKernel", "elementwise", "enabled", "jit_kernel", "matmul", "nn", "rows", "select",
           "selector"]
