"""The flat ``pyggml.*`` API keeps every name it had: ggml.h, ggml-alloc.h, ggml-backend.h and gguf.h
functions, enums and constants under their ggml names without the ``ggml_`` prefix, and the
objects they return.

The lists were captured from ``dir(pyggml)`` on main before the layers were reorganised (issue 16)
and are kept here, written out, so that moving a module cannot silently drop a public name.
Adding names is fine; removing one must be a decision (edit this list and say why).
"""

from __future__ import annotations

import enum

import pytest

import pyggml

#: ggml.h: context, tensors, op constructors, graphs, types, CPU compute (ggml-cpu.h)
GGML_H = [
    "abs", "abs_inplace", "acc", "acc_inplace", "add", "add1", "add1_inplace", "add_cast", "add_id", "add_inplace",
    "add_rel_pos", "add_rel_pos_inplace", "arange", "are_same_layout", "are_same_shape", "are_same_stride",
    "argmax", "argsort", "blck_size", "build_forward_expand", "build_forward_select", "calc_conv_output_size",
    "calc_pool_output_size", "can_mul_mat", "can_out_prod", "can_repeat", "can_repeat_rows", "cast", "ceil",
    "ceil_inplace", "clamp", "clamp_inplace", "col2im_1d", "concat", "cont", "cont_1d", "cont_2d", "cont_3d",
    "cont_4d", "conv_1d", "conv_2d", "conv_2d_direct", "conv_2d_dw_direct", "conv_3d_direct", "conv_transpose_1d",
    "conv_transpose_2d_p0", "cos", "cos_inplace", "count_equal", "cpy", "cross_entropy_loss",
    "cross_entropy_loss_back", "cumsum", "custom_4d", "custom_inplace", "diag", "diag_mask_inf",
    "diag_mask_inf_inplace", "diag_mask_zero", "diag_mask_zero_inplace", "div", "div_inplace", "dsv4_hc_comb",
    "dsv4_hc_post", "dsv4_hc_pre", "dsv4_hc_pre_gated", "dup", "dup_inplace", "dup_tensor", "elu", "elu_inplace",
    "exp", "exp_inplace", "expm1", "expm1_inplace", "fill", "fill_inplace", "flash_attn_ext",
    "flash_attn_ext_add_sinks", "flash_attn_ext_get_prec", "flash_attn_ext_set_prec", "floor", "floor_inplace",
    "gated_delta_net", "gated_linear_attn", "geglu", "geglu_erf", "geglu_erf_split", "geglu_erf_swapped",
    "geglu_quick", "geglu_quick_split", "geglu_quick_swapped", "geglu_split", "geglu_swapped", "gelu", "gelu_erf",
    "gelu_erf_inplace", "gelu_inplace", "gelu_quick", "gelu_quick_inplace", "get_rel_pos", "get_rows",
    "get_rows_back", "get_tensor", "glu", "glu_op_name", "glu_split", "graph_compute_with_ctx", "graph_get_tensor",
    "graph_n_nodes", "graph_node", "graph_overhead", "graph_overhead_custom", "graph_view", "group_norm",
    "group_norm_inplace", "hardsigmoid", "hardsigmoid_inplace", "hardswish", "hardswish_inplace", "im2col",
    "im2col_3d", "im2col_back", "init", "init_context", "interpolate", "is_contiguous", "is_permuted",
    "is_transposed", "l2_norm", "l2_norm_inplace", "leaky_relu", "lightning_indexer", "load_tensor", "log",
    "log_inplace", "map_custom1", "map_custom1_inplace", "map_custom2", "map_custom2_inplace", "map_custom3",
    "map_custom3_inplace", "mean", "mul", "mul_inplace", "mul_mat", "mul_mat_id", "mul_mat_set_prec", "n_dims",
    "nbytes", "neg", "neg_inplace", "nelements", "new_f32", "new_graph", "new_graph_custom", "new_i32",
    "new_tensor", "new_tensor_1d", "new_tensor_2d", "new_tensor_3d", "new_tensor_4d", "norm", "norm_inplace",
    "nrows", "op_name", "opt_step_adamw", "opt_step_sgd", "out_prod", "pad", "pad_circular", "pad_ext",
    "pad_reflect_1d", "permute", "pool_1d", "pool_2d", "pool_2d_back", "reglu", "reglu_split", "reglu_swapped",
    "relu", "relu_inplace", "repeat", "repeat_4d", "repeat_back", "reshape", "reshape_1d", "reshape_2d",
    "reshape_3d", "reshape_4d", "rms_norm", "rms_norm_back", "rms_norm_inplace", "roll", "rope", "rope_ext",
    "rope_ext_back", "rope_ext_inplace", "rope_inplace", "rope_multi", "rope_multi_back", "rope_set_offset",
    "rope_yarn_corr_dims", "round", "round_inplace", "row_size", "rwkv_wkv6", "rwkv_wkv7", "scale", "scale_bias",
    "scale_bias_inplace", "scale_inplace", "set", "set_1d", "set_1d_inplace", "set_2d", "set_2d_inplace",
    "set_inplace", "set_input", "set_name", "set_output", "set_param", "set_rows", "sgn", "sgn_inplace", "sigmoid",
    "sigmoid_inplace", "silu", "silu_back", "silu_inplace", "sin", "sin_inplace", "soft_max", "soft_max_add_sinks",
    "soft_max_ext", "soft_max_ext_back", "soft_max_ext_back_inplace", "soft_max_ext_inplace", "soft_max_inplace",
    "softplus", "softplus_inplace", "solve_tri", "sqr", "sqr_inplace", "sqrt", "sqrt_inplace", "ssm_conv",
    "ssm_scan", "step", "step_inplace", "sub", "sub_inplace", "sum", "sum_rows", "swiglu", "swiglu_clamp",
    "swiglu_oai", "swiglu_split", "swiglu_swapped", "tanh", "tanh_inplace", "tensor_overhead", "timestep_embedding",
    "top_k", "transpose", "tri", "trunc", "trunc_inplace", "type_size", "unary", "unary_inplace", "unary_op_name",
    "upscale", "upscale_ext", "view_1d", "view_2d", "view_3d", "view_4d", "view_tensor", "win_part", "win_unpart",
    "xielu",
]

