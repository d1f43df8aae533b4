"""The fast fp16 rounding of activations equals numpy's float32 -> float16 -> float32, bit for bit."""

import numpy as np

from pyggml.backend.cpu.actquant import round_to_f16


def _same(ref: np.ndarray, got: np.ndarray) -> bool:
    return bool(np.all((ref.view(np.uint32) == got.view(np.uint32)) | (np.isnan(ref) & np.isnan(got))))


def _ref(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(np.float16).astype(np.float32)


def test_every_fp16_value_and_every_tie():
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    assert _same(_ref(h), round_to_f16(h))
    fin = np.sort(h[np.isfinite(h)]).astype(np.float64)
    mid = ((fin[1:] + fin[:-1]) / 2).astype(np.float32)  # ties (ties-to-even) and their neighbours
    for x in (mid, np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(-np.inf))):
        assert _same(_ref(x), round_to_f16(x))


def test_random_bit_patterns():
    x = np.random.default_rng(0).integers(0, 2**32, 500_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    assert _same(_ref(x), round_to_f16(x))
