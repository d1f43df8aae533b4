"""The CPU backend's graph plans: compiled kernels against the numpy kernels, threads, reuse, errors.

Every compiled kernel (backend/cpu/jit) is checked against its op's numpy kernel on the same node:
the test first asserts that the plan really took the compiled kernel (a selector that silently
fell back would otherwise pass), computes the graph through the plan, then recomputes every node
with the numpy kernels and compares. Integer and copy paths must agree bit for bit; paths through
exp/tanh/cos (libm and the vectorized expf vs numpy's) and float dot products summed in another
order agree to float32 rounding.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

import numpy as np
import pytest

from helpers.opcheck import OpCase, values
from pyggml.backend.cpu import jit
from pyggml.backend.cpu.compute import _resolve, compute_forward, graph_compute, new_plan
from pyggml.backend.cpu.ops import mat_jit
from pyggml.backend.cpu.plan import GraphPlan, plan_for
from pyggml.backend.cpu.quants import gemm
from pyggml.backend.cpu.traits import ALL_COLS, MATVEC_MAX_COLS, TYPE_TRAITS_CPU, traits
from pyggml.errors import PyGGMLError
from pyggml.graph import Graph
from pyggml.ops import builders as B
from pyggml.ops.enums import GluOp
from pyggml.tensor import Tensor
from pyggml.tensor_data import bf16_to_f32, f32_to_bf16
from pyggml.types import GGMLType

F32, F16, BF16, I32, I64 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32, GGMLType.I64


def both(out: Tensor, n_threads: int = 2, compiled: tuple[Tensor, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
    """(result through the plan, result through the numpy kernels) of ``out``'s graph.

    ``compiled`` (default: out) are the nodes that must have taken a compiled kernel.
    """
    g = Graph()
    g.build_forward_expand(out)
    plan = plan_for(g, _resolve)
    for node in compiled or (out,):
        assert any(n is node for n in plan.nodes), f"{node.op.name} did not take a compiled kernel"
    assert graph_compute(g, n_threads) == 0
    got = values(out)
    for node in g.nodes:
        compute_forward(node, n_threads)
    return got, values(out)


def exact(got: np.ndarray, ref: np.ndarray) -> None:
    np.testing.assert_array_equal(got, ref)


def close(got: np.ndarray, ref: np.ndarray, rtol: float = 2e-6) -> None:
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * max(1.0, float(np.abs(ref).max())))


# ----------------------------------------------------------------------------------- elementwise
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("bshape", [(64, 6, 2, 1), (64, 1, 1, 1), (1, 6, 1, 1), (16, 3, 2, 1)])
def test_binary_broadcasts(op: str, bshape: tuple[int, ...]) -> None:
    c = OpCase()
    a = c.tensor(F32, 64, 6, 2)
    b = c.tensor(F32, *bshape, lo=0.5, hi=2.0)
    exact(*both(getattr(B, op)(c.ctx, a, b)))


def test_binary_on_a_permuted_operand() -> None:
    c = OpCase()
    a = B.permute(c.ctx, c.tensor(F32, 8, 5, 3), 1, 0, 2, 3)  # elements not contiguous
    b = c.tensor(F32, 5, 8, 3)
    exact(*both(B.add(c.ctx, a, b)))


@pytest.mark.parametrize("bias", [0.0, 0.25])
def test_scale(bias: float) -> None:
    c = OpCase()
    exact(*both(B.scale_bias(c.ctx, c.tensor(F32, 33, 7), 1.5, bias)))


@pytest.mark.parametrize("fn", ["gelu", "relu", "silu", "tanh", "exp", "sigmoid", "neg", "abs", "sqr"])
def test_unary(fn: str) -> None:
    c = OpCase()
    out = getattr(B, fn)(c.ctx, c.tensor(F32, 100, 9, lo=-12.0, hi=12.0))
    got, ref = both(out)
    (exact if fn in ("gelu", "relu", "neg", "abs", "sqr") else close)(got, ref)


def test_gelu_takes_the_table_for_every_fp16_value() -> None:
    """The compiled GELU (8 values at a time: vcvtps2ph and a gather, where the CPU has AVX2) on every fp16 value
    widened, on floats halfway between fp16 neighbours (the rounding ties), the clamps' edges, infinities and NaN,
    in rows of 2051 values (a tail of 3 after the vectors): the numpy kernel's bits."""
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    finite = np.sort(np.unique(halves[np.isfinite(halves)]))
    ties = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)
    edges = np.float32([-10.0, 10.0, np.nextafter(np.float32(-10), 0), np.nextafter(np.float32(10), 0), -np.inf,
                        np.inf, np.nan, 65520.0, -65520.0, 1e-8, -1e-8, 0.0, -0.0])
    x = np.concatenate([halves, ties, edges]).astype(np.float32)
    x = np.concatenate([x, np.zeros(-len(x) % 2051, np.float32)]).reshape(-1, 2051)
    c = OpCase()
    got, ref = both(B.gelu(c.ctx, c.tensor(F32, 2051, x.shape[0], data=x)))
    exact(got, ref)


@pytest.mark.parametrize("fn", ["exp", "sigmoid"])
def test_exp_and_sigmoid_take_libm_expf_on_every_element(fn: str) -> None:
    """ggml's unary-ops.cpp calls the C library's expf per element (no ggml_v_expf): the compiled kernel's
    bits are libm's, over a row long enough that a vector path would have shown (numpy's exp may differ)."""
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.expf.restype, libm.expf.argtypes = ctypes.c_float, [ctypes.c_float]
    c = OpCase()
    x = c.tensor(F32, 67, 5, lo=-30.0, hi=30.0)
    got, _ = both(getattr(B, fn)(c.ctx, x))
    xs = values(x).reshape(-1)
    one = np.float32(1.0)
    e = np.array([libm.expf(float(v if fn == "exp" else -v)) for v in xs], dtype=np.float32)
    exact(got.reshape(-1), e if fn == "exp" else one / (one + e))


