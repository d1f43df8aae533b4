"""ggml_backend_sched: run one graph across several backends.

The scheduler decides a backend for every tensor (passes 1-4, assign.py), cuts the node
list into splits that each run on one backend, gives every split a copy of the inputs it cannot
read where they live (pass 5), allocates the whole thing with one multi-buffer graph allocator
and runs the splits in order with ggml's synchronisation rules. With ``parallel`` it keeps
GGML_SCHED_MAX_COPIES sets of input copies and events and rotates them between runs, so a
pipeline of asynchronous backends never overwrites an input still in use.

Typical use, as in llama.cpp::

    sched = backend_sched_new([gpu, cpu], None, 2048, False, True)
    backend_sched_reset(sched)
    backend_sched_set_tensor_backend(sched, some_node, cpu)   # optional user placements
    backend_sched_alloc_graph(sched, gf)
    ... write the input tensors ...
    backend_sched_graph_compute(sched, gf)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..alloc.gallocr import Gallocr, gallocr_new_n
from ..backend import api
from ..backend.base import Backend, BufferType, BufferUsage, DeviceType, Event, GGMLStatus
from ..context import Context
from ..graph import Graph, graph_next_uid, graph_overhead_custom, hash_size
from ..ops.enums import VIEW_OPS
from ..tensor import FLAG_INPUT, FLAG_OUTPUT, GGML_MAX_NAME, GGML_TENSOR_SIZE
from .assign import Assigner, Assignments, SchedAssignError, SchedError
from .compute import compute_splits
from .debug import debug_level, print_assignments

if TYPE_CHECKING:
    from ..tensor import Tensor

__all__ = [
    "GGML_SCHED_MAX_BACKENDS",
    "GGML_SCHED_MAX_COPIES",
    "GGML_SCHED_MAX_SPLIT_INPUTS",
    "BackendSched",
    "SchedAssignError",
    "SchedError",
    "SchedSplit",
]

GGML_SCHED_MAX_BACKENDS = 16
GGML_SCHED_MAX_SPLIT_INPUTS = 30
GGML_SCHED_MAX_COPIES = 4

#: cb(tensor, ask) -> bool, or cb(tensor, ask, user_data) when user data was given
EvalCallback = Callable[..., bool]


@dataclass
class SchedSplit:
    """ggml_backend_sched_split: nodes [i_start, i_end) of the graph, run on one backend."""

    backend_id: int
    i_start: int
    i_end: int = -1
    inputs: list[Tensor] = field(default_factory=list)
    inputs_capacity: int = GGML_SCHED_MAX_SPLIT_INPUTS
    graph: Graph | None = None


@dataclass
class SchedGraphState:
    """What ``alloc_graph`` decided for one graph: its backends and copies, its splits (each keeping its backend's
    compute plan), the graph ggml-alloc planned, and the allocator generation its tensors were placed in.

    llama.cpp reuses the one graph the scheduler last allocated; a caller that alternates between a few graph
    shapes (a prompt, then one-token steps; a speculative verify batch, then a step) keeps one of these per
    graph and hands it back with :meth:`BackendSched.restore_graph_state` instead of splitting and planning
    the graph again. The tensors' addresses stay valid while the allocator keeps its buffers (the generation)."""

    graph: Graph
    splits: list[SchedSplit]
    graph_inputs: list[Tensor]
    graph_copy: Graph
    node_backend_ids: list[int]
    leaf_backend_ids: list[int]
    ctx: Context | None
    assign: Assignments
    cur_copy: int
    alloc_generation: int


def _env_int(name: str) -> int:
    """An integer environment setting read as C's atoi would (unset or garbage is 0)."""
    try:
        return int(os.environ.get(name, "").strip() or 0)
    except ValueError:
        return 0


def _is_view_op(t: Tensor) -> bool:
    return t.op in VIEW_OPS


