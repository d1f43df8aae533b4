"""The CPU_REPACK extra buffer type: layouts, kernels that give the plain kernels' bits, placement, errors."""

from __future__ import annotations

import numpy as np
import pytest

import pyggml as gg
from pyggml import quants
from pyggml.backend.cpu import repack, repack_buffer
from pyggml.backend.cpu.backend import backend_cpu_reg
from pyggml.backend.cpu.quants import repacked
from pyggml.backend.cpu.traits import MATVEC_MAX_COLS
from pyggml.backend.errors import NotSupportedError
from pyggml.types import GGMLType

LAYOUT_TYPES = [GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.IQ4_NL]


def _need(ty: GGMLType) -> None:
    if ty not in repacked.TYPES:
        pytest.skip(f"this CPU has no repacked {ty.name} kernel (Q4_K/Q6_K need AVX2 and F16C, the others VNNI)")


def _weights(ty: GGMLType, k: int, rows: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return quants.quantize(rng.standard_normal((rows, k)).astype(np.float32), ty).reshape(-1)


@pytest.mark.parametrize("ty", LAYOUT_TYPES)
def test_repack_then_unpack_gives_the_gguf_bytes(ty: GGMLType) -> None:
    """Every byte of a block moves somewhere and comes back (random bytes, so every scale bit is exercised)."""
    k, rows = 2 * ty.blck_size * (8 if ty == GGMLType.Q4_K else 1), 16
    raw = np.random.default_rng(1).integers(0, 256, rows * k // ty.blck_size * ty.type_size, dtype=np.uint8)
    packed = repack.repack(ty, raw, k, rows)
    assert packed.nbytes == repack.repacked_nbytes(ty, k, rows)
    assert not np.array_equal(packed[: raw.nbytes], raw)  # it is a different layout
    np.testing.assert_array_equal(repack.unpack(ty, packed, k, rows), raw)


def _products(ty: GGMLType, k: int, rows: int, n: int, use_repack: bool, n_threads: int = 2,
              by_column: bool = False) -> np.ndarray:
    """out (n, rows) of weight x n activation rows; by_column: one product per activation row."""
    if by_column:
        return np.concatenate([_product(ty, k, rows, 1, use_repack, n_threads, col=j) for j in range(n)])
    return _product(ty, k, rows, n, use_repack, n_threads)


def _product(ty: GGMLType, k: int, rows: int, n: int, use_repack: bool, n_threads: int, col: int = -1) -> np.ndarray:
    wctx = gg.init(4096, no_alloc=True)
    w = wctx.new_tensor(ty, k, rows)
    buft = repack_buffer.repack_buffer_type() if use_repack else gg.backend_cpu_buffer_type()
    buf = gg.backend_alloc_ctx_tensors_from_buft(wctx, buft)
    gg.backend_tensor_set(w, _weights(ty, k, rows))
    assert repack_buffer.is_repacked(w) == use_repack
    ctx = gg.init(4 * (k * n + rows * n) + (1 << 20))
    x = ctx.new_tensor(GGMLType.F32, k, n)
    xs = np.random.default_rng(2).uniform(-3, 3, (max(n, col + 1), k)).astype(np.float32)
    x.set(xs[col : col + 1] if col >= 0 else xs)
    out = gg.mul_mat(ctx, w, x)
    gf = gg.new_graph(ctx)
    gg.build_forward_expand(gf, out)
    gg.graph_compute_with_ctx(ctx, gf, n_threads)
    res = out.numpy().reshape(-1, rows).copy()
    buf.free()
    return res


@pytest.mark.parametrize("ty", LAYOUT_TYPES)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 8, 9, 37, 70])
def test_repacked_products_give_the_plain_kernels_bits(ty: GGMLType, n: int) -> None:
    """Decode (1 row), the shapes between the 4-row/3-row tiles and their remainders, both sides of Q4_K's and Q6_K's
    group-at-a-time limit (repacked.Q4K_STREAM_COLS = 8), and prompts (70 rows: past repacked.PROMPT_COLS, the
    finer chunks, as many as the row groups): exactly the
    bits of the same product with the weight in a plain CPU buffer (mat-vec kernels, scratch tiles or row dots).
    24 rows: three Q4_K/Q6_K 8-row tiles (a pair and a single one), six Q0 groups. Past the mat-vec kernels' column
    limit IQ4_NL's plain product is the numpy kernel (dequantized, BLAS): its mat-vec, a column at a time."""
    _need(ty)
    k = 512 if ty in (GGMLType.Q4_K, GGMLType.Q6_K) else 256
    plain = _products(ty, k, 24, n, use_repack=False, by_column=n > MATVEC_MAX_COLS[ty])
    packed = _products(ty, k, 24, n, use_repack=True)
    np.testing.assert_array_equal(packed.view(np.uint32), plain.view(np.uint32))