@pytest.mark.parametrize("case", ["add_a", "add_b", "mul_scalar", "scale", "silu", "gelu", "relu"])
def test_a_node_in_place_over_its_source_gets_the_same_bits(case: str) -> None:
    """The graph allocator puts an elementwise node's output on a source it is the last reader of (a Mamba
    layer's conv bias ADD and its SiLU); those kernels then compute through one array (elementwise_jit's
    _binary): the bits must be those of the same node with an output of its own."""

    def run(in_place: bool) -> np.ndarray:
        c = OpCase()
        a, b = c.tensor(F32, 72, 6, lo=-6.0, hi=6.0), c.tensor(F32, 72, 6, lo=0.5, hi=2.0)
        src = b if case == "add_b" else a
        if case in ("add_a", "add_b"):
            out = B.add(c.ctx, a, b)
        elif case == "mul_scalar":
            out = B.mul(c.ctx, a, c.tensor(F32, 1, 6, lo=0.5, hi=2.0))
        elif case == "scale":
            out = B.scale(c.ctx, a, 0.75)
        else:
            out = getattr(B, case)(c.ctx, a)
        if in_place:
            out.data = src.data
        g = Graph()
        g.build_forward_expand(out)
        assert any(n is out for n in plan_for(g, _resolve).nodes)
        assert graph_compute(g, 2) == 0
        return values(out)

    exact(run(True).view(np.uint32), run(False).view(np.uint32))


@pytest.mark.parametrize("op", [GluOp.GEGLU, GluOp.SWIGLU, GluOp.REGLU])
@pytest.mark.parametrize("form", ["split", "fused", "swapped"])
def test_glu(op: GluOp, form: str) -> None:
    c = OpCase()
    if form == "split":
        out = B.glu_split(c.ctx, c.tensor(F32, 48, 5, lo=-6, hi=6), c.tensor(F32, 48, 5), op)
    else:
        out = B.glu(c.ctx, c.tensor(F32, 96, 5, lo=-6, hi=6), op, form == "swapped")
    got, ref = both(out)
    (close if op == GluOp.SWIGLU else exact)(got, ref)


# ------------------------------------------------------------------------------------------- nn
def test_rms_norm() -> None:
    c = OpCase()
    exact(*both(B.rms_norm(c.ctx, c.tensor(F32, 640, 6, 2, lo=-30, hi=30), 1e-6)))


@pytest.mark.parametrize(("mask_type", "max_bias"), [(None, 0.0), (F32, 0.0), (F16, 0.0), (F32, 8.0), (F16, 8.0)])
def test_soft_max(mask_type: GGMLType | None, max_bias: float) -> None:
    c = OpCase()
    n_kv, n_tok, n_head = 70, 5, 4
    a = c.tensor(F32, n_kv, n_tok, n_head, lo=-8, hi=8)
    mask = None
    if mask_type is not None:
        m = np.zeros((n_tok, n_kv), np.float32)
        m[:, 60:] = -np.inf
        m[1, 10:20] = -np.inf
        mask = c.tensor(mask_type, n_kv, n_tok, data=m)
    close(*both(B.soft_max_ext(c.ctx, a, mask, 0.3, max_bias)))


@pytest.mark.parametrize(
    ("kv_type", "n_q", "n_kv", "softcap", "max_bias", "sinks"),
    [
        (F16, 1, 96, 0.0, 0.0, False),  # one chunk (a short decode)
        (F16, 5, 96, 0.0, 8.0, True),
        (F32, 5, 96, 30.0, 0.0, False),
        (F16, 1, 600, 0.0, 0.0, True),  # split KV: the cells shared out over the threads, partials merged
        (F32, 1, 520, 0.0, 0.0, False),
        (F16, 70, 150, 0.0, 0.0, False),  # tiled: 64 query rows by 64 cells
        (F32, 130, 96, 20.0, 8.0, True),
    ],
)
def test_flash_attn_ext(kv_type: GGMLType, n_q: int, n_kv: int, softcap: float, max_bias: float, sinks: bool) -> None:
    """The compiled kernel's three paths against the numpy kernel, which takes the same steps (the fp16
    accumulator of the one-chunk and split paths too) up to float32 round-off; the bits are llama.cpp's
    (tests/llm/test_llm_flash_attn.py)."""
    c = OpCase()
    d, n_head, n_head_kv = 64, 4, 2
    q = c.tensor(F32, d, n_q, n_head)
    k = c.tensor(kv_type, d, n_kv, n_head_kv)
    v = c.tensor(kv_type, d, n_kv, n_head_kv)
    m = np.zeros((n_q, n_kv), np.float32)
    for i in range(n_q):  # causal over a history, and one row's early cells masked
        m[i, n_kv - n_q + i + 1:] = -np.inf
    m[0, :3] = -np.inf
    mask = c.tensor(F16, n_kv, n_q, data=m)
    out = B.flash_attn_ext(c.ctx, q, k, v, mask, 1.0 / 8, max_bias, softcap)
    if sinks:
        B.flash_attn_ext_add_sinks(out, c.tensor(F32, n_head))
    got, ref = both(out)
    close(got, ref, rtol=2e-5)
    assert np.isfinite(got).all()


@pytest.mark.parametrize("max_bias", [0.0, 8.0])
def test_flash_attn_ext_skips_masked_tiles(max_bias: float) -> None:
    """An encoder's batch of many short sequences: a block-diagonal mask, most 64x64 tiles masked whole (the
    tiled path skips them from the mask's raw bits), against the numpy kernel."""
    c = OpCase()
    d, n_head, n_tok, n_seq_tok = 64, 2, 200, 30
    q = c.tensor(F32, d, n_tok, n_head)
    k = c.tensor(F16, d, n_tok, n_head)
    v = c.tensor(F16, d, n_tok, n_head)
    seq = np.arange(n_tok) // n_seq_tok
    m = np.where(seq[:, None] == seq[None, :], 0.0, -np.inf).astype(np.float32)
    mask = c.tensor(F16, n_tok, n_tok, data=m)
    got, ref = both(B.flash_attn_ext(c.ctx, q, k, v, mask, 1.0 / 8, max_bias, 0.0))
    close(got, ref, rtol=2e-5)
    assert np.isfinite(got).all()


