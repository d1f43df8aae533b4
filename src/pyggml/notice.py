"""Telling the user what a long first run is doing: a line on stderr when a step takes over a second.

First runs compile numba kernels and assemble model files; without a word they look hung. The
notice is printed only if the step is still running after ``after_s`` seconds, so fast (cached)
runs stay quiet.
"""

from __future__ import annotations

import sys
import threading
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
