"""The CPU backend: host buffers and the numpy/numba kernels."""