@pytest.mark.parametrize("kv_type", [F16, F32])
def test_flash_attn_ext_tiles_follow_the_sequences_with_the_same_bits(kv_type: GGMLType) -> None:
    """The tiled path groups query rows by the cells they see (a tile per sequence of a block-diagonal mask) and
    computes only those cells' columns: a sequence's rows have the bits they have when every other query row is
    masked whole (rows that see nothing join any tile, so there the tiles are 64 rows as before), and the numpy
    kernel's values. Sequences of 37, 8, 70, 1, 53 and 31 tokens: spans across and inside the 64-cell tiles, at
    odd offsets; sinks on."""
    c = OpCase()
    d, n_head = 64, 2
    lens = [37, 8, 70, 1, 53, 31]
    n_tok = sum(lens)
    q = c.tensor(F32, d, n_tok, n_head)
    k = c.tensor(kv_type, d, n_tok, n_head)
    v = c.tensor(kv_type, d, n_tok, n_head)
    sinks = c.tensor(F32, n_head)
    seq = np.repeat(np.arange(len(lens)), lens)
    block = np.where(seq[:, None] == seq[None, :], 0.0, -np.inf).astype(np.float32)
    out = B.flash_attn_ext(c.ctx, q, k, v, c.tensor(F16, n_tok, n_tok, data=block), 1.0 / 8, 0.0, 0.0)
    B.flash_attn_ext_add_sinks(out, sinks)
    full, ref = both(out)
    close(full, ref, rtol=2e-5)  # every live cell counted (the numpy kernel's attention)
    for s in range(len(lens)):
        alone = np.where((seq[:, None] == s) & (seq[None, :] == s), 0.0, -np.inf).astype(np.float32)
        out = B.flash_attn_ext(c.ctx, q, k, v, c.tensor(F16, n_tok, n_tok, data=alone), 1.0 / 8, 0.0, 0.0)
        B.flash_attn_ext_add_sinks(out, sinks)
        got = both(out)[0]
        rows = seq == s
        exact(got[:, rows], full[:, rows])