#: ggml-alloc.h
GGML_ALLOC_H = [
    "backend_alloc_ctx_tensors", "backend_alloc_ctx_tensors_from_buft", "backend_alloc_ctx_tensors_from_buft_size",
    "gallocr_alloc_graph", "gallocr_free", "gallocr_get_buffer_size", "gallocr_new", "gallocr_new_n",
    "gallocr_reserve", "gallocr_reserve_n", "gallocr_reserve_n_size", "tallocr_alloc", "tallocr_new",
]

#: ggml-backend.h (with ggml-cpu.h's backend_cpu_* and the scheduler)
GGML_BACKEND_H = [
    "backend_alloc_buffer", "backend_buffer_clear", "backend_buffer_copy_tensor", "backend_buffer_free",
    "backend_buffer_get_alignment", "backend_buffer_get_alloc_size", "backend_buffer_get_base",
    "backend_buffer_get_max_size", "backend_buffer_get_size", "backend_buffer_get_type", "backend_buffer_get_usage",
    "backend_buffer_init_tensor", "backend_buffer_is_host", "backend_buffer_is_multi_buffer", "backend_buffer_name",
    "backend_buffer_reset", "backend_buffer_set_usage", "backend_buft_alloc_buffer", "backend_buft_get_alignment",
    "backend_buft_get_alloc_size", "backend_buft_get_device", "backend_buft_get_max_size", "backend_buft_is_host",
    "backend_buft_name", "backend_cpu_buffer_type", "backend_cpu_init", "backend_cpu_set_n_threads",
    "backend_dev_backend_reg", "backend_dev_buffer_from_host_ptr", "backend_dev_buffer_type", "backend_dev_by_name",
    "backend_dev_by_type", "backend_dev_count", "backend_dev_description", "backend_dev_get",
    "backend_dev_get_props", "backend_dev_host_buffer_type", "backend_dev_init", "backend_dev_memory",
    "backend_dev_name", "backend_dev_offload_op", "backend_dev_supports_buft", "backend_dev_supports_op",
    "backend_dev_type", "backend_device_register", "backend_devices", "backend_event_free", "backend_event_new",
    "backend_event_record", "backend_event_synchronize", "backend_event_wait", "backend_free",
    "backend_get_alignment", "backend_get_default_buffer_type", "backend_get_device", "backend_get_max_size",
    "backend_graph_compute", "backend_graph_compute_async", "backend_guid", "backend_init_best",
    "backend_init_by_name", "backend_init_by_type", "backend_load", "backend_load_all",
    "backend_multi_buffer_alloc_buffer", "backend_multi_buffer_set_usage", "backend_name", "backend_offload_op",
    "backend_reg_by_name", "backend_reg_count", "backend_reg_dev_count", "backend_reg_dev_get", "backend_reg_get",
    "backend_reg_get_proc_address", "backend_reg_name", "backend_register", "backend_sched_alloc_graph",
    "backend_sched_free", "backend_sched_get_backend", "backend_sched_get_buffer_size",
    "backend_sched_get_n_backends", "backend_sched_get_n_copies", "backend_sched_get_n_splits",
    "backend_sched_get_tensor_backend", "backend_sched_graph_compute", "backend_sched_graph_compute_async",
    "backend_sched_new", "backend_sched_reserve", "backend_sched_reset", "backend_sched_set_eval_callback",
    "backend_sched_set_tensor_backend", "backend_sched_synchronize", "backend_supports_buft", "backend_supports_op",
    "backend_synchronize", "backend_tensor_alloc", "backend_tensor_copy", "backend_tensor_copy_async",
    "backend_tensor_get", "backend_tensor_get_async", "backend_tensor_memset", "backend_tensor_set",
    "backend_tensor_set_async", "backend_unload", "backend_view_init",
]

