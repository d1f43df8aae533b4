"""ggml-backend's scheduler: one graph across several backends (ggml_backend_sched_*).

It sits above alloc/ (it plans each backend's memory with a multi-buffer gallocr) and backend/
(it places nodes by asking each backend's supports_op / offload_op), as the scheduler part of
ggml-backend.cpp does; nothing in backend/ or alloc/ imports it.

scheduler.py: BackendSched and the flat backend_sched_* functions; assign.py: passes 1-4 (a
backend for every node); compute.py: running the splits with their input copies; debug.py:
GGML_SCHED_DEBUG's printout.
"""

from __future__ import annotations

from . import scheduler
from .scheduler import *  # noqa: F403  (BackendSched and the flat backend_sched_* functions)

__all__ = scheduler.__all__  # what pyggml.* re-exports, too
