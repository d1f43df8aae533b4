"""qmatmul.mul_mat_q: the fused integer mat-vec and the tiled BLAS paths against float references.

Two references per case:
* the float64 product of the dequantized weight with the raw activations, at ggml's MUL_MAT
  threshold (NMSE <= 5e-4): what a user of MUL_MAT is promised;
* the float64 product with the activations quantized as ggml-cpu does (actquant.fake_quant, an
  independent numpy implementation), much tighter: this is what llama.cpp's logits are made of,
  so a kernel that skipped the activation quantization, or got an offset or a scale wrong,
  fails here even where it would pass the loose check.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from pyggml import quants
from pyggml.backend.cpu import simd, traits
from pyggml.backend.cpu.ops import mat_q as qmatmul
from pyggml.backend.cpu.quants import actquant, dots
from pyggml.backend.cpu.quants.quantize import _quantize_q8_0_lanes
from pyggml.tensor_data import bf16_to_f32, f32_to_bf16
from pyggml.types import GGMLType

T = GGMLType
NMSE_MATMUL = 5e-4
#: every type with a fused kernel, plus types that only take the BLAS path
TYPES = [*sorted(traits.FUSED, key=int), T.TQ2_0, T.F16, T.BF16, T.F32]  # TQ2_0: dequantize + BLAS
#: 1: decode; 3: fused small batch; 40: BLAS tiles (test_crossover_boundaries covers the edges)
COLS = [1, 3, 40]


def _weights(ty: GGMLType, m: int, k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(stored rows uint8 (m, row_bytes), their float32 values as ggml's to_float gives them)."""
    w = rng.standard_normal((m, k)).astype(np.float32)
    if ty == T.F32:
        return w.view(np.uint8), w
    if ty == T.F16:
        h = w.astype(np.float16)
        return h.view(np.uint8), h.astype(np.float32)
    if ty == T.BF16:
        b = f32_to_bf16(w)
        return b.view(np.uint8), bf16_to_f32(b)
    imatrix = rng.uniform(0.5, 2.0, k).astype(np.float32) if quants.requires_imatrix(ty) else None
    q = quants.quantize(w, ty, imatrix=imatrix)
    return q, quants.dequantize(q, ty)


def _nmse(out: np.ndarray, ref: np.ndarray) -> float:
    return float(((out.astype(np.float64) - ref) ** 2).sum() / (ref**2).sum())


def _k_for(ty: GGMLType) -> int:
    return 512 if ty.blck_size == 256 else 96  # 96: an odd number of 32-blocks


def _check(ty: GGMLType, n: int) -> None:
    rng = np.random.default_rng(1000 * int(ty) + n)
    k, m = _k_for(ty), 37
    w, wf = _weights(ty, m, k, rng)
    x = rng.standard_normal((n, k)).astype(np.float32)
    out = qmatmul.mul_mat_q(w, ty, x, n_threads=2)
    assert out.shape == (n, m) and out.dtype == np.float32
    assert _nmse(out, x.astype(np.float64) @ wf.T.astype(np.float64)) <= NMSE_MATMUL
    # ggml's semantics: activations quantized to the vec_dot_type first
    xq = actquant.fake_quant(x, qmatmul.vec_dot_type_of(ty)).astype(np.float64)
    ref = xq @ wf.T.astype(np.float64)
    scale = np.sqrt(((xq[:, None, :] * wf[None, :, :]) ** 2).sum(-1))  # natural size of each dot
    err = np.abs(out - ref) / scale
    # Q4_1/Q5_1 mat-vec use Q8_1's fp16 s = d*sum(q), an extra fp16 rounding fake_quant lacks
    tol = 5e-3 if ty in (T.Q4_1, T.Q5_1) else 2e-5
    assert err.max() <= tol, f"{ty.name}: max error {err.max():.2e} of the dot's scale"


@pytest.mark.parametrize("n", COLS)
@pytest.mark.parametrize("ty", TYPES, ids=lambda t: t.name)
def test_against_float_reference(ty: GGMLType, n: int) -> None:
    _check(ty, n)


