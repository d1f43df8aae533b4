"""ggml's computation graph (``struct ggml_cgraph``) and graph building.

``build_forward_expand`` does ggml's post-order walk over ``src[0..9]`` (ggml_visit_parents_graph),
iteratively so a 100k-node chain needs no recursion. Unnamed tensors are named ``leaf_%d`` /
``node_%d`` as they are added, ``use_counts`` counts edges, and every op node reached with
``compute=True`` gets the COMPUTE flag, exactly as in ggml.c.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable, Iterator
from enum import IntEnum

from .context import Context
from .errors import GraphFullError, PyGGMLError
from .ops.enums import Op
from .tensor import (
    FLAG_COMPUTE,
    FLAG_PARAM,
    GGML_MAX_SRC,
    GGML_MEM_ALIGN,
    GGML_OBJECT_SIZE,
    Tensor,
    TensorFlag,
    ggml_pad,
)

GGML_DEFAULT_GRAPH_SIZE = 2048

#: ggml_hash_size's table of primes (ggml.c:6515-6538)
_PRIMES = (2, 3, 5, 11, 17, 37, 67, 131, 257, 521, 1031, 2053, 4099, 8209, 16411, 32771, 65537, 131101,
           262147, 524309, 1048583, 2097169, 4194319, 8388617, 16777259, 33554467, 67108879, 134217757,
           268435459, 536870923, 1073741827, 2147483659)
#: sizeof(struct ggml_cgraph) on 64-bit (3 ints + pad, 5 pointers, hash set of 3 words, order, uid)
_CGRAPH_SIZE = 88

_uid_counter = itertools.count(1)


class EvalOrder(IntEnum):
    LEFT_TO_RIGHT = 0
    RIGHT_TO_LEFT = 1


def graph_next_uid() -> int:
    """ggml_graph_next_uid: a process-wide counter starting at 1 (0 means "no uid")."""
    return next(_uid_counter)


def hash_size(min_sz: int) -> int:
    """ggml_hash_size: the smallest tabled prime >= min_sz (or min_sz | 1 past the table)."""
    for p in _PRIMES:
        if p >= min_sz:
            return p
    return min_sz | 1


def graph_nbytes(size: int, grads: bool) -> int:
    """ggml_graph_nbytes: bytes of a graph object with room for ``size`` nodes and leafs."""
    hs = hash_size(size * 2)
    nbytes = _CGRAPH_SIZE
    nbytes += size * 8 * 2  # nodes, leafs
    nbytes += hs * 4  # use_counts
    nbytes += hs * 8  # hash keys
    if grads:
        nbytes += hs * 8 * 2  # grads, grad_accs
    nbytes += ((hs + 31) // 32) * 4  # visited bitset
    return nbytes


def graph_overhead_custom(size: int, grads: bool = False) -> int:
    return GGML_OBJECT_SIZE + ggml_pad(graph_nbytes(size, grads), GGML_MEM_ALIGN)


def graph_overhead() -> int:
    return graph_overhead_custom(GGML_DEFAULT_GRAPH_SIZE, False)


class Graph:
    """A ggml cgraph: ``nodes`` (ops, in topological order) and ``leafs`` (constants/inputs)."""

    def __init__(self, size: int = GGML_DEFAULT_GRAPH_SIZE, grads: bool = False,
                 _parent: Graph | None = None) -> None:
        self.size = size
        self.nodes: list[Tensor] = []
        self.leafs: list[Tensor] = []
        self.order = EvalOrder.LEFT_TO_RIGHT
        self.grads = grads
        if _parent is None:
            self.visited: dict[int, Tensor] = {}
            self.use_counts: dict[int, int] = {}
            self.uid = graph_next_uid()
        else:  # a graph view shares its parent's hash set and use counts (ggml_graph_view)
            self.visited = _parent.visited
            self.use_counts = _parent.use_counts
            self.uid = 0

    # ------------------------------------------------------------------ ggml accessors
    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    @property
    def n_leafs(self) -> int:
        return len(self.leafs)

    def node(self, i: int) -> Tensor:
        """ggml_graph_node: negative i counts from the end."""
        return self.nodes[i]

    def get_tensor(self, name: str) -> Tensor | None:
        """ggml_graph_get_tensor: a leaf or node by name."""
        for t in itertools.chain(self.leafs, self.nodes):
            if t.name == name:
                return t
        return None

    def use_count(self, t: Tensor) -> int:
        return self.use_counts.get(id(t), 0)

    def contains(self, t: Tensor) -> bool:
        return id(t) in self.visited

    def clear(self) -> None:
        """ggml_graph_clear."""
        self.nodes.clear()
        self.leafs.clear()
        self.visited.clear()
        self.use_counts.clear()

    def reset(self) -> None:
        """ggml_graph_reset without gradients: nothing to zero here."""

    def add_node(self, t: Tensor) -> None:
        """ggml_graph_add_node: append without walking sources."""
        if len(self.nodes) >= self.size:
            raise GraphFullError(f"graph is full ({self.size} nodes)")
        self.nodes.append(t)

    def view(self, i0: int, i1: int) -> Graph:
        """ggml_graph_view: nodes [i0, i1), no leafs, sharing this graph's hash set; uid 0."""
        g = Graph(i1 - i0, False, _parent=self)
        g.nodes = self.nodes[i0:i1]
        return g

    def copy_to(self, dst: Graph) -> None:
        """ggml_graph_cpy."""
        if dst.size < len(self.nodes) or dst.size < len(self.leafs):
            raise GraphFullError("destination graph is too small")
        dst.nodes = list(self.nodes)
        dst.leafs = list(self.leafs)
        dst.visited = dict(self.visited)
        dst.use_counts = dict(self.use_counts)
        dst.order = self.order

    def __iter__(self) -> Iterator[Tensor]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    # ------------------------------------------------------------------ building
    def _visit(self, root: Tensor, compute: bool) -> None:
        """ggml_visit_parents_graph, iteratively. Post-order over src in eval order."""
        visited, use_counts = self.visited, self.use_counts
        if root.op != Op.NONE and compute:
            root.flags |= FLAG_COMPUTE
        if id(root) in visited:
            if compute:
                _propagate_compute(root)
            return
        rtl = self.order == EvalOrder.RIGHT_TO_LEFT
        src_order = range(GGML_MAX_SRC - 1, -1, -1) if rtl else range(GGML_MAX_SRC)
        visited[id(root)] = root
        use_counts[id(root)] = 0
        # stack of (tensor, iterator over its sources)
        stack: list[tuple[Tensor, Iterator[int]]] = [(root, iter(src_order))]
        while stack:
            node, it = stack[-1]
            pushed = False
            for k in it:
                src = node.src[k]
                if src is None:
                    continue
                if src.op != Op.NONE and compute:
                    src.flags |= FLAG_COMPUTE
                if id(src) in visited:
                    use_counts[id(src)] += 1
                    if compute:
                        _propagate_compute(src)
                    continue
                visited[id(src)] = src
                use_counts[id(src)] = 0
                stack.append((src, iter(src_order)))
                pushed = True
                break
            if pushed:
                continue
            stack.pop()
            if stack:  # the edge parent -> node is counted once node is finished, as ggml does
                use_counts[id(node)] += 1
            self._append(node)

    def _append(self, node: Tensor) -> None:
        if node.op == Op.NONE and not (node.flags & FLAG_PARAM):
            if len(self.leafs) >= self.size:
                raise GraphFullError(f"graph is full: more than {self.size} leafs")
            if not node.name:
                node.name = f"leaf_{len(self.leafs)}"
            self.leafs.append(node)
        else:
            if len(self.nodes) >= self.size:
                raise GraphFullError(
                    f"graph is full: more than {self.size} nodes (use new_graph_custom with a larger size)"
                )
            if not node.name:
                node.name = f"node_{len(self.nodes)}"
            self.nodes.append(node)

    def build_forward_expand(self, tensor: Tensor, compute: bool = True) -> None:
        """ggml_build_forward_expand: add ``tensor`` and everything it depends on."""
        n0 = len(self.nodes)
        self._visit(tensor, compute)
        if len(self.nodes) > n0 and self.nodes[-1] is not tensor:
            raise PyGGMLError("build_forward_expand: the last added node is not the expanded tensor")

    def build_forward_select(self, tensors: list[Tensor], idx: int) -> Tensor:
        """ggml_build_forward_select: add every branch, but only ``tensors[idx]`` computes."""
        if not 0 <= idx < len(tensors):
            raise IndexError(f"build_forward_select: idx {idx} out of range for {len(tensors)} tensors")
        for i, t in enumerate(tensors):
            self.build_forward_expand(t, compute=(i == idx))
        return tensors[idx]

    # ------------------------------------------------------------------ printing
    def print(self, file: object = None) -> None:
        """ggml_graph_print: one line per node and leaf."""
        out = file or sys.stdout
        print("=== GRAPH ===", file=out)
        print(f"n_nodes = {self.n_nodes}", file=out)
        for i, n in enumerate(self.nodes):
            ne = ", ".join(f"{x:5d}" for x in n.ne[:3])
            flag = "x" if n.flags & TensorFlag.PARAM else "g" if n.flags & TensorFlag.LOSS else " "
            print(f" - {i:3d}: [ {ne}] {n.op.name:>16} {flag} {n.name}", file=out)
        print(f"n_leafs = {self.n_leafs}", file=out)
        for i, n in enumerate(self.leafs):
            print(f" - {i:3d}: [ {n.ne[0]:5d}, {n.ne[1]:5d}] {n.op.name:>8} {n.name:>16}", file=out)
        print("========================================", file=out)

    def dump_dot(self, path: str, gb: Graph | None = None) -> None:
        """ggml_graph_dump_dot: write the graph in Graphviz DOT format (nodes yellow, leafs pink)."""
        lines = ["digraph G {", "  newrank = true;", "  rankdir = TB;"]
        ids: dict[int, str] = {}
        for i, n in enumerate(itertools.chain(self.nodes, self.leafs)):
            ids[id(n)] = f"t{i}"
        for n in self.nodes:
            color = "yellow" if not (gb and gb.contains(n)) else "green"
            shape = "x".join(str(x) for x in n.ne[: n.n_dims()])
            lines.append(f'  "{ids[id(n)]}" [ style = filled; fillcolor = {color}; shape = record; '
                         f'label="{_dot_escape(n.name)} ({n.type.type_name})|[{shape}]|<x>{n.op.name}"; ]')
        for n in self.leafs:
            shape = "x".join(str(x) for x in n.ne[: n.n_dims()])
            lines.append(f'  "{ids[id(n)]}" [ style = filled; fillcolor = pink; shape = record; '
                         f'label="<x>{_dot_escape(n.name)} ({n.type.type_name})|[{shape}]"; ]')
        for n in itertools.chain(self.nodes, self.leafs):
            for j, s in enumerate(n.src):
                if s is not None and id(s) in ids:
                    lines.append(f'  "{ids[id(s)]}":x -> "{ids[id(n)]}":x [ arrowhead = vee; '
                                 f'style = solid; label = "src {j}"; ]')
        lines.append("}")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")


