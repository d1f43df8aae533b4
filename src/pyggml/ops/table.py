"""The op table: for every ggml op (``Op``), unary sub-op (``UnaryOp``) and GLU sub-op (``GluOp``),
its builders, whether the CPU and torch backends compute it, and the test modules that exercise it.

Like ggml's single ``enum ggml_op`` with a constructor per op, this is the one place to look up
where an op lives: its builders in ``pyggml/ops/<family>.py`` and its CPU kernel in
``pyggml/backend/cpu/kernels/<family>.py``, the same family name on both sides (elementwise,
unary, reduce, shape, rows, mat, nn, conv, recurrent, train, custom). tests/test_op_table.py
holds the table to the code: it fails when an op has no row, a listed builder is missing, its
builder and kernel sit in families of different names, a CPU kernel or torch support differs from
what the row says, or a listed test module does not mention the op. An op without a builder or a CPU kernel must
say why (``why_not``); nothing is skipped silently.

The table only names things (builders by function name, tests by module name): importing it
loads no backend, so the ops layer stays below the backends.
"""

from __future__ import annotations

from dataclasses import dataclass

from .enums import GluOp, Op, UnaryOp

AnyOp = Op | UnaryOp | GluOp


@dataclass(frozen=True)
class OpRow:
    """One op's row. ``builders`` are names in ``pyggml.ops.builders``, which gathers the family
    modules (``pyggml.*`` for leaf constructors); ``tests`` are module names (in any folder under tests/) without
    ``test_`` and ``.py``."""

    op: AnyOp
    builders: tuple[str, ...]
    tests: tuple[str, ...]
    cpu: bool = True
    torch: bool = False
    why_not: str = ""


def _row(op: AnyOp, builders: str, tests: str, *, cpu: bool = True, torch: bool = False, why_not: str = "") -> OpRow:
    return OpRow(op, tuple(builders.split()), tuple(tests.split()), cpu, torch, why_not)


_EMPTY = "computes nothing (ggml_op_is_empty): a leaf or a view of its source, so no backend has a kernel"
_FA_BACK = ("ggml_flash_attn_back GGML_ABORTs ('TODO: adapt to ggml_flash_attn_ext() changes') and no ggml "
            "backend implements FLASH_ATTN_BACK, so pyggml has neither a builder nor a kernel for it")