class BackendSched:
    """``ggml_backend_sched_t``; build it with :func:`backend_sched_new`."""

    def __init__(self, backends: Sequence[Backend], bufts: Sequence[BufferType | None] | None,
                 graph_size: int, parallel: bool, op_offload: bool) -> None:
        backends = list(backends)
        if not 1 <= len(backends) <= GGML_SCHED_MAX_BACKENDS:
            raise SchedError(f"a scheduler takes 1 to {GGML_SCHED_MAX_BACKENDS} backends, got {len(backends)}")
        last_dev = backends[-1].get_device()
        if last_dev is None or last_dev.type() != DeviceType.CPU:
            raise SchedError(f"the last backend of a scheduler must be a CPU backend, got {backends[-1].name()!r}")
        if bufts is not None and len(bufts) != len(backends):
            raise SchedError(f"{len(bufts)} buffer types given for {len(backends)} backends")
        if graph_size < 1:
            raise SchedError(f"graph_size must be positive, got {graph_size}")
        self.backends = backends
        self.n_backends = len(backends)
        self.graph_size = int(graph_size)
        self.n_copies = GGML_SCHED_MAX_COPIES if parallel else 1
        self.op_offload = bool(op_offload)
        self.debug = debug_level()
        # GGML_SCHED_DEBUG_REALLOC: 1 = fail on a re-plan the graph size does not explain, 2 = on any
        self.debug_realloc = _env_int("GGML_SCHED_DEBUG_REALLOC")
        self.debug_graph_size = 0
        self.debug_prev_graph_size = 0
        self.bufts: list[BufferType] = []
        for i, b in enumerate(backends):
            buft = bufts[i] if bufts is not None and bufts[i] is not None else b.get_default_buffer_type()
            if not b.supports_buft(buft):
                raise SchedError(f"backend {b.name()!r} does not support buffer type {buft.name()!r}")
            self.bufts.append(buft)
        # events[b][c]: None where the device has no events, as ggml_backend_event_new returns NULL
        self.events: list[list[Event | None]] = [
            [api.backend_event_new(b.get_device()) if self.n_copies > 1 else None for _ in range(self.n_copies)]
            for b in backends
        ]
        self.galloc: Gallocr = gallocr_new_n(self.bufts)
        self.assign = Assignments()
        self.assigner = Assigner(self.backends, self.bufts, self.op_offload, self.assign)
        self.splits: list[SchedSplit] = []
        self.graph_inputs: list[Tensor] = []
        self.graph = Graph(1)
        self.node_backend_ids: list[int] = []
        self.leaf_backend_ids: list[int] = []
        self.prev_node_backend_ids: list[int] = []
        self.prev_leaf_backend_ids: list[int] = []
        self.ctx: Context | None = None
        self.cur_copy = 0
        self.next_copy = 0
        self.is_reset = False
        self.is_alloc = False
        self.callback_eval: EvalCallback | None = None
        self.callback_eval_user_data: Any = None
        # the MoE expert selection of the last ids tensor read, reused while the ids are the same
        self._prev_ids_tensor: Tensor | None = None
        self._used_experts: list[int] = []
        # the assignments are also held by a saved graph state: copy them before any change
        self._assign_shared = False
        self._user_graph: Graph | None = None
        self.reset()

    # ------------------------------------------------------------------ lookups
    def backend_id(self, backend: Backend) -> int:
        """The backend's priority (index), -1 when it is not one of this scheduler's."""
        return next((i for i, b in enumerate(self.backends) if b is backend), -1)

    def _checked_id(self, backend: Backend) -> int:
        i = self.backend_id(backend)
        if i < 0:
            raise SchedError(f"backend {backend.name()!r} is not one of this scheduler's backends")
        return i

    def get_tensor_backend(self, t: Tensor) -> Backend | None:
        bid = self.assign.get(t)
        return None if bid == -1 else self.backends[bid]

    def set_tensor_backend(self, t: Tensor, backend: Backend) -> None:
        self._own_assign(keep=True)
        self.assign.set(t, self._checked_id(backend), "usr")
        self.is_reset = False

    def cause(self, t: Tensor) -> str:
        """Which rule placed the tensor (1.dst, 1.wgt0, 2.sup, 3.best, 4.cpy, usr, ...)."""
        return self.assign.cause(t)

    def tensor_copy(self, t: Tensor, backend_id: int, copy: int) -> Tensor | None:
        slots = self.assign.copies.get(id(t))
        return None if slots is None else slots[backend_id][copy]

    def _set_copy(self, t: Tensor, backend_id: int, copy: int, t_copy: Tensor) -> None:
        slots = self.assign.copies.get(id(t))
        if slots is None:
            slots = self.assign.copies[id(t)] = [[None] * self.n_copies for _ in range(self.n_backends)]
            self.assign.keep[id(t)] = t
        slots[backend_id][copy] = t_copy

    @property
    def n_splits(self) -> int:
        return len(self.splits)

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Forget every assignment and copy (unless already reset); the graph is no longer allocated."""
        if not self.is_reset:
            if self._assign_shared:
                self._own_assign(keep=False)
            else:
                self.assign.clear()
            self.is_reset = True
        self.is_alloc = False

    def _own_assign(self, keep: bool) -> None:
        """Make the assignments this scheduler's alone (a saved graph state keeps the ones it shared); ``keep``
        carries their entries over (user placements made since a restore), else the new ones start empty."""
        if not self._assign_shared:
            return
        self.assign = self.assigner.a = self.assign.copy() if keep else Assignments()
        self._assign_shared = False

    def save_graph_state(self) -> SchedGraphState:
        """The allocated graph's scheduling and allocation, to run it again later (see SchedGraphState)."""
        if not self.is_alloc:
            raise SchedError("save_graph_state: no graph is allocated (call backend_sched_alloc_graph first)")
        assert self._user_graph is not None
        self._assign_shared = True
        return SchedGraphState(self._user_graph, list(self.splits), list(self.graph_inputs), self.graph,
                               list(self.node_backend_ids), list(self.leaf_backend_ids), self.ctx, self.assign,
                               self.cur_copy, self.galloc.generation)

    def restore_graph_state(self, state: SchedGraphState) -> bool:
        """Make a saved graph the allocated one again, as if alloc_graph had just placed it: False (changing
        nothing) when the allocator has replaced its buffers since, so the saved addresses are stale."""
        if state.alloc_generation != self.galloc.generation:
            return False
        self.synchronize()  # the previous graph may still be running in the memory this one shares
        self.splits, self.graph_inputs, self.graph = list(state.splits), list(state.graph_inputs), state.graph_copy
        self.node_backend_ids, self.leaf_backend_ids = list(state.node_backend_ids), list(state.leaf_backend_ids)
        self.ctx, self.cur_copy = state.ctx, state.cur_copy
        self.assign = self.assigner.a = state.assign
        self._assign_shared = True
        self._user_graph = state.graph
        self.is_reset = False
        self.is_alloc = True
        return True

    def synchronize(self) -> None:
        for b in self.backends:
            b.synchronize()
        if not self.is_alloc:
            # always start again from copy 0 so repeated generation sees one stable graph
            self.next_copy = 0

    def _check_graph_size(self, graph: Graph) -> None:
        # ggml sizes its hash set from graph_size and asserts the graph fits
        if graph.n_nodes + graph.n_leafs > hash_size(self.graph_size):
            raise SchedError(f"graph of {graph.n_nodes} nodes and {graph.n_leafs} leafs is too large for a "
                             f"scheduler created with graph_size={self.graph_size}")

    # ------------------------------------------------------------------ split_graph
    def _dup_tensor_layout(self, src: Tensor, name: str) -> Tensor:
        assert self.ctx is not None
        t = self.ctx.new_tensor_impl(src.type, src.ne)
        t.nb = list(src.nb)
        raw = name.encode()
        if len(raw) >= GGML_MAX_NAME:  # ggml truncates the formatted name silently
            name = raw[: GGML_MAX_NAME - 1].decode(errors="ignore")
        t.set_name(name)
        return t

    def split_graph(self, graph: Graph) -> None:
        """ggml_backend_sched_split_graph: assign backends, cut splits, create input copies and
        build the allocation graph (inputs and their copies ahead of each split's nodes)."""
        self._own_assign(keep=True)
        self.splits = []
        self.graph_inputs = []
        self.is_reset = False
        self._user_graph = graph
        n_ctx = self.graph_size * GGML_SCHED_MAX_SPLIT_INPUTS * 2
        self.ctx = Context(n_ctx * GGML_TENSOR_SIZE * 2 + graph_overhead_custom(self.graph_size), no_alloc=True)
        # copies made in an earlier context died with it
        self.assign.copies.clear()
        graph.uid = graph_next_uid()

        a = self.assigner
        a.pass1(graph)
        a.pass2(graph)
        a.pass3(graph)
        a.pass4(graph)
        self._pass5(graph)

        if self.debug:
            print_assignments(self, graph)

        self.prev_node_backend_ids, self.node_backend_ids = self.node_backend_ids, []
        self.prev_leaf_backend_ids, self.leaf_backend_ids = self.leaf_backend_ids, []
        for split in self.splits:
            split.graph = graph.view(split.i_start, split.i_end)
            self.backends[split.backend_id].graph_optimize(split.graph)
        self._build_graph_copy(graph)
        for split in self.splits:
            assert split.graph is not None
            split.graph.uid = graph_next_uid()

    def _pass5(self, graph: Graph) -> None:
        """Cut the node list where the backend changes and copy the inputs a split cannot read."""
        a, ids = self.assigner, self.assign
        nodes = graph.nodes
        first = next((k for k, n in enumerate(nodes) if not _is_view_op(n)), len(nodes))
        first_id = ids.get(nodes[first]) if first < len(nodes) else self.n_backends - 1
        split = SchedSplit(first_id, 0)
        self.splits = [split]
        cur = split.backend_id
        for i in range(first, len(nodes)):
            node = nodes[i]
            if _is_view_op(node):
                continue
            node_id = ids.get(node)
            if node_id == -1:
                raise SchedAssignError(f"node {node.name!r} ({node.op.name}) was left without a backend")
            need_new_split = False
            if node_id == cur and split.inputs:
                for src in node.src:
                    if src is None:
                        continue
                    # a weight from an incompatible backend: a new split lets its copy's memory be reused
                    if (src.buffer is not None and src.buffer.usage == BufferUsage.WEIGHTS
                            and ids.get(src) != cur and not a.buffer_supported(src, cur)):
                        need_new_split = True
                        break
                    if (len(split.inputs) >= split.inputs_capacity and ids.get(src) != cur
                            and self.tensor_copy(src, cur, 0) is None and not a.buffer_supported(src, cur)):
                        need_new_split = True
                        break
            if node_id != cur or need_new_split:
                split.i_end = i
                split = SchedSplit(node_id, i)
                self.splits.append(split)
                cur = node_id
            for j, src in enumerate(node.src):
                if src is None:
                    continue
                src_id = ids.get(src)
                if src_id == -1:
                    raise SchedAssignError(f"source {src.name!r} of node {node.name!r} was left without a backend")
                if src.flags & FLAG_INPUT and self.n_copies > 1 and self.tensor_copy(src, src_id, 0) is None:
                    bname = self.backends[src_id].name()
                    for c in range(self.n_copies):
                        t_copy = src if c == self.cur_copy else self._dup_tensor_layout(src, f"{bname}#{src.name}#{c}")
                        t_copy.flags |= FLAG_INPUT | FLAG_OUTPUT  # keep ggml-alloc off it
                        self._set_copy(src, src_id, c, t_copy)
                        if t_copy is not src:
                            ids.set(t_copy, src_id, "4.cpy")
                    self.graph_inputs.append(src)
                if src_id != cur and not a.buffer_supported(src, cur):
                    if self.tensor_copy(src, cur, 0) is None:
                        bname = self.backends[cur].name()
                        for c in range(self.n_copies):
                            t_copy = self._dup_tensor_layout(src, f"{bname}#{src.name}#{c}")
                            if self.n_copies > 1:
                                t_copy.flags |= FLAG_INPUT | FLAG_OUTPUT
                            self._set_copy(src, cur, c, t_copy)
                            ids.set(t_copy, cur, "4.cpy")
                        if len(split.inputs) >= split.inputs_capacity:
                            split.inputs_capacity *= 2
                        split.inputs.append(src)
                    copy = self.tensor_copy(src, cur, self.cur_copy)
                    assert copy is not None
                    node.src[j] = copy
        split.i_end = len(nodes)

    def _build_graph_copy(self, graph: Graph) -> None:
        """The graph ggml-alloc plans: per split, each input (kept alive by a dependency view)
        and its copy, then the split's nodes; pipeline copies and the original leafs as leafs."""
        assert self.ctx is not None
        ids = self.assign
        total_inputs = len(self.graph_inputs) + sum(len(s.inputs) for s in self.splits)
        size = max(graph.n_nodes, graph.n_leafs) + total_inputs * 2 * self.n_copies
        self.debug_prev_graph_size, self.debug_graph_size = self.debug_graph_size, size
        gc = Graph(max(size, 1))
        node_ids = self.node_backend_ids
        for split in self.splits:
            for inp in split.inputs:
                dep = self.ctx.view_tensor(inp)
                dep.src[0] = inp
                node_ids.append(ids.get(inp))
                gc.nodes.append(dep)
                inp_cpy = self.tensor_copy(inp, split.backend_id, self.cur_copy)
                assert inp_cpy is not None
                node_ids.append(split.backend_id)
                gc.nodes.append(inp_cpy)
            for j in range(split.i_start, split.i_end):
                node_ids.append(ids.get(graph.nodes[j]))
                gc.nodes.append(graph.nodes[j])
        leaf_ids = self.leaf_backend_ids
        if self.n_copies > 1:
            for inp in self.graph_inputs:
                bid = ids.get(inp)
                for c in range(self.n_copies):
                    leaf_ids.append(bid)
                    gc.leafs.append(self.tensor_copy(inp, bid, c))  # type: ignore[arg-type]
            for split in self.splits:
                for inp in split.inputs:
                    for c in range(self.n_copies):
                        leaf_ids.append(split.backend_id)
                        gc.leafs.append(self.tensor_copy(inp, split.backend_id, c))  # type: ignore[arg-type]
        for leaf in graph.leafs:
            leaf_ids.append(ids.get(leaf))
            gc.leafs.append(leaf)
        self.graph = gc

    # ------------------------------------------------------------------ allocation
    def _alloc_splits(self) -> bool:
        def changed(cur: list[int], prev: list[int]) -> bool:
            for k, bid in enumerate(cur):
                p = prev[k] if k < len(prev) else 0
                if bid != p and self.bufts[bid] is not self.bufts[p]:
                    return True
            return False

        ids_changed = (changed(self.node_backend_ids, self.prev_node_backend_ids)
                       or changed(self.leaf_backend_ids, self.prev_leaf_backend_ids))
        if ids_changed or not self.galloc.alloc_graph(self.graph):
            if self.debug_realloc > 0:
                unexpected = not ids_changed and self.debug_prev_graph_size == self.debug_graph_size
                if unexpected or self.debug_realloc > 1:
                    raise SchedError(f"unexpected graph reallocation (graph size = {self.debug_graph_size}, "
                                     f"nodes = {self.graph.n_nodes}, leafs = {self.graph.n_leafs}), "
                                     f"debug_realloc = {self.debug_realloc}")
            # the new plan may move split inputs: finish pending work first (keeping cur_copy)
            for b in self.backends:
                b.synchronize()
            if not self.galloc.reserve_n(self.graph, self.node_backend_ids, self.leaf_backend_ids):
                return False
            if not self.galloc.alloc_graph(self.graph):
                return False
        return True

    def reserve(self, measure_graph: Graph) -> bool:
        """ggml_backend_sched_reserve: size the compute buffers for a worst-case graph."""
        self._check_graph_size(measure_graph)
        self.synchronize()
        self.split_graph(measure_graph)
        if not self.galloc.reserve_n(self.graph, self.node_backend_ids, self.leaf_backend_ids):
            return False
        self.reset()
        return True

    def reserve_size(self, measure_graph: Graph) -> list[int]:
        """ggml_backend_sched_reserve_size: the bytes each backend would need, allocating nothing."""
        self._check_graph_size(measure_graph)
        self.reset()
        self.synchronize()
        self.split_graph(measure_graph)
        return self.galloc.reserve_n_size(self.graph, self.node_backend_ids, self.leaf_backend_ids)

    def alloc_graph(self, graph: Graph) -> bool:
        self._check_graph_size(graph)
        if self.is_alloc:
            raise SchedError("the graph is already allocated: call backend_sched_reset before allocating another")
        self.cur_copy = self.next_copy
        self.next_copy = (self.next_copy + 1) % self.n_copies
        self.split_graph(graph)
        if not self._alloc_splits():
            return False
        self.is_alloc = True
        return True

    # ------------------------------------------------------------------ compute
    def graph_compute_async(self, graph: Graph) -> GGMLStatus:
        if not self.is_reset and not self.is_alloc:
            self.reset()
        if not self.is_alloc and not self.alloc_graph(graph):
            return GGMLStatus.ALLOC_FAILED
        return compute_splits(self)

    def graph_compute(self, graph: Graph) -> GGMLStatus:
        status = self.graph_compute_async(graph)
        self.synchronize()
        return status

    # ------------------------------------------------------------------ teardown
    def free(self) -> None:
        for row in self.events:
            for ev in row:
                api.backend_event_free(ev)
        self.events = [[None] * self.n_copies for _ in self.backends]
        self.galloc.free()
        self.assign.clear()
        self.ctx = None


