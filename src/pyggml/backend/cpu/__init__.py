"""The CPU backend: host buffers and the numpy/numba kernels."""

from .numba_inline import install as _install_inline_copy

_install_inline_copy()  # before any kernel compiles: numba's inliner copies IR in a third of the time
