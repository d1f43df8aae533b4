"""Small-float formats and rounding helpers, each bit for bit as ggml computes them.

Every quantizer stores its scales in one of these formats, so the conversions live here once.
The numpy functions work on whole arrays; the ``*_nb`` functions are numba scalars meant to be
called from inside other ``@njit`` kernels.

Where ggml differs from numpy it is on NaN: ggml's software fp32->fp16 (ggml-impl.h,
``ggml_compute_fp32_to_fp16``) turns every NaN into ``0x7E00 | sign``, and its fp16->fp32 goes
through a float multiply, which quiets a signalling NaN. numpy keeps payloads untouched, so the
NaN lanes are patched after the fast numpy conversion.

The plain float types F32, F16 and BF16 are codecs here too (block size 1, at the end of this
module): ``ggml_quantize_chunk`` and ``to_float`` handle them (F16 through
``ggml_fp32_to_fp16_row``, BF16 through ``ggml_fp32_to_bf16_row_ref``), and the matmul path
converts activations to F16/BF16 as their ``vec_dot_type``. An importance matrix means nothing for
them and is ignored, as in ggml.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numba as nb
import numpy as np

from ..types import GGMLType
from .codec import Codec, register

# ---------------------------------------------------------------------------------------------
# fp16
# ---------------------------------------------------------------------------------------------


def fp32_to_fp16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> IEEE half bits (uint16), round-to-nearest-even, NaN -> 0x7E00 with x's sign."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        h = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        sign = (x.view(np.uint32) >> 16).astype(np.uint16) & np.uint16(0x8000)
        h = np.where(nan, sign | np.uint16(0x7E00), h)
    return h


def fp16_bits_to_fp32(h: np.ndarray) -> np.ndarray:
    """IEEE half bits (uint16) -> float32 (exact; a signalling NaN comes back quiet, as in ggml)."""
    h = np.asarray(h, dtype=np.uint16)
    f = h.view(np.float16).astype(np.float32)
    nan = np.isnan(f)
    if nan.any():
        f[nan] = (f[nan].view(np.uint32) | np.uint32(0x00400000)).view(np.float32)
    return f


def round_fp16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest fp16 and widened back (what ``FP16_TO_FP32(FP32_TO_FP16(x))``
    gives)."""
    return fp16_bits_to_fp32(fp32_to_fp16_bits(x))


@nb.njit(cache=True, error_model="numpy")
def fp32_to_fp16_bits_nb(v: float) -> int:
    """float32 -> IEEE half bits (``GGML_FP32_TO_FP16``) on one value, for ``@njit`` kernels that
    write their block bytes themselves: round to nearest even, overflow to inf, NaN -> 0x7E00
    with its sign (as :func:`fp32_to_fp16_bits`)."""
    sign = 0x8000 if math.copysign(1.0, v) < 0 else 0
    a = abs(float(v))
    if a != a:
        return sign | 0x7E00
    if a == math.inf:
        return sign | 0x7C00
    if a < 6.103515625e-05:  # below the smallest normal half: units of 2**-24
        return sign | int(np.rint(a * 16777216.0))
    m, e = math.frexp(a)
    bits = ((e + 14) << 10) + int(np.rint(m * 2048.0)) - 1024
    if bits > 0x7C00:
        bits = 0x7C00
    return sign | bits


@nb.njit(cache=True, error_model="numpy")
def fp16_bits_to_fp32_nb(h: int) -> np.float32:
    """IEEE half bits -> float32 (exact) on one value; a NaN comes back as the default quiet NaN."""
    e = (h >> 10) & 31
    f = h & 1023
    if e == 0:
        a = math.ldexp(float(f), -24)
    elif e == 31:
        a = math.inf if f == 0 else math.nan
    else:
        a = math.ldexp(float(1024 + f), e - 25)
    return np.float32(-a) if h & 0x8000 else np.float32(a)


# ---------------------------------------------------------------------------------------------
# bf16
# ---------------------------------------------------------------------------------------------