@pytest.mark.parametrize("mode", [0, 2])
@pytest.mark.parametrize("variant", ["plain", "yarn", "freq_factors", "partial", "back"])
def test_rope(mode: int, variant: str) -> None:
    c = OpCase()
    head, n_head, n_tok = 64, 3, 5
    x = c.tensor(F32, head, n_head, n_tok)
    pos = c.ints(I32, n_tok, data=np.array([0, 1, 7, 300, 4000]))
    n_dims = 32 if variant == "partial" else head
    ff = c.tensor(F32, n_dims // 2, lo=1.0, hi=4.0) if variant == "freq_factors" else None
    ext = 1.0 if variant == "yarn" else 0.0
    scale = 0.25 if variant == "yarn" else 1.0
    rope = B.rope_ext_back if variant == "back" else B.rope_ext
    out = rope(c.ctx, x, pos, ff, n_dims, mode, 4096, 10000.0, scale, ext, 1.0, 32.0, 1.0)
    close(*both(out), rtol=5e-6)


# ------------------------------------------------------------------------------------------ rows
@pytest.mark.parametrize("ty", [F32, F16, GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q4_K,
                                GGMLType.Q6_K])
def test_get_rows(ty: GGMLType) -> None:
    c = OpCase()
    table = c.tensor(ty, 256, 10, 2)
    idx = c.ints(I32, 4, 2, data=np.array([[9, 0, 3, 3], [1, 8, 2, 0]]))
    exact(*both(B.get_rows(c.ctx, table, idx)))


def test_get_rows_index_out_of_range_is_an_error() -> None:
    c = OpCase()
    out = B.get_rows(c.ctx, c.tensor(F32, 8, 4), c.ints(I32, 2, data=np.array([1, 4])))
    g = Graph()
    g.build_forward_expand(out)
    assert plan_for(g, _resolve).nodes == [out]
    with pytest.raises(PyGGMLError, match="out of range"):
        graph_compute(g, 2)


@pytest.mark.parametrize("dst", [F16, F32])
@pytest.mark.parametrize("idx_type", [I32, I64])
def test_set_rows(dst: GGMLType, idx_type: GGMLType) -> None:
    c = OpCase()
    cache = c.tensor(dst, 32, 12, 2)
    src = c.tensor(F32, 32, 3, 2, lo=-100, hi=100)
    idx = c.ints(idx_type, 3, data=np.array([11, 0, 5]))
    exact(*both(B.set_rows(c.ctx, cache, src, idx)))


def test_set_rows_to_f16_rounds_ties_to_even() -> None:
    """The fp16 cache write (8 values at a time with F16C, the rest one by one: rows of 37) rounds ties and
    subnormals as the numpy kernel does."""
    c = OpCase()
    i = np.arange(37 * 3)
    xs = np.where(i % 3 == 0, (2 * i % 64 + 1) * 2.0**-25, 1 + (2 * i % 512 + 1) * 2.0**-11) * np.where(i % 2, -1, 1)
    src = c.tensor(F32, 37, 3, data=xs.astype(np.float32).reshape(3, 37))
    cache = c.tensor(F16, 37, 8)
    idx = c.ints(I64, 3, data=np.array([7, 0, 3]))
    exact(*both(B.set_rows(c.ctx, cache, src, idx)))


@pytest.mark.parametrize(("src_type", "dst_type"), [(F32, F32), (F32, F16), (F16, F32), (F16, F16)])
def test_cont_of_a_permuted_tensor(src_type: GGMLType, dst_type: GGMLType) -> None:
    c = OpCase()
    x = B.permute(c.ctx, c.tensor(src_type, 16, 4, 6), 0, 2, 1, 3)
    if dst_type == src_type:
        out = B.cont_2d(c.ctx, x, 16 * 6, 4)
    else:
        out = B.cpy(c.ctx, x, c.ctx.new_tensor(dst_type, 16, 6, 4))
    exact(*both(out))


@pytest.mark.parametrize("dim", [0, 1, 2, 3])
@pytest.mark.parametrize("ty", [F32, F16])
def test_concat_along_each_dim(dim: int, ty: GGMLType) -> None:
    c = OpCase()
    ne_a, ne_b = [6, 5, 4, 3], [6, 5, 4, 3]
    ne_b[dim] = 2
    exact(*both(B.concat(c.ctx, c.tensor(ty, *ne_a), c.tensor(ty, *ne_b), dim)))


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_concat_of_permuted_sources(dim: int) -> None:
    """Sources with any strides (Mamba-2 appends a transposed view to its conv state)."""
    c = OpCase()
    a = B.permute(c.ctx, c.tensor(F32, 5, 7, 3), 1, 0, 2, 3)  # ne (7, 5, 3): elements strided
    ne_b = [7, 5, 3]
    ne_b[dim] = 4
    b = B.transpose(c.ctx, c.tensor(F32, ne_b[1], ne_b[0], ne_b[2]))
    exact(*both(B.concat(c.ctx, a, b, dim)))


@pytest.mark.parametrize("ty", [GGMLType.I32, GGMLType.I8])
def test_concat_of_integers_and_a_row_view(ty: GGMLType) -> None:
    c = OpCase()
    w = ty.type_size
    a = c.ints(ty, 3, 4, data=np.arange(12))
    b = B.view_2d(c.ctx, c.ints(ty, 8, 4, data=np.arange(50, 82)), 5, 4, 8 * w, 3 * w)  # rows of a wider tensor
    exact(*both(B.concat(c.ctx, a, b, 0)))


@pytest.mark.parametrize(("src", "dst"), [((8, 1, 1, 1), (8, 3, 2, 2)), ((1, 3, 1, 1), (5, 3, 4, 1)),
                                          ((4, 3, 2, 1), (12, 6, 2, 3)), ((1, 1, 1, 1), (9, 2, 1, 1))])
@pytest.mark.parametrize("ty", [F32, F16])
def test_repeat_broadcasts(src: tuple[int, ...], dst: tuple[int, ...], ty: GGMLType) -> None:
    c = OpCase()
    exact(*both(B.repeat_4d(c.ctx, c.tensor(ty, *src), *dst)))


def test_repeat_of_a_transposed_source() -> None:
    c = OpCase()
    a = B.transpose(c.ctx, c.tensor(F32, 3, 4))  # ne (4, 3), elements strided
    exact(*both(B.repeat_4d(c.ctx, a, 8, 6, 2, 1)))


# ----------------------------------------------------------------------------- the MoE router's ops
def test_sum_rows_in_double() -> None:
    c = OpCase()
    close(*both(B.sum_rows(c.ctx, c.tensor(F32, 37, 5, 2, lo=-3, hi=3))))


def test_clamp() -> None:
    c = OpCase()
    exact(*both(B.clamp(c.ctx, c.tensor(F32, 19, 6, lo=-3, hi=3), -1.0, 0.5)))


@pytest.mark.parametrize("order", [B.SortOrder.ASC, B.SortOrder.DESC])
def test_argsort_is_stable(order: B.SortOrder) -> None:
    """Rows with ties (the lower index first, as the numpy kernel), of a router's width and longer."""
    c = OpCase()
    x = np.round(np.random.default_rng(3).normal(size=(7, 130)), 1).astype(np.float32)
    exact(*both(B.argsort(c.ctx, c.tensor(F32, 130, 7, data=x), order)))


def test_add_id_adds_the_chosen_experts_biases() -> None:
    c = OpCase()
    ids = np.array([[(t * 3 + s) % 5 for s in range(2)] for t in range(4)])
    out = B.add_id(c.ctx, c.tensor(F32, 24, 2, 4), c.tensor(F32, 24, 5), c.ints(I32, 2, 4, data=ids))
    exact(*both(out))


# ---------------------------------------------------------------------------------------- mul_mat
@pytest.mark.parametrize("ty", [GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.IQ4_NL, GGMLType.Q2_K,
                                GGMLType.Q3_K, GGMLType.IQ4_XS, GGMLType.IQ3_S, GGMLType.IQ3_XXS, GGMLType.Q4_K,
                                GGMLType.Q5_K, GGMLType.Q6_K])
@pytest.mark.parametrize("cols", [1, 3, "max"])
def test_quantized_mat_vec_is_the_numpy_paths_bits(ty: GGMLType, cols: int | str) -> None:
    """Few src1 rows: the compiled kernel runs the same integer block dots as the numpy path."""
    c = OpCase()
    n = min(MATVEC_MAX_COLS[ty], 100) if cols == "max" else cols  # Q8_0/Q4_0/Q5_0: no limit
    w = c.tensor(ty, 512, 70)
    x = c.tensor(F32, 512, n, lo=-3, hi=3)
    exact(*both(B.mul_mat(c.ctx, w, x)))


def test_quantized_mat_vec_over_planes_of_src1() -> None:
    c = OpCase()
    w = c.tensor(GGMLType.Q4_K, 256, 40)
    x = c.tensor(F32, 256, 2, 3)
    exact(*both(B.mul_mat(c.ctx, w, x)))


@pytest.mark.parametrize("ty", [GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.IQ4_NL, GGMLType.Q2_K,
                                GGMLType.Q3_K, GGMLType.IQ4_XS, GGMLType.IQ3_S, GGMLType.IQ3_XXS, GGMLType.Q4_K,
                                GGMLType.Q5_K, GGMLType.Q6_K])
@pytest.mark.parametrize(("n_b", "n_tok"), [(1, 1), (1, 5), (2, 1), (2, 7)])
def test_quantized_mul_mat_id_is_the_numpy_paths_bits(ty: GGMLType, n_b: int, n_tok: int) -> None:
    """The experts' product (one src1 row per token shared by its experts, or one per chosen expert): each
    routed row through the expert's weight with the mat-vec kernels' bits; experts nobody chose, and an
    expert chosen by several tokens, included."""
    c = OpCase()
    n_expert, n_used = 5, 2
    w = c.tensor(ty, 512, 70, n_expert)
    x = c.tensor(F32, 512, n_b, n_tok, lo=-3, hi=3)
    ids = np.array([[(t + s) % 3 if t % 2 else 4 - s for s in range(n_used)] for t in range(n_tok)])
    out = B.mul_mat_id(c.ctx, w, x, c.ints(I32, n_used, n_tok, data=ids))
    exact(*both(out))


@pytest.mark.parametrize("n_tok", [1, 3, 40])
@pytest.mark.parametrize("wt", [F16, BF16, F32])
def test_float_mat_mul_like_attention(wt: GGMLType, n_tok: int) -> None:
    """KQ against a permuted K view with GQA broadcast (4 query heads per KV head)."""
    c = OpCase()
    head, n_kv, n_kv_head, n_head = 64, 37, 2, 8
    k = B.permute(c.ctx, c.tensor(wt, head, n_kv_head, n_kv), 0, 2, 1, 3)  # [head, n_kv, n_kv_head]
    q = B.permute(c.ctx, c.tensor(F32, head, n_head, n_tok), 0, 2, 1, 3)  # [head, n_tok, n_head]
    close(*both(B.mul_mat(c.ctx, k, q)), rtol=1e-5)


def _fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 fused multiply-add: the product of two float32 is exact in float64 (rounding the float64 sum
    to float32 differs from one rounding only at float32 ties after a float64 rounding, ~2^-29 a step)."""
    return (a.astype(np.float64) * b + c).astype(np.float32)


def _hsum8(v: np.ndarray) -> np.ndarray:
    q = v[..., 4:] + v[..., :4]
    return (q[..., 0] + q[..., 2]) + (q[..., 1] + q[..., 3])


def _tinyblas(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """llamafile's tinyBLAS<8, __m256> per output (sgemm.cpp gemm_bloc): one 8-lane fma accumulator, hsum."""
    acc = np.zeros((x.shape[0], w.shape[0], 8), np.float32)
    for l in range(0, w.shape[1], 8):
        acc = _fma(w[None, :, l:l + 8], x[:, None, l:l + 8], acc)
    return _hsum8(acc)


def _vec_dot(w: np.ndarray, x: np.ndarray, half: bool) -> np.ndarray:
    """ggml_vec_dot_f16/_f32 on AVX2 (vec.cpp): four 8-lane fma accumulators over steps of 32,
    GGML_F32x8_REDUCE, leftovers in double (fp16) or float (f32)."""
    k = w.shape[1]
    np32 = k // 32 * 32
    acc = np.zeros((x.shape[0], w.shape[0], 4, 8), np.float32)
    for i in range(0, np32, 32):
        acc = _fma(w[None, :, i:i + 32].reshape(1, -1, 4, 8), x[:, None, i:i + 32].reshape(-1, 1, 4, 8), acc)
    x0 = (acc[..., 0, :] + acc[..., 2, :]) + (acc[..., 1, :] + acc[..., 3, :])
    t0 = x0[..., :4] + x0[..., 4:]
    red = (t0[..., 0] + t0[..., 1]) + (t0[..., 2] + t0[..., 3])
    if half:
        s = red.astype(np.float64)
        for i in range(np32, k):
            s = s + (w[None, :, i] * x[:, None, i]).astype(np.float64)
        return s.astype(np.float32)
    for i in range(np32, k):
        red = _fma(w[None, :, i], x[:, None, i], red)
    return red


@pytest.mark.parametrize("wt", [F16, BF16, F32])
@pytest.mark.parametrize(("k", "m", "n"), [(64, 36, 17), (72, 36, 21), (40, 37, 17), (70, 36, 18)])
def test_prompt_float_mat_mul_is_llama_cpps_order(wt: GGMLType, k: int, m: int, n: int) -> None:
    """Prompt-size products get llama.cpp's bits on x86/AVX2: tinyBLAS's tiles when k % 8 == 0 and m % 4 == 0,
    one ggml_vec_dot per output otherwise (m = 37; k = 70), src1 rounded to fp16 / bf16 against fp16 / bf16
    weights."""
    c = OpCase()
    w = c.tensor(wt, k, m)
    x = c.tensor(F32, k, n, lo=-3, hi=3)
    out = B.mul_mat(c.ctx, w, x)
    got, _ = both(out)
    wv = values(w)[0, 0]
    xv = _rounded_src1(values(x)[0, 0], wt)
    tiled = k % 8 == 0 and m % 4 == 0
    want = _tinyblas(wv, xv) if tiled else _vec_dot(wv, xv, wt != F32)
    exact(got[0, 0], want)


def test_prompt_f16_mat_mul_rounds_src1_ties_to_even() -> None:
    """src1 goes to fp16 first (8 values at a time with F16C): ties, fp16 subnormals and their ties round as
    numpy's (and ggml's) conversion, to the nearest, ties to even."""
    c = OpCase()
    k, m, n = 64, 8, 20
    ties = 1 + (2 * np.arange(k * n) % 512 + 1) * 2.0**-11  # halfway between neighbouring fp16 values
    sub = (2 * np.arange(k * n) % 64 + 1) * 2.0**-25  # halfway between fp16 subnormals
    xs = np.where(np.arange(k * n) % 3 == 0, sub, ties) * np.where(np.arange(k * n) % 2, -1, 1)
    x = c.tensor(F32, k, n, data=xs.astype(np.float32).reshape(n, k))
    w = c.tensor(F16, k, m)
    got, _ = both(B.mul_mat(c.ctx, w, x))
    xv = values(x)[0, 0].astype(np.float16).astype(np.float32)
    exact(got[0, 0], _tinyblas(values(w)[0, 0], xv))


def _rounded_src1(xv: np.ndarray, wt: GGMLType) -> np.ndarray:
    """src1 as the product sees it: rounded to the weight's vec_dot_type (F16, BF16) and back."""
    if wt == F16:
        return xv.astype(np.float16).astype(np.float32)
    return bf16_to_f32(f32_to_bf16(xv)) if wt == BF16 else xv


@pytest.mark.parametrize("wt", [F16, BF16, F32])
def test_decode_float_mat_mul_sums_in_double(wt: GGMLType) -> None:
    """Up to 16 columns of a product over several planes (attention's heads, one KV head for two query heads
    here): each output is the double sum of the float products, rounded once."""
    c = OpCase()
    w = c.tensor(wt, 72, 36, 1)
    x = c.tensor(F32, 72, 16, 2, lo=-3, hi=3)
    got, _ = both(B.mul_mat(c.ctx, w, x))
    for p in range(2):
        xv = _rounded_src1(values(x)[0, p], wt)
        want = (xv.astype(np.float64) @ values(w)[0, 0].T.astype(np.float64)).astype(np.float32)
        np.testing.assert_array_equal(got[0, p], want)


@pytest.mark.parametrize("wt", [F16, BF16, F32])
def test_decode_weight_mat_mul_is_ggmls_vec_dot(wt: GGMLType) -> None:
    """A one-plane product (a model's weight by its activations) of up to 16 columns: ggml's vec_dot per output."""
    c = OpCase()
    w = c.tensor(wt, 72, 36)
    x = c.tensor(F32, 72, 16, lo=-3, hi=3)
    got, _ = both(B.mul_mat(c.ctx, w, x))
    exact(got[0, 0], _vec_dot(values(w)[0, 0], _rounded_src1(values(x)[0, 0], wt), wt != F32))


def test_attention_rows_do_not_change_with_the_batch() -> None:
    """Prompt-size KQV over more cells (zero probabilities past the live ones) and with other query rows beside
    it: each output keeps its bits, so perplexity does not depend on how chunks are grouped into batches."""
    c = OpCase()
    v = c.tensor(F16, 512, 64)  # V^T: [n_kv, head]
    probs = c.rng.uniform(0, 1, size=(40, 512)).astype(np.float32)
    probs[:, 256:] = 0  # the cells past the first 256 are masked
    p = c.tensor(F32, 512, 40, data=probs)
    few = c.tensor(F32, 256, 20, data=probs[:20, :256])  # 20 query rows over the first 256 cells only
    vw = B.view_2d(c.ctx, v, 256, 64, v.nb[1], 0)
    all_rows = c.compute(B.mul_mat(c.ctx, v, p))[0, 0]
    exact(c.compute(B.mul_mat(c.ctx, vw, few))[0, 0], all_rows[:20])


def _one_column_at_a_time(c: OpCase, w: Tensor, x: Tensor) -> np.ndarray:
    """mul_mat(w, x) computed for each activation row alone: the one-column mat-vec kernel."""
    k = x.ne[0]
    return np.stack([c.compute(B.mul_mat(c.ctx, w, B.view_2d(c.ctx, x, k, 1, x.nb[1], j * x.nb[1])))[0, 0, 0]
                     for j in range(x.ne[1])])


@pytest.mark.parametrize("ty", [GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.IQ4_NL, GGMLType.Q2_K,
                                GGMLType.Q3_K, GGMLType.IQ4_XS, GGMLType.IQ3_S, GGMLType.IQ3_XXS, GGMLType.Q4_K,
                                GGMLType.Q5_K, GGMLType.Q6_K])
@pytest.mark.parametrize("cols", [3, 4, 6, 11])
def test_mat_vec_columns_together_give_each_columns_bits(ty: GGMLType, cols: int) -> None:
    """Several activation rows share each decode of a weight block (groups of 4, the last 1-3 together);
    each output is summed exactly as when its row is alone, so a sequence's logits do not depend on
    how many others share its batch."""
    c = OpCase()
    w = c.tensor(ty, 512, 37)
    x = c.tensor(F32, 512, cols, lo=-3, hi=3)
    out = B.mul_mat(c.ctx, w, x)
    exact(c.compute(out)[0, 0], _one_column_at_a_time(c, w, x))


@pytest.mark.parametrize("background", ["1", "0"])
def test_a_short_prompt_takes_the_one_column_kernel_while_the_batch_kernel_compiles_aside(
        background: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A first run's short prompt (2..LEAN_MAX_COLS rows) does not wait for k_mm_*: it runs k_mv_* (each row
    alone, the same bits) and k_mm_* compiles in the background; with background compiles off it waits, as
    before; past LEAN_MAX_COLS the batch kernel is compiled now either way."""
    started: list[str] = []
    monkeypatch.setenv("PYGGML_JIT_BACKGROUND", background)
    monkeypatch.setattr(jit, "compile_in_background", lambda k: started.append(k.name))
    tr = traits(GGMLType.Q6_K)
    monkeypatch.setattr(tr.mm, "load_cached", lambda: False)  # as on a first run
    c = OpCase()
    w = c.tensor(GGMLType.Q6_K, 256, 8)
    for cols, lean in ((3, background == "1"), (mat_jit.LEAN_MAX_COLS + 1, False)):
        out = B.mul_mat(c.ctx, w, c.tensor(F32, 256, cols))
        assert jit.select(out).kernel is (tr.mv if lean else tr.mm)
    assert started == (["k_mm_q6_k"] if background == "1" else [])


@pytest.mark.parametrize("ty", [GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0])
def test_prompt_size_q8_0_family_gives_each_columns_bits(ty: GGMLType) -> None:
    """Q8_0/Q4_0/Q5_0 prompts (register tiles over decoded rows, a block of columns at a time: k = 8192 makes
    blocks of 32 columns; 9 rows and 70 columns leave partial tiles) give each row the bits it gets alone."""
    c = OpCase()
    w = c.tensor(ty, 8192, 9)
    x = c.tensor(F32, 8192, 70, lo=-3, hi=3)
    out = B.mul_mat(c.ctx, w, x)
    if gemm.AVAILABLE:  # x86 AVX2: the register tiles over decoded rows
        assert jit.select(out).kernel.name == f"k_tiles_{ty.name.lower()}"
    exact(c.compute(out)[0, 0], _one_column_at_a_time(c, w, x))


@pytest.mark.parametrize("ty", [GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q6_K])
@pytest.mark.parametrize(("rows", "extra"), [(64, 8), (70, 5), (8, 1)])
def test_integer_gemm_gives_the_mat_vec_results(ty: GGMLType, rows: int, extra: int) -> None:
    """Prompt-size products (AVX2 integer GEMM over interleaved 8-row tiles) against the one-column kernel:
    exactly its bits (same integer dots, same float steps). Rows past the last whole tile and activation
    rows past the last group of 4 are covered by the odd sizes."""
    from pyggml.backend.cpu.quants import gemm

    if not gemm.AVAILABLE:
        pytest.skip("the integer GEMM needs AVX2 (this CPU takes the numpy kernel)")
    c = OpCase()
    cols = MATVEC_MAX_COLS[ty] + extra  # past the mat-vec kernels' limit
    w = c.tensor(ty, 512, rows)
    x = c.tensor(F32, 512, cols, lo=-3, hi=3)
    out = B.mul_mat(c.ctx, w, x)
    g = Graph()
    g.build_forward_expand(out)
    assert any(n is out for n in plan_for(g, _resolve).nodes)
    graph_compute(g, 2)
    exact(values(out)[0, 0], _one_column_at_a_time(c, w, x))


def test_products_no_compiled_kernel_covers_stay_on_the_numpy_kernel() -> None:
    """Q4_1/Q5_1 have no compiled kernel (their fused row dots run from the numpy path up to their column
    limit, BLAS past it); every compiled quantized type has a kernel for any column count."""
    c = OpCase()
    out = B.mul_mat(c.ctx, c.tensor(GGMLType.Q4_1, 64, 8), c.tensor(F32, 64, 1))
    many = B.mul_mat(c.ctx, c.tensor(GGMLType.Q5_1, 64, 8), c.tensor(F32, 64, MATVEC_MAX_COLS[GGMLType.Q5_1] + 1))
    compiled = [ty for ty, tr in TYPE_TRAITS_CPU.items() if tr.mm is not None]
    assert all(traits(ty).matvec_max_cols == ALL_COLS or traits(ty).gemm is not None for ty in compiled)
    for node in (out, many):
        g = Graph()
        g.build_forward_expand(node)
        assert plan_for(g, _resolve).nodes == []


# ------------------------------------------------------------------------------- plans and threads
def _chain(c: OpCase) -> tuple[Tensor, Tensor]:
    w = c.tensor(GGMLType.Q4_K, 512, 300)
    x = c.tensor(F32, 512, 1)
    h = B.mul_mat(c.ctx, w, B.rms_norm(c.ctx, x, 1e-5))
    return x, B.soft_max(c.ctx, B.scale(c.ctx, h, 0.1))


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_results_do_not_depend_on_the_thread_count(n_threads: int) -> None:
    c = OpCase()
    _, out = _chain(c)
    g = Graph()
    g.build_forward_expand(out)
    graph_compute(g, 1)
    one = values(out)
    graph_compute(g, n_threads)
    exact(values(out), one)


def test_a_plan_is_reused_while_its_graph_is_unchanged() -> None:
    c = OpCase()
    x, out = _chain(c)
    g = Graph()
    g.build_forward_expand(out)
    graph_compute(g, 2)
    plan = g._cpu_plan
    x.set(np.full((1, 512), 0.5, np.float32))
    graph_compute(g, 2)
    assert g._cpu_plan is plan
    first = values(out)
    for node in g.nodes:
        compute_forward(node)
    close(values(out), first)  # the new input was used
    out.data += 0  # same address: same plan
    assert plan_for(g, _resolve) is plan
    view = g.view(0, len(g.nodes))  # uid 0: never cached
    assert plan_for(view, _resolve) is not plan_for(view, _resolve)


def test_a_moved_tensor_gets_a_new_plan() -> None:
    c = OpCase()
    a = c.tensor(F32, 16)
    out = B.scale(c.ctx, a, 2.0)
    g = Graph()
    g.build_forward_expand(out)
    graph_compute(g, 1)
    plan = g._cpu_plan
    moved = c.ctx.new_tensor(F32, 16)
    out.data = moved.data  # as a re-allocation would
    graph_compute(g, 1)
    assert g._cpu_plan is not plan
    exact(values(moved), values(a) * np.float32(2.0))


def _two_chains(c: OpCase, overlap: bool = False) -> tuple[Graph, list[Tensor]]:
    """Two chains of elementwise nodes on separate data, interleaved in the graph (each node's neighbours are
    of the other chain); ``overlap``: the second chain's first output, one row of 2100, placed on the first
    chain's input of 7 rows, as an allocator reusing memory would (only a barrier then keeps a thread from
    overwriting rows another thread has yet to read)."""
    a = c.tensor(F32, 300, 7, lo=-4.0, hi=4.0)
    b = c.tensor(F32, 2100, 1, lo=-4.0, hi=4.0) if overlap else c.tensor(F32, 300, 7, lo=-4.0, hi=4.0)
    w = c.tensor(F32, 300, 7, lo=0.5, hi=2.0)
    a1 = B.mul(c.ctx, a, w)
    b1 = B.silu(c.ctx, b)
    if overlap:
        b1.data = a.data
    a2, b2 = B.add(c.ctx, a1, w), B.scale(c.ctx, b1, 0.5)
    g = Graph()
    for t in (a1, b1, a2, b2):
        g.build_forward_expand(t)
    return g, [a2, b2]


@pytest.mark.parametrize("n_threads", [2, 3])
def test_independent_records_run_without_barriers_between_them(n_threads: int) -> None:
    """plan.py's barrier table: records touching separate memory, or row kernels over the same rows reading
    what their own rows of the last wrote (each chain), run back to back without barriers, with the bits of a
    plan that has a barrier after every node."""
    g, outs = _two_chains(OpCase())
    plan = new_plan(g)
    assert list(plan.bars[: plan.n_compiled]) == [0, 0, 0, 1]
    assert graph_compute(g, n_threads) == 0
    got = [values(t) for t in outs]
    g2, outs2 = _two_chains(OpCase())
    assert GraphPlan(g2, _resolve).bars.all()  # no Independent: a barrier after every record
    assert graph_compute(g2, n_threads) == 0
    for x, y in zip(got, outs2, strict=True):
        exact(x.view(np.uint32), values(y).view(np.uint32))


def test_a_record_writing_what_an_earlier_one_reads_waits_for_it() -> None:
    g, _ = _two_chains(OpCase(), overlap=True)  # b1 over a, which a1 reads, in rows of another length
    assert list(new_plan(g).bars[:4]) == [1, 0, 0, 1]


def test_a_row_kernel_over_other_rows_of_the_last_waits_for_it() -> None:
    """The norm's one row spans the MUL's seven: a thread's share of it is not what it wrote."""
    c = OpCase()
    m = B.mul(c.ctx, c.tensor(F32, 300, 7), c.tensor(F32, 300, 7))
    g = Graph()
    g.build_forward_expand(B.rms_norm(c.ctx, B.reshape_2d(c.ctx, m, 2100, 1), 1e-6))
    assert list(new_plan(g).bars[:2]) == [1, 1]


