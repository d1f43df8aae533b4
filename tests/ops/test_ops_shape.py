"""CPU kernels that move, repeat, pad or mask data, and the generators (ARANGE, TIMESTEP_EMBEDDING)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from helpers.opcheck import OpCase, assert_close, values
from pyggml.ops import builders as B
from pyggml.types import GGMLType

F32, F16, BF16, I32, Q8_0 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32, GGMLType.Q8_0


@pytest.mark.parametrize("ty", [F32, F16, BF16])
def test_repeat(ty: GGMLType) -> None:
    c = OpCase()
    a = c.tensor(ty, 3, 2, 1, 2)
    shape = c.ctx.new_tensor(ty, 6, 4, 3, 2)
    got = c.compute(B.repeat(c.ctx, a, shape))
    assert_close(got, np.tile(values(a), (1, 3, 2, 2)))


def test_repeat_i32_bitexact() -> None:
    c = OpCase()
    a = c.ints(I32, 4, 1, data=np.array([1, -2, 2**30, 7]))
    got = c.compute(B.repeat_4d(c.ctx, a, 8, 2, 1, 1))
    assert (got.reshape(2, 8) == np.tile([1, -2, 2**30, 7], (2, 2))).all()


def test_repeat_back() -> None:
    c = OpCase()
    a = c.tensor(F32, 6, 4, 3)
    small = c.ctx.new_tensor(F32, 3, 2, 3)
    got = c.compute(B.repeat_back(c.ctx, a, small))
    x = values(a).astype(np.float64)  # (1, 3, 4, 6) -> (1, 3, 2, 3)
    ref = x.reshape(1, 3, 2, 2, 2, 3).sum(axis=(2, 4))
    assert_close(got, ref.astype(np.float32))


@pytest.mark.parametrize("dim", [0, 1, 2, 3])
def test_concat(dim: int) -> None:
    c = OpCase()
    ne_a = [4, 3, 2, 2]
    ne_b = list(ne_a)
    ne_b[dim] = 5
    a = c.tensor(F32, *ne_a)
    b = c.tensor(F32, *ne_b)
    got = c.compute(B.concat(c.ctx, a, b, dim))
    assert_close(got, np.concatenate([values(a), values(b)], axis=3 - dim))


def test_concat_non_contiguous_and_quantized_rows() -> None:
    c = OpCase()
    base = c.tensor(F32, 5, 4)
    a = B.transpose(c.ctx, base)  # [4, 5]
    b = c.tensor(F32, 4, 2)
    got = c.compute(B.concat(c.ctx, a, b, 1))
    assert_close(got, np.concatenate([values(a), values(b)], axis=2))
    qa = c.tensor(Q8_0, 64, 2)
    qb = c.tensor(Q8_0, 64, 3)
    out = B.concat(c.ctx, qa, qb, 1)
    c.compute(out)
    assert (out.view4() == np.concatenate([qa.view4(), qb.view4()], axis=2)).all()


def test_pad_and_pad_ext() -> None:
    c = OpCase()
    a = c.tensor(F32, 3, 2, 2)
    got = c.compute(B.pad_ext(c.ctx, a, 1, 2, 0, 1, 2, 0, 0, 1))
    ref = np.pad(values(a), ((0, 1), (2, 0), (0, 1), (1, 2)))
    assert_close(got, ref)
    got = c.compute(B.pad(c.ctx, a, 2, 1, 0, 0))
    assert_close(got, np.pad(values(a), ((0, 0), (0, 0), (0, 1), (0, 2))))


def test_pad_circular() -> None:
    c = OpCase()
    a = c.tensor(F32, 4, 3)
    got = c.compute(B.pad_circular(c.ctx, a, 2, 1, 1, 1, 0, 0, 0, 0))
    assert_close(got, np.pad(values(a), ((0, 0), (0, 0), (1, 1), (2, 1)), mode="wrap"))


@pytest.mark.parametrize("inplace", [False, True])
def test_acc(inplace: bool) -> None:
    c = OpCase()
    a = c.tensor(F32, 8, 6, 2)
    b = c.tensor(F32, 3, 2, 2)
    before = values(a).copy()
    nb1, nb2, offset = a.nb[1], a.nb[2], 4 * 2 + a.nb[1] * 1
    fn = B.acc_inplace if inplace else B.acc
    got = c.compute(fn(c.ctx, a, b, nb1, nb2, a.nb[3], offset))
    ref = before.copy()
    ref[0, :, 1:3, 2:5] += values(b)[0]
    assert_close(got, ref)
    if not inplace:
        assert_close(values(a), before)  # the source is untouched


def test_set_f32_and_i32() -> None:
    c = OpCase()
    a = c.tensor(F32, 6, 5)
    b = c.tensor(F32, 2, 3)
    got = c.compute(B.set_2d(c.ctx, a, b, a.nb[1], 4 * 1 + a.nb[1] * 2))
    ref = values(a).copy()
    ref[0, 0, 2:5, 1:3] = values(b)[0, 0]
    assert_close(got, ref)
    ai = c.ints(I32, 5, data=np.arange(5))
    bi = c.ints(I32, 2, data=np.array([-7, 9]))
    got = c.compute(B.set_1d(c.ctx, ai, bi, 4 * 2))
    assert got.reshape(-1).tolist() == [0, 1, -7, 9, 4]


def test_diag() -> None:
    c = OpCase()
    a = c.tensor(F32, 5, 1, 3)
    got = c.compute(B.diag(c.ctx, a))
    ref = np.stack([np.diag(values(a)[0, k, 0]) for k in range(3)])[None]
    assert_close(got, ref)


@pytest.mark.parametrize("n_past", [0, 2])
@pytest.mark.parametrize("which", ["inf", "zero"])
def test_diag_mask(which: str, n_past: int) -> None:
    c = OpCase()
    a = c.tensor(F32, 7, 5, 2)
    fn = B.diag_mask_inf if which == "inf" else B.diag_mask_zero
    got = c.compute(fn(c.ctx, a, n_past))
    ref = values(a).copy()
    fillv = -np.inf if which == "inf" else 0.0
    for j in range(5):
        for i in range(7):
            if i > n_past + j:
                ref[:, :, j, i] = fillv
    assert_close(got, ref)


@pytest.mark.parametrize("tt", list(B.TriType), ids=lambda t: t.name)
def test_tri(tt: B.TriType) -> None:
    c = OpCase()
    a = c.tensor(F32, 6, 6, 2)
    got = c.compute(B.tri(c.ctx, a, tt))
    x = values(a)
    keep = {
        B.TriType.UPPER_DIAG: np.triu(np.ones((6, 6)), 0),
        B.TriType.UPPER: np.triu(np.ones((6, 6)), 1),
        B.TriType.LOWER_DIAG: np.tril(np.ones((6, 6)), 0),
        B.TriType.LOWER: np.tril(np.ones((6, 6)), -1),
    }[tt]
    assert_close(got, x * keep)  # keep[row, col]: rows are dim 1, columns dim 0


def test_arange() -> None:
    c = OpCase()
    got = c.compute(B.arange(c.ctx, 1.5, 7.0, 0.5))
    ref = np.float32(1.5) + np.float32(0.5) * np.arange(11, dtype=np.float32)
    assert_close(got.reshape(-1), ref)


@pytest.mark.parametrize("dim", [16, 17])
def test_timestep_embedding(dim: int) -> None:
    c = OpCase()
    t = c.tensor(F32, 4, data=np.array([0.0, 1.0, 10.0, 999.0], dtype=np.float32))
    got = c.compute(B.timestep_embedding(c.ctx, t, dim, 10000))
    half = dim // 2
    ref = np.zeros((4, dim))
    for i, ts in enumerate([0.0, 1.0, 10.0, 999.0]):
        for j in range(half):
            f = math.exp(-math.log(10000) * j / half)
            ref[i, j] = math.cos(ts * f)
            ref[i, j + half] = math.sin(ts * f)
    assert_close(got.reshape(4, dim), ref.astype(np.float32))
