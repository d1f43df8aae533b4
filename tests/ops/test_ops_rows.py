"""DUP/CPY/CONT conversions and SET_ROWS (including quantized destinations) against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.opcheck import OpCase, assert_close, round_to, values
from pyggml import quants
from pyggml.ops import builders as B
from pyggml.types import GGMLType

F32, F16, BF16, I32, I64 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32, GGMLType.I64
Q8_0, Q4_0, Q4_K = GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_K


@pytest.mark.parametrize("src", [F32, F16, BF16])
@pytest.mark.parametrize("dst", [F32, F16, BF16])
def test_cpy_float_conversions(src: GGMLType, dst: GGMLType) -> None:
    c = OpCase()
    a = c.tensor(src, 10, 3, 2)
    b = c.ctx.new_tensor(dst, 10, 3, 2)
    got = c.compute(B.cpy(c.ctx, a, b))
    assert_close(got, round_to(values(a), dst), max_nmse=0.0 if src == dst else 1e-6)
    assert_close(values(b), got, max_nmse=0.0)  # the result is a view of b


def test_cpy_permuted_source_reshaped_destination() -> None:
    """Elements flow in logical (ne) order from a permuted view into a differently shaped dst."""
    c = OpCase()
    base = c.tensor(F32, 4, 3, 2)
    a = B.permute(c.ctx, base, 2, 0, 1, 3)  # ne = [3, 2, 4]
    b = c.ctx.new_tensor(F16, 6, 4)
    got = c.compute(B.cpy(c.ctx, a, b))
    assert_close(got, round_to(values(a).reshape(1, 1, 4, 6), F16))


def test_cont_and_cont_4d_of_transposed() -> None:
    c = OpCase()
    base = c.tensor(F32, 5, 7)
    t = B.transpose(c.ctx, base)
    out = B.cont(c.ctx, t)
    got = c.compute(out)
    assert out.is_contiguous()
    assert_close(got, values(t), max_nmse=0.0)
    got = c.compute(B.cont_2d(c.ctx, t, 35, 1))
    assert_close(got.reshape(-1), values(t).reshape(-1), max_nmse=0.0)


def test_dup_and_cast_ints() -> None:
    c = OpCase()
    a = c.ints(I32, 5, data=np.array([-3, 0, 7, 2**20, -(2**30)]))
    got = c.compute(B.dup(c.ctx, a))
    assert got.reshape(-1).tolist() == [-3, 0, 7, 2**20, -(2**30)]
    f = c.tensor(F32, 4, data=np.array([1.9, -1.9, 3.0, -0.5], dtype=np.float32))
    got = c.compute(B.cast(c.ctx, f, I32))
    assert got.reshape(-1).tolist() == [1, -1, 3, 0]  # C truncation


@pytest.mark.parametrize("qt", [Q8_0, Q4_0, Q4_K])
def test_cpy_to_and_from_quantized(qt: GGMLType) -> None:
    c = OpCase()
    a = c.tensor(F32, 256, 3)
    q = c.compute(B.cast(c.ctx, a, qt))
    # quantize -> dequantize stays within the type's error
    assert_close(q, values(a), max_nmse={Q8_0: 1e-4, Q4_0: 1e-2, Q4_K: 5e-3}[qt])
    qt_tensor = c.tensor(qt, 256, 3)
    back = c.compute(B.cast(c.ctx, qt_tensor, F32))
    assert_close(back, values(qt_tensor), max_nmse=0.0)


def test_cpy_to_q8_0_uses_x86_rounding() -> None:
    """ggml-cpu's Q8_0 from_float uses 127/amax and round-half-even: 2.5 at amax 127 becomes 2, not 3."""
    c = OpCase()
    row = np.zeros(32, dtype=np.float32)
    row[0], row[1] = 127.0, 2.5
    a = c.tensor(F32, 32, data=row)
    out = B.cast(c.ctx, a, Q8_0)
    c.compute(out)
    qs = out.view4().reshape(-1)[2:].view(np.int8)
    assert qs[0] == 127 and qs[1] == 2
    ref = quants.quantize(row[None, :], Q8_0).reshape(-1)[2:].view(np.int8)
    assert ref[1] == 3  # the reference quantizer rounds half away from zero


@pytest.mark.parametrize("idx_type", [I32, I64])
@pytest.mark.parametrize("dst_type", [F32, F16, BF16])
@pytest.mark.parametrize("src_type", [F32, F16])
def test_set_rows(src_type: GGMLType, dst_type: GGMLType, idx_type: GGMLType) -> None:
    c = OpCase()
    dst = c.tensor(dst_type, 8, 10, 2, 2)
    before = values(dst).copy()
    rows = c.tensor(src_type, 8, 3, 2, 2)
    idx = np.array([[[7, 0, 4]], [[1, 9, 2]]])  # (ne12=2, ne11=1, ne10=3): broadcast over dim 2
    ids = c.ints(idx_type, 3, 1, 2, data=idx)
    out = B.set_rows(c.ctx, dst, rows, ids)
    c.compute(out)
    ref = before.copy()
    vr = values(rows)
    for i3 in range(2):
        for i2 in range(2):
            for i in range(3):
                ref[i3, i2, idx[i3, 0, i]] = round_to(vr[i3, i2, i], dst_type)
    assert_close(values(dst), ref, max_nmse=0.0)


def test_set_rows_quantized_destination() -> None:
    c = OpCase()
    dst = c.tensor(Q8_0, 64, 6)
    rows = c.tensor(F32, 64, 2)
    ids = c.ints(I64, 2, data=np.array([4, 1]))
    before = values(dst).copy()
    c.compute(B.set_rows(c.ctx, dst, rows, ids))
    after = values(dst)
    untouched = [0, 2, 3, 5]
    assert_close(after[0, 0, untouched], before[0, 0, untouched], max_nmse=0.0)
    assert_close(after[0, 0, [4, 1]], values(rows)[0, 0], max_nmse=1e-4)


def test_set_rows_index_out_of_range_raises() -> None:
    from pyggml.errors import PyGGMLError

    c = OpCase()
    dst = c.tensor(F32, 4, 3)
    rows = c.tensor(F32, 4, 1)
    ids = c.ints(I32, 1, data=np.array([3]))
    with pytest.raises(PyGGMLError, match="out of range"):
        c.compute(B.set_rows(c.ctx, dst, rows, ids))