def fp32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits as ``ggml_compute_fp32_to_bf16``: round-nearest-even, NaN |= 64.

    The rounding is done on the integer bits, so an input near FLT_MAX rounds up to inf exactly
    as the C code does.
    """
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    out = (u >> np.uint32(16)) & np.uint32(1)
    out += np.uint32(0x7FFF)
    out += u  # wraps only for negative NaNs, which are replaced below
    out >>= np.uint32(16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():
        out[nan] = (u[nan] >> np.uint32(16)) | np.uint32(64)
    return out.astype(np.uint16)


def bf16_bits_to_fp32(h: np.ndarray) -> np.ndarray:
    """bfloat16 bits -> float32: the bits are the top half of the float, nothing is rounded."""
    return (np.asarray(h, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# ---------------------------------------------------------------------------------------------
# E8M0 (MXFP4 block exponent) and UE4M3 (NVFP4 sub-block scale)
# ---------------------------------------------------------------------------------------------


def _e8m0_half_table() -> np.ndarray:
    # 2^(e-128): e = 0 and 1 are subnormal floats, the rest have biased exponent e-1.
    e = np.arange(256, dtype=np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << 23)
    return bits.astype(np.uint32).view(np.float32)


def _ue4m3_table() -> np.ndarray:
    # ggml returns half the UE4M3 value because the fp4 code book (kvalues_fp4) is doubled.
    u = np.arange(256)
    exp = (u >> 3) & 0xF
    man = (u & 7).astype(np.float64)
    raw = np.where(exp == 0, man * 2.0**-9, (1.0 + man / 8.0) * np.exp2(exp - 7.0))
    raw[(u == 0) | (u == 0x7F)] = 0.0
    return (raw * 0.5).astype(np.float32)


#: ``ggml_e8m0_to_fp32_half`` for every byte
E8M0_HALF = _e8m0_half_table()
#: ``ggml_ue4m3_to_fp32`` for every byte (bit 7 is ignored, as in ggml)
UE4M3 = _ue4m3_table()


def e8m0_to_fp32_half(e: np.ndarray) -> np.ndarray:
    """ggml_e8m0_to_fp32_half: 2^(e-128) as float32 (no NaN for 0xFF, like ggml)."""
    return E8M0_HALF[np.asarray(e, dtype=np.uint8)]


def ue4m3_to_fp32(u: np.ndarray) -> np.ndarray:
    """ggml_ue4m3_to_fp32: half the value of an unsigned E4M3 byte; 0 and 0x7F give 0."""
    return UE4M3[np.asarray(u, dtype=np.uint8)]


@nb.njit(cache=True, error_model="numpy")
def fp32_to_ue4m3_nb(x: float) -> int:
    """ggml_fp32_to_ue4m3 on one float32: clamps to 448, rounds mantissa halves up (not to even)."""
    x = np.float32(x)
    if not x > np.float32(0.0):
        return 0
    if x > np.float32(448.0):
        x = np.float32(448.0)
    m, e = math.frexp(x)  # x = m * 2^e, 0.5 <= m < 1, so the float32 exponent is e-1
    ue_exp = e - 1 + 7
    if ue_exp <= 0:
        # subnormal UE4M3: value = man * 2^-9; x*512 is exact, so one float32 add rounds
        man = int(np.float32(x * np.float32(512.0)) + np.float32(0.5))
        if man > 7:
            man = 7
        if man < 1:
            return 0
        return man
    if ue_exp >= 15:
        return 0x7E
    frac = int((m * 2.0 - 1.0) * 8388608.0)  # the 23 float32 mantissa bits
    ue_man = (frac >> 20) + ((frac >> 19) & 1)
    if ue_man > 7:
        ue_man = 0
        ue_exp += 1
        if ue_exp >= 15:
            return 0x7E
    return (ue_exp << 3) | ue_man


@nb.njit(cache=True, error_model="numpy")
def _fp32_to_ue4m3_array(x: np.ndarray, out: np.ndarray) -> None:
    for i in range(x.size):
        out[i] = fp32_to_ue4m3_nb(x[i])


def fp32_to_ue4m3(x: np.ndarray) -> np.ndarray:
    """ggml_fp32_to_ue4m3 over an array (uint8 result)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty(x.size, dtype=np.uint8)
    _fp32_to_ue4m3_array(x.reshape(-1), out)
    return out.reshape(x.shape)


# ---------------------------------------------------------------------------------------------
# rounding
# ---------------------------------------------------------------------------------------------

_MAGIC = np.float32(12582912.0)  # 1.5 * 2^23


@nb.njit(cache=True, error_model="numpy")
def nearest_int_nb(fval: float) -> int:
    """ggml's ``nearest_int``: add 1.5*2^23 in float32 and read the low mantissa bits back.

    That is round-half-to-even for |x| < 2^22; outside that range ggml asserts only in debug
    builds, so this reproduces what the bits give (NaN reads as a default quiet NaN, i.e. 0).
    """
    v = np.float32(np.float32(fval) + _MAGIC)
    if v >= np.float32(8388608.0) and v < np.float32(16777216.0):
        return int(v) - 12582912  # the common case: v's mantissa field is v - 2^23
    if v != v:
        return 0
    if v == np.float32(0.0) or math.isinf(v):
        frac = 0
    else:
        m, _e = math.frexp(abs(v))
        frac = int((m * 2.0 - 1.0) * 8388608.0)
    return frac - 0x00400000


def nearest_int(x: np.ndarray) -> np.ndarray:
    """ggml's ``nearest_int`` over an array (int32), bit for bit: the same magic-number trick on
    float32, so it is round-half-to-even for |x| < 2^22 and gives C's bits beyond (a NaN gives
    what its payload gives, as on x86; a default quiet NaN gives 0)."""
    with np.errstate(over="ignore", invalid="ignore"):
        v = np.asarray(x, dtype=np.float32) + _MAGIC
    return (v.view(np.int32) & 0x007FFFFF) - 0x00400000