def test_an_index_error_after_records_without_barriers_is_the_numpy_kernels() -> None:
    """The failing GET_ROWS is noticed at the barrier after the SCALE run with it."""
    c = OpCase()
    rows = B.get_rows(c.ctx, c.tensor(F32, 8, 4), c.ints(I32, 2, data=np.array([1, 4])))
    g = Graph()
    g.build_forward_expand(rows)
    g.build_forward_expand(B.scale(c.ctx, c.tensor(F32, 64, 3), 2.0))
    assert list(new_plan(g).bars[:1]) == [0]
    with pytest.raises(PyGGMLError, match="out of range"):
        graph_compute(g, 2)


def test_graphs_computed_from_two_threads_at_once() -> None:
    """One thread holds the worker pool; the other computes alone, on its own control block."""
    results: dict[int, np.ndarray] = {}
    refs: dict[int, np.ndarray] = {}
    cases = []
    for seed in range(2):
        c = OpCase(seed=seed)
        _, out = _chain(c)
        g = Graph()
        g.build_forward_expand(out)
        graph_compute(g, 1)
        refs[seed] = values(out)
        cases.append((g, out))
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            for _ in range(30):
                graph_compute(cases[i][0], 2)
            results[i] = values(cases[i][1])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    for i in range(2):
        exact(results[i], refs[i])


