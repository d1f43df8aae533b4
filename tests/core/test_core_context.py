"""Context: ggml's memory accounting, no_alloc, lookup, reset and the full-context error."""

import pytest

import pyggml as gg
from pyggml import GGMLType as T
from pyggml.errors import ContextFullError
from pyggml.tensor import NoDataError


def test_accounting_matches_ggml():
    ctx = gg.init(1024 * 1024)
    assert gg.tensor_overhead() == 368
    gg.new_tensor_1d(ctx, T.F32, 10)  # 336 + 40 -> padded to 384, plus the 32-byte object header
    assert ctx.used_mem() == 32 + 384
    gg.new_tensor_1d(ctx, T.F32, 4)
    assert ctx.used_mem() == 32 + 384 + 32 + 352


def test_no_alloc_accounts_metadata_only():
    ctx = gg.init(10 * gg.tensor_overhead(), no_alloc=True)
    ts = [gg.new_tensor_2d(ctx, T.F32, 4096, 4096) for _ in range(10)]
    assert all(t.data is None for t in ts)
    with pytest.raises(NoDataError):
        ts[0].numpy()
    with pytest.raises(ContextFullError, match="not enough space"):
        gg.new_tensor_1d(ctx, T.F32, 1)


def test_full_context_raises():
    ctx = gg.init(4096)
    gg.new_tensor_1d(ctx, T.F32, 256)
    with pytest.raises(ContextFullError, match="needed"):
        gg.new_tensor_1d(ctx, T.F32, 1024)


def test_iteration_lookup_reset():
    ctx = gg.init(1 << 20)
    a = gg.new_tensor_1d(ctx, T.F32, 1).set_name("a")
    b = gg.new_tensor_1d(ctx, T.F32, 1).set_name("b")
    assert list(ctx) == [a, b] and gg.get_tensor(ctx, "b") is b and ctx.get_tensor("zz") is None
    assert ctx.get_first_tensor() is a and ctx.get_next_tensor(a) is b and ctx.get_next_tensor(b) is None
    ctx.reset()
    assert ctx.used_mem() == 0 and len(ctx) == 0


def test_graph_is_accounted_in_context():
    ctx = gg.init(gg.graph_overhead_custom(16) + gg.tensor_overhead())
    gg.new_graph_custom(ctx, 16)
    with pytest.raises(ContextFullError):
        gg.new_graph_custom(ctx, 16)


def test_views_share_memory_and_negative_dims():
    ctx = gg.init(1 << 20)
    a = gg.new_tensor_1d(ctx, T.F32, 8)
    v = gg.view_1d(ctx, a, 4, 16)
    assert v.view_src is a and v.data == a.data + 16
    with pytest.raises(gg.ShapeError, match="exceeds"):
        gg.view_1d(ctx, a, 8, 16)
    with pytest.raises(gg.ShapeError, match="negative"):
        gg.new_tensor_1d(ctx, T.F32, -1)