@pytest.mark.parametrize("side", [0, 1], ids=["fused", "blas"])
@pytest.mark.parametrize("ty", sorted((t for t in traits.FUSED if traits.MATVEC_MAX_COLS[t] < traits.ALL_COLS),
                                      key=int), ids=lambda t: t.name)
def test_crossover_boundaries(ty: GGMLType, side: int) -> None:
    """The last column count of the fused path and the first of the BLAS path."""
    _check(ty, traits.MATVEC_MAX_COLS[ty] + side)


@pytest.mark.parametrize("ty", [T.Q8_0, T.Q5_0, T.Q4_K, T.Q6_K, T.Q2_K], ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 5, 33])
def test_strided_rows_need_no_copy_and_match(ty: GGMLType, n: int) -> None:
    """Rows taken from a bigger buffer (every other row, and a leading part of longer rows)."""
    rng = np.random.default_rng(7 + n)
    k, m = _k_for(ty), 23
    w, _ = _weights(ty, 2 * m, k, rng)
    x = rng.standard_normal((n, k)).astype(np.float32)
    every_other = w[::2]
    assert not every_other.flags.c_contiguous
    wide = np.zeros((m, w.shape[1] + 40), np.uint8)
    wide[:, : w.shape[1]] = w[::2]
    leading = wide[:, : w.shape[1]]
    want = qmatmul.mul_mat_q(np.ascontiguousarray(every_other), ty, x)
    np.testing.assert_array_equal(qmatmul.mul_mat_q(every_other, ty, x), want)
    np.testing.assert_array_equal(qmatmul.mul_mat_q(leading, ty, x), want)


def test_every_fused_type_has_a_crossover() -> None:
    assert set(traits.MATVEC_MAX_COLS) == traits.FUSED
    assert all(n >= 1 for n in traits.MATVEC_MAX_COLS.values())


def test_read_only_weights() -> None:
    """Weights straight from a mmapped GGUF are read-only views."""
    rng = np.random.default_rng(2)
    w, _ = _weights(T.Q4_K, 6, 256, rng)
    ro = w.copy()
    ro.flags.writeable = False
    x = rng.standard_normal((1, 256)).astype(np.float32)
    np.testing.assert_array_equal(qmatmul.mul_mat_q(ro, T.Q4_K, x), qmatmul.mul_mat_q(w, T.Q4_K, x))


def test_flat_rows_is_a_view_for_strided_rows() -> None:
    buf = np.arange(10 * 50, dtype=np.uint8).reshape(10, 50)
    rows = buf[1::3, :34]
    flat, rs = qmatmul._flat_rows(rows)
    assert rs == 150 and np.shares_memory(flat, buf)
    assert flat[rs * 2 + 5] == rows[2, 5]


@pytest.mark.parametrize("ty", sorted(traits.FUSED, key=int), ids=lambda t: t.name)
def test_fused_and_blas_paths_agree(ty: GGMLType) -> None:
    rng = np.random.default_rng(int(ty))
    k = _k_for(ty)
    w, _ = _weights(ty, 19, k, rng)
    x = rng.standard_normal((4, k)).astype(np.float32)
    a = np.empty((4, 19), np.float32)
    b = np.empty((4, 19), np.float32)
    qmatmul.matvec_q(w, ty, x, a, 1)
    qmatmul.matmul_tiles(w, ty, x, b, 1)
    tol = 5e-3 if ty in (T.Q4_1, T.Q5_1) else 1e-5
    assert np.abs(a - b).max() <= tol * np.abs(b).max()