def _propagate_compute(node: Tensor) -> None:
    """Revisiting a node with compute=True flags every ancestor that lacks COMPUTE (as ggml does)."""
    stack = [node]
    while stack:
        n = stack.pop()
        for src in n.src:
            if src is not None and not (src.flags & FLAG_COMPUTE):
                if src.op != Op.NONE:
                    src.flags |= FLAG_COMPUTE
                stack.append(src)


def _dot_escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("|", "\\|").replace("<", "\\<").replace(">", "\\>")


def new_graph_custom(ctx: Context, size: int, grads: bool = False) -> Graph:
    """ggml_new_graph_custom: the graph's memory is accounted in ctx as in ggml."""
    if size <= 0:
        raise ValueError("graph size must be positive")
    ctx.new_object(graph_nbytes(size, grads))
    return Graph(size, grads)


def new_graph(ctx: Context, size: int = GGML_DEFAULT_GRAPH_SIZE) -> Graph:
    """ggml_new_graph (size defaults to GGML_DEFAULT_GRAPH_SIZE = 2048)."""
    return new_graph_custom(ctx, size, False)


def build_forward_expand(graph: Graph, tensor: Tensor) -> None:
    graph.build_forward_expand(tensor)


def build_forward_select(graph: Graph, tensors: Iterable[Tensor], idx: int) -> Tensor:
    return graph.build_forward_select(list(tensors), idx)


def graph_view(graph: Graph, i0: int, i1: int) -> Graph:
    return graph.view(i0, i1)


def graph_n_nodes(graph: Graph) -> int:
    return graph.n_nodes


def graph_node(graph: Graph, i: int) -> Tensor:
    return graph.node(i)


def graph_get_tensor(graph: Graph, name: str) -> Tensor | None:
    return graph.get_tensor(name)
