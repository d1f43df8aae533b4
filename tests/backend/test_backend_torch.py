"""The torch backend: its memory behaves like device memory, and every op it claims computes what
the CPU backend computes (within test-backend-ops' NMSE thresholds)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch backend is the optional extra pyggml[torch]")

import pyggml as g  # noqa: E402
from helpers.backend_run import Inputs, run_graph, upload_inputs  # noqa: E402
from helpers.data import normal_f32  # noqa: E402
from helpers.opcheck import NMSE_DEFAULT, NMSE_MATMUL, NMSE_SOFTMAX, assert_close  # noqa: E402
from pyggml.backend import api  # noqa: E402
from pyggml.backend.base import BufferUsage  # noqa: E402
from pyggml.backend.cpu.backend import backend_cpu_init  # noqa: E402
from pyggml.backend.torch import backend_torch_init, supports_op  # noqa: E402
from pyggml.ops.enums import GluOp, UnaryOp  # noqa: E402
from pyggml.tensor import NoDataError  # noqa: E402
from pyggml.types import GGMLType as T  # noqa: E402

rng = np.random.default_rng(1234)
_r = normal_f32(rng)


def _same(inputs: Inputs, build, max_nmse: float = NMSE_DEFAULT) -> None:
    cpu = run_graph(backend_cpu_init(), inputs, build)
    tb = backend_torch_init("cpu")
    ctx = g.Context(1 << 20, no_alloc=True)
    gf = g.new_graph(ctx)
    gf.build_forward_expand(build(ctx, upload_inputs(tb, inputs)[1]))
    for node in gf.nodes:
        assert supports_op(node), f"torch backend does not claim {node.op.name}"
    out = run_graph(tb, inputs, build)
    assert_close(out, cpu, max_nmse)


# ------------------------------------------------------------------ memory
def test_buffers_are_device_memory() -> None:
    tb = backend_torch_init("cpu")
    buft = tb.get_default_buffer_type()
    assert not buft.is_host()
    _, ts = upload_inputs(tb, {"a": (T.F32, [4, 3], _r(3, 4))})
    a = ts["a"]
    with pytest.raises(NoDataError):
        a.numpy()  # not host memory: only set/get may touch it
    vals = np.arange(12, dtype=np.float32)
    api.backend_tensor_set(a, vals)
    assert np.array_equal(api.backend_tensor_get(a).view(np.float32), vals)
    api.backend_tensor_memset(a, 0, 8, 8)
    got = api.backend_tensor_get(a).view(np.float32)
    assert np.array_equal(got[2:4], [0, 0]) and got[4] == 4
    assert api.backend_buffer_get_base(a.buffer) % buft.get_alignment() == 0


def test_copy_between_torch_and_cpu_buffers() -> None:
    tb, cpu = backend_torch_init("cpu"), backend_cpu_init()
    vals = _r(5, 8)
    _, on_t = upload_inputs(tb, {"x": (T.F32, [8, 5], vals)})
    _, on_t2 = upload_inputs(tb, {"x": (T.F32, [8, 5], np.zeros((5, 8)))})
    _, on_c = upload_inputs(cpu, {"x": (T.F32, [8, 5], np.zeros((5, 8)))})
    api.backend_tensor_copy(on_t["x"], on_c["x"])  # device -> host through get
    assert np.array_equal(on_c["x"].numpy(), vals)
    api.backend_tensor_copy(on_t["x"], on_t2["x"])  # device -> device through the buffer's cpy_tensor
    assert np.array_equal(api.backend_tensor_get(on_t2["x"]).view(np.float32).reshape(5, 8), vals)


# ------------------------------------------------------------------ ops
@pytest.mark.parametrize("ty", [T.F32, T.F16, T.Q4_0, T.Q6_K])
def test_get_rows(ty: T) -> None:
    inputs = {"a": (ty, [256, 10, 2], _r(2, 10, 256)), "ids": (T.I32, [4, 2], np.array([[1, 9, 1, 0], [3, 3, 7, 2]]))}
    _same(inputs, lambda ctx, t: g.get_rows(ctx, t["a"], t["ids"]))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_binary_broadcast(op: str) -> None:
    inputs = {"a": (T.F32, [16, 6, 4], _r(4, 6, 16)), "b": (T.F32, [16, 3, 1], _r(1, 3, 16) + 3.0)}
    _same(inputs, lambda ctx, t: getattr(g, op)(ctx, t["a"], t["b"]))


def test_scale_rms_norm_unary() -> None:
    inputs = {"a": (T.F32, [32, 5], _r(5, 32))}
    _same(inputs, lambda ctx, t: g.scale_bias(ctx, t["a"], 0.5, 0.25))
    _same(inputs, lambda ctx, t: g.rms_norm(ctx, t["a"], 1e-6))
    for op in (UnaryOp.SILU, UnaryOp.GELU, UnaryOp.TANH):
        _same(inputs, lambda ctx, t, op=op: g.unary(ctx, t["a"], op), 1e-6)


@pytest.mark.parametrize("ty", [T.F32, T.F16, T.Q4_0, T.Q4_K, T.Q8_0])
def test_mul_mat(ty: T) -> None:
    inputs = {"w": (ty, [256, 12, 2], _r(2, 12, 256)), "x": (T.F32, [256, 5, 4], _r(4, 5, 256))}
    _same(inputs, lambda ctx, t: g.mul_mat(ctx, t["w"], t["x"]), NMSE_MATMUL)


@pytest.mark.parametrize("mode", [0, 2])
@pytest.mark.parametrize("freq_factors", [False, True])
@pytest.mark.parametrize("ext_factor", [0.0, 1.0])
def test_rope(mode: int, freq_factors: bool, ext_factor: float) -> None:
    inputs = {"x": (T.F32, [64, 4, 6], _r(6, 4, 64)), "pos": (T.I32, [6], np.array([0, 1, 5, 9, 100, 2047]))}
    if freq_factors:
        inputs["ff"] = (T.F32, [24], 1.0 + rng.random(24).astype(np.float32))

    def build(ctx, t):
        return g.rope_ext(ctx, t["x"], t["pos"], t.get("ff"), 48, mode, 4096, 10000.0, 0.5, ext_factor,
                          1.0, 32.0, 1.0)

    _same(inputs, build)


@pytest.mark.parametrize("mask_type", [None, T.F16, T.F32])
def test_soft_max(mask_type: T | None) -> None:
    inputs = {"a": (T.F32, [16, 7, 4], _r(4, 7, 16))}
    if mask_type is not None:
        inputs["m"] = (mask_type, [16, 8], np.where(rng.random((8, 16)) < 0.3, -np.inf, _r(8, 16)))
    _same(inputs, lambda ctx, t: g.soft_max_ext(ctx, t["a"], t.get("m"), 0.3, 0.0), NMSE_SOFTMAX)
    if mask_type is not None:
        _same(inputs, lambda ctx, t: g.soft_max_ext(ctx, t["a"], t["m"], 0.3, 8.0), NMSE_SOFTMAX)


def test_copies_and_views() -> None:
    inputs = {"a": (T.F32, [8, 6, 3], _r(3, 6, 8)), "h": (T.F16, [6, 8, 3], np.zeros((3, 8, 6)))}
    _same(inputs, lambda ctx, t: g.cont(ctx, g.permute(ctx, t["a"], 1, 0, 2, 3)))
    _same(inputs, lambda ctx, t: g.cont(ctx, g.transpose(ctx, g.reshape_2d(ctx, t["a"], 24, 6))))
    _same(inputs, lambda ctx, t: g.cast(ctx, g.view_2d(ctx, t["a"], 4, 6, t["a"].nb[1], 16), T.F16))
    _same(inputs, lambda ctx, t: g.cpy(ctx, g.cont(ctx, g.transpose(ctx, t["a"])), t["h"]))
    _same(inputs, lambda ctx, t: g.dup(ctx, t["a"]))


@pytest.mark.parametrize("dst", [T.F16, T.F32])
def test_set_rows(dst: T) -> None:
    inputs = {"kv": (dst, [16, 10, 2], _r(2, 10, 16)), "rows": (T.F32, [16, 3, 2], _r(2, 3, 16)),
              "ids": (T.I64, [3], np.array([7, 0, 4]))}
    _same(inputs, lambda ctx, t: g.set_rows(ctx, t["kv"], t["rows"], t["ids"]))


@pytest.mark.parametrize("op", [GluOp.SWIGLU, GluOp.GEGLU])
def test_glu(op: GluOp) -> None:
    inputs = {"a": (T.F32, [32, 5], _r(5, 32)), "b": (T.F32, [32, 5], _r(5, 32))}
    _same(inputs, lambda ctx, t: g.glu(ctx, t["a"], op, False), 1e-6)
    _same(inputs, lambda ctx, t: g.glu(ctx, t["a"], op, True), 1e-6)
    _same(inputs, lambda ctx, t: g.glu_split(ctx, t["a"], t["b"], op), 1e-6)


def test_declines_what_it_cannot_do() -> None:
    tb = backend_torch_init("cpu")
    ctx = g.Context(1 << 20, no_alloc=True)
    a = ctx.new_tensor(T.F32, 16, 4, 2)
    sinks = ctx.new_tensor(T.F32, 2)
    sm = g.soft_max_ext(ctx, a, None, 1.0, 0.0)
    g.soft_max_add_sinks(sm, sinks)
    assert not tb.supports_op(sm)
    q = ctx.new_tensor(T.F32, 64, 4, 2)
    kv = ctx.new_tensor(T.F16, 64, 8, 2)
    assert not tb.supports_op(g.flash_attn_ext(ctx, q, kv, kv, None, 1.0, 0.0, 0.0))
    assert not tb.supports_op(g.cpy(ctx, a, ctx.new_tensor(T.Q8_0, 32, 4)))
    assert not tb.supports_op(g.unary(ctx, a, UnaryOp.HARDSWISH))
    assert tb.supports_op(g.rms_norm(ctx, a, 1e-5))


def test_weights_usage_survives_upload() -> None:
    tb = backend_torch_init("cpu")
    _, ts = upload_inputs(tb, {"w": (T.Q4_0, [64, 2], _r(2, 64))})
    assert ts["w"].buffer.usage == BufferUsage.WEIGHTS
    assert ts["w"].buffer.name().startswith("TORCH")


@pytest.mark.parametrize("ty", [T.Q8_0, T.Q4_0])
def test_device_decoders_match_the_reference(ty: T) -> None:
    from pyggml import quants
    from pyggml.backend.torch.torch_dequant import DEVICE_DECODERS

    x = _r(7, 128) * 3
    raw = quants.quantize(x, ty).reshape(7, -1)
    got = DEVICE_DECODERS[ty](torch.from_numpy(raw)).numpy()
    assert np.array_equal(got, quants.dequantize(raw, ty))


def test_attention_block_with_kv_cache() -> None:
    """A gemma-like layer: GQA attention through an F16 KV cache (SET_ROWS, strided K/V views,
    permutes, masked softmax) and a GEGLU MLP, on torch and on the CPU."""
    D, T_, H, HKV, HD, NKV = 64, 5, 4, 2, 16, 8
    mask = np.zeros((T_, NKV), dtype=np.float32)
    for t in range(T_):
        mask[t, 3 + t + 1 :] = -np.inf  # cells 0..2 hold earlier tokens; token t sees up to cell 3 + t
    inputs = {
        "x": (T.F32, [D, T_], _r(T_, D)), "wq": (T.F16, [D, H * HD], _r(H * HD, D) * 0.2),
        "wk": (T.Q8_0, [D, HKV * HD], _r(HKV * HD, D) * 0.2), "wv": (T.F32, [D, HKV * HD], _r(HKV * HD, D) * 0.2),
        "wo": (T.Q4_0, [H * HD, D], _r(D, H * HD) * 0.2), "wg": (T.F16, [D, 256], _r(256, D) * 0.2),
        "wu": (T.F32, [D, 256], _r(256, D) * 0.2), "wd": (T.Q4_K, [256, D], _r(D, 256) * 0.1),
        "kc": (T.F16, [HKV * HD, NKV], _r(NKV, HKV * HD)), "vc": (T.F16, [HKV * HD, NKV], _r(NKV, HKV * HD)),
        "pos": (T.I32, [T_], np.arange(3, 3 + T_)), "cells": (T.I64, [T_], np.arange(3, 3 + T_)),
        "mask": (T.F16, [NKV, T_], mask),
    }

    def build(ctx, t):
        def rope(a):
            return g.rope_ext(ctx, a, t["pos"], None, HD, 2, 4096, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)

        q = rope(g.reshape_3d(ctx, g.mul_mat(ctx, t["wq"], t["x"]), HD, H, T_))
        k = rope(g.reshape_3d(ctx, g.mul_mat(ctx, t["wk"], t["x"]), HD, HKV, T_))
        v = g.mul_mat(ctx, t["wv"], t["x"])
        k_st = g.set_rows(ctx, t["kc"], g.reshape_2d(ctx, k, HD * HKV, T_), t["cells"])
        v_st = g.set_rows(ctx, t["vc"], v, t["cells"])
        kc, vc = t["kc"], t["vc"]
        kview = g.permute(ctx, g.view_3d(ctx, k_st, HD, HKV, NKV, HD * 2, kc.nb[1], 0), 0, 2, 1, 3)
        vview = g.cont(ctx, g.permute(ctx, g.view_3d(ctx, v_st, HD, HKV, NKV, HD * 2, vc.nb[1], 0), 1, 2, 0, 3))
        kq = g.mul_mat(ctx, kview, g.permute(ctx, q, 0, 2, 1, 3))  # [NKV, T, H] (GQA broadcast)
        kq = g.soft_max_ext(ctx, kq, t["mask"], HD ** -0.5, 0.0)
        kqv = g.mul_mat(ctx, vview, kq)  # [HD, T, H]
        o = g.cont_2d(ctx, g.permute(ctx, kqv, 0, 2, 1, 3), H * HD, T_)
        o = g.add(ctx, g.mul_mat(ctx, t["wo"], o), t["x"])
        n = g.rms_norm(ctx, o, 1e-6)
        mlp = g.geglu_split(ctx, g.mul_mat(ctx, t["wg"], n), g.mul_mat(ctx, t["wu"], n))
        return g.add(ctx, g.mul_mat(ctx, t["wd"], mlp), o)

    _same(inputs, build, NMSE_MATMUL)


@pytest.mark.parametrize("ty", [T.F32, T.Q4_0, T.Q4_K])
@pytest.mark.parametrize("b_rows", [1, 2])
def test_mul_mat_id(ty: T, b_rows: int) -> None:
    ids = np.array([[5, 1], [1, 1], [0, 7], [5, 2]], dtype=np.int32)  # (n_tokens, n_used)
    inputs = {"as": (ty, [256, 12, 8], _r(8, 12, 256)), "b": (T.F32, [256, b_rows, 4], _r(4, b_rows, 256)),
              "ids": (T.I32, [2, 4], ids)}
    _same(inputs, lambda ctx, t: g.mul_mat_id(ctx, t["as"], t["b"], t["ids"]), NMSE_MATMUL)
