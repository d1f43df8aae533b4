"""The compiled kernels' fp16 rounding (simd.f16_bits, F16C's round to nearest even) equals numpy's float32 ->
float16 -> float32, bit for bit."""

import numba
import numpy as np

from pyggml.backend.cpu.simd import F16_TO_F32, f16_bits


@numba.njit
def _via_f16_bits(x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    xu = x.view(np.uint32)
    for i in range(x.size):
        out[i] = F16_TO_F32[f16_bits(xu[i])]
    return out


def _same(ref: np.ndarray, got: np.ndarray) -> bool:
    return bool(np.all((ref.view(np.uint32) == got.view(np.uint32)) | (np.isnan(ref) & np.isnan(got))))


def _ref(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(np.float16).astype(np.float32)


def test_every_fp16_value_and_every_tie():
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    assert _same(_ref(h), _via_f16_bits(h))
    fin = np.sort(h[np.isfinite(h)]).astype(np.float64)
    mid = ((fin[1:] + fin[:-1]) / 2).astype(np.float32)  # ties (ties-to-even) and their neighbours
    for x in (mid, np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(-np.inf))):
        assert _same(_ref(x), _via_f16_bits(x))


def test_random_bit_patterns():
    x = np.random.default_rng(0).integers(0, 2**32, 500_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    assert _same(_ref(x), _via_f16_bits(x))


def test_f16_value_and_the_quantizers_rounding() -> None:
    """f16_value gives every fp16 pattern's float32 value; the quantizers' _round_fp16 (f16_value of
    f16_bits) rounds as numpy's float16 does, subnormals, ties and overflow included."""
    from pyggml.backend.cpu.quants.quantize import _round_fp16
    from pyggml.backend.cpu.simd import f16_value

    @numba.njit
    def values() -> np.ndarray:
        out = np.empty(65536, np.float32)
        for h in range(65536):
            out[h] = f16_value(np.uint32(h))
        return out

    @numba.njit
    def rounded(x: np.ndarray) -> np.ndarray:
        out = np.empty_like(x)
        for i in range(x.size):
            out[i] = _round_fp16(x[i])
        return out

    v = values()
    assert ((v.view(np.uint32) == F16_TO_F32.view(np.uint32)) | (np.isnan(v) & np.isnan(F16_TO_F32))).all()
    rng = np.random.default_rng(5)
    x = (np.abs(rng.standard_normal(20000)) * 10.0 ** rng.integers(-9, 6, 20000)).astype(np.float32)
    edges = np.array([65504, 65519.99, 65520, 2.0**-25, 2.0**-24 * 1.5, 2.0**-14, 0.0], np.float32)
    x = np.concatenate([x, edges])
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(rounded(x), x.astype(np.float16).astype(np.float32))
