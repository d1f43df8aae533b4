"""The quants public API: bad input gets a specific error; validate_row_data as ggml's."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from pyggml.errors import PyGGMLError
from pyggml.quants import CODECS, Codec, QuantError, chunks, dequantize, get_codec, quantize, validate_row_data
from pyggml.types import GGMLType

RNG = np.random.default_rng(42)


def _x(rows: int = 2, cols: int = 64) -> np.ndarray:
    return RNG.standard_normal((rows, cols)).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# quantize / dequantize argument checks
# ---------------------------------------------------------------------------------------------


def test_quantize_rejects_non_float32() -> None:
    with pytest.raises(QuantError, match="float32"):
        quantize(_x().astype(np.float64), GGMLType.Q4_0)


def test_quantize_rejects_3d() -> None:
    with pytest.raises(QuantError, match="2-d"):
        quantize(_x().reshape(2, 2, 32), GGMLType.Q4_0)


def test_quantize_rejects_partial_block() -> None:
    with pytest.raises(QuantError, match="multiple"):
        quantize(_x(2, 48), GGMLType.Q4_0)
    with pytest.raises(QuantError, match="multiple"):
        quantize(_x(1, 128), GGMLType.TQ2_0)


def test_quantize_rejects_missing_imatrix() -> None:
    with pytest.raises(QuantError, match="importance matrix"):
        quantize(_x(1, 256), GGMLType.IQ2_XXS)


def test_quantize_rejects_imatrix_of_wrong_length() -> None:
    with pytest.raises(QuantError, match="imatrix"):
        quantize(_x(2, 64), GGMLType.Q4_0, imatrix=np.ones(32, np.float32))


@pytest.mark.parametrize("bad", [99, 43, -1])
def test_unknown_type_id(bad: int) -> None:
    with pytest.raises(PyGGMLError, match="unknown"):
        quantize(_x(), bad)
    with pytest.raises(PyGGMLError, match="unknown"):
        dequantize(np.zeros((1, 18), np.uint8), bad)
    with pytest.raises(QuantError, match="unknown"):
        get_codec(bad)


@pytest.mark.parametrize("removed", [4, 5, 31, 32, 33, 36, 37, 38])
def test_removed_type_id(removed: int) -> None:
    with pytest.raises(PyGGMLError, match="not usable"):
        quantize(_x(), removed)


def test_unknown_type_name() -> None:
    with pytest.raises(PyGGMLError, match="q9_9"):
        quantize(_x(), "q9_9")


def test_codec_without_quantizer_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A codec that declares ``can_quantize = False`` (a type ggml_quantize_chunk lacks) is refused."""

    class NoQuantizer(Codec):
        qtype = GGMLType.Q8_K
        can_quantize = False

    monkeypatch.setitem(CODECS, GGMLType.Q8_K, NoQuantizer())
    with pytest.raises(QuantError, match="no quantizer"):
        quantize(_x(1, 256), GGMLType.Q8_K)


def test_dequantize_rejects_non_uint8() -> None:
    with pytest.raises(QuantError, match="uint8"):
        dequantize(np.zeros((1, 18), np.float32), GGMLType.Q4_0)


def test_dequantize_rejects_3d() -> None:
    with pytest.raises(QuantError, match="2-d"):
        dequantize(np.zeros((1, 2, 18), np.uint8), GGMLType.Q4_0)


def test_dequantize_rejects_partial_block() -> None:
    with pytest.raises(QuantError, match="whole number"):
        dequantize(np.zeros((1, 20), np.uint8), GGMLType.Q4_0)


def test_names_and_ids_are_accepted() -> None:
    x = _x()
    ref = quantize(x, GGMLType.Q5_1)
    np.testing.assert_array_equal(quantize(x, "q5_1"), ref)
    np.testing.assert_array_equal(quantize(x, "Q5_1"), ref)
    np.testing.assert_array_equal(quantize(x, 7), ref)


def test_one_row_as_1d() -> None:
    x = _x(1, 64)
    np.testing.assert_array_equal(quantize(x[0], GGMLType.Q8_0), quantize(x, GGMLType.Q8_0))
    q = quantize(x, GGMLType.Q8_0)
    np.testing.assert_array_equal(dequantize(q[0], GGMLType.Q8_0), dequantize(q, GGMLType.Q8_0))


def test_zero_rows() -> None:
    q = quantize(np.zeros((0, 64), np.float32), GGMLType.Q4_1)
    assert q.shape == (0, 40) and q.dtype == np.uint8
    assert dequantize(q, GGMLType.Q4_1).shape == (0, 64)