@nb.njit(cache=True, error_model="numpy")
def trunc_to_i32_nb(v: float) -> int:
    """C's float->int conversion as x86 ``cvttss2si`` does it: truncate toward zero, and give
    INT_MIN for NaN or anything out of range (where C leaves the result undefined)."""
    if v >= -2147483648.0 and v < 2147483648.0:
        return int(v)
    return -2147483648


@nb.njit(cache=True, error_model="numpy")
def trunc_to_i8_nb(v: float) -> int:
    """``(int8_t)f`` on x86: cvttss2si to int32, then keep the low byte (signed)."""
    i = trunc_to_i32_nb(v) & 0xFF
    return i - 256 if i >= 128 else i


@nb.njit(cache=True, error_model="numpy")
def roundf_nb(v: float) -> float:
    """C ``roundf``: round half away from zero (returns a float; NaN and inf pass through).

    For a float32 input floor(|v| + 0.5) in float64 is exact: below 2^23 the sum needs at most
    25 bits, and above it |v| is already an integer.
    """
    a = np.floor(abs(np.float64(v)) + 0.5)
    return a if v >= 0 else -a


@nb.njit(cache=True, error_model="numpy")
def lroundf_nb(v: float) -> int:
    """glibc ``lroundf`` on x86-64: half away from zero; NaN, inf and |v| >= 2^63 give LONG_MIN."""
    if v != v or not abs(v) < 9.223372036854775807e18:
        return -9223372036854775807 - 1
    return int(roundf_nb(v))


@nb.njit(cache=True, error_model="numpy")
def round_fp16_nb(x: float) -> np.float32:
    """float32 -> nearest fp16 value (round-half-even, overflow to inf), returned as float32.

    For kernels that continue with the fp16-rounded scale, as ggml does with
    ``GGML_FP16_TO_FP32(y.d)``. A NaN is returned unchanged (payload and all).
    """
    if x != x:
        return np.float32(x)
    return fp16_bits_to_fp32_nb(fp32_to_fp16_bits_nb(x))


# ---------------------------------------------------------------------------------------------
# the float types as codecs
# ---------------------------------------------------------------------------------------------


@register
class F32Codec(Codec):
    """Identity: the bytes are the little-endian floats themselves."""

    qtype = GGMLType.F32
    vec_dot_type = GGMLType.F32
    block_dtype = np.dtype("<f4")

    def quantize_rows(self, x: np.ndarray, imatrix: np.ndarray | None) -> np.ndarray:
        return np.ascontiguousarray(x, dtype="<f4").view(np.uint8).copy()

    def dequantize_rows(self, q: np.ndarray) -> np.ndarray:
        return q.view("<f4").astype(np.float32)


class _Float16Codec(Codec):
    """A 16-bit float type: each value's bit pattern, rounded the way ggml rounds."""

    block_dtype = np.dtype("<u2")
    _to_bits: Callable[[np.ndarray], np.ndarray]
    _from_bits: Callable[[np.ndarray], np.ndarray]

    def quantize_rows(self, x: np.ndarray, imatrix: np.ndarray | None) -> np.ndarray:
        return self._to_bits(x).astype("<u2").view(np.uint8)

    def dequantize_rows(self, q: np.ndarray) -> np.ndarray:
        return self._from_bits(q.view("<u2"))


@register
class F16Codec(_Float16Codec):
    qtype = vec_dot_type = GGMLType.F16
    block_dtype = np.dtype("<f2")
    _to_bits = staticmethod(fp32_to_fp16_bits)
    _from_bits = staticmethod(fp16_bits_to_fp32)


@register
class BF16Codec(_Float16Codec):
    qtype = vec_dot_type = GGMLType.BF16  # numpy has no bfloat16: the block dtype is the raw bits
    _to_bits = staticmethod(fp32_to_bf16_bits)
    _from_bits = staticmethod(bf16_bits_to_fp32)


__all__ = [
    "E8M0_HALF",
    "UE4M3",
    "BF16Codec",
    "F16Codec",
    "F32Codec",
    "bf16_bits_to_fp32",
    "e8m0_to_fp32_half",
    "fp16_bits_to_fp32",
    "fp16_bits_to_fp32_nb",
    "fp32_to_bf16_bits",
    "fp32_to_fp16_bits",
    "fp32_to_fp16_bits_nb",
    "fp32_to_ue4m3",
    "fp32_to_ue4m3_nb",
    "lroundf_nb",
    "nearest_int",
    "nearest_int_nb",
    "round_fp16",
    "round_fp16_nb",
    "roundf_nb",
    "trunc_to_i8_nb",
    "trunc_to_i32_nb",
    "ue4m3_to_fp32",
]