def test_abort_callback_is_asked_after_every_compiled_node() -> None:
    c = OpCase()
    a = c.tensor(F32, 8)
    t1 = B.scale(c.ctx, a, 2.0)
    t2 = B.scale(c.ctx, t1, 3.0)
    t3 = B.scale(c.ctx, t2, 5.0)
    g = Graph()
    g.build_forward_expand(t3)
    calls = []
    assert graph_compute(g, 2, abort_callback=lambda: calls.append(1) or len(calls) == 2) == 1
    assert len(calls) == 2
    exact(values(t2), values(a) * np.float32(6.0))
    assert (values(t3) == 0).all()


def test_pyggml_jit_0_turns_the_compiled_kernels_off(monkeypatch: pytest.MonkeyPatch) -> None:
    c = OpCase()
    out = B.scale(c.ctx, c.tensor(F32, 8), 2.0)
    g = Graph()
    g.build_forward_expand(out)
    monkeypatch.setenv("PYGGML_JIT", "0")
    assert not jit.enabled()
    assert GraphPlan(g, _resolve).nodes == []


def test_compile_helpers_take_each_kernel_once(tmp_path) -> None:
    """jit.prepare's processes walk one list; a kernel is compiled by whichever claims it first, once."""
    compiled: list[tuple[str, str]] = []

    class Fake:
        def __init__(self, key: str) -> None:
            self.key = key

        def compile(self) -> None:
            compiled.append((who, self.key))

    kernels = [Fake(f"pyggml.backend.cpu.jit.mod:k{i}") for i in range(5)]
    for who in ("main", "helper"):  # the helper walks the list after the main process claimed all of it
        jit._compile_claimed(kernels[:3] if who == "main" else kernels, str(tmp_path))
    assert compiled == [("main", k.key) for k in kernels[:3]] + [("helper", k.key) for k in kernels[3:]]