# ---------------------------------------------------------------------- flat ggml API
def backend_sched_new(backends: Sequence[Backend], bufts: Sequence[BufferType | None] | None = None,
                      graph_size: int = 2048, parallel: bool = False, op_offload: bool = True) -> BackendSched:
    """ggml_backend_sched_new. Backends are in priority order; the last must be the CPU."""
    return BackendSched(backends, bufts, graph_size, parallel, op_offload)


def backend_sched_free(sched: BackendSched | None) -> None:
    if sched is not None:
        sched.free()


def backend_sched_reserve(sched: BackendSched, measure_graph: Graph) -> bool:
    return sched.reserve(measure_graph)


def backend_sched_reserve_size(sched: BackendSched, measure_graph: Graph, sizes: list[int] | None = None) -> list[int]:
    """Returns the per-backend sizes; a ``sizes`` list passed in is filled as ggml's out-array."""
    result = sched.reserve_size(measure_graph)
    if sizes is not None:
        sizes[:] = result
    return result


def backend_sched_get_n_backends(sched: BackendSched) -> int:
    return sched.n_backends


def backend_sched_get_backend(sched: BackendSched, i: int) -> Backend:
    if not 0 <= i < sched.n_backends:
        raise IndexError(f"the scheduler has {sched.n_backends} backends, no backend {i}")
    return sched.backends[i]