@pytest.mark.parametrize(("ty", "n"), [(T.Q8_0, 2), (T.Q4_K, 3), (T.Q6_K, 40), (T.Q5_0, 40)])
def test_thread_count_does_not_change_results(ty: GGMLType, n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each output is one sequential dot (fused) or comes from one tile's sgemm (BLAS), whatever
    the split (as in ggml)."""
    rng = np.random.default_rng(3)
    k = _k_for(ty)
    w, _ = _weights(ty, 300, k, rng)
    x = rng.standard_normal((n, k)).astype(np.float32)
    monkeypatch.setattr(qmatmul, "PARALLEL_MIN_BYTES", 0)  # force the split even for small products
    monkeypatch.setattr(qmatmul, "BLAS_PARALLEL_MIN_FLOPS", 0)
    monkeypatch.setattr(qmatmul, "_TILE_BYTES", 8 * 4 * k)  # many tiles
    one = qmatmul.mul_mat_q(w, ty, x, n_threads=1)
    np.testing.assert_array_equal(qmatmul.mul_mat_q(w, ty, x, n_threads=2), one)
    np.testing.assert_array_equal(qmatmul.mul_mat_q(w, ty, x, n_threads=3), one)


@pytest.mark.parametrize("n_threads", [1, 2, 4])
def test_parallel_ranges_covers_each_item_once(n_threads: int) -> None:
    seen = np.zeros(1000, np.int64)

    def fn(i0: int, i1: int) -> None:
        seen[i0:i1] += 1

    qmatmul.parallel_ranges(fn, 1000, n_threads, 13)
    assert (seen == 1).all()
    qmatmul.parallel_ranges(fn, 0, n_threads, 4)  # nothing to do
    assert (seen == 1).all()


def test_parallel_ranges_reraises_in_the_caller() -> None:
    def fn(i0: int, i1: int) -> None:
        if i0 <= 500 < i1:
            raise RuntimeError("chunk failed")

    with pytest.raises(RuntimeError, match="chunk failed"):
        qmatmul.parallel_ranges(fn, 1000, 2, 8)


@pytest.mark.parametrize("n", [1, 20])
def test_writes_into_a_strided_out(n: int) -> None:
    rng = np.random.default_rng(5)
    w, _ = _weights(T.Q4_K, 10, 256, rng)
    x = rng.standard_normal((n, 256)).astype(np.float32)
    big = np.full((n, 20), -1.0, np.float32)
    out = big[:, ::2]
    qmatmul.mul_mat_q(w, T.Q4_K, x, out=out)
    np.testing.assert_array_equal(out, qmatmul.mul_mat_q(w, T.Q4_K, x))
    assert (big[:, 1::2] == -1).all()


def test_activation_quantizers_match_actquant() -> None:
    """The numba Q8_0 / Q8_K quantizers (Q8_0's vectorised where the CPU has AVX2) are byte-exact with
    ggml-cpu's (actquant, numpy)."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 1024)).astype(np.float32)
    x[0, :256] = 0  # an all-zero block (both block sizes)
    x[1, 32:64] *= 1e-5  # fp16-subnormal d
    x[2, 64:96] = np.round(x[2, 64:96] * 4) / 4  # ties for rint
    x[2, 90] = -127.0  # Q8_K: the first of two equal magnitudes sets the sign of d
    x[2, 96] = 127.0
    x[2, 97:128] = 2.5
    qa, da, asum = qmatmul.quantize_activations(x, T.Q8_0)
    _, d16, q = actquant._q8_0_parts(x)
    np.testing.assert_array_equal(qa.reshape(q.shape), q)
    np.testing.assert_array_equal(da, d16.astype(np.float32))
    np.testing.assert_array_equal(asum, q.astype(np.int32).sum(-1))
    # the repacked kernels' variant: the same codes and d, and -128 x each 4 codes' sum
    ql, dl, lanes = np.empty((3, 1024), np.int8), np.empty((3, 32), np.float32), np.empty((3, 256), np.int32)
    _quantize_q8_0_lanes(x, ql, dl, lanes)
    np.testing.assert_array_equal(ql.reshape(q.shape), q)
    np.testing.assert_array_equal(dl, d16.astype(np.float32))
    np.testing.assert_array_equal(lanes, -128 * q.reshape(3, 256, 4).astype(np.int32).sum(-1))
    qk, dk, bs = qmatmul.quantize_activations(x, T.Q8_K)
    dref, qref = actquant._q8_k_parts(x)
    np.testing.assert_array_equal(qk.reshape(qref.shape), qref)
    np.testing.assert_array_equal(dk, dref)
    np.testing.assert_array_equal(bs, qref.reshape(3, 64, 16).astype(np.int32).sum(-1))


def test_empty_and_bad_shapes() -> None:
    w, _ = _weights(T.Q8_0, 4, 64, np.random.default_rng(0))
    assert qmatmul.mul_mat_q(w, T.Q8_0, np.zeros((0, 64), np.float32)).shape == (0, 4)
    with pytest.raises(ValueError, match="64"):
        qmatmul.mul_mat_q(w, T.Q8_0, np.zeros((1, 32), np.float32))


@pytest.mark.parametrize("ty", [T.Q5_0, T.Q4_K, T.Q2_K], ids=lambda t: t.name)
def test_writes_into_column_slice_of_a_wider_out(ty: GGMLType) -> None:
    """An out whose rows are unit-stride but longer than m: the sgemm writes straight into it."""
    rng = np.random.default_rng(9)
    k = _k_for(ty)
    w, _ = _weights(ty, 30, k, rng)
    x = rng.standard_normal((40, k)).astype(np.float32)
    big = np.full((40, 50), -1.0, np.float32)
    out = big[:, 7:37]
    qmatmul.mul_mat_q(w, ty, x, out=out, n_threads=2)
    np.testing.assert_array_equal(out, qmatmul.mul_mat_q(w, ty, x))
    assert (big[:, :7] == -1).all() and (big[:, 37:] == -1).all()


@pytest.mark.parametrize("vdt", [T.Q8_0, T.Q8_1, T.Q8_K, T.F16, T.F32], ids=lambda t: t.name)
def test_scratch_fake_quant_matches_fake_quant(vdt: GGMLType) -> None:
    rng = np.random.default_rng(13)
    for n in (40, 3, 300):  # shrinking and growing reuse of the same scratch; 300: split in threads
        x = rng.standard_normal((n, 512)).astype(np.float32)
        want = actquant.fake_quant(x, vdt)
        np.testing.assert_array_equal(qmatmul._fake_quant_scratch(x, vdt), want)
        np.testing.assert_array_equal(qmatmul._fake_quant_scratch(x, vdt, 2), want)


def test_scratch_is_reused_per_slot_and_thread() -> None:
    a = qmatmul.scratch("test_a", (4, 8))
    b = qmatmul.scratch("test_a", (2, 3), np.int32)
    assert np.shares_memory(a, b) and b.flags.c_contiguous and b.dtype == np.int32
    assert not np.shares_memory(a, qmatmul.scratch("test_b", (4, 8)))
    big = qmatmul.scratch("test_a", (100, 100))  # grows
    assert big.shape == (100, 100)
    other: list[np.ndarray] = []
    t = threading.Thread(target=lambda: other.append(qmatmul.scratch("test_a", (100, 100))))
    t.start()
    t.join()
    assert not np.shares_memory(big, other[0])
    huge = (qmatmul.SCRATCH_MAX_BYTES // 4 + 1,)
    assert not np.shares_memory(qmatmul.scratch("test_a", huge), qmatmul.scratch("test_a", huge))


def test_successive_products_do_not_share_results() -> None:
    """Each product's result is right even though scratch buffers are reused between calls."""
    rng = np.random.default_rng(17)
    got, want = [], []
    for ty, m, n in [(T.Q5_0, 48, 40), (T.Q4_K, 16, 64), (T.Q5_0, 80, 33), (T.Q8_0, 8, 2)]:
        k = _k_for(ty)
        w, wf = _weights(ty, m, k, rng)
        x = rng.standard_normal((n, k)).astype(np.float32)
        got.append(qmatmul.mul_mat_q(w, ty, x, n_threads=2))
        want.append(actquant.fake_quant(x, qmatmul.vec_dot_type_of(ty)).astype(np.float64) @ wf.T.astype(np.float64))
    for g, r in zip(got, want, strict=True):
        assert np.abs(g - r).max() <= 1e-4 * np.abs(r).max()


@pytest.mark.parametrize("ty", [T.F16, T.F32, T.BF16], ids=lambda t: t.name)
@pytest.mark.parametrize("n", [3, 300])
def test_weight_product_float_weights(ty: GGMLType, n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """kernels_mat.weight_product's float branch (attention with an F16 K/V cache): x rounded to
    the weight's type, split over threads, identical for any thread count, into a scratch result."""
    from pyggml.backend.cpu.ops import mat as kernels_mat

    rng = np.random.default_rng(19)
    k, m = 96, 70
    w, wf = _weights(ty, m, k, rng)
    stored = w.view({T.F16: np.float16, T.F32: np.float32, T.BF16: np.uint16}[ty])
    x = rng.standard_normal((n, k)).astype(np.float32)
    xq = actquant.fake_quant(x, ty).astype(np.float64)
    ref = xq @ wf.T.astype(np.float64)
    monkeypatch.setattr(qmatmul, "BLAS_PARALLEL_MIN_FLOPS", 0)
    monkeypatch.setattr(kernels_mat, "_X_BLOCK_ROWS", 64)  # several blocks of x rows
    one = kernels_mat.weight_product(stored, ty, x, 1).copy()
    assert np.abs(one - ref).max() <= 1e-5 * np.abs(ref).max()
    np.testing.assert_array_equal(kernels_mat.weight_product(stored, ty, x, 2), one)
    monkeypatch.setattr(kernels_mat, "_TILE_FLOATS", 16 * k)  # several weight tiles
    tiled = kernels_mat.weight_product(stored, ty, x, 1).copy()
    assert np.abs(tiled - ref).max() <= 1e-5 * np.abs(ref).max()
    np.testing.assert_array_equal(kernels_mat.weight_product(stored, ty, x, 2), tiled)


def test_widen_f16_matches_numpy_for_every_value_and_strides() -> None:
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).reshape(256, 256)
    want = every.astype(np.float32)
    got = dots.widen_f16(every, np.empty((256, 256), np.float32))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))  # NaN payloads too
    view = every.T[::3, 5:200]  # transposed, strided both ways (like the V cache's rows)
    got = dots.widen_f16(view, np.empty(view.shape, np.float32))
    np.testing.assert_array_equal(got.view(np.uint32), view.astype(np.float32).view(np.uint32))


def _flat_weights(ty: GGMLType, m: int, k: int, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """m random rows of ty as the kernels take them: one flat uint8 array, and the row stride in bytes."""
    wq, _ = _weights(ty, m, k, rng)
    return np.ascontiguousarray(wq).reshape(-1), wq.shape[1]


@pytest.mark.parametrize("ty", [T.Q8_0, T.Q4_0, T.Q5_0, T.IQ4_NL], ids=lambda t: t.name)
def test_decode_row_dots_several_rows_at_once_give_each_rows_bits(ty: GGMLType) -> None:
    """A decode's mat-vec runs ROWDOT_ROWS rows per call (rows a quarter of the range apart); each output
    must be bit for bit the one-row dot, for every range length (remainder rows included)."""
    from pyggml.backend.cpu.quants import dots as kernels
    from pyggml.backend.cpu.quants import intrinsics

    rng = np.random.default_rng(7)
    m, k = 23, 256
    wu, rs = _flat_weights(ty, m, k, rng)
    qa = rng.integers(-127, 128, size=(1, k), dtype=np.int8)
    da = rng.uniform(0.001, 0.02, size=(1, k // 32)).astype(np.float32)
    name = ty.name.lower()
    one = intrinsics.ROWDOT[name].one
    import numba

    @numba.njit
    def single(wi, out):  # pragma: no cover - compiled
        for r in range(m):
            out[r] = one(wi, r * rs, k // 32, qa[0], 0, da[0], 0, simd.F16_TO_F32)

    want = np.zeros(m, np.float32)
    single(wu.view(np.int8), want)
    asum = np.zeros((1, k // 32), np.int32)
    for fn in (getattr(kernels, f"_mv_{name}"), getattr(kernels, f"_mv1_{name}")):  # with/without column groups
        for r0, r1 in [(0, m), (0, 4), (3, 10), (5, 6), (2, 23), (0, 0)]:
            out = np.full((1, m), np.nan, np.float32)
            fn(wu, wu.view(np.int8), rs, m, qa, da, asum, simd.F16_TO_F32, out, r0, r1)
            np.testing.assert_array_equal(out[0, r0:r1], want[r0:r1])
            assert np.isnan(out[0, :r0]).all() and np.isnan(out[0, r1:]).all()


@pytest.mark.parametrize("ty", [T.Q2_K, T.Q3_K, T.IQ4_XS, T.IQ3_S, T.IQ3_XXS, T.Q4_K, T.Q5_K, T.Q6_K],
                         ids=lambda t: t.name)
def test_k_quant_decode_rows_match_the_prompt_path_bits(ty: GGMLType) -> None:
    """A lone activation row (a decode) goes four weight rows at a time; a prompt's rows go four columns
    at a time. The same activation row must get the same bits either way, for every row range."""
    from pyggml.backend.cpu.quants import dots as kernels

    rng = np.random.default_rng(11)
    m, k = 21, 512
    wu, rs = _flat_weights(ty, m, k, rng)
    x = rng.integers(-127, 128, size=(1, k), dtype=np.int8)
    qa5 = np.ascontiguousarray(np.vstack([rng.integers(-127, 128, size=(4, k), dtype=np.int8), x]))
    da5 = rng.uniform(0.001, 0.02, size=(5, k // 256)).astype(np.float32)
    fn = getattr(kernels, f"_mv_{ty.name.lower()}")
    one_at_a_time = getattr(kernels, f"_mv1_{ty.name.lower()}")  # no column groups compiled
    for r0, r1 in [(0, m), (3, 10), (5, 6), (1, 20)]:
        outs = []
        for f, (qa, da) in ((fn, (qa5, da5)), (fn, (np.repeat(x, 4, axis=0), np.repeat(da5[4:], 4, axis=0))),
                            (one_at_a_time, (qa5, da5))):
            bsum = qa.reshape(qa.shape[0], -1, 16).sum(-1, dtype=np.int32)
            out = np.full((qa.shape[0], m), np.nan, np.float32)
            f(wu, wu.view(np.int8), rs, m, qa, da, bsum, simd.F16_TO_F32, out, r0, r1)
            outs.append(out)
        decode, prompt = outs[0][4, r0:r1], outs[1][0, r0:r1]
        assert np.isfinite(decode).all()
        np.testing.assert_array_equal(decode.view(np.uint32), prompt.view(np.uint32))
        np.testing.assert_array_equal(outs[2][:, r0:r1].view(np.uint32), outs[0][:, r0:r1].view(np.uint32))


@pytest.mark.parametrize("ty", [T.Q8_0, T.Q4_0, T.Q5_0, T.IQ4_NL, T.Q2_K, T.Q3_K, T.IQ4_XS, T.IQ3_S, T.IQ3_XXS,
                                T.Q4_K, T.Q5_K, T.Q6_K],
                         ids=lambda t: t.name)
def test_a_batch_of_columns_gives_each_column_its_one_column_bits(ty: GGMLType) -> None:
    """A batch of decodes (2..9 activation rows) decodes each weight row once for groups of up to ROWDOT_COLS
    columns, the last 1-3 of a batch together; every column must be bit for bit what the one-column kernel
    gives it (the batch's size must never change a sequence's logits), for every row range."""
    rng = np.random.default_rng(int(ty))
    m, k = 13, _k_for(ty) * (2 if ty.blck_size == 32 else 1)
    wu, rs = _flat_weights(ty, m, k, rng)
    bs = 256 if ty.blck_size == 256 else 32
    name = ty.name.lower()
    batch, one = getattr(dots, f"_mv_{name}"), getattr(dots, f"_mv1_{name}")
    for n in range(2, 10):
        qa = rng.integers(-127, 128, size=(n, k), dtype=np.int8)
        da = rng.uniform(0.001, 0.02, size=(n, k // bs)).astype(np.float32)
        extra = qa.reshape(n, -1, 16 if bs == 256 else 32).sum(-1, dtype=np.int32)
        for r0, r1 in [(0, m), (3, 10), (5, 6)]:
            want = np.full((n, m), np.nan, np.float32)
            one(wu, wu.view(np.int8), rs, m, qa, da, extra, simd.F16_TO_F32, want, r0, r1)
            got = np.full((n, m), np.nan, np.float32)
            batch(wu, wu.view(np.int8), rs, m, qa, da, extra, simd.F16_TO_F32, got, r0, r1)
            assert np.isfinite(want[:, r0:r1]).all() and np.isnan(got[:, :r0]).all() and np.isnan(got[:, r1:]).all()
            np.testing.assert_array_equal(got[:, r0:r1].view(np.uint32), want[:, r0:r1].view(np.uint32),
                                          err_msg=f"{n} columns, rows {r0}..{r1}")
