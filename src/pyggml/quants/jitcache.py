"""Stale numba caches after an edit or an upgrade: dropped once, before any kernel loads.

numba's disk cache keys a compiled function on its own source file (path, mtime, size). pyggml's
kernels inline helpers and LLVM intrinsics from other files (mathf.py, quants/intrinsics.py, native.py, the
codecs' shared kernels), so a change there alone would leave every cached kernel that inlined the
old code in use. A stamp over all the package's numba source files catches that: when it changes,
the package's cache files go and kernels compile afresh (the usual first-run notice says so).

It lives in quants/, the lowest layer that compiles with numba, whose import precedes every kernel
load in the package.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parent.parent  # src/pyggml
STAMP = ROOT / "__pycache__" / "numba-sources.sha256"


F = TypeVar("F", bound=Callable)


def variant(*tags: object) -> Callable[[F], F]:
    """Decorator (under ``@njit``) naming one variant of a closure factory's kernel in its ``__qualname__``.

    numba names a compiled function's symbol after its module, qualname and a per-process counter. Two
    variants of one closure (a factory's Q8_0 and Q5_0 row kernels) compiled in different processes (the
    compile helpers, or earlier runs) can get the same symbol; loaded from the disk cache into one process,
    a kernel calling one then links to the other's code. A qualname per variant keeps their symbols apart.
    """

    def name(fn: F) -> F:
        fn.__qualname__ = f"{fn.__qualname__}_{'_'.join(str(t) for t in tags)}"
        return fn

    return name


def sources_digest(root: Path = ROOT) -> str:
    """SHA-256 over the path and bytes of every .py file under ``root`` that uses numba."""
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        data = path.read_bytes()
        if b"numba" in data:
            h.update(str(path.relative_to(root)).encode())
            h.update(data)
    return h.hexdigest()


def drop_stale_caches(root: Path = ROOT, stamp: Path = STAMP) -> bool:
    """Delete the numba cache files under ``root`` when the sources changed since the stamp; True if it did.
    A read-only install (no stamp can be written) is left as it is."""
    digest = sources_digest(root)
    try:
        if stamp.exists() and stamp.read_text() == digest:
            return False
        stamp.parent.mkdir(exist_ok=True)
        if not os.access(stamp.parent, os.W_OK):
            return False
        for cached in [*root.rglob("*.nbi"), *root.rglob("*.nbc")]:
            cached.unlink(missing_ok=True)
        stamp.write_text(digest)
    except OSError:
        return False
    return True
