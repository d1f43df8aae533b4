"""ggml's SIMD expf, lane by lane, so softmax and SiLU give llama.cpp's bits.

ggml-cpu computes exp in softmax rows and SiLU/SwiGLU with ``ggml_v_expf`` (vec.h) over whole
vectors and libm's ``expf`` over the leftover elements. The vector function is a fixed sequence
of fma/mul/add and bit operations, so the same steps on one float per call give each lane's
result exactly; written without calls or data-dependent branches LLVM vectorizes the loops
again. The algorithm (as in ARM's optimized-routines): n = round(x/ln2) through the 1.5*2^23
shift, b = x - n*ln2 in two fma steps (ln2 split in a high and a low part), a degree-5
polynomial p(b) ~ e^b - 1, then 2^n * (1 + p) with the exponent built in the bits; |n| > 126
scales in two steps (gradual underflow, overflow to inf), |n| > 192 saturates.

``LANES`` is the AVX2 vector (8 floats): rows are split the way ggml splits them on an AVX2+FMA
build, the build this project measures against (an AVX-512 build uses 16).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from ..native import f32_bits, f32_from_bits, fmaf

#: floats per ggml SIMD step on AVX2 (exp lanes, then libm expf for the row's last n % LANES)
LANES = 8
#: ggml_v_expf's constants, as vec.h spells them (hex floats: exact)
_SHIFT = np.float32(float.fromhex("0x1.8p23"))  # adding it rounds to an integer in the low mantissa bits
_LOG2E = np.float32(float.fromhex("0x1.715476p+0"))
_LN2_HI = np.float32(float.fromhex("0x1.62e4p-1"))
_LN2_LO = np.float32(float.fromhex("0x1.7f7d1cp-20"))
_C1 = np.float32(float.fromhex("0x1.ffffecp-1"))
_C2 = np.float32(float.fromhex("0x1.fffdb6p-2"))
_C3 = np.float32(float.fromhex("0x1.555e66p-3"))
_C4 = np.float32(float.fromhex("0x1.573e2ep-5"))
_C5 = np.float32(float.fromhex("0x1.0e4020p-7"))
_ONE_BITS = np.int32(0x3F800000)


@numba.njit(inline="always", cache=True, error_model="numpy")
def v_expf(x):  # pragma: no cover - compiled
    """One lane of ggml_v_expf (AVX2/FMA): e**x of a float32, about 1.5 ulp from the exact value."""
    z = fmaf(x, _LOG2E, _SHIFT)
    n = z - _SHIFT
    b = fmaf(-n, _LN2_LO, fmaf(-n, _LN2_HI, x))
    e = np.int32(f32_bits(z) << np.int32(23))
    k = f32_from_bits(e + _ONE_BITS)
    u = b * b
    j = fmaf(fmaf(fmaf(_C5, b, _C4), u, fmaf(_C3, b, _C2)), u, _C1 * b)
    an = abs(n)
    small = fmaf(k, j, k)
    # ggml takes the two-step scale where 126 < |n| and saturates where |n| > 192 (it branches around
    # both when no lane needs them). Lanes that drop the scaled value compute it from 1 and 2^n instead
    # of 2^-125 and 2^(n+125), and the saturated value is ggml's s1*s1 (2^-250 or 2^254) already
    # rounded: a subnormal or underflowing product costs a microcode assist on x86 (ten times the whole
    # exp), even in a lane an AVX-512 mask discards. The choice is in integer bits, where LLVM keeps it.
    huge = an > np.float32(192.0)
    wide = an > np.float32(126.0) and not huge
    if wide:
        g = np.int32(-2113929216) if n <= np.float32(0.0) else np.int32(0)  # 0x82000000 where n <= 0
    else:
        g = np.int32(-1065353216)  # 0xC0800000: s1 = 1.0, s2 = 2^n
    s1 = f32_from_bits(g + np.int32(0x7F000000))
    s2 = f32_from_bits(e - g)
    scaled = fmaf(s2, j, s2) * s1
    r = scaled if wide else small
    big = np.float32(0.0) if n <= np.float32(0.0) else np.float32(np.inf)
    return big if huge else r


@numba.njit(inline="always", cache=True, error_model="numpy")
def libm_expf(x):  # pragma: no cover - compiled
    """expf from the C library: ggml's leftover elements after the vector steps."""
    return np.float32(math.exp(x))
