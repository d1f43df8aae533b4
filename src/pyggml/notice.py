"""Telling the user what a long first run is doing: a line on stderr when a step takes over a second.

First runs compile numba kernels and assemble model files; without a word they look hung. The
notice is printed only if the step is still running after ``after_s`` seconds, so fast (cached)
runs stay quiet.

The seconds such first-run work takes are also summed (:func:`first_run_time`, read through
:func:`first_run_seconds`), so speed figures measured around it can leave them out: a first
``pyggml generate`` compiles its kernels inside the prompt's first decode, and "prompt eval: 6
tokens in 40 s" would report the compiler, not the prompt.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def slow_notice(message: str, after_s: float = 1.0) -> Iterator[None]:
    """Print ``message`` on stderr if the ``with`` block is still running after ``after_s`` seconds."""
    timer = threading.Timer(after_s, lambda: print(message, file=sys.stderr, flush=True))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


_first_run_s = 0.0
_first_run_lock = threading.Lock()


@contextmanager
def first_run_time() -> Iterator[None]:
    """Count the ``with`` block's wall time as first-run work (compiling, not computing)."""
    global _first_run_s
    t0 = time.perf_counter()
    try:
        yield
    finally:
        with _first_run_lock:
            _first_run_s += time.perf_counter() - t0


def first_run_seconds() -> float:
    """Seconds this process has spent in :func:`first_run_time` blocks so far (a running total: take
    the difference across a timed span)."""
    return _first_run_s