@pytest.mark.parametrize("ty", LAYOUT_TYPES)
def test_many_rows_split_over_threads_keep_their_bits(ty: GGMLType) -> None:
    """Enough rows for several work chunks per thread; one thread and two give the same bits as the plain kernel."""
    _need(ty)
    k = 1024
    plain = _products(ty, k, 1024, 1, use_repack=False)
    for nth in (1, 2):
        np.testing.assert_array_equal(_products(ty, k, 1024, 1, use_repack=True, n_threads=nth), plain)


def test_get_tensor_reads_back_the_gguf_layout() -> None:
    _need(GGMLType.Q4_K)
    wctx = gg.init(4096, no_alloc=True)
    w = wctx.new_tensor(GGMLType.Q4_K, 512, 16)
    buf = gg.backend_alloc_ctx_tensors_from_buft(wctx, repack_buffer.repack_buffer_type())
    raw = _weights(GGMLType.Q4_K, 512, 16)
    gg.backend_tensor_set(w, raw)
    back = np.empty_like(raw)
    gg.backend_tensor_get(w, back)
    np.testing.assert_array_equal(back, raw)
    part = np.empty(100, np.uint8)
    gg.backend_tensor_get(w, part, 200, 100)
    np.testing.assert_array_equal(part, raw[200:300])
    with pytest.raises(NotSupportedError, match="whole tensor"):
        gg.backend_tensor_set(w, raw[:144], 0, 144)
    buf.free()


def test_an_op_other_than_mul_mat_on_a_repacked_weight_is_refused() -> None:
    """GET_ROWS would read the interleaved bytes as rows: the plan refuses it, naming the weight and the way out."""
    _need(GGMLType.Q4_K)
    wctx = gg.init(4096, no_alloc=True)
    w = wctx.new_tensor(GGMLType.Q4_K, 256, 8).set_name("blk.0.ffn_up.weight")
    buf = gg.backend_alloc_ctx_tensors_from_buft(wctx, repack_buffer.repack_buffer_type())
    gg.backend_tensor_set(w, _weights(GGMLType.Q4_K, 256, 8))
    ctx = gg.init(1 << 20)
    ids = ctx.new_tensor(GGMLType.I32, 2)
    ids.set(np.array([0, 3], np.int32))
    rows = gg.get_rows(ctx, w, ids)
    gf = gg.new_graph(ctx)
    gg.build_forward_expand(gf, rows)
    assert not backend_cpu_reg().devices()[0].supports_op(rows)
    with pytest.raises(NotSupportedError, match=r"blk\.0\.ffn_up\.weight.*--no-repack"):
        gg.graph_compute_with_ctx(ctx, gf, 1)
    buf.free()


def test_the_cpu_device_lists_the_repack_buffer_type_as_extra() -> None:
    dev = backend_cpu_reg().devices()[0]
    extra = backend_cpu_reg().get_proc_address("ggml_backend_dev_get_extra_bufts")(dev)
    assert extra == ([repack_buffer.repack_buffer_type()] if repacked.TYPES else [])
    for buft in extra:
        assert buft.name() == "CPU_REPACK" and not buft.is_host() and dev.supports_buft(buft)
