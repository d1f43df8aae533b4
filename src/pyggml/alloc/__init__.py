"""ggml-alloc: the linear allocator (tallocr), the best-fit planner (dyn_tallocr) and the graph
allocator (gallocr), plus allocation of a whole context's tensors."""

from .ctx_alloc import (
    backend_alloc_ctx_tensors,
    backend_alloc_ctx_tensors_from_buft,
    backend_alloc_ctx_tensors_from_buft_size,
)
from .dyn_tallocr import GGML_VBUFFER_MAX_CHUNKS, MAX_FREE_BLOCKS, BufferAddress, DynTallocr
from .gallocr import (
    INPLACE_OPS,
    Gallocr,
    gallocr_alloc_graph,
    gallocr_free,
    gallocr_get_buffer_size,
    gallocr_new,
    gallocr_new_n,
    gallocr_reserve,
    gallocr_reserve_n,
    gallocr_reserve_n_size,
    op_can_inplace,
)
from .plan import Plan, PlotUnavailableError, TensorRecord
from .tallocr import Tallocr, tallocr_alloc, tallocr_new

#: ggml-alloc.h's functions, which pyggml.* re-exports flat
__all__ = [n for n in dir() if n.startswith(("tallocr_", "gallocr_", "backend_alloc_ctx_tensors"))]