#: gguf.h
GGUF_H = [
    "gguf_find_key", "gguf_find_tensor", "gguf_free", "gguf_get_alignment", "gguf_get_arr_data", "gguf_get_arr_n",
    "gguf_get_arr_str", "gguf_get_arr_type", "gguf_get_data_offset", "gguf_get_key", "gguf_get_kv_type",
    "gguf_get_meta_data", "gguf_get_meta_size", "gguf_get_n_kv", "gguf_get_n_tensors", "gguf_get_tensor_name",
    "gguf_get_tensor_ne", "gguf_get_tensor_offset", "gguf_get_tensor_size", "gguf_get_tensor_type",
    "gguf_get_val_bool", "gguf_get_val_f32", "gguf_get_val_f64", "gguf_get_val_i16", "gguf_get_val_i32",
    "gguf_get_val_i64", "gguf_get_val_i8", "gguf_get_val_str", "gguf_get_val_u16", "gguf_get_val_u32",
    "gguf_get_val_u64", "gguf_get_val_u8", "gguf_get_version", "gguf_init_empty", "gguf_init_from_buffer",
    "gguf_init_from_file", "gguf_remove_key", "gguf_set_arr_data", "gguf_set_arr_str", "gguf_set_kv",
    "gguf_set_val_bool", "gguf_set_val_f32", "gguf_set_val_f64", "gguf_set_val_i16", "gguf_set_val_i32",
    "gguf_set_val_i64", "gguf_set_val_i8", "gguf_set_val_str", "gguf_set_val_u16", "gguf_set_val_u32",
    "gguf_set_val_u64", "gguf_set_val_u8", "gguf_type_name", "gguf_type_size", "gguf_write_to_file",
]

