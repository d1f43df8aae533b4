"""One compile of each numba function per test run, however many xdist workers need it.

The suite's workers start with an empty kernel cache (CI) and meet the same kernels in different tests: each
compiled what it missed, so a kernel the two workers reached close together was compiled twice (the largest
take 5-15 CPU seconds). Here every compile (a numba dispatcher's, and a ``cfunc``'s: jit.JitKernel) takes a
file lock named after the function and its signature first; the worker that waited then finds the other's
result in numba's disk cache (both look there before compiling). A function's compile can start others
(the functions it calls), never the other way round, so the locks cannot wait on each other in a loop.

The workers compile in their own process (PYGGML_JIT_PROCESSES=1, set beside this): two workers already keep
both cores busy, and a compile helper process costs an import of numba and pyggml (about 1.5 CPU seconds) every
time a plan misses a kernel.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from numba.core.ccallback import CFunc
from numba.core.dispatcher import Dispatcher


def _name(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def _locked(compile_fn: Callable[..., Any], key_of: Callable[..., str], folder: Path) -> Callable[..., Any]:
    @functools.wraps(compile_fn)
    def compile_locked(self: Any, *args: Any, **kwargs: Any) -> Any:
        key = hashlib.sha1(key_of(self, *args).encode()).hexdigest()
        with open(folder / key, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                return compile_fn(self, *args, **kwargs)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    return compile_locked


def install(run_id: str) -> None:
    """Serialize this process's numba compiles with those of the other processes given the same ``run_id``
    (the xdist run's id)."""
    base = Path(tempfile.gettempdir())
    for old in base.glob(f"pyggml-compile-locks-{os.getuid()}-*"):  # earlier runs' (a day old: surely ended)
        if time.time() - old.stat().st_mtime > 86400:
            shutil.rmtree(old, ignore_errors=True)
    folder = base / f"pyggml-compile-locks-{os.getuid()}-{run_id}"
    folder.mkdir(exist_ok=True)
    Dispatcher.compile = _locked(Dispatcher.compile, lambda d, sig: f"{_name(d.py_func)}:{sig}", folder)
    CFunc.compile = _locked(CFunc.compile, lambda c: f"{_name(c._pyfunc)}:{c._sig}", folder)
