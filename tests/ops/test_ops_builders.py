"""The builders written for ops that once had only CPU kernels (in ops/conv.py, shape.py, rows.py,
mat.py, nn.py, unary.py, recurrent.py, train.py) against ggml.c's constructors: result type and
shape, src slots, op_params layout, and each GGML_ASSERT as a ShapeError / TypeMismatchError (never
a bare assert). The kernels' numbers are checked elsewhere (test_ops_extra, test_ops_recurrent,
test_ops_tbo); this module computes only where the layout is the point (CONV_2D_DW's channels-innermost result).
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.opcheck import OpCase, assert_close
from pyggml.errors import PyGGMLError, ShapeError, TypeMismatchError
from pyggml.ops import builders as B
from pyggml.ops.enums import GluOp, Op
from pyggml.types import GGMLType

F32, F16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.I32


@pytest.fixture
def c() -> OpCase:
    return OpCase(mem=8 << 20)


def _i32(t: object, n: int) -> list[int]:
    return [t.get_op_params_i32(i) for i in range(n)]  # type: ignore[attr-defined]


def test_mul_mat_id_shape_and_checks(c: OpCase) -> None:
    w, b = c.tensor(F32, 16, 6, 4), c.tensor(F32, 16, 1, 3)
    ids = c.ints(I32, 2, 3, data=np.zeros((3, 2)))
    out = B.mul_mat_id(c.ctx, w, b, ids)
    assert (out.op, out.type, out.ne, out.src[:3]) == (Op.MUL_MAT_ID, F32, [6, 2, 3, 1], [w, b, ids])
    with pytest.raises(TypeMismatchError, match="ids must be I32"):
        B.mul_mat_id(c.ctx, w, b, c.tensor(F32, 2, 3))
    with pytest.raises(ShapeError, match="one expert list per token"):
        B.mul_mat_id(c.ctx, w, b, c.ints(I32, 2, 4, data=np.zeros((4, 2))))
    with pytest.raises(ShapeError, match="row length"):
        B.mul_mat_id(c.ctx, w, c.tensor(F32, 8, 1, 3), ids)
    with pytest.raises(ShapeError, match="transposed"):
        B.mul_mat_id(c.ctx, B.transpose(c.ctx, w), b, ids)


def test_get_rows_back_records_only_a_and_b(c: OpCase) -> None:
    g, ids, like = c.tensor(F32, 6, 4), c.ints(I32, 4, data=np.arange(4)), c.tensor(F16, 6, 9)
    out = B.get_rows_back(c.ctx, g, ids, like)
    assert (out.type, out.ne, out.src[2]) == (F32, [6, 9, 1, 1], None)  # ggml uses c for the shape only
    with pytest.raises(ShapeError, match="rows like a"):
        B.get_rows_back(c.ctx, g, ids, c.tensor(F32, 5, 9))


def test_conv_op_params_and_shapes(c: OpCase) -> None:
    kern, img = c.tensor(F16, 3, 2, 3, 4), c.tensor(F32, 7, 6, 3, 2)
    out = B.conv_2d_direct(c.ctx, kern, img, 2, 1, 1, 0, 1, 2)
    assert (out.op, out.type, out.ne, _i32(out, 6)) == (Op.CONV_2D, F32, [4, 4, 4, 2], [2, 1, 1, 0, 1, 2])
    with pytest.raises(ShapeError, match="input channels differ"):
        B.conv_2d_direct(c.ctx, kern, c.tensor(F32, 7, 6, 2, 2), 1, 1, 0, 0, 1, 1)
    t1 = B.conv_transpose_1d(c.ctx, c.tensor(F32, 3, 2, 4), c.tensor(F32, 5, 4), 2, 0, 1)
    assert (t1.ne, _i32(t1, 3)) == ([11, 2, 1, 1], [2, 0, 1])
    with pytest.raises(ShapeError, match="p0 == 0"):
        B.conv_transpose_1d(c.ctx, c.tensor(F32, 3, 2, 4), c.tensor(F32, 5, 4), 2, 1, 1)
    t2 = B.conv_transpose_2d_p0(c.ctx, c.tensor(F32, 2, 3, 2, 3), c.tensor(F32, 4, 3, 3), 2)
    assert (t2.ne, _i32(t2, 1)) == ([8, 7, 2, 1], [2])
    c3 = B.conv_3d_direct(c.ctx, c.tensor(F32, 2, 2, 2, 6), c.tensor(F32, 4, 4, 3, 4), 1, 2, 1, 1, 0, 0, 1, 1, 1,
                          2, 2, 3)
    assert (c3.ne, _i32(c3, 12)) == ([5, 2, 2, 6], [1, 2, 1, 1, 0, 0, 1, 1, 1, 2, 2, 3])
    with pytest.raises(ShapeError, match="c\\*oc"):
        B.conv_3d_direct(c.ctx, c.tensor(F32, 2, 2, 2, 5), c.tensor(F32, 4, 4, 3, 4), 1, 1, 1, 0, 0, 0, 1, 1, 1,
                         2, 2, 3)
    i3 = B.im2col_3d(c.ctx, c.tensor(F32, 2, 2, 2, 6), c.tensor(F32, 4, 4, 3, 4), 2, 1, 2, 1, 1, 0, 0, 1, 1, 1, F16)
    assert (i3.type, i3.ne, _i32(i3, 10)) == (F16, [16, 5, 2, 4], [1, 2, 1, 1, 0, 0, 1, 1, 1, 2])
    with pytest.raises(ShapeError, match="IC must be positive"):
        B.im2col_3d(c.ctx, c.tensor(F32, 2, 2, 2, 6), c.tensor(F32, 4, 4, 3, 4), 0, 1, 1, 1, 0, 0, 0, 1, 1, 1, F32)
    col = B.col2im_1d(c.ctx, c.tensor(F32, 6, 5), 2, 2, 1)
    assert (col.ne, _i32(col, 3)) == ([9, 2, 1, 1], [2, 2, 1])
    with pytest.raises(ShapeError, match="whole number"):
        B.col2im_1d(c.ctx, c.tensor(F32, 7, 5), 2, 2, 1)
    with pytest.raises(TypeMismatchError):
        B.col2im_1d(c.ctx, c.ints(I32, 6, 5, data=np.zeros((5, 6))), 2, 2, 1)


def test_conv_2d_dw_direct_keeps_a_channels_innermost_layout(c: OpCase) -> None:
    kern = c.tensor(F32, 3, 3, 1, 4)
    whcn = c.tensor(F32, 6, 5, 4, 1)
    plain = B.conv_2d_dw_direct(c.ctx, kern, whcn, 1, 1, 1, 1, 1, 1)
    assert plain.is_contiguous() and _i32(plain, 6) == [1, 1, 1, 1, 1, 1]
    cwhn = c.tensor(F32, 4, 6, 5, 1, data=np.ascontiguousarray(c.compute(B.cont(c.ctx, whcn)).transpose(0, 2, 3, 1)))
    permuted = B.permute(c.ctx, cwhn, 2, 0, 1, 3)  # ne [W, H, C, N], channels innermost in memory
    out = B.conv_2d_dw_direct(c.ctx, kern, permuted, 1, 1, 1, 1, 1, 1)
    ts = F32.type_size
    assert out.ne == [6, 5, 4, 1] and out.nb[:3] == [4 * ts, 6 * 4 * ts, ts]
    assert_close(c.compute(out), c.compute(plain), max_nmse=0.0)
    with pytest.raises(ShapeError, match="ne\\[2\\] == 1"):
        B.conv_2d_dw_direct(c.ctx, c.tensor(F32, 3, 3, 2, 4), whcn, 1, 1, 1, 1, 1, 1)


def test_shape_ops(c: OpCase) -> None:
    a = c.tensor(F32, 5, 3, 2)
    r = B.roll(c.ctx, a, -2, 1, 1, 0)
    assert (r.op, r.ne, _i32(r, 4)) == (Op.ROLL, a.ne, [-2, 1, 1, 0])
    with pytest.raises(ShapeError, match="shift1"):
        B.roll(c.ctx, a, 0, 3, 0, 0)
    p = B.pad_reflect_1d(c.ctx, a, 3, 2)
    assert (p.ne, _i32(p, 2)) == ([10, 3, 2, 1], [3, 2])
    with pytest.raises(ShapeError, match="shorter than the row"):
        B.pad_reflect_1d(c.ctx, a, 5, 0)
    with pytest.raises(TypeMismatchError):
        B.pad_reflect_1d(c.ctx, c.tensor(F16, 5, 3), 1, 1)
    w = B.win_part(c.ctx, c.tensor(F32, 3, 5, 4), 3)
    assert (w.ne, _i32(w, 3)) == ([3, 3, 3, 4], [2, 2, 3])
    u = B.win_unpart(c.ctx, w, 5, 4, 3)
    assert (u.ne, _i32(u, 1)) == ([3, 5, 4, 1], [3])
    rel = B.get_rel_pos(c.ctx, c.tensor(F32, 4, 5), 3, 3)
    assert (rel.type, rel.ne) == (F16, [4, 3, 3, 1])
    with pytest.raises(ShapeError, match="must equal kh"):
        B.get_rel_pos(c.ctx, c.tensor(F32, 4, 5), 3, 2)
    ap = B.add_rel_pos_inplace(c.ctx, c.tensor(F32, 9, 4, 2), c.tensor(F32, 3, 2, 2, 2), c.tensor(F32, 3, 2, 2, 2))
    assert ap.view_src is not None and _i32(ap, 1) == [1]


def test_recurrent_builders(c: OpCase) -> None:
    s, x, dt = c.tensor(F32, 4, 3, 4, 2), c.tensor(F32, 3, 4, 5, 2), c.tensor(F32, 4, 5, 2)
    b, ids = c.tensor(F32, 4, 2, 5, 2), c.ints(I32, 2, data=np.array([1, 0]))
    a2, a1 = c.tensor(F32, 1, 4), c.tensor(F32, 4, 4)
    out = B.ssm_scan(c.ctx, s, x, dt, a2, b, b, ids, 3)
    assert (out.ne, _i32(out, 1), out.src[6]) == ([120 + 3 * 96, 1, 1, 1], [3], ids)
    with pytest.raises(ShapeError, match="Mamba-1"):
        B.ssm_scan(c.ctx, s, x, dt, a1, b, b, ids, 2)
    with pytest.raises(ShapeError, match="dt must be"):
        B.ssm_scan(c.ctx, s, x, c.tensor(F32, 4, 4, 2), a2, b, b, ids, 1)
    k = c.tensor(F32, 4, 2, 6)
    state = c.tensor(F32, 32, 2)
    gla = B.gated_linear_attn(c.ctx, k, k, k, k, state, 0.5)
    assert gla.ne == [8, 6 + 8, 1, 1] and gla.get_op_params_f32(0) == 0.5
    with pytest.raises(ShapeError, match="state"):
        B.rwkv_wkv6(c.ctx, k, k, k, c.tensor(F32, 4, 2), k, c.tensor(F32, 30, 2))
    with pytest.raises(ShapeError, match="only left=True"):
        B.solve_tri(c.ctx, c.tensor(F32, 3, 3), c.tensor(F32, 2, 3), True, False, False)
    v = c.tensor(F32, 4, 2, 3, 2)
    gdn = B.gated_delta_net(c.ctx, v, v, v, c.tensor(F32, 1, 2, 3, 2), c.tensor(F32, 1, 2, 3, 2),
                            c.tensor(F32, 4, 4, 2, 2), 2)
    assert gdn.ne == [8, 3 * 2 + 2 * 4 * 2, 1, 1] and _i32(gdn, 1) == [2]


def test_train_builders(c: OpCase) -> None:
    w, g = c.tensor(F32, 8), c.tensor(F32, 8)
    with pytest.raises(ShapeError, match="must be a parameter"):
        B.opt_step_sgd(c.ctx, w, g, c.tensor(F32, 2))
    w.set_param()
    sgd = B.opt_step_sgd(c.ctx, w, g, c.tensor(F32, 2))
    assert sgd.view_src is w and sgd.src[:3] == [w, g, sgd.src[2]]
    with pytest.raises(ShapeError, match="7 values"):
        B.opt_step_adamw(c.ctx, w, g, g, g, c.tensor(F32, 6))
    sm = B.soft_max_ext_back(c.ctx, c.tensor(F32, 5, 2), c.tensor(F32, 5, 2), 0.7, 0.0)
    assert sm.op == Op.SOFT_MAX_BACK and sm.get_op_params_f32(0) == pytest.approx(0.7)
    pb = B.pool_2d_back(c.ctx, c.tensor(F32, 3, 3), c.tensor(F16, 5, 4), 1, 2, 2, 2, 2, 1.0, 1.0)
    assert (pb.type, pb.ne, _i32(pb, 7)) == (F32, [5, 4, 1, 1], [1, 2, 2, 2, 2, 1, 1])
    with pytest.raises(ShapeError, match="scalar"):
        B.cross_entropy_loss_back(c.ctx, c.tensor(F32, 2), c.tensor(F32, 4), c.tensor(F32, 4))


def test_rope_back_swiglu_clamp_and_dsv4(c: OpCase) -> None:
    a, pos = c.tensor(F32, 16, 2, 4), c.ints(I32, 4, data=np.arange(4))
    fwd = B.rope_ext(c.ctx, a, pos, None, 16, 2, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)
    back = B.rope_ext_back(c.ctx, a, pos, None, 16, 2, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)
    assert back.op == Op.ROPE_BACK and np.array_equal(back.op_params, fwd.op_params)
    assert B.rope_set_offset(back, 8).get_op_params_i32(15) == 8
    with pytest.raises(PyGGMLError, match="not a ROPE"):
        B.rope_set_offset(a, 8)
    sc = B.swiglu_clamp(c.ctx, c.tensor(F32, 8, 3), None, 2.5)
    assert (sc.ne, _i32(sc, 2), sc.get_op_params_f32(3)) == ([4, 3, 1, 1], [int(GluOp.SWIGLU_CLAMP), 0], 2.5)
    mixes, scale, base = c.tensor(F32, 24, 3), c.tensor(F32, 3), c.tensor(F32, 24)
    comb = B.dsv4_hc_comb(c.ctx, mixes, scale, base, 1e-3, 3)
    assert comb.ne == [4, 4, 3, 1] and comb.get_op_params_i32(1) == 3
    with pytest.raises(ShapeError, match="hc = 4"):
        B.dsv4_hc_comb(c.ctx, c.tensor(F32, 15, 3), scale, c.tensor(F32, 15), 1e-3, 3)
    pre = B.dsv4_hc_pre_gated(c.ctx, c.tensor(F32, 6, 4, 3), c.tensor(F32, 6, 4, 3), 0.5)
    assert pre.ne == [6, 3, 1, 1] and _i32(pre, 2)[1] == 1
    with pytest.raises(ShapeError, match="weights must be"):
        B.dsv4_hc_pre(c.ctx, c.tensor(F32, 6, 4, 3), c.tensor(F32, 4, 2))
    with pytest.raises(TypeMismatchError, match="mask must be F16"):
        B.lightning_indexer(c.ctx, c.tensor(F32, 8, 3, 4), c.tensor(F16, 8, 1, 6), c.tensor(F32, 3, 4),
                            c.tensor(F32, 6, 4))