ROWS: tuple[OpRow, ...] = (
    # Op
    _row(Op.NONE, "new_tensor new_tensor_1d new_tensor_2d new_tensor_3d new_tensor_4d", "core_graph", torch=True,
         cpu=False, why_not=_EMPTY),
    _row(Op.DUP, "dup dup_inplace", "ops_rows", torch=True),
    _row(Op.ADD, "add add_inplace add_cast", "ops_elementwise", torch=True),
    _row(Op.ADD_ID, "add_id", "ops_mat"),
    _row(Op.ADD1, "add1 add1_inplace", "ops_elementwise"),
    _row(Op.ACC, "acc acc_inplace", "ops_shape"),
    _row(Op.SUB, "sub sub_inplace", "ops_elementwise", torch=True),
    _row(Op.MUL, "mul mul_inplace", "ops_elementwise", torch=True),
    _row(Op.DIV, "div div_inplace", "ops_elementwise", torch=True),
    _row(Op.SQR, "sqr sqr_inplace", "ops_dispatch ops_elementwise"),
    _row(Op.SQRT, "sqrt sqrt_inplace", "ops_elementwise"),
    _row(Op.LOG, "log log_inplace", "ops_elementwise"),
    _row(Op.SIN, "sin sin_inplace", "ops_elementwise"),
    _row(Op.COS, "cos cos_inplace", "ops_elementwise"),
    _row(Op.SUM, "sum", "ops_reduce"),
    _row(Op.SUM_ROWS, "sum_rows", "ops_reduce"),
    _row(Op.CUMSUM, "cumsum", "ops_reduce"),
    _row(Op.MEAN, "mean", "ops_reduce"),
    _row(Op.ARGMAX, "argmax", "ops_reduce"),
    _row(Op.COUNT_EQUAL, "count_equal", "ops_reduce"),
    _row(Op.REPEAT, "repeat repeat_4d", "ops_shape"),
    _row(Op.REPEAT_BACK, "repeat_back", "ops_shape"),
    _row(Op.CONCAT, "concat", "ops_shape"),
    _row(Op.SILU_BACK, "silu_back", "ops_extra"),
    _row(Op.NORM, "norm norm_inplace", "ops_nn"),
    _row(Op.RMS_NORM, "rms_norm rms_norm_inplace", "ops_nn", torch=True),
    _row(Op.RMS_NORM_BACK, "rms_norm_back", "ops_extra"),
    _row(Op.GROUP_NORM, "group_norm group_norm_inplace", "ops_nn"),
    _row(Op.L2_NORM, "l2_norm l2_norm_inplace", "ops_nn"),
    _row(Op.MUL_MAT, "mul_mat", "ops_dispatch ops_mat", torch=True),
    _row(Op.MUL_MAT_ID, "mul_mat_id", "ops_mat ops_builders", torch=True),
    _row(Op.OUT_PROD, "out_prod", "ops_mat"),
    _row(Op.SCALE, "scale scale_inplace scale_bias scale_bias_inplace", "ops_dispatch ops_elementwise", torch=True),
    _row(Op.SET, "set set_inplace set_1d set_1d_inplace set_2d set_2d_inplace", "ops_shape"),
    _row(Op.CPY, "cpy cast", "ops_rows ops_tbo", torch=True),
    _row(Op.CONT, "cont cont_1d cont_2d cont_3d cont_4d", "ops_dispatch ops_rows", torch=True),
    _row(Op.RESHAPE, "reshape reshape_1d reshape_2d reshape_3d reshape_4d", "core_tensor", torch=True, cpu=False,
         why_not=_EMPTY),
    _row(Op.VIEW, "view_1d view_2d view_3d view_4d", "ops_elementwise ops_tbo", torch=True, cpu=False, why_not=_EMPTY),
    _row(Op.PERMUTE, "permute", "ops_elementwise ops_mat", torch=True, cpu=False, why_not=_EMPTY),
    _row(Op.TRANSPOSE, "transpose", "ops_dispatch ops_elementwise", torch=True, cpu=False, why_not=_EMPTY),
    _row(Op.GET_ROWS, "get_rows", "ops_mat", torch=True),
    _row(Op.GET_ROWS_BACK, "get_rows_back", "ops_extra ops_builders"),
    _row(Op.SET_ROWS, "set_rows", "ops_rows ops_tbo", torch=True),
    _row(Op.DIAG, "diag", "ops_shape"),
    _row(Op.DIAG_MASK_INF, "diag_mask_inf diag_mask_inf_inplace", "ops_shape"),
    _row(Op.DIAG_MASK_ZERO, "diag_mask_zero diag_mask_zero_inplace", "ops_shape"),
    _row(Op.SOFT_MAX, "soft_max soft_max_inplace soft_max_ext soft_max_ext_inplace", "ops_dispatch ops_nn", torch=True),
    _row(Op.SOFT_MAX_BACK, "soft_max_ext_back soft_max_ext_back_inplace", "ops_extra ops_builders"),
    _row(Op.ROPE, "rope rope_inplace rope_ext rope_ext_inplace rope_multi", "ops_extra ops_nn", torch=True),
    _row(Op.ROPE_BACK, "rope_ext_back rope_multi_back", "ops_extra ops_tbo ops_builders"),
    _row(Op.CLAMP, "clamp clamp_inplace", "ops_elementwise"),
    _row(Op.CONV_TRANSPOSE_1D, "conv_transpose_1d", "ops_extra ops_builders"),
    _row(Op.IM2COL, "im2col conv_1d conv_2d", "ops_conv ops_extra"),
    _row(Op.IM2COL_BACK, "im2col_back", "ops_extra"),
    _row(Op.IM2COL_3D, "im2col_3d", "ops_extra ops_tbo"),
    _row(Op.COL2IM_1D, "col2im_1d", "ops_extra ops_builders"),
    _row(Op.CONV_2D, "conv_2d_direct", "ops_extra ops_builders"),
    _row(Op.CONV_3D, "conv_3d_direct", "ops_extra ops_builders"),
    _row(Op.CONV_2D_DW, "conv_2d_dw_direct", "ops_extra ops_builders"),
    _row(Op.CONV_TRANSPOSE_2D, "conv_transpose_2d_p0", "ops_extra ops_tbo ops_builders"),
    _row(Op.POOL_1D, "pool_1d", "ops_conv"),
    _row(Op.POOL_2D, "pool_2d", "ops_conv"),
    _row(Op.POOL_2D_BACK, "pool_2d_back", "ops_extra ops_builders"),
    _row(Op.UPSCALE, "upscale upscale_ext interpolate", "ops_conv ops_tbo"),
    _row(Op.PAD, "pad pad_ext pad_circular", "ops_shape"),
    _row(Op.PAD_REFLECT_1D, "pad_reflect_1d", "ops_extra ops_builders"),
    _row(Op.ROLL, "roll", "ops_extra ops_builders"),
    _row(Op.ARANGE, "arange", "ops_shape"),
    _row(Op.TIMESTEP_EMBEDDING, "timestep_embedding", "ops_shape"),
    _row(Op.ARGSORT, "argsort", "ops_reduce"),
    _row(Op.TOP_K, "top_k", "ops_reduce"),
    _row(Op.LEAKY_RELU, "leaky_relu", "ops_elementwise"),
    _row(Op.TRI, "tri", "ops_shape"),
    _row(Op.FILL, "fill fill_inplace", "ops_elementwise"),
    _row(Op.FLASH_ATTN_EXT, "flash_attn_ext", "ops_nn"),
    _row(Op.FLASH_ATTN_BACK, "", "ops_dispatch", cpu=False, why_not=_FA_BACK),
    _row(Op.SSM_CONV, "ssm_conv", "ops_recurrent"),
    _row(Op.SSM_SCAN, "ssm_scan", "ops_recurrent ops_tbo ops_builders"),
    _row(Op.WIN_PART, "win_part", "ops_extra ops_builders"),
    _row(Op.WIN_UNPART, "win_unpart", "ops_extra ops_builders"),
    _row(Op.GET_REL_POS, "get_rel_pos", "ops_extra ops_builders"),
    _row(Op.ADD_REL_POS, "add_rel_pos add_rel_pos_inplace", "ops_extra ops_builders"),
    _row(Op.RWKV_WKV6, "rwkv_wkv6", "ops_recurrent ops_builders"),
    _row(Op.GATED_LINEAR_ATTN, "gated_linear_attn", "ops_recurrent ops_builders"),
    _row(Op.RWKV_WKV7, "rwkv_wkv7", "ops_recurrent"),
    _row(Op.SOLVE_TRI, "solve_tri", "ops_recurrent ops_builders"),
    _row(Op.GATED_DELTA_NET, "gated_delta_net", "ops_recurrent ops_builders"),
    _row(Op.LIGHTNING_INDEXER, "lightning_indexer", "ops_nn ops_builders"),
    _row(Op.DSV4_HC_COMB, "dsv4_hc_comb", "ops_recurrent ops_builders"),
    _row(Op.DSV4_HC_PRE, "dsv4_hc_pre dsv4_hc_pre_gated", "ops_recurrent ops_tbo ops_builders"),
    _row(Op.DSV4_HC_POST, "dsv4_hc_post", "ops_recurrent ops_tbo"),
    _row(Op.UNARY, "unary unary_inplace", "ops_elementwise", torch=True),
    _row(Op.MAP_CUSTOM1, "map_custom1 map_custom1_inplace", "ops_dispatch"),
    _row(Op.MAP_CUSTOM2, "map_custom2 map_custom2_inplace", "ops_dispatch"),
    _row(Op.MAP_CUSTOM3, "map_custom3 map_custom3_inplace", "ops_dispatch"),
    _row(Op.CUSTOM, "custom_4d custom_inplace", "ops_dispatch"),
    _row(Op.CROSS_ENTROPY_LOSS, "cross_entropy_loss", "ops_extra"),
    _row(Op.CROSS_ENTROPY_LOSS_BACK, "cross_entropy_loss_back", "ops_extra ops_builders"),
    _row(Op.OPT_STEP_ADAMW, "opt_step_adamw", "ops_extra ops_builders"),
    _row(Op.OPT_STEP_SGD, "opt_step_sgd", "ops_extra ops_builders"),
    _row(Op.GLU, "glu glu_split", "ops_elementwise", torch=True),
    # UnaryOp
    _row(UnaryOp.ABS, "abs abs_inplace", "ops_elementwise", torch=True),
    _row(UnaryOp.SGN, "sgn sgn_inplace", "ops_elementwise"),
    _row(UnaryOp.NEG, "neg neg_inplace", "ops_elementwise", torch=True),
    _row(UnaryOp.STEP, "step step_inplace", "ops_elementwise"),
    _row(UnaryOp.TANH, "tanh tanh_inplace", "ops_elementwise", torch=True),
    _row(UnaryOp.ELU, "elu elu_inplace", "ops_elementwise"),
    _row(UnaryOp.RELU, "relu relu_inplace", "ops_elementwise", torch=True),
    _row(UnaryOp.SIGMOID, "sigmoid sigmoid_inplace", "ops_elementwise", torch=True),
    _row(UnaryOp.GELU, "gelu gelu_inplace", "ops_elementwise", torch=True),
    _row(UnaryOp.GELU_QUICK, "gelu_quick gelu_quick_inplace", "ops_elementwise", torch=True),
    _row(UnaryOp.SILU, "silu silu_inplace", "ops_elementwise", torch=True),
    _row(UnaryOp.HARDSWISH, "hardswish hardswish_inplace", "ops_elementwise"),
    _row(UnaryOp.HARDSIGMOID, "hardsigmoid hardsigmoid_inplace", "ops_elementwise"),
    _row(UnaryOp.EXP, "exp exp_inplace", "ops_elementwise", torch=True),
    _row(UnaryOp.EXPM1, "expm1 expm1_inplace", "ops_elementwise"),
    _row(UnaryOp.SOFTPLUS, "softplus softplus_inplace", "ops_elementwise"),
    _row(UnaryOp.GELU_ERF, "gelu_erf gelu_erf_inplace", "ops_elementwise", torch=True),
    _row(UnaryOp.XIELU, "xielu", "ops_elementwise"),
    _row(UnaryOp.FLOOR, "floor floor_inplace", "ops_elementwise"),
    _row(UnaryOp.CEIL, "ceil ceil_inplace", "ops_elementwise"),
    _row(UnaryOp.ROUND, "round round_inplace", "ops_elementwise"),
    _row(UnaryOp.TRUNC, "trunc trunc_inplace", "ops_elementwise"),
    # GluOp
    _row(GluOp.REGLU, "reglu reglu_swapped reglu_split", "ops_elementwise", torch=True),
    _row(GluOp.GEGLU, "geglu geglu_swapped geglu_split", "ops_elementwise", torch=True),
    _row(GluOp.SWIGLU, "swiglu swiglu_swapped swiglu_split", "ops_elementwise", torch=True),
    _row(GluOp.SWIGLU_OAI, "swiglu_oai", "ops_elementwise"),
    _row(GluOp.GEGLU_ERF, "geglu_erf geglu_erf_swapped geglu_erf_split", "ops_elementwise", torch=True),
    _row(GluOp.GEGLU_QUICK, "geglu_quick geglu_quick_swapped geglu_quick_split", "ops_elementwise", torch=True),
    _row(GluOp.SWIGLU_CLAMP, "swiglu_clamp", "ops_tbo ops_builders"),
)


def key(op: AnyOp) -> tuple[str, str]:
    """A row's key, ("Op", "ADD"): the enums are IntEnums, so Op.NONE == UnaryOp.ABS == GluOp.REGLU == 0
    and the members themselves cannot key one dict."""
    return type(op).__name__, op.name


#: the rows by key(op); every Op, UnaryOp and GluOp member has exactly one (checked by the test)
OP_TABLE: dict[tuple[str, str], OpRow] = {key(r.op): r for r in ROWS}


def row(op: AnyOp) -> OpRow:
    """The table row of ``op`` (KeyError for a member without one, which the op-table test forbids)."""
    return OP_TABLE[key(op)]
