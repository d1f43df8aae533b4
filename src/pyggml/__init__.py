"""pyggml: ggml, the tensor engine under llama.cpp, rebuilt in Python.

The flat API mirrors ggml's C API without the ``ggml_`` prefix (``pyggml.mul_mat(ctx, a, b)``
is ``ggml_mul_mat``); the objects carry Pythonic methods on top (``ctx.new_tensor``,
``t.numpy()``, ``a + b``).
"""

from __future__ import annotations

from .alloc import *  # noqa: F403  (ggml-alloc.h's flat API)
from .backend.api import *  # noqa: F403  (ggml-backend's flat API)
from .backend.cpu.backend import backend_cpu_buffer_type, backend_cpu_init, backend_cpu_set_n_threads
from .context import (
    Context,
    dup_tensor,
    get_tensor,
    init,
    new_f32,
    new_i32,
    new_tensor,
    new_tensor_1d,
    new_tensor_2d,
    new_tensor_3d,
    new_tensor_4d,
    tensor_overhead,
    view_tensor,
)
from .errors import (
    ContextFullError,
    GraphFullError,
    NameTooLongError,
    PyGGMLError,
    ShapeError,
    TypeMismatchError,
    UnsupportedOpError,
)
from .gguf import *  # noqa: F403  (gguf_* functions, GGUFReader, GGUFWriter, GGUFError)
from .gguf_loader import init_context, load_tensor
from .graph import (
    GGML_DEFAULT_GRAPH_SIZE,
    Graph,
    build_forward_expand,
    build_forward_select,
    graph_get_tensor,
    graph_n_nodes,
    graph_node,
    graph_overhead,
    graph_overhead_custom,
    graph_view,
    new_graph,
    new_graph_custom,
)
from .ops import operators as _operators  # attaches a + b, a @ b, ... to Tensor
from .ops.builders import *  # noqa: F403  (ggml's op constructors, flat)
from .ops.enums import GluOp, Op, UnaryOp, glu_op_name, op_name, unary_op_name
from .sched import *  # noqa: F403  (ggml-backend.h's backend_sched_* API and BackendSched)
from .tensor import (
    GGML_MAX_DIMS,
    GGML_MAX_NAME,
    GGML_MAX_OP_PARAMS,
    GGML_MAX_SRC,
    Tensor,
    TensorFlag,
    are_same_layout,
    are_same_shape,
    are_same_stride,
    can_repeat,
    can_repeat_rows,
)
from .types import GGML_TYPE_COUNT, QK_K, GGMLType, GGMLTypeError, TypeTraits, blck_size, row_size, type_size

__version__ = "0.1.0"


def graph_compute_with_ctx(ctx: Context, graph: Graph, n_threads: int = 1) -> int:
    """ggml_graph_compute_with_ctx: run every node of ``graph`` on the CPU, in the tensors' memory."""
    from .backend.cpu.compute import graph_compute_with_ctx as compute  # deferred: the kernels load numba

    return compute(ctx, graph, n_threads)


def set_input(t: Tensor) -> None:
    t.set_input()


def set_output(t: Tensor) -> None:
    t.set_output()


def set_param(t: Tensor) -> None:
    t.set_param()


def set_name(t: Tensor, name: str) -> Tensor:
    return t.set_name(name)


def nbytes(t: Tensor) -> int:
    return t.nbytes()


def nelements(t: Tensor) -> int:
    return t.nelements()


def nrows(t: Tensor) -> int:
    return t.nrows()


def n_dims(t: Tensor) -> int:
    return t.n_dims()


def is_contiguous(t: Tensor) -> bool:
    return t.is_contiguous()


def is_transposed(t: Tensor) -> bool:
    return t.is_transposed()


def is_permuted(t: Tensor) -> bool:
    return t.is_permuted()


#: llama-cpp-python's names, exported lazily
_LLAMA_API = ("Llama", "LlamaGrammar", "LlamaState", "LogitsProcessorList", "StoppingCriteriaList")


def __getattr__(name: str) -> object:
    """Lazy exports of llama.cpp's quantization tools (``pyggml.quantize_model``, ``pyggml.IMatrixCollector``)
    and of llama-cpp-python's API (``pyggml.Llama``, ``pyggml.LlamaGrammar``...): importing them loads the
    quantizers or the LLM stack, which a plain ``import pyggml`` should not pay for."""
    if name in ("quantize_model", "QuantizeOptions", "IMatrixCollector"):
        from . import quantize  # deferred (see the docstring)

        return getattr(quantize, name)
    if name in _LLAMA_API:  # llama-cpp-python's API (``from pyggml import Llama``): loads the LLM stack
        from . import llama

        return getattr(llama, name)
    raise AttributeError(f"module 'pyggml' has no attribute {name!r}")
