"""ggml-backend's scheduler: one graph across several backends (ggml_backend_sched_*).

It sits above alloc/ (it plans each backend's memory with a multi-buffer gallocr) and backend/
(it places nodes by asking each backend's supports_op / offload_op), as the scheduler part of
ggml-backend.cpp does; nothing in backend/ or alloc/ imports it.

scheduler.py: BackendSched and the flat backend_sched_* functions; assign.py: passes 1-4 (a
backend for every node); compute.py: running the splits with their input copies; debug.py:
GGML_SCHED_DEBUG's printout.
"""

from __future__ import annotations

from .assign import SchedAssignError, SchedError
from .scheduler import (
    GGML_SCHED_MAX_BACKENDS,
    GGML_SCHED_MAX_COPIES,
    GGML_SCHED_MAX_SPLIT_INPUTS,
    BackendSched,
    EvalCallback,
    SchedSplit,
    backend_sched_alloc_graph,
    backend_sched_free,
    backend_sched_get_backend,
    backend_sched_get_buffer_size,
    backend_sched_get_buffer_type,
    backend_sched_get_n_backends,
    backend_sched_get_n_copies,
    backend_sched_get_n_splits,
    backend_sched_get_tensor_backend,
    backend_sched_graph_compute,
    backend_sched_graph_compute_async,
    backend_sched_new,
    backend_sched_reserve,
    backend_sched_reserve_size,
    backend_sched_reset,
    backend_sched_set_eval_callback,
    backend_sched_set_tensor_backend,
    backend_sched_split_graph,
    backend_sched_synchronize,
)

__all__ = [
    "GGML_SCHED_MAX_BACKENDS",
    "GGML_SCHED_MAX_COPIES",
    "GGML_SCHED_MAX_SPLIT_INPUTS",
    "BackendSched",
    "EvalCallback",
    "SchedAssignError",
    "SchedError",
    "SchedSplit",
    "backend_sched_alloc_graph",
    "backend_sched_free",
    "backend_sched_get_backend",
    "backend_sched_get_buffer_size",
    "backend_sched_get_buffer_type",
    "backend_sched_get_n_backends",
    "backend_sched_get_n_copies",
    "backend_sched_get_n_splits",
    "backend_sched_get_tensor_backend",
    "backend_sched_graph_compute",
    "backend_sched_graph_compute_async",
    "backend_sched_new",
    "backend_sched_reserve",
    "backend_sched_reserve_size",
    "backend_sched_reset",
    "backend_sched_set_eval_callback",
    "backend_sched_set_tensor_backend",
    "backend_sched_split_graph",
    "backend_sched_synchronize",
]
