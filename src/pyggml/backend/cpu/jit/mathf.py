"""expf written for vectorizing loops: Cephes' polynomial with a bit-built 2^n, no calls, no branches.

libm's expf is a call LLVM cannot vectorize, which made a softmax row cost ~8 ns a value. This
one is about 1 ulp from the correctly rounded result (ggml's own SIMD ``ggml_v_expf`` is about
1.5 ulp), returns +inf above 88.72 and 0 below -87.33 (where the true value would be a subnormal
under 1.2e-38: nothing a softmax or SiLU can tell from zero).
"""

from __future__ import annotations

import numba
import numpy as np

from ..native import f32_from_bits

_LOG2E = np.float32(1.44269504088896341)
_C1 = np.float32(0.693359375)
_C2 = np.float32(-2.12194440e-4)
_P0 = np.float32(1.9875691500e-4)
_P1 = np.float32(1.3981999507e-3)
_P2 = np.float32(8.3334519073e-3)
_P3 = np.float32(4.1665795894e-2)
_P4 = np.float32(1.6666665459e-1)
_P5 = np.float32(5.0000001201e-1)
_HI = np.float32(88.7228391)
_LO = np.float32(-87.3365447)


@numba.njit(inline="always", cache=True, error_model="numpy")
def expf(x):  # pragma: no cover - compiled
    """e**x for a float32 x (see the module docstring for the range)."""
    xc = min(max(x, _LO), _HI)
    fx = min(np.floor(xc * _LOG2E + np.float32(0.5)), np.float32(127.0))  # 2^fx stays a normal float
    r = xc - fx * _C1
    r = r - fx * _C2
    z = r * r
    y = ((((_P0 * r + _P1) * r + _P2) * r + _P3) * r + _P4) * r + _P5
    y = y * z + r + np.float32(1.0)
    y = y * f32_from_bits((np.int32(fx) + np.int32(127)) << np.int32(23))
    if x > _HI:
        y = np.float32(np.inf)
    if x < _LO:
        y = np.float32(0.0)
    return y
