"""Passes 1 to 4 of ggml_backend_sched_split_graph: which backend runs each tensor.

Kept apart from the splitting and copying (scheduler.py) because these passes only read the graph
and write a backend id (and the rule that chose it, the "cause") per tensor. The order of the
passes and every tie-break follow ggml-backend.cpp, so a GGML_SCHED_DEBUG table printed by
llama.cpp for the same graph and backends reads the same here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..backend.base import BufferUsage
from ..backend.errors import BackendError
from ..ops.enums import VIEW_OPS, Op
from ..tensor import FLAG_INPUT

if TYPE_CHECKING:
    from ..backend.base import Backend, Buffer, BufferType
    from ..graph import Graph
    from ..tensor import Tensor


class SchedError(BackendError):
    """The scheduler was built or driven in a way ggml asserts against."""


class SchedAssignError(SchedError):
    """A tensor cannot be placed on any backend of the scheduler (ggml aborts here)."""


class Assignments:
    """The scheduler's per-tensor hash values: backend id, the rule that chose it, and copies.

    ggml keys these by tensor pointer in a hash set; here by ``id(tensor)``, with the tensor kept
    alive in ``keep`` so an id cannot be reused by a new tensor while the entry exists.
    """

    def __init__(self) -> None:
        self.backend_ids: dict[int, int] = {}
        self.causes: dict[int, str] = {}
        self.keep: dict[int, Tensor] = {}
        #: id(tensor) -> [backend][copy] -> the tensor's copy in that backend's memory
        self.copies: dict[int, list[list[Tensor | None]]] = {}

    def clear(self) -> None:
        self.backend_ids.clear()
        self.causes.clear()
        self.keep.clear()
        self.copies.clear()

    def copy(self) -> Assignments:
        """An independent copy (the copy tables' rows too): what a saved graph state shared stays as it was."""
        new = Assignments()
        new.backend_ids, new.causes, new.keep = dict(self.backend_ids), dict(self.causes), dict(self.keep)
        new.copies = {k: [list(row) for row in v] for k, v in self.copies.items()}
        return new

    def get(self, t: Tensor | None) -> int:
        if t is None:
            return -1
        return self.backend_ids.get(id(t), -1)

    def set(self, t: Tensor, backend_id: int, cause: str) -> None:
        self.backend_ids[id(t)] = backend_id
        self.causes[id(t)] = cause
        self.keep[id(t)] = t

    def cause(self, t: Tensor) -> str:
        return self.causes.get(id(t), "")


def _tensor_buffer(t: Tensor) -> Buffer | None:
    return t.view_src.buffer if t.view_src is not None else t.buffer


class Assigner:
    """Runs passes 1-4 for one scheduler: its backends (priority order), bufts and op_offload."""

    def __init__(self, backends: list[Backend], bufts: list[BufferType], op_offload: bool,
                 assignments: Assignments) -> None:
        self.backends = backends
        self.bufts = bufts
        self.op_offload = op_offload
        self.a = assignments
        self.n = len(backends)

    # ------------------------------------------------------------------ helpers
    def backend_from_buffer(self, t: Tensor, op: Tensor) -> int:
        """The highest-priority backend that can use t's buffer type and run ``op``, else -1."""
        buf = _tensor_buffer(t)
        if buf is None:
            return -1
        for i, b in enumerate(self.backends):
            if b.supports_buft(buf.buft) and b.supports_op(op):
                return i
        return -1

    def buffer_supported(self, t: Tensor, backend_id: int) -> bool:
        """Whether backend ``backend_id`` can read t where it lives (or where it will live)."""
        buf = _tensor_buffer(t)
        buft = None
        if buf is not None:
            buft = buf.buft
        else:
            bid = self.a.get(t)
            if bid == -1 and t.view_src is not None:
                bid = self.a.get(t.view_src)
            if bid != -1:
                buft = self.bufts[bid]
        return buft is not None and self.backends[backend_id].supports_buft(buft)

    def _set_if_supported(self, node: Tensor, backend_id: int) -> None:
        if self.backends[backend_id].supports_op(node):
            self.a.set(node, backend_id, "2.sup")

    # ------------------------------------------------------------------ pass 1
    def id_from_cur(self, t: Tensor) -> tuple[int, str]:
        """ggml_backend_sched_backend_id_from_cur: the first placement rule that applies."""
        bid = self.backend_from_buffer(t, t)
        if bid != -1:
            return bid, "1.dst"
        if t.view_src is not None:
            bid = self.backend_from_buffer(t.view_src, t)
            if bid != -1:
                return bid, "1.vsrc"
        buf = _tensor_buffer(t)
        if buf is not None:
            raise SchedAssignError(f"pre-allocated tensor ({t.name}) in a buffer ({buf.name()}) that cannot run "
                                   f"the operation ({t.op.name}): no backend of the scheduler supports both")
        if t.flags & FLAG_INPUT:
            return self.n - 1, "1.inp"
        # ROPE's freq factors and FLASH_ATTN_EXT's sinks are too small to choose a backend by
        if t.op in (Op.ROPE, Op.FLASH_ATTN_EXT):
            return -1, ""
        for i, src in enumerate(t.src):
            if src is None or src.buffer is None or src.buffer.usage != BufferUsage.WEIGHTS:
                continue
            src_bid = self.backend_from_buffer(src, t)
            if self.op_offload and src_bid == self.n - 1 and src.buffer.is_host():
                for b in range(src_bid):
                    if self.backends[b].supports_op(t) and self.backends[b].offload_op(t):
                        return b, "1.off"
            return src_bid, f"1.wgt{i}"
        return -1, ""

    def pass1(self, graph: Graph) -> None:
        for t in (*graph.leafs, *graph.nodes):
            if self.a.get(t) == -1:  # user assignments are kept
                bid, cause = self.id_from_cur(t)
                if bid != -1:
                    self.a.set(t, bid, cause)

    # ------------------------------------------------------------------ pass 2
    def pass2(self, graph: Graph) -> None:
        """Expand assignments to neighbours: GPU-like backends down then up (the CPU stops the
        spread), then any backend down then up. Unsupported nodes stay unassigned for pass 3."""
        nodes = [n for n in graph.nodes if n.op not in VIEW_OPS]
        for order, skip_cpu in ((nodes, True), (nodes[::-1], True), (nodes, False), (nodes[::-1], False)):
            cur = -1
            for node in order:
                bid = self.a.get(node)
                if bid != -1:
                    cur = -1 if (skip_cpu and bid == self.n - 1) else bid
                elif cur != -1:
                    self._set_if_supported(node, cur)

    # ------------------------------------------------------------------ pass 3
    def pass3(self, graph: Graph) -> None:
        """Unassigned nodes go where most of their inputs already are ("3.best"); assigned ones
        move to a higher-priority backend sharing their buffer type when it can ("3.upg")."""
        for node in graph.nodes:
            if node.op in VIEW_OPS:
                continue
            bid = self.a.get(node)
            srcs = [s for s in node.src if s is not None]
            if bid == -1:
                best = -1
                for b, backend in enumerate(self.backends):
                    if not backend.supports_op(node):
                        continue
                    n_ok = sum(1 for s in srcs
                               if (self.a.get(s) != -1 or self.a.get(s.view_src) != -1)
                               and self.buffer_supported(s, b))
                    if n_ok > best:
                        best = n_ok
                        self.a.set(node, b, "3.best")
                continue
            for b in range(bid):
                if (self.bufts[b] is self.bufts[bid] and self.backends[b].supports_op(node)
                        and all(self.buffer_supported(s, b) for s in srcs)):
                    self.a.set(node, b, "3.upg")
                    break

    # ------------------------------------------------------------------ pass 4
    def pass4(self, graph: Graph) -> None:
        """Views follow their source, remaining sources follow their consumer, and a node still
        unplaced takes the first backend that supports it."""
        for node in graph.nodes:
            if node.view_src is not None and self.a.get(node) == -1:
                self.a.set(node, self.a.get(node.view_src), "4.vsrc")
            cur = self.a.get(node)
            for src in node.src:
                if src is None or self.a.get(src) != -1:
                    continue
                if src.view_src is not None:
                    self.a.set(src, self.a.get(src.view_src), "4.vsrc")
                else:
                    self.a.set(src, cur, "4.cur")
            for b in range(self.n):
                if self.a.get(node) != -1:
                    break
                self._set_if_supported(node, b)
            if self.a.get(node) == -1:
                raise SchedAssignError(f"no backend of the scheduler supports node {node.name!r} "
                                       f"(op {node.op.name}); the last backend should be the CPU")