def backend_sched_get_n_splits(sched: BackendSched) -> int:
    return sched.n_splits


def backend_sched_get_n_copies(sched: BackendSched) -> int:
    return sched.n_copies


def backend_sched_get_buffer_type(sched: BackendSched, backend: Backend) -> BufferType:
    return sched.bufts[sched._checked_id(backend)]


def backend_sched_get_buffer_size(sched: BackendSched, backend: Backend) -> int:
    return sched.galloc.get_buffer_size(sched._checked_id(backend))


def backend_sched_set_tensor_backend(sched: BackendSched, node: Tensor, backend: Backend) -> None:
    sched.set_tensor_backend(node, backend)


def backend_sched_get_tensor_backend(sched: BackendSched, node: Tensor) -> Backend | None:
    return sched.get_tensor_backend(node)


def backend_sched_split_graph(sched: BackendSched, graph: Graph) -> None:
    sched.split_graph(graph)


def backend_sched_alloc_graph(sched: BackendSched, graph: Graph) -> bool:
    return sched.alloc_graph(graph)


def backend_sched_graph_compute(sched: BackendSched, graph: Graph) -> GGMLStatus:
    return sched.graph_compute(graph)


def backend_sched_graph_compute_async(sched: BackendSched, graph: Graph) -> GGMLStatus:
    return sched.graph_compute_async(graph)


def backend_sched_synchronize(sched: BackendSched) -> None:
    sched.synchronize()


def backend_sched_reset(sched: BackendSched) -> None:
    sched.reset()


def backend_sched_set_eval_callback(sched: BackendSched, callback: EvalCallback | None,
                                    user_data: Any = None) -> None:
    """cb(t, ask) -> bool (or cb(t, ask, user_data) when user_data is given): asked whether node t
    is wanted (ask=True), then shown it once computed (ask=False); False then stops the split."""
    sched.callback_eval = callback
    sched.callback_eval_user_data = user_data


# the flat ggml_backend_sched_* functions join the exports (sched/__init__.py re-exports this list)
__all__ += ["EvalCallback", *(n for n, v in list(globals().items()) if n.startswith("backend_sched_") and callable(v))]
