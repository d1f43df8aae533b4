"""ggml's graph allocator (``ggml_gallocr``): plan where every tensor of a graph lives, then place it.

Planning walks the graph once in execution order, giving each tensor memory just before its
first use and returning it right after its last consumer, so tensors whose lifetimes do not
overlap share bytes. The rules are ggml-alloc.c's, because pyggml must plan the same sizes:

* leafs, then INPUT tensors, get memory before any node, so nothing overwrites them;
* OUTPUT tensors are never freed and never reused in place;
* views get no memory of their own; they keep their source alive until their last consumer;
* an op in :data:`INPLACE_OPS` writes over its first parent that is owned by this allocator,
  not OUTPUT, has the same layout, and has no other consumer and no view;
* tensors that already have data (or a buffer) belong to someone else and are left alone.

Several buffer types can be planned at once (``gallocr_new_n``), one per backend of the
scheduler; identical buffer types share one planner and one set of buffers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..backend import api
from ..backend.base import Buffer, BufferType, BufferUsage
from ..backend.errors import AllocationError, BackendError
from ..graph import Graph
from ..ops.enums import Op
from ..tensor import GGML_MAX_SRC, Tensor, TensorFlag, are_same_layout
from .debug import AllocLog
from .dyn_tallocr import ADDRESS_INVALID, BufferAddress, DynTallocr, round_up
from .plan import Plan, TensorRecord

#: ggml_op_can_inplace: ops whose kernels tolerate dst aliasing src (ggml-alloc.c). CLAMP is in the
#: list of the ggml that llama-cpp-python 0.3.36 vendors and of llama.cpp master, which pyggml's
#: plans are compared against (bench/alloc_vs_ggml.py); some older ggml snapshots lack it.
INPLACE_OPS = frozenset({
    Op.FILL, Op.SCALE, Op.DIAG_MASK_ZERO, Op.DIAG_MASK_INF, Op.ADD, Op.ADD_ID, Op.ADD1, Op.SUB,
    Op.MUL, Op.DIV, Op.SQR, Op.SQRT, Op.LOG, Op.UNARY, Op.ROPE, Op.ROPE_BACK, Op.SILU_BACK,
    Op.RMS_NORM, Op.RMS_NORM_BACK, Op.CLAMP, Op.SOFT_MAX, Op.SOFT_MAX_BACK,
})

_INPUT = TensorFlag.INPUT
_OUTPUT = TensorFlag.OUTPUT


def op_can_inplace(op: Op) -> bool:
    """ggml_op_can_inplace."""
    return op in INPLACE_OPS


class HashNode:
    """Per-tensor planning state (ggml's ``struct hash_node``)."""

    __slots__ = ("addr", "allocated", "buffer_id", "n_children", "n_views")

    def __init__(self) -> None:
        self.n_children = 0
        self.n_views = 0
        self.buffer_id = 0
        self.addr = BufferAddress(0, 0)
        self.allocated = False


@dataclass(frozen=True, slots=True)
class TensorAlloc:
    """Where one tensor was planned; ``size_max == 0`` marks a view or pre-allocated tensor."""

    buffer_id: int
    addr: BufferAddress
    size_max: int


_NO_ALLOC = TensorAlloc(-1, ADDRESS_INVALID, 0)


@dataclass(slots=True)
class NodeAlloc:
    dst: TensorAlloc
    src: list[TensorAlloc]


class Gallocr:
    """``ggml_gallocr_t``. Build with :func:`gallocr_new` / :func:`gallocr_new_n`."""

    def __init__(self, bufts: Sequence[BufferType]) -> None:
        if not bufts:
            raise AllocationError("a graph allocator needs at least one buffer type")
        self.bufts: list[BufferType] = list(bufts)
        self.n_buffers = len(self.bufts)
        # one "vbuffer" per buffer id: a backend buffer per chunk, or None before reserve
        self.buffers: list[list[Buffer] | None] = [None] * self.n_buffers
        self.buf_tallocs: list[DynTallocr] = []
        for i, buft in enumerate(self.bufts):
            shared = next((self.buf_tallocs[j] for j in range(i) if self.bufts[j] is buft), None)
            self.buf_tallocs.append(shared or DynTallocr(buft.get_alignment(), buft.get_max_size()))
        self._hash: dict[int, HashNode] = {}
        self.node_allocs: list[NodeAlloc] = []
        self.n_nodes = 0
        self.leaf_allocs: list[TensorAlloc] = []
        self.n_leafs = 0
        self._plan: Plan | None = None
        self._records: dict[int, TensorRecord] = {}
        self._step = -1
        self._log = AllocLog()
        #: counts buffer replacements (a grown or freed buffer): tensors placed under an older generation
        #: point into memory that is gone (the scheduler's saved graph states check it)
        self.generation = 0

    # ------------------------------------------------------------------ hash
    def _hash_get(self, t: Tensor) -> HashNode:
        hn = self._hash.get(id(t))
        if hn is None:
            hn = self._hash[id(t)] = HashNode()
        return hn

    def _alloc_size(self, buffer_id: int, t: Tensor) -> int:
        return api.backend_buft_get_alloc_size(self.bufts[buffer_id], t)

    def _is_allocated(self, t: Tensor, hn: HashNode) -> bool:
        # data set externally, an external buffer not yet placed, or planned by us
        return t.data is not None or t.buffer is not None or hn.allocated

    # ------------------------------------------------------------------ planning steps
    def _allocate_node(self, node: Tensor, buffer_id: int) -> None:
        if buffer_id < 0 or buffer_id >= self.n_buffers:
            raise AllocationError(f"tensor {node.name!r}: buffer id {buffer_id} is not in 0..{self.n_buffers - 1}")
        hn = self._hash_get(node)
        if self._is_allocated(node, hn) or node.view_src is not None:
            return
        hn.allocated = True
        if node.op in INPLACE_OPS and self._try_inplace(node, hn):
            return
        size = self._alloc_size(buffer_id, node)
        hn.buffer_id = buffer_id
        hn.addr = self.buf_tallocs[buffer_id].alloc(size)
        self._record(node, hn, size, None)
        if self._log.on:
            self._log(f"alloc {node.name} ({size} bytes) at buffer {buffer_id} chunk {hn.addr.chunk} "
                      f"offset {hn.addr.offset}")

    def _try_inplace(self, node: Tensor, hn: HashNode) -> bool:
        """Reuse the first suitable parent's memory; True when one was taken."""
        for parent in node.src:
            if parent is None:
                continue
            p_hn = self._hash_get(parent)
            if not p_hn.allocated:  # external data, or not ours to give away
                continue
            vs = parent.view_src
            if parent.flags & _OUTPUT or (vs is not None and vs.flags & _OUTPUT):
                continue
            if not are_same_layout(node, parent):
                continue
            if p_hn.n_children != 1 or p_hn.n_views != 0:
                continue
            if vs is not None:
                # ggml keeps this branch although views are never marked allocated, so it
                # cannot be reached today; it is mirrored so the two stay in step
                vs_hn = self._hash_get(vs)
                if vs_hn.n_views == 1 and vs_hn.n_children == 0 and vs.data == parent.data:
                    hn.buffer_id, hn.addr = p_hn.buffer_id, p_hn.addr
                    p_hn.allocated = False
                    vs_hn.allocated = False
                    self._take_over(node, hn, vs)
                    self._free_extra_space(node, vs)
                    return True
                continue
            hn.buffer_id, hn.addr = p_hn.buffer_id, p_hn.addr
            p_hn.allocated = False  # the node owns the bytes now; the parent must not free them
            self._take_over(node, hn, parent)
            self._free_extra_space(node, parent)
            return True
        return False

    def _free_extra_space(self, node: Tensor, parent: Tensor) -> None:
        """After an in-place reuse, give back the parent's bytes beyond the node's size."""
        hn = self._hash_get(node)
        p_hn = self._hash_get(parent)
        parent_size = self._alloc_size(p_hn.buffer_id, parent)
        node_size = self._alloc_size(hn.buffer_id, node)
        if parent_size < node_size:
            raise AllocationError(f"in-place {node.name!r} ({node_size} bytes) is larger than its parent "
                                  f"{parent.name!r} ({parent_size} bytes)")
        p_alloc = self.buf_tallocs[p_hn.buffer_id]
        parent_size = round_up(parent_size, p_alloc.alignment)
        node_size = round_up(node_size, p_alloc.alignment)
        if parent_size > node_size:
            tail = BufferAddress(p_hn.addr.chunk, p_hn.addr.offset + node_size)
            p_alloc.free_bytes(tail, parent_size - node_size)
            if self._log.on:
                self._log(f"free extra {parent_size - node_size} bytes of {parent.name} after in-place {node.name}")

    def _free_node(self, node: Tensor) -> None:
        if node.flags & _OUTPUT:
            return  # graph outputs are never freed
        hn = self._hash_get(node)
        size = self._alloc_size(hn.buffer_id, node)
        self.buf_tallocs[hn.buffer_id].free_bytes(hn.addr, size)
        hn.allocated = False
        rec = self._records.get(id(node))
        if rec is not None:
            rec.last = self._step
        if self._log.on:
            self._log(f"free {node.name} ({size} bytes) at buffer {hn.buffer_id} chunk {hn.addr.chunk} "
                      f"offset {hn.addr.offset}")

    # ------------------------------------------------------------------ plan records
    def _record(self, t: Tensor, hn: HashNode, size: int, inplace_of: str | None) -> None:
        flags = ("I" if t.flags & _INPUT else "") + ("O" if t.flags & _OUTPUT else "")
        self._records[id(t)] = TensorRecord(t.name, t.op.name, hn.buffer_id, hn.addr.chunk, hn.addr.offset, size,
                                            self._step, -2, inplace_of, flags)

    def _take_over(self, node: Tensor, hn: HashNode, parent: Tensor) -> None:
        rec = self._records.get(id(parent))
        if rec is not None:
            rec.last = self._step
        self._record(node, hn, self._alloc_size(hn.buffer_id, node), parent.name)
        if self._log.on:
            self._log(f"reuse {parent.name} for {node.name} in place at buffer {hn.buffer_id} "
                      f"chunk {hn.addr.chunk} offset {hn.addr.offset}")

    # ------------------------------------------------------------------ the planning pass
    def _alloc_graph_impl(self, graph: Graph, node_ids: Sequence[int] | None, leaf_ids: Sequence[int] | None) -> None:
        self._hash = {}
        self._records = {}
        self._step = -1
        hash_get = self._hash_get
        allocate = self._allocate_node

        for i, leaf in enumerate(graph.leafs):
            allocate(leaf, leaf_ids[i] if leaf_ids is not None else 0)

        # count consumers and views; inputs get memory now so nothing overwrites them
        for i, node in enumerate(graph.nodes):
            bid = node_ids[i] if node_ids is not None else 0
            # op NONE nodes are the scheduler's dependency markers, not real views
            if node.view_src is not None and node.op != Op.NONE:
                hash_get(node.view_src).n_views += 1
            if node.flags & _INPUT:
                allocate(node, bid)
            for src in node.src:
                if src is None:
                    continue
                hash_get(src).n_children += 1
                if src.flags & _INPUT:
                    allocate(src, bid)

        for i, node in enumerate(graph.nodes):
            self._step = i
            bid = node_ids[i] if node_ids is not None else 0
            srcs = [s for s in node.src if s is not None]
            for parent in srcs:
                allocate(parent, bid)
            allocate(node, bid)
            for parent in srcs:
                p_hn = hash_get(parent)
                p_hn.n_children -= 1
                if p_hn.n_children != 0 or p_hn.n_views != 0:
                    continue
                vs = parent.view_src
                if vs is not None:
                    vs_hn = hash_get(vs)
                    vs_hn.n_views -= 1
                    if vs_hn.n_views == 0 and vs_hn.n_children == 0 and vs_hn.allocated:
                        self._free_node(vs)
                elif p_hn.allocated:
                    self._free_node(parent)

    def _tensor_alloc(self, t: Tensor | None) -> TensorAlloc:
        if t is None or t.view_src is not None or t.data is not None:
            return _NO_ALLOC
        hn = self._hash_get(t)
        return TensorAlloc(hn.buffer_id, hn.addr, self._alloc_size(hn.buffer_id, t))

    def _check_ids(self, graph: Graph, node_ids: Sequence[int] | None, leaf_ids: Sequence[int] | None) -> None:
        if node_ids is not None and len(node_ids) < graph.n_nodes:
            raise AllocationError(f"{len(node_ids)} node buffer ids for a graph of {graph.n_nodes} nodes")
        if leaf_ids is not None and len(leaf_ids) < graph.n_leafs:
            raise AllocationError(f"{len(leaf_ids)} leaf buffer ids for a graph of {graph.n_leafs} leafs")

    def _reserve_n_impl(self, graph: Graph, node_ids: Sequence[int] | None, leaf_ids: Sequence[int] | None,
                        no_alloc: bool) -> bool:
        self._check_ids(graph, node_ids, leaf_ids)
        self._log = AllocLog()
        for talloc in self.buf_tallocs:
            talloc.reset()
        self._alloc_graph_impl(graph, node_ids, leaf_ids)

        self.n_nodes = graph.n_nodes
        self.node_allocs = [NodeAlloc(self._tensor_alloc(node), [self._tensor_alloc(s) for s in node.src])
                            for node in graph.nodes]
        self.n_leafs = graph.n_leafs
        self.leaf_allocs = [self._tensor_alloc(leaf) for leaf in graph.leafs]
        self._plan = self._make_plan(graph.n_nodes)

        for i in range(self.n_buffers):
            # a buffer type used several times shares one set of buffers
            for j in range(i):
                if self.buf_tallocs[j] is self.buf_tallocs[i]:
                    self.buffers[i] = self.buffers[j]
                    break
            talloc = self.buf_tallocs[i]
            vbuf = self.buffers[i]
            # even with nothing planned the buffer must exist, to initialise views
            realloc = vbuf is None
            for c in range(talloc.n_chunks):
                cur = vbuf[c].size if vbuf is not None and c < len(vbuf) else 0
                if talloc.max_size(c) > cur:
                    realloc = True
            if not realloc:
                continue
            self.generation += 1
            if vbuf is not None:
                if self._log.on:
                    self._log(f"reallocating {self.bufts[i].name()} buffer from {sum(b.size for b in vbuf)} "
                              f"to {talloc.total_size()} bytes")
                _vbuffer_free(vbuf)
            self.buffers[i] = None
            if not no_alloc:
                try:
                    self.buffers[i] = _vbuffer_alloc(self.bufts[i], talloc)
                except (AllocationError, MemoryError) as e:
                    if self._log.on:
                        self._log(f"failed to allocate {self.bufts[i].name()} buffer of size "
                                  f"{talloc.total_size()}: {e}")
                    return False
        return True

    def _make_plan(self, n_nodes: int) -> Plan:
        records = list(self._records.values())
        for r in records:
            if r.last == -2:
                r.last = n_nodes - 1
        chunk_sizes: dict[int, list[int]] = {}
        owner: dict[int, int] = {}
        for i, talloc in enumerate(self.buf_tallocs):
            first = next(j for j in range(i + 1) if self.buf_tallocs[j] is talloc)
            owner[i] = first
            if first == i:
                chunk_sizes[i] = [c.max_size for c in talloc.chunks]
        return Plan(n_nodes, records, chunk_sizes, [b.name() for b in self.bufts], owner)

    # ------------------------------------------------------------------ public
    def reserve_n(self, graph: Graph, node_buffer_ids: Sequence[int] | None = None,
                  leaf_buffer_ids: Sequence[int] | None = None) -> bool:
        """Plan the graph and (re)allocate buffers that became too small. False if allocation failed."""
        return self._reserve_n_impl(graph, node_buffer_ids, leaf_buffer_ids, no_alloc=False)

    def reserve(self, graph: Graph) -> bool:
        return self.reserve_n(graph, None, None)

    def reserve_n_size(self, graph: Graph, node_buffer_ids: Sequence[int] | None = None,
                       leaf_buffer_ids: Sequence[int] | None = None) -> list[int]:
        """Plan only: the bytes each buffer id would need (shared buffer types count at each id)."""
        self._reserve_n_impl(graph, node_buffer_ids, leaf_buffer_ids, no_alloc=True)
        return [talloc.total_size() for talloc in self.buf_tallocs]

    def _node_valid(self, t: Tensor, talloc: TensorAlloc) -> bool:
        """ggml_gallocr_node_needs_realloc (true means the old plan still fits this tensor)."""
        node_size = 0
        if t.data is None and t.view_src is None:
            if talloc.buffer_id < 0:
                return False  # was pre-allocated or a view at reserve time, now needs memory
            node_size = self._alloc_size(talloc.buffer_id, t)
        return talloc.size_max >= node_size

    def needs_realloc(self, graph: Graph) -> bool:
        """Whether the last plan cannot place this graph: other node/leaf counts, or a tensor
        that grew. Leaf sizes are not re-checked, only their count, exactly as in ggml."""
        if self.n_nodes != graph.n_nodes or self.n_leafs != graph.n_leafs:
            return True
        for node, na in zip(graph.nodes, self.node_allocs, strict=True):
            if not self._node_valid(node, na.dst):
                return True
            for j in range(GGML_MAX_SRC):
                src = node.src[j]
                if src is not None and not self._node_valid(src, na.src[j]):
                    return True
        return False

    def _init_tensor(self, t: Tensor, ta: TensorAlloc) -> None:
        if t.view_src is not None:
            if t.buffer is None and t.view_src.buffer is not None:
                api.backend_view_init(t)
            return
        if t.data is not None:
            return  # allocated by someone else
        vbuf = self.buffers[ta.buffer_id] if ta.buffer_id >= 0 else None
        if vbuf is None:
            raise AllocationError(f"tensor {t.name!r} has no planned buffer; call gallocr_reserve first")
        chunk = vbuf[ta.addr.chunk]
        base = api.backend_buffer_get_base(chunk)
        if base is None and ta.addr.offset != 0:
            raise AllocationError(f"tensor {t.name!r} planned at offset {ta.addr.offset} of an empty buffer")
        api.backend_tensor_alloc(chunk, t, None if base is None else base + ta.addr.offset)

    def alloc_graph(self, graph: Graph) -> bool:
        """Place every tensor of the graph in the reserved buffers (re-planning first if needed).

        Re-planning is automatic only with a single buffer; with several, False tells the caller
        (the scheduler) to call reserve_n with its own buffer ids.
        """
        if self.needs_realloc(graph):
            if self.n_buffers != 1:
                if self._log.on:
                    self._log("cannot reallocate a multi-buffer graph automatically; call reserve_n")
                return False
            if self._log.on:
                self._log("reallocating buffers automatically")
            if not self.reserve(graph):
                return False
        for vbuf in self.buffers:
            if vbuf is not None:
                for chunk in vbuf:
                    chunk.reset()
        for leaf, ta in zip(graph.leafs, self.leaf_allocs, strict=False):
            self._init_tensor(leaf, ta)
        for node, na in zip(graph.nodes, self.node_allocs, strict=False):
            for j in range(GGML_MAX_SRC):
                src = node.src[j]
                if src is not None:
                    self._init_tensor(src, na.src[j])
            self._init_tensor(node, na.dst)
        return True

    def get_buffer_size(self, buffer_id: int) -> int:
        """Bytes allocated for a buffer id; 0 for none yet, or for an id sharing an earlier id's buffer."""
        if not 0 <= buffer_id < self.n_buffers:
            raise IndexError(f"buffer id {buffer_id} is not in 0..{self.n_buffers - 1}")
        vbuf = self.buffers[buffer_id]
        if vbuf is None:
            return 0
        if any(self.buffers[i] is vbuf for i in range(buffer_id)):
            return 0
        return sum(b.size for b in vbuf)

    def get_buffers(self, buffer_id: int) -> list[Buffer]:
        """The backend buffers (one per chunk) behind a buffer id; empty before reserve."""
        return list(self.buffers[buffer_id] or [])

    def plan(self) -> Plan:
        """What the last reserve decided (records, live ranges, peaks); see :class:`Plan`."""
        if self._plan is None:
            raise AllocationError("nothing planned yet: call gallocr_reserve or gallocr_alloc_graph first")
        return self._plan

    def free(self) -> None:
        seen: list[list[Buffer]] = []
        for vbuf in self.buffers:
            if vbuf is not None and not any(v is vbuf for v in seen):
                _vbuffer_free(vbuf)
                seen.append(vbuf)
        self.buffers = [None] * self.n_buffers
        self.generation += 1


def _vbuffer_alloc(buft: BufferType, talloc: DynTallocr) -> list[Buffer]:
    chunks: list[Buffer] = []
    try:
        for chunk in talloc.chunks:
            buf = api.backend_buft_alloc_buffer(buft, chunk.max_size)
            api.backend_buffer_set_usage(buf, BufferUsage.COMPUTE)
            chunks.append(buf)
    except (AllocationError, MemoryError, BackendError):
        _vbuffer_free(chunks)
        raise
    return chunks


def _vbuffer_free(vbuf: list[Buffer]) -> None:
    for buf in vbuf:
        buf.free()


# ---------------------------------------------------------------------- flat ggml API
def gallocr_new(buft: BufferType) -> Gallocr:
    return Gallocr([buft])


def gallocr_new_n(bufts: Sequence[BufferType], n_bufs: int | None = None) -> Gallocr:
    return Gallocr(list(bufts) if n_bufs is None else list(bufts)[:n_bufs])


def gallocr_free(galloc: Gallocr | None) -> None:
    if galloc is not None:
        galloc.free()


def gallocr_reserve(galloc: Gallocr, graph: Graph) -> bool:
    return galloc.reserve(graph)


def gallocr_reserve_n(galloc: Gallocr, graph: Graph, node_buffer_ids: Sequence[int] | None,
                      leaf_buffer_ids: Sequence[int] | None) -> bool:
    return galloc.reserve_n(graph, node_buffer_ids, leaf_buffer_ids)


def gallocr_reserve_n_size(galloc: Gallocr, graph: Graph, node_buffer_ids: Sequence[int] | None,
                           leaf_buffer_ids: Sequence[int] | None, sizes: list[int] | None = None) -> list[int]:
    """Returns the sizes; when a ``sizes`` list is passed it is filled in as well (ggml's out-array)."""
    result = galloc.reserve_n_size(graph, node_buffer_ids, leaf_buffer_ids)
    if sizes is not None:
        sizes[:] = result
    return result


def gallocr_alloc_graph(galloc: Gallocr, graph: Graph) -> bool:
    return galloc.alloc_graph(graph)


def gallocr_get_buffer_size(galloc: Gallocr, buffer_id: int) -> int:
    return galloc.get_buffer_size(buffer_id)
