"""The small-float helpers of pyggml.quants.fp against independent bit-level oracles.

The oracles restate ggml's definitions (ggml-impl.h) on integer bit patterns; the helpers under
test take other routes (numpy casts, frexp), so agreement over large samples that include every
special value is real evidence.
"""

from __future__ import annotations

import numpy as np
import pytest

from pyggml.quants import fp

RNG = np.random.default_rng(11)


def _float_sample(n: int = 200_000) -> np.ndarray:
    """Random float32 bit patterns (every class: subnormal, NaN, inf) plus values near fp16 edges."""
    bits = RNG.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32)
    edges = np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, 65504, 65519.99, 65520, 65536, 2.0**-24, 2.0**-25,
         1.5 * 2.0**-25, 2.0**-14, 6.1e-5, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 3.4028235e38, 1e-45],
        dtype=np.float32,
    )  # fmt: skip
    near = (RNG.standard_normal(n) * 10.0 ** RNG.integers(-9, 6, n)).astype(np.float32)
    return np.concatenate([bits.view(np.float32), edges, -edges, near])


def _oracle_fp32_to_fp16(x: np.ndarray) -> np.ndarray:
    """ggml_compute_fp32_to_fp16 (the FP16 library's bias trick) on float32 arrays."""
    with np.errstate(over="ignore", invalid="ignore"):
        base = (np.abs(x) * np.float32(2.0**112)) * np.float32(2.0**-110)
    w = x.view(np.uint32)
    shl1 = w + w
    sign = w & np.uint32(0x80000000)
    bias = np.maximum(shl1 & np.uint32(0xFF000000), np.uint32(0x71000000))
    with np.errstate(invalid="ignore"):
        base = ((bias >> np.uint32(1)) + np.uint32(0x07800000)).view(np.float32) + base
    bits = base.view(np.uint32)
    nonsign = ((bits >> np.uint32(13)) & np.uint32(0x7C00)) + (bits & np.uint32(0x0FFF))
    out = (sign >> np.uint32(16)) | np.where(shl1 > np.uint32(0xFF000000), np.uint32(0x7E00), nonsign)
    return out.astype(np.uint16)


def test_fp32_to_fp16_matches_ggml() -> None:
    x = _float_sample()
    np.testing.assert_array_equal(fp.fp32_to_fp16_bits(x), _oracle_fp32_to_fp16(x))


def test_fp16_to_fp32_all_values() -> None:
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    got = fp.fp16_bits_to_fp32(h).view(np.uint32)
    sign = (h.astype(np.uint32) & 0x8000) << 16
    exp = (h.astype(np.uint32) >> 10) & 0x1F
    man = h.astype(np.uint32) & 0x3FF
    value = np.where(exp == 0, man * 2.0**-24, (1024 + man) * 2.0 ** (exp.astype(np.int64) - 25))
    want = value.astype(np.float32).view(np.uint32) | sign
    special = exp == 0x1F  # inf keeps its bits; NaN keeps its payload and is made quiet
    want = np.where(special, sign | np.uint32(0x7F800000) | (man << 13), want)
    want = np.where(special & (man != 0), want | np.uint32(0x00400000), want)
    np.testing.assert_array_equal(got, want)


def test_round_fp16_scalar_matches_array() -> None:
    x = _float_sample(50_000)
    x = x[~np.isnan(x)]
    got = np.array([fp.round_fp16_nb(v) for v in x[:20_000]], dtype=np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), fp.round_fp16(x[:20_000]).view(np.uint32))


def test_bf16_round_trip_and_rounding() -> None:
    x = _float_sample()
    got = fp.fp32_to_bf16_bits(x)
    for v, h in zip(x[:5000].view(np.uint32).tolist(), got[:5000].tolist(), strict=True):
        if (v & 0x7FFFFFFF) > 0x7F800000:
            assert h == (v >> 16) | 64
        else:
            assert h == ((v + 0x7FFF + ((v >> 16) & 1)) >> 16) & 0xFFFF
    # exact values survive; halfway cases go to even
    np.testing.assert_array_equal(fp.bf16_bits_to_fp32(np.array([0x3F80, 0xC000], np.uint16)), [1.0, -2.0])
    halfway = np.array([0x3F808000, 0x3F818000], np.uint32).view(np.float32)
    np.testing.assert_array_equal(fp.fp32_to_bf16_bits(halfway), [0x3F80, 0x3F82])


