"""Control of the BLAS thread count numpy uses, so MUL_MAT honours the graph's ``n_threads``.

numpy's bundled OpenBLAS starts one thread per core and makes every matmul wait for all of them.
For a mat-vec (a decode step) the work is memory-bound and tiny; waiting on a second thread
costs more than it saves, and on a busy machine a descheduled worker stalls the call for
milliseconds. So the executor asks for ``n_threads`` on mat-mat products and one thread on
mat-vec products. Setting the count is a plain call into OpenBLAS (what threadpoolctl does);
without a known OpenBLAS in the process this module does nothing.
"""

from __future__ import annotations

import ctypes
import os

_SET_NAMES = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
              "openblas_set_num_threads")
_GET_NAMES = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads", "openblas_get_num_threads64_",
              "openblas_get_num_threads")


def _find_openblas() -> tuple[object | None, object | None]:
    """The set/get thread-count functions of the OpenBLAS numpy loaded, if any."""
    import numpy  # noqa: F401  (make sure numpy's BLAS is loaded before looking for it)

    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line}
    except OSError:
        return None, None
    for path in sorted(paths):
        if not os.path.exists(path):
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        setter = next((getattr(lib, n) for n in _SET_NAMES if hasattr(lib, n)), None)
        getter = next((getattr(lib, n) for n in _GET_NAMES if hasattr(lib, n)), None)
        if setter is not None and getter is not None:
            setter.argtypes = [ctypes.c_int]
            setter.restype = None
            getter.argtypes = []
            getter.restype = ctypes.c_int
            return setter, getter
    return None, None


_setter, _getter = _find_openblas()
_current = _getter() if _getter is not None else 0  # type: ignore[operator]
_max = max(1, _current)


def available() -> bool:
    """Whether the BLAS thread count can be set."""
    return _setter is not None


def set_threads(n: int) -> None:
    """Use ``n`` BLAS threads from now on (capped at the count OpenBLAS started with)."""
    global _current
    n = max(1, min(int(n), _max))
    if _setter is None or n == _current:
        return
    _setter(n)  # type: ignore[operator]
    _current = n


def get_threads() -> int:
    """The BLAS thread count in effect (0 when unknown)."""
    return _current
