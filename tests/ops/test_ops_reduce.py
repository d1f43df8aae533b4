"""CPU kernels of reductions and orderings against numpy references."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.opcheck import OpCase, assert_close, round_to, values
from pyggml.ops import builders as B
from pyggml.types import GGMLType

F32, F16, BF16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32


@pytest.mark.parametrize("ty", [F32, F16, BF16])
def test_sum(ty: GGMLType) -> None:
    c = OpCase()
    a = c.tensor(ty, 33, 5, 3, 2)
    got = c.compute(B.sum(c.ctx, a))
    ref = round_to(np.array(values(a).astype(np.float64).sum(), dtype=np.float32).reshape(1, 1, 1, 1), ty)
    assert_close(got, ref)


def test_sum_rows_and_mean_on_permuted_input() -> None:
    c = OpCase()
    base = c.tensor(F32, 7, 9, 4)
    a = B.permute(c.ctx, base, 1, 0, 2, 3)  # ne = [9, 7, 4]
    x = values(a).astype(np.float64)
    got = c.compute(B.sum_rows(c.ctx, a))
    assert_close(got, x.sum(axis=-1, keepdims=True).astype(np.float32))
    got = c.compute(B.mean(c.ctx, a))
    assert_close(got, x.mean(axis=-1, keepdims=True).astype(np.float32))


def test_cumsum() -> None:
    c = OpCase()
    a = c.tensor(F32, 50, 3, 2)
    got = c.compute(B.cumsum(c.ctx, a))
    assert_close(got, np.cumsum(values(a).astype(np.float64), axis=-1).astype(np.float32))


def test_argmax_last_of_equal_maxima() -> None:
    c = OpCase()
    data = c.rng.uniform(-1, 1, size=(4, 10)).astype(np.float32)
    data[0, [2, 7]] = 5.0  # tie: ggml returns 7
    data[1, [0, 9]] = 3.0  # tie at both ends: 9
    a = c.tensor(F32, 10, 4, data=data)
    got = c.compute(B.argmax(c.ctx, a)).reshape(-1)
    ref = [max(i for i in range(10) if row[i] == row.max()) for row in data]
    assert got.tolist() == ref
    assert got[0] == 7 and got[1] == 9


def test_count_equal() -> None:
    c = OpCase()
    x = c.rng.integers(0, 3, size=(3, 17))
    y = c.rng.integers(0, 3, size=(3, 17))
    a = c.ints(I32, 17, 3, data=x)
    b = c.ints(I32, 17, 3, data=y)
    got = c.compute(B.count_equal(c.ctx, a, b))
    assert int(got.reshape(-1)[0]) == int((x == y).sum())


@pytest.mark.parametrize("order", [B.SortOrder.ASC, B.SortOrder.DESC])
def test_argsort(order: B.SortOrder) -> None:
    c = OpCase()
    a = c.tensor(F32, 31, 4, 2)
    got = c.compute(B.argsort(c.ctx, a, order))
    x = values(a)
    # gathering by the result must give a sorted row (ties are unspecified in ggml)
    gathered = np.take_along_axis(x, got.astype(np.int64), axis=-1)
    diffs = np.diff(gathered, axis=-1)
    assert (diffs >= 0).all() if order == B.SortOrder.ASC else (diffs <= 0).all()
    assert (np.sort(got, axis=-1) == np.arange(31)).all()  # a permutation


def test_top_k_selects_the_largest() -> None:
    c = OpCase()
    a = c.tensor(F32, 40, 3)
    k = 6
    got = c.compute(B.top_k(c.ctx, a, k))
    x = values(a)[0, 0]
    for row in range(3):
        sel = set(got[0, 0, row].tolist())
        assert len(sel) == k
        assert sel == set(np.argsort(-x[row])[:k].tolist())