def test_e8m0_half() -> None:
    for e in range(255):
        assert fp.E8M0_HALF[e] == np.float32(2.0 ** (e - 128)), e
    np.testing.assert_array_equal(fp.e8m0_to_fp32_half(np.array([0, 127, 128])), [2.0**-128, 0.5, 1.0])


def test_ue4m3_decode() -> None:
    for u in range(256):
        exp, man = (u >> 3) & 0xF, u & 7
        raw = man * 2.0**-9 if exp == 0 else (1 + man / 8) * 2.0 ** (exp - 7)
        want = 0.0 if u in (0, 0x7F) else raw / 2
        assert fp.ue4m3_to_fp32(np.uint8(u)) == np.float32(want), u
    assert fp.UE4M3[0x7E] == 224.0 and fp.UE4M3[0x38] == 0.5


def _oracle_fp32_to_ue4m3(x: float) -> int:
    """ggml_fp32_to_ue4m3 on the float32 bit pattern."""
    x32 = np.float32(x)
    if not x32 > 0:
        return 0
    x32 = min(x32, np.float32(448.0))
    bits = int(np.array([x32]).view(np.uint32)[0])
    e = ((bits >> 23) & 0xFF) - 127 + 7
    if e <= 0:
        man = int(x32 * np.float32(512.0) + np.float32(0.5))
        return 0 if man < 1 else min(man, 7)
    if e >= 15:
        return 0x7E
    m = ((bits >> 20) & 7) + ((bits >> 19) & 1)
    if m > 7:
        m, e = 0, e + 1
        if e >= 15:
            return 0x7E
    return (e << 3) | m


def test_fp32_to_ue4m3() -> None:
    xs = np.concatenate(
        [
            np.exp2(RNG.uniform(-14, 10, 20_000)).astype(np.float32),
            np.array([0, -1, np.nan, np.inf, 2.0**-10, 2.0**-9, 1.5 * 2.0**-9, 2.0**-6, 448, 480, 1e9,
                      1.0625, 1.0625 * 2.0**-3, 15.5 * 2.0**-4], dtype=np.float32),
        ]
    )  # fmt: skip
    got = fp.fp32_to_ue4m3(xs)
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, [_oracle_fp32_to_ue4m3(v) for v in xs])


def test_nearest_int_magic() -> None:
    inside = (RNG.standard_normal(20_000) * 10.0 ** RNG.integers(-3, 7, 20_000)).astype(np.float32)
    inside = inside[np.abs(inside) < 4194303]
    halves = np.arange(-20, 20, dtype=np.float32) + np.float32(0.5)
    outside = np.array([5e6, -5e6, 1e7, -1.2e7, -12582912, 3e9, np.inf, -np.inf], dtype=np.float32)
    for x in np.concatenate([inside, halves, outside]):
        with np.errstate(over="ignore"):
            v = np.array([x + np.float32(12582912.0)], dtype=np.float32).view(np.int32)[0]
        assert fp.nearest_int_nb(x) == (int(v) & 0x007FFFFF) - 0x00400000, x
    np.testing.assert_array_equal(fp.nearest_int(halves), np.rint(halves))
    assert fp.nearest_int_nb(np.float32(np.nan)) == 0


@pytest.mark.parametrize(
    "v, i32, i8",
    [(1.9, 1, 1), (-1.9, -1, -1), (200.0, 200, -56), (-129.5, -129, 127), (np.nan, -(2**31), 0),
     (np.inf, -(2**31), 0), (3e9, -(2**31), 0)],
)  # fmt: skip
def test_truncating_casts(v: float, i32: int, i8: int) -> None:
    assert fp.trunc_to_i32_nb(v) == i32
    assert fp.trunc_to_i8_nb(v) == i8


def test_roundf_and_lroundf() -> None:
    for v, want in [(2.5, 3.0), (-2.5, -3.0), (0.49999997, 0.0), (1.5, 2.0), (-0.5, -1.0), (8388609.0, 8388609.0)]:
        assert fp.roundf_nb(np.float32(v)) == want
        assert fp.lroundf_nb(np.float32(v)) == int(want)
    assert fp.lroundf_nb(np.float32(np.nan)) == -(2**63)
    assert fp.lroundf_nb(np.float32(np.inf)) == -(2**63)