def test_non_contiguous_input() -> None:
    x = _x(4, 128)
    strided = np.asfortranarray(x)
    np.testing.assert_array_equal(quantize(strided, GGMLType.Q4_0), quantize(x, GGMLType.Q4_0))
    im = np.linspace(0.1, 2.0, 256)[::2]  # float64, strided
    np.testing.assert_array_equal(
        quantize(x[:, :], GGMLType.Q5_0, im.tolist()), quantize(x, GGMLType.Q5_0, im.astype(np.float32))
    )


# ---------------------------------------------------------------------------------------------
# validate_row_data
# ---------------------------------------------------------------------------------------------

#: byte offsets of the fp16 scale fields in each block (ggml-common.h block structs)
FP16_SCALES: dict[GGMLType, tuple[int, ...]] = {
    GGMLType.Q4_0: (0,),
    GGMLType.Q4_1: (0, 2),
    GGMLType.Q5_0: (0,),
    GGMLType.Q5_1: (0, 2),
    GGMLType.Q8_0: (0,),
    GGMLType.Q2_K: (80, 82),
    GGMLType.Q3_K: (108,),
    GGMLType.Q4_K: (0, 2),
    GGMLType.Q5_K: (0, 2),
    GGMLType.Q6_K: (208,),
    GGMLType.IQ2_XXS: (0,),
    GGMLType.IQ2_XS: (0,),
    GGMLType.IQ3_XXS: (0,),
    GGMLType.IQ1_S: (0,),
    GGMLType.IQ4_NL: (0,),
    GGMLType.IQ3_S: (0,),
    GGMLType.IQ2_S: (0,),
    GGMLType.IQ4_XS: (0,),
    GGMLType.TQ1_0: (52,),
    GGMLType.TQ2_0: (64,),
    GGMLType.Q1_0: (0,),
    GGMLType.Q2_0: (0,),
}

BAD_FP16 = [0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFFFF]


def _random_blocks(ty: GGMLType, n_blocks: int = 3) -> np.ndarray:
    return RNG.integers(0, 256, size=(n_blocks, ty.type_size), dtype=np.uint8)


def _put_u16(blocks: np.ndarray, block: int, offset: int, value: int) -> None:
    blocks[block, offset : offset + 2] = np.array([value], "<u2").view(np.uint8)


@pytest.mark.parametrize("ty", list(FP16_SCALES), ids=lambda t: t.type_name)
def test_validate_fp16_scales(ty: GGMLType) -> None:
    blocks = _random_blocks(ty)
    for off in FP16_SCALES[ty]:
        for b in range(blocks.shape[0]):
            _put_u16(blocks, b, off, 0x3C00 + int(RNG.integers(0, 0x3000)))  # finite
    assert validate_row_data(ty, blocks) is True
    assert validate_row_data(ty, blocks.tobytes()) is True
    for off in FP16_SCALES[ty]:
        for bad in BAD_FP16:
            poisoned = blocks.copy()
            _put_u16(poisoned, 2, off, bad)
            assert validate_row_data(ty, poisoned) is False, (off, hex(bad))


def test_validate_poisoned_codec_output() -> None:
    """The same offsets seen from the codec side: an inf scale written by hand dequantizes to inf."""
    q = quantize(_x(1, 64), GGMLType.Q4_1)
    assert validate_row_data(GGMLType.Q4_1, q)
    q[0, 20 + 2 : 20 + 4] = np.array([0x7C00], "<u2").view(np.uint8)  # second block's m
    assert not validate_row_data(GGMLType.Q4_1, q)
    assert np.isinf(dequantize(q, GGMLType.Q4_1)[0, 32:]).all()


def test_validate_f16() -> None:
    ok = RNG.standard_normal(100).astype(np.float16)
    assert validate_row_data(GGMLType.F16, ok)
    for bad in (np.inf, -np.inf, np.nan):
        arr = ok.copy()
        arr[57] = bad
        assert validate_row_data(GGMLType.F16, arr) is False


def test_validate_bf16() -> None:
    ok = np.array([0x3F80, 0x7F7F, 0x0001, 0x8000], "<u2")
    assert validate_row_data(GGMLType.BF16, ok)
    for bad in (0x7F80, 0xFF80, 0x7FC0, 0x7F81):
        assert validate_row_data(GGMLType.BF16, np.append(ok, np.uint16(bad))) is False


@pytest.mark.parametrize("ty, dt", [(GGMLType.F32, np.float32), (GGMLType.F64, np.float64)])
def test_validate_f32_f64(ty: GGMLType, dt: type) -> None:
    ok = RNG.standard_normal(33).astype(dt)
    assert validate_row_data(ty, ok)
    for bad in (np.inf, -np.inf, np.nan):
        arr = ok.copy()
        arr[-1] = bad
        assert validate_row_data(ty, arr) is False


