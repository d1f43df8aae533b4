"""Tensor fields, ggml's shape helpers, numpy views honouring nb, and set() checks."""

import numpy as np
import pytest

import pyggml as gg
from pyggml import GGMLType as T
from pyggml.errors import NameTooLongError, ShapeError, TypeMismatchError


@pytest.fixture
def ctx():
    c = gg.init(8 * 1024 * 1024)
    yield c
    c.free()


def test_new_tensor_strides(ctx):
    t = gg.new_tensor_3d(ctx, T.F32, 5, 3, 2)
    assert t.ne == [5, 3, 2, 1]
    assert t.nb == [4, 20, 60, 120]
    assert t.nbytes() == 120 and t.nelements() == 30 and t.nrows() == 6 and t.n_dims() == 3
    q = gg.new_tensor_2d(ctx, T.Q4_K, 512, 3)
    assert q.nb == [144, 288, 864, 864] and q.nbytes() == 864 and q.row_size() == 288


def test_contiguity_helpers(ctx):
    a = gg.new_tensor_3d(ctx, T.F32, 4, 3, 2)
    assert a.is_contiguous() and a.is_contiguous_1() and a.is_contiguous_2() and a.is_contiguous_rows()
    t = gg.transpose(ctx, a)
    assert t.is_transposed() and t.is_permuted() and not t.is_contiguous() and not t.is_contiguous_rows()
    p = gg.permute(ctx, a, 0, 2, 1, 3)
    assert p.is_permuted() and not p.is_contiguous() and not p.is_transposed()
    # a view of every other row: rows contiguous, the tensor not
    v = gg.view_2d(ctx, a, 4, 3, 2 * a.nb[1], 0)
    assert not v.is_contiguous() and v.is_contiguous_1() and v.is_contiguous_rows()
    assert gg.are_same_shape(a, gg.dup_tensor(ctx, a)) and gg.are_same_layout(a, gg.dup_tensor(ctx, a))
    assert not gg.are_same_layout(a, t)


def test_can_repeat(ctx):
    a = gg.new_tensor_2d(ctx, T.F32, 4, 3)
    assert gg.can_repeat(gg.new_tensor_1d(ctx, T.F32, 4), a)
    assert gg.can_repeat(gg.new_tensor_2d(ctx, T.F32, 2, 1), a)
    assert not gg.can_repeat(gg.new_tensor_1d(ctx, T.F32, 3), a)
    assert gg.can_repeat_rows(gg.new_tensor_1d(ctx, T.F32, 4), a)


def test_numpy_view_honours_strides_and_writes_through(ctx):
    a = gg.new_tensor_2d(ctx, T.F32, 4, 3)
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    a.set(data)
    np.testing.assert_array_equal(a.numpy(), data)
    t = gg.transpose(ctx, a)
    np.testing.assert_array_equal(t.numpy(), data.T)
    v = gg.view_2d(ctx, a, 2, 2, a.nb[1], 4)  # columns 1..2 of rows 0..1
    np.testing.assert_array_equal(v.numpy(), data[:2, 1:3])
    v.numpy()[0, 0] = 100.0
    assert a.numpy()[0, 1] == 100.0


def test_set_checks_shape_and_type(ctx):
    a = gg.new_tensor_2d(ctx, T.F32, 4, 3)
    with pytest.raises(ShapeError, match="does not fit"):
        a.set(np.zeros((4, 3), dtype=np.float32))
    a.set(np.arange(12, dtype=np.float32))  # flat arrays of the right size are fine
    i = gg.new_tensor_1d(ctx, T.I32, 3)
    with pytest.raises(TypeMismatchError):
        i.set(np.array([1.5, 2, 3]))
    with pytest.raises(TypeMismatchError, match="out of range"):
        gg.new_tensor_1d(ctx, T.I8, 1).set(np.array([300]))
    i.set(np.array([1, -2, 3]))
    np.testing.assert_array_equal(i.numpy(), [1, -2, 3])


def test_f16_and_bf16_round_like_ggml(ctx):
    x = np.array([1.0, 1.0009765625 + 2**-12, 65504.0, np.nan, -0.0], dtype=np.float32)
    h = gg.new_tensor_1d(ctx, T.F16, 5).set(x)
    np.testing.assert_array_equal(h.numpy().view(np.uint16), x.astype(np.float16).view(np.uint16))
    b = gg.new_tensor_1d(ctx, T.BF16, 3).set(np.array([1.00390625, 1.01171875, np.nan], dtype=np.float32))
    # round to nearest even: 0x3F808000 -> 0x3F80 (tie to even), 0x3F818000 -> 0x3F82; NaN stays quiet
    assert list(b.numpy()) == [0x3F80, 0x3F82, 0x7FC0]


def test_name_limit(ctx):
    a = gg.new_tensor_1d(ctx, T.F32, 1)
    a.set_name("x" * 63)
    with pytest.raises(NameTooLongError, match="63"):
        a.set_name("x" * 64)
    # derived names are truncated like ggml's snprintf, never longer than 63 bytes
    assert len(gg.transpose(ctx, gg.reshape_2d(ctx, a, 1, 1)).name) == 63


def test_op_params_views(ctx):
    a = gg.new_tensor_1d(ctx, T.F32, 8)
    r = gg.rms_norm(ctx, a, 1e-6)
    assert r.get_op_params_f32(0) == np.float32(1e-6)
    c = gg.concat(ctx, a, a, 0)
    assert c.get_op_params_i32(0) == 0 and c.ne[0] == 16
    v = gg.view_1d(ctx, a, 2, 8)
    assert v.op_params.view(np.uint64)[0] == 8 and v.view_offs == 8 and v.data == a.data + 8