#: ggml's enums as Python enums (ggml_type, ggml_op, ggml_unary_op, ggml_glu_op, gguf_type, ...)
ENUMS = [
    "GGMLType", "GGUFValueType", "GluOp", "Op", "OpPool", "ScaleMode", "SortOrder", "TensorFlag", "TriType",
    "UnaryOp",
]

#: ggml's and gguf's #defines
CONSTANTS = [
    "GGML_DEFAULT_GRAPH_SIZE", "GGML_MAX_DIMS", "GGML_MAX_NAME", "GGML_MAX_OP_PARAMS", "GGML_MAX_SRC",
    "GGML_N_TASKS_MAX", "GGML_PREC_DEFAULT", "GGML_PREC_F32", "GGML_ROPE_TYPE_IMROPE", "GGML_ROPE_TYPE_MROPE",
    "GGML_ROPE_TYPE_NEOX", "GGML_ROPE_TYPE_VISION", "GGML_SCALE_FLAG_ALIGN_CORNERS", "GGML_SCALE_FLAG_ANTIALIAS",
    "GGML_TYPE_COUNT", "GGUF_DEFAULT_ALIGNMENT", "GGUF_KEY_GENERAL_ALIGNMENT", "GGUF_MAGIC", "GGUF_VERSION", "QK_K",
]

#: the objects behind the flat functions, and pyggml's errors
OBJECTS = [
    "BackendSched", "CHECKS", "Context", "ContextFullError", "GGMLTypeError", "GGUFContext", "GGUFError", "GGUFKV",
    "GGUFKeyError", "GGUFReader", "GGUFTypeError", "GGUFWriter", "Graph", "GraphFullError", "Keys",
    "NameTooLongError", "PyGGMLError", "ShapeError", "StringArray", "Tensor", "TensorInfo", "TypeMismatchError",
    "TypeTraits", "UnsupportedOpError",
]


FUNCTIONS = GGML_H + GGML_ALLOC_H + GGML_BACKEND_H + GGUF_H


@pytest.mark.parametrize("name", FUNCTIONS)
def test_function_is_there(name: str) -> None:
    assert callable(getattr(pyggml, name, None)), f"pyggml.{name} is gone or not callable"


@pytest.mark.parametrize("name", ENUMS)
def test_enum_is_there(name: str) -> None:
    obj = getattr(pyggml, name, None)
    assert isinstance(obj, type) and issubclass(obj, enum.Enum) and len(obj) > 0, f"pyggml.{name}"


@pytest.mark.parametrize("name", CONSTANTS)
def test_constant_is_there(name: str) -> None:
    assert isinstance(getattr(pyggml, name, None), int | str | bytes), f"pyggml.{name}"


@pytest.mark.parametrize("name", OBJECTS)
def test_object_is_there(name: str) -> None:
    obj = getattr(pyggml, name, None)
    assert isinstance(obj, type | dict), f"pyggml.{name}"


def test_lists_have_no_duplicates() -> None:
    names = FUNCTIONS + ENUMS + CONSTANTS + OBJECTS
    assert len(names) == len(set(names)) == 509


def test_a_few_work_as_in_ggml() -> None:
    """Usable, not only present: a tiny graph through the flat names, and an operator on tensors."""
    ctx = pyggml.init(1 << 20)
    a = pyggml.new_tensor_1d(ctx, pyggml.GGMLType.F32, 4)
    b = pyggml.new_tensor_1d(ctx, pyggml.GGMLType.F32, 4)
    a.set([1, 2, 3, 4])
    b.set([10, 20, 30, 40])
    out = pyggml.add(ctx, a, b * 2.0)
    gf = pyggml.new_graph(ctx)
    pyggml.build_forward_expand(gf, out)
    pyggml.graph_compute_with_ctx(ctx, gf, 1)
    assert out.numpy().tolist() == [21, 42, 63, 84]
    assert pyggml.Op.ADD.value == 2 and pyggml.GGMLType.Q4_K.value == 12
