"""Host memory as integer addresses, the way ggml sees it.

In ggml a tensor's ``data`` is a pointer. pyggml keeps that model: every block of host
memory (a context's arena, a CPU backend buffer, a mmap'd model file) is a numpy ``uint8``
array registered here, and a tensor's ``data`` is an integer address inside one of them.
``region_view(addr, n)`` turns an address back into a numpy view, so kernels read and write
exactly the bytes the allocator planned: an overlap bug corrupts results, and tests see it.

Regions are held by weak reference: the owner (context, buffer) keeps the array alive, and
the region disappears when the array is freed.
"""

from __future__ import annotations

import bisect
import threading
import weakref

import numpy as np

from .errors import PyGGMLError


class MemoryAccessError(PyGGMLError, ValueError):
    """An address range that is not inside any registered host memory region."""


_lock = threading.Lock()
_bases: list[int] = []  # sorted start addresses
_regions: dict[int, tuple[int, weakref.ref]] = {}  # base -> (size, weakref to array)


def address_of(arr: np.ndarray) -> int:
    """The integer address of an array's first byte."""
    return int(arr.__array_interface__["data"][0])


def register(arr: np.ndarray) -> int:
    """Register a C-contiguous uint8 array as host memory; returns its base address."""
    if arr.dtype != np.uint8 or arr.ndim != 1 or not arr.flags.c_contiguous:
        raise TypeError("host memory regions must be 1-d contiguous uint8 arrays")
    base = address_of(arr)
    size = arr.nbytes
    if size == 0:
        return base

    def _drop(_ref: weakref.ref, base: int = base) -> None:
        with _lock:
            entry = _regions.get(base)
            if entry is not None and entry[1] is _ref:
                del _regions[base]
                _bases.pop(bisect.bisect_left(_bases, base))

    ref = weakref.ref(arr, _drop)
    with _lock:
        if base in _regions:
            _bases.pop(bisect.bisect_left(_bases, base))
        _regions[base] = (size, ref)
        bisect.insort(_bases, base)
    return base


def unregister(arr: np.ndarray) -> None:
    base = address_of(arr)
    with _lock:
        entry = _regions.get(base)
        if entry is not None and entry[1]() is arr:
            del _regions[base]
            _bases.pop(bisect.bisect_left(_bases, base))


def find_region(addr: int, nbytes: int = 0) -> tuple[np.ndarray, int]:
    """The registered array holding ``[addr, addr+nbytes)`` and the offset of ``addr`` in it."""
    with _lock:
        i = bisect.bisect_right(_bases, addr) - 1
        if i >= 0:
            base = _bases[i]
            size, ref = _regions[base]
            arr = ref()
            if arr is not None and addr + nbytes <= base + size:
                return arr, addr - base
    raise MemoryAccessError(f"address range 0x{addr:x}+{nbytes} is not in any host memory region")


def region_view(addr: int, nbytes: int) -> np.ndarray:
    """A writable uint8 view of ``nbytes`` bytes at ``addr``."""
    arr, off = find_region(addr, nbytes)
    return arr[off : off + nbytes]


def aligned_empty(size: int, alignment: int = 64) -> np.ndarray:
    """A zero-filled uint8 array of ``size`` bytes whose start is ``alignment``-aligned."""
    raw = np.zeros(size + alignment, dtype=np.uint8)
    off = (-address_of(raw)) % alignment
    return raw[off : off + size]
