"""Rows quantized on several threads, as llama-quantize does it: each thread runs ``ggml_quantize_chunk`` on
its own rows (llama_tensor_quantize_impl). Here the threads are Python's, each calling a numba kernel
compiled with ``nogil``, so they really run at once.

Why not numba's ``parallel=True``: a parallel loop costs its kernel 1-10 s more to compile on first use (the
Q4_K quantizer 37.6 s cold against 12.3 s serial, the test suite paying it again in every worker), and it
needs numba's own thread pool, which cannot be entered again from a thread already in it. Rows are
independent, so the bytes do not depend on how the rows are cut.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager

_local = threading.local()  # ``worker`` is set in the pool's own threads
_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


_n_threads = _cores()


def n_threads() -> int:
    """How many threads a big quantization uses (the cores this process may run on, unless
    :func:`using_threads` says otherwise)."""
    return _n_threads


@contextmanager
def using_threads(n: int) -> Iterator[None]:
    """Quantize on ``n`` threads inside the block (llama-quantize's ``nthread``), then restore the count."""
    global _n_threads
    before = _n_threads
    _n_threads = max(1, int(n))
    try:
        yield
    finally:
        _n_threads = before


def _mark_worker() -> None:
    _local.worker = True


def _get_pool(size: int) -> ThreadPoolExecutor:
    """A pool of at least ``size`` threads (all the cores at first, so that it is rarely made again). A smaller
    pool it replaces is not shut down: another thread may be about to submit to it, and an idle pool costs
    only its sleeping threads."""
    global _pool, _pool_size
    with _lock:
        if _pool is None or _pool_size < size:
            _pool_size = max(size, _cores())
            _pool = ThreadPoolExecutor(_pool_size, thread_name_prefix="pyggml-quant", initializer=_mark_worker)
        return _pool


def for_row_chunks(fn: Callable[[int, int], None], n_rows: int, work: int, serial_below: int) -> None:
    """Run ``fn(r0, r1)`` over the rows ``[0, n_rows)``, cut into one range per thread; ``work`` (in 256-value
    units) below ``serial_below`` runs on the calling thread alone, where a hand-off would cost more than it
    saves. A call from one of the pool's threads runs alone too (the pool is never waited on from inside).
    An exception from any range is raised here, that of the lowest rows first."""
    nt = min(_n_threads, n_rows)
    if nt <= 1 or work < serial_below or getattr(_local, "worker", False):
        fn(0, n_rows)
        return
    bounds = [n_rows * i // nt for i in range(nt + 1)]
    pool = _get_pool(nt)
    futures = [pool.submit(fn, bounds[i], bounds[i + 1]) for i in range(nt)]
    wait(futures)  # all of them, so that no range still writes into the output after an error
    for f in futures:
        f.result()


__all__ = ["for_row_chunks", "n_threads", "using_threads"]
