"""GGML_SCHED_DEBUG output: ggml_backend_sched_print_assignments, line for line.

ggml prints the split headers at level 1 and the per-node table at level 2 with the causes
compiled out; pyggml always records causes and prints the node table from level 1, because
the table is what one reads the scheduler's decisions from.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, TextIO

from ..ops.enums import VIEW_OPS, GluOp, Op, UnaryOp
from ..tensor import TensorFlag

if TYPE_CHECKING:
    from ..graph import Graph
    from ..tensor import Tensor
    from .scheduler import BackendSched


def debug_level() -> int:
    """GGML_SCHED_DEBUG as ggml reads it (atoi: anything unparsable is 0)."""
    raw = os.environ.get("GGML_SCHED_DEBUG", "")
    try:
        return int(raw.strip() or 0)
    except ValueError:
        return 0


def fmt_size(size: int) -> str:
    return f"{size // 1024 // 1024}M" if size >= 1024 * 1024 else f"{size // 1024}K"


def _op_desc(t: Tensor) -> str:
    """ggml_op_desc: the unary/glu sub-op name for UNARY and GLU nodes, else the op name."""
    if t.op == Op.UNARY:
        return UnaryOp(t.get_op_params_i32(0)).name
    if t.op == Op.GLU:
        return GluOp(t.get_op_params_i32(0)).name
    return t.op.name


def _desc(sched: BackendSched, t: Tensor) -> str:
    backend = sched.get_tensor_backend(t)
    bname = backend.name() if backend is not None else "NULL"
    return f"{t.name[:20]:>20} ({fmt_size(t.nbytes())[:5]:>5}) [{bname[:5]:>5} {sched.cause(t)[:8]:>8}]"


def print_assignments(sched: BackendSched, graph: Graph, out: TextIO | None = None) -> None:
    """Each split with its backend and inputs, then each non-view node with its backend, cause,
    use count, compute flag and the same for its sources."""
    out = out or sys.stderr
    splits = sched.splits
    cur = 0
    for i, node in enumerate(graph.nodes):
        if cur < len(splits) and i == splits[cur].i_start:
            split = splits[cur]
            line = f"\n## SPLIT #{cur}: {sched.backends[split.backend_id].name()} # {len(split.inputs)} inputs"
            if split.inputs:
                line += ": " + "".join(f"[{t.name} ({fmt_size(t.nbytes())[:5]:>5})] " for t in split.inputs)
            print(line, file=out)
            cur += 1
        if node.op in VIEW_OPS:
            continue
        compute = 1 if node.flags & TensorFlag.COMPUTE else 0
        line = (f"node #{i:3d} ({_op_desc(node)[:10]:>10}): {_desc(sched, node)} "
                f"use={graph.use_count(node)},c={compute}:")
        for src in node.src:
            if src is not None:
                line += " " + _desc(sched, src)
        print(line, file=out)