def test_jit_function_compiles_once_and_is_found_in_the_disk_cache(tmp_path, monkeypatch) -> None:
    """A JitFunction (how prepare compiles the thread pool's loops beside the kernels) misses an empty cache,
    compiles, and a fresh process then loads it from the disk cache without compiling."""
    import subprocess
    import sys

    from numba import types

    mod = tmp_path / "jitfn_mod.py"
    mod.write_text("import numba\n\n@numba.njit(cache=True)\ndef add(a, b):\n    return a * 3 + b\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sig = (types.int64, types.int64)
    fn = jit.JitFunction("jitfn_mod:add", sig)
    assert not fn.load_cached()  # nothing cached yet
    fn.compile()
    assert fn.load_cached() and sig in fn._dispatcher().overloads
    assert fn._dispatcher()(4, 5) == 17
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from numba import types; from pyggml.backend.cpu import jit; "
            "f = jit.JitFunction('jitfn_mod:add', (types.int64, types.int64)); "
            "print(f.load_cached(), len(f._dispatcher().stats.cache_misses))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "0"], out.stderr


def test_pool_functions_are_the_thread_pools() -> None:
    from pyggml.backend.cpu import threads

    assert [f._dispatcher() for f in jit.POOL_FUNCTIONS] == [threads.run_nodes, threads.worker_loop,
                                                             threads.seq_begin, threads.seq_end]
    # the signatures the pool calls them with (Python ints): prepare's compile is the one later calls find
    c = OpCase()
    g = Graph()
    g.build_forward_expand(B.scale(c.ctx, c.tensor(F32, 64), 2.0))
    assert GraphPlan(g, _resolve).compute(2) == 0
    for f in jit.POOL_FUNCTIONS:
        if f.key.endswith(":worker_loop") and threads.available_cores() < 2:
            continue  # no worker ran
        assert f.sig in f._dispatcher().overloads, f