def test_validate_q8_K() -> None:
    blocks = _random_blocks(GGMLType.Q8_K)
    blocks[:, :4] = np.array([0.25], "<f4").view(np.uint8)
    assert validate_row_data(GGMLType.Q8_K, blocks)
    for bad in (np.inf, np.nan):
        poisoned = blocks.copy()
        poisoned[1, :4] = np.array([bad], "<f4").view(np.uint8)
        assert validate_row_data(GGMLType.Q8_K, poisoned) is False


def test_validate_mxfp4() -> None:
    blocks = _random_blocks(GGMLType.MXFP4)
    blocks[:, 0] = 0xFE
    assert validate_row_data(GGMLType.MXFP4, blocks)
    blocks[1, 0] = 0xFF
    assert validate_row_data(GGMLType.MXFP4, blocks) is False


def test_validate_iq1_m_assembled_scale() -> None:
    blocks = _random_blocks(GGMLType.IQ1_M)
    words = np.ascontiguousarray(blocks[:, 48:56]).view("<u2") & np.uint16(0x0FFF)
    blocks[:, 48:56] = words.view(np.uint8)  # top nibbles 0: scale 0.0
    assert validate_row_data(GGMLType.IQ1_M, blocks)
    # scale 0x7C00 (inf): nibble 0xC comes from word 2, nibble 0x7 from word 3
    poisoned = blocks.copy()
    w = np.ascontiguousarray(poisoned[1, 48:56]).view("<u2")
    w[2] |= 0xC000
    w[3] |= 0x7000
    poisoned[1, 48:56] = w.view(np.uint8)
    assert validate_row_data(GGMLType.IQ1_M, poisoned) is False
    # the same bits in a word's low nibbles are not part of the scale
    harmless = blocks.copy()
    w = np.ascontiguousarray(harmless[1, 48:56]).view("<u2")
    w[:] |= 0x0FFF
    harmless[1, 48:56] = w.view(np.uint8)
    assert validate_row_data(GGMLType.IQ1_M, harmless)


@pytest.mark.parametrize("ty", [GGMLType.NVFP4, GGMLType.I8, GGMLType.I16, GGMLType.I32, GGMLType.I64])
def test_validate_types_without_checks(ty: GGMLType) -> None:
    assert validate_row_data(ty, np.full(ty.type_size * 4, 0xFF, np.uint8))


def test_validate_q8_1_is_never_valid() -> None:
    # ggml_validate_row_data has no Q8_1 case and falls through to "invalid type"
    assert validate_row_data(GGMLType.Q8_1, np.zeros(36, np.uint8)) is False


@pytest.mark.parametrize("ty", [GGMLType.Q4_0, GGMLType.F16, GGMLType.Q6_K, GGMLType.MXFP4])
def test_validate_partial_block(ty: GGMLType) -> None:
    assert validate_row_data(ty, np.zeros(ty.type_size * 2 + 1, np.uint8)) is False


@pytest.mark.parametrize("bad", [99, 43, -1, 4, 5, 31, 36])
def test_validate_unknown_or_removed_type(bad: int) -> None:
    assert validate_row_data(bad, np.zeros(72, np.uint8)) is False


def test_validate_accepts_buffer_kinds() -> None:
    q = quantize(_x(1, 64), GGMLType.Q8_0)
    for data in (q, q.tobytes(), bytearray(q.tobytes()), memoryview(q.tobytes())):
        assert validate_row_data(GGMLType.Q8_0, data) is True


def test_validate_type_names_and_bad_data() -> None:
    q = quantize(_x(1, 64), GGMLType.Q8_0)
    assert validate_row_data("q8_0", q) is True
    with pytest.raises(PyGGMLError, match="q9_9"):
        validate_row_data("q9_9", q)
    with pytest.raises(QuantError, match="bytes or a numpy array"):
        validate_row_data(GGMLType.Q8_0, [1, 2, 3])  # type: ignore[arg-type]


def test_concurrent_quantizations_with_other_thread_counts_share_the_pool() -> None:
    """Several threads quantizing at once, each asking for another thread count: the row-range pool grows as
    asked and no call meets a pool shut down under it (the old pool used to be shut down when a bigger one
    was made, and a submit racing with that raised RuntimeError); every result is the same bytes."""
    x = np.random.default_rng(0).standard_normal((64, 1024)).astype(np.float32)
    ref = quantize(x, GGMLType.Q8_0)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for _ in range(20):
                with chunks.using_threads(n):
                    assert np.array_equal(quantize(x, GGMLType.Q8_0), ref)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n,)) for n in (2, 3, 4, 5, 6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
