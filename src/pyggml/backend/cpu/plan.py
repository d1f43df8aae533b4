"""A graph's execution plan for the CPU backend (ggml_graph_plan), resolved once and reused.

Building the plan does every per-node decision in Python once: which kernel computes the node
(a compiled one, or the numpy kernel: ops/<family>_jit.py and ops/<family>.py), the node's record (data
addresses, ne, nb, op_params and kernel-specific words), the scratch it needs. Running it is a
loop over *steps*: runs of compiled nodes go to the thread pool as one command (threads.py: every
thread walks the run, kernel then barrier, with no Python in between), and each numpy node runs
on the calling thread between runs.

Consecutive compiled records that touch separate memory, none writing what another reads or writes, run
without barriers between them (``independent`` says which kernels may: those that only read their sources
and write their outputs, with no shared scratch or work counter): each thread goes on to its share of the
next while the other finishes its share of the last. So do row kernels over the same rows that share memory
row for row (an elementwise chain: a thread's rows of the next read only its own rows of the last). A
barrier costs a microsecond or two with every thread on a core of its own and tens of microseconds with a
busy core (a waiting thread sleeps), against a few microseconds of work in most of a decode step's records.

A plan is kept on its graph and reused while the graph's uid and its tensors' addresses are the
same (the scheduler gives every new split graph a fresh uid, as ggml's backends expect when they
cache per graph). Changing a node's op_params in place between computes is not noticed, as in
ggml's RPC and CUDA graph reuse: build a new graph, or set ``graph.uid = graph_next_uid()``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from ...errors import PyGGMLError
from ...graph import Graph
from ...ops.enums import EMPTY_OPS
from ...tensor import FLAG_COMPUTE, Tensor
from . import jit
from .jit.record import AUX, NODE_WORDS, PARAMS, T_DST, T_SRC0, T_SRC1, T_SRC2, write_tensor
from .kernel_table import Kernel
from .threads import ThreadPool, available_cores, get_pool, new_ctrl, run_nodes

GGML_STATUS_SUCCESS = 0
GGML_STATUS_ABORTED = 1
_SLOTS = (T_SRC0, T_SRC1, T_SRC2)


@dataclass
class _Python:
    """A node computed by its numpy kernel."""

    node: Tensor
    fn: Kernel


@dataclass
class _Run:
    """Compiled nodes [n0, n1) of the plan's tables."""

    n0: int
    n1: int


_data = operator.attrgetter("data")
#: a fusion rule set: (previous node, its choice, node, its choice, the graph's readers) -> the fused choice,
#: or None
Fuse = Callable[[Tensor, jit.Choice, Tensor, jit.Choice, jit.Readers], "jit.Choice | None"]
#: whether a record's kernel (with its fused parts) may run without a barrier before or after it: NOT_FREE, or
#: FREE (it reads its sources and writes its output, and nothing else: no shared scratch, no work counter, no
#: barrier of its own), or ROWS (FREE, and its threads split the output's rows as record.span does, each row
#: computed from the same row of every source of the output's shape)
Independent = Callable[[jit.Choice], int]
NOT_FREE, FREE, ROWS = 0, 1, 2
#: what a plan that defers missing kernels (jit.deferring) calls with the nodes it runs on their Python kernels,
#: so that those kernels' own numba functions compile ahead (ops/mat.py's warm_aside)
Warm = Callable[[Iterable[Tensor]], None]


class _Readers:
    """jit.Readers of one graph: tensor -> the graph's nodes that take it as a source, mapped on the first ask."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.map: dict[int, list[Tensor]] | None = None

    def __call__(self, t: Tensor) -> list[Tensor]:
        if self.map is None:
            self.map = {}
            for n in self.graph.nodes:
                for s in n.src:
                    if s is not None:
                        self.map.setdefault(id(s), []).append(n)
        return self.map.get(id(t), [])


def _fingerprint(graph: Graph) -> tuple:
    """What a plan baked in and may change without a new uid: the graph's node list and the data
    addresses of its nodes and leafs (a re-allocation moves them)."""
    return id(graph.nodes), len(graph.nodes), list(map(_data, graph.nodes)), list(map(_data, graph.leafs))


class GraphPlan:
    """The resolved steps of one graph (see the module docstring)."""

    def __init__(self, graph: Graph, resolve: Callable[[Tensor], Kernel], fuse: Fuse | None = None,
                 independent: Independent | None = None, warm: Warm | None = None) -> None:
        """``resolve`` gives a node's numpy kernel (raising when there is none), ``fuse`` the kernel running
        two consecutive compiled nodes as one record, or None, and ``independent`` the kernels that may run
        without barriers around them, or None for a barrier after every record, and ``warm`` what a deferring plan
        hands its Python-kernel nodes to (ops/fusion.py's fuse and barrier_free, ops/mat.py's warm_aside: the
        executor passes what it knows, so a plan needs nothing above it)."""
        self.uid = graph.uid
        self.resolve = resolve
        nodes = [n for n in graph.nodes
                 if n.flags & FLAG_COMPUTE and n.op not in EMPTY_OPS and not n.is_empty()]
        self.fingerprint = _fingerprint(graph)
        use_jit = jit.enabled()
        # deferring (jit.deferring): a node whose kernel is not compiled yet runs its Python kernel while the
        # kernel compiles in the background, and plan_for builds the plan again once that has ended
        defer = use_jit and jit.deferring()
        #: the kernels this plan would take and runs without (Python kernels) until their background compile ends
        self.waiting_for: set[str] = set(jit.missing(jit.POOL_FUNCTIONS)) if defer else set()
        pool_missing = bool(self.waiting_for)  # then nothing compiled can run: the kernels only get queued
        steps: list[_Python | _Run] = []
        compiled: list[tuple[Tensor, jit.Choice]] = []
        readers = _Readers(graph)
        for node in nodes:
            fn = resolve(node)  # checks the op has a kernel and its operands (raises before any compute)
            choice = jit.select(node) if use_jit else None
            if choice is not None and defer:
                absent = jit.missing(choice)
                if absent or pool_missing:
                    self.waiting_for.update(absent)
                    choice = None
            if choice is None:
                _settle(steps, compiled)
                steps.append(_Python(node, fn))
                continue
            if steps and isinstance(steps[-1], _Run):
                fused = None if fuse is None else fuse(*compiled[-1], node, choice, readers)
                if fused is not None and defer:
                    absent = jit.missing(fused)
                    if absent:
                        self.waiting_for.update(absent)
                        fused = None
                if fused is not None:  # the previous node and this one become one record (named by this node)
                    compiled[-1] = (node, fused)
                    continue
                _settle(steps, compiled)
                steps[-1].n1 += 1
            else:
                steps.append(_Run(len(compiled), len(compiled) + 1))
            compiled.append((node, choice))
        _settle(steps, compiled)
        if self.waiting_for and warm is not None:  # the Python kernels' own numba functions compile ahead
            warm(s.node for s in steps if isinstance(s, _Python))
        self.steps = steps
        self.nodes = [node for node, _ in compiled]
        # arrays records point into
        self.keep = [c.notes for _, choice in compiled for _, c in (*choice.parts, (None, choice)) if c.notes]
        self.python_fns = {id(s.node): s.fn for s in steps if isinstance(s, _Python)}
        jit.prepare(choice.kernel for _, choice in compiled)
        n = len(compiled)
        self.fns = np.zeros(max(n, 1), dtype=np.int64)
        self.recs = np.zeros((max(n, 1), NODE_WORDS), dtype=np.int64)
        n_parts = sum(len(choice.parts) for _, choice in compiled)
        self.part_recs = np.zeros((max(n_parts, 1), NODE_WORDS), dtype=np.int64)  # fused nodes' own records
        wsize, j = 0, 0
        for i, (node, choice) in enumerate(compiled):
            self.fns[i] = choice.kernel.address
            addrs = []
            for part, part_choice in choice.parts:
                self._write_record(self.part_recs[j], part, part_choice, [])
                addrs.append(self.part_recs[j].ctypes.data)
                wsize, j = max(wsize, part_choice.wsize), j + 1
            self._write_record(self.recs[i], node, choice, addrs)
            wsize = max(wsize, choice.wsize)
        self.wdata = np.zeros(max(wsize, 64), dtype=np.uint8)
        self.n_compiled = n
        #: 1 after a record the next one must wait for, 0 where it need not (see the module doc)
        self.bars = _barriers(compiled, independent)

    @staticmethod
    def _write_record(words: np.ndarray, node: Tensor, choice: jit.Choice, part_addrs: list[int]) -> None:
        words[0] = int(node.op)
        write_tensor(words, T_DST, node)
        for slot, src in zip(_SLOTS, node.src[:3], strict=True):
            write_tensor(words, slot, src)
        words[PARAMS : PARAMS + 8] = node.op_params.view(np.int64)
        ints, floats = [*part_addrs, *choice.ints], list(choice.floats)
        if len(ints) > 8 or len(floats) > 14:
            raise PyGGMLError(f"kernel {choice.kernel.name}: too many record words")
        words[AUX : AUX + len(ints)] = ints
        words.view(np.float32)[2 * (AUX + 8) : 2 * (AUX + 8) + len(floats)] = floats

    def kernels_landed(self) -> bool:
        """Whether kernels this plan ran without (waiting_for) have since been compiled aside: built again, it
        takes them."""
        return bool(self.waiting_for) and not jit.compiling(self.waiting_for)

    def matches(self, graph: Graph) -> bool:
        return graph.uid != 0 and graph.uid == self.uid and _fingerprint(graph) == self.fingerprint

    # ------------------------------------------------------------------ running
    def compute(self, n_threads: int, abort_callback: Callable[[], bool] | None = None) -> int:
        """Run the plan on up to ``n_threads`` threads; ggml's status (0 success, 1 aborted)."""
        nth = max(1, min(n_threads, available_cores()))
        pool = get_pool()
        if pool.acquire():
            try:
                nth = pool.ensure(nth)
                return self._compute(pool, nth, n_threads, abort_callback)
            finally:
                pool.release()
        return self._compute(None, 1, n_threads, abort_callback)

    def _compute(self, pool: ThreadPool | None, nth: int, n_threads: int,
                 abort_callback: Callable[[], bool] | None) -> int:
        for step in self.steps:
            if isinstance(step, _Python):
                step.fn(step.node, n_threads)
                if abort_callback is not None and abort_callback():
                    return GGML_STATUS_ABORTED
                continue
            if abort_callback is None:
                self._run(pool, nth, step.n0, step.n1)
                continue
            for i in range(step.n0, step.n1):  # ggml asks after every node
                self._run(pool, nth, i, i + 1)
                if abort_callback():
                    return GGML_STATUS_ABORTED
        return GGML_STATUS_SUCCESS

    def compute_timed(self, n_threads: int) -> list[tuple[Tensor, bool, float]]:
        """Run the plan one node at a time: (node, compiled?, seconds) per node, for profiles
        (bench/node_profile.py). Each compiled node then costs a command round-trip more."""
        import time

        out: list[tuple[Tensor, bool, float]] = []
        pool = get_pool()
        if not pool.acquire():
            raise PyGGMLError("the CPU thread pool is busy")
        try:
            nth = pool.ensure(max(1, min(n_threads, available_cores())))
            for step in self.steps:
                if isinstance(step, _Python):
                    t0 = time.perf_counter()
                    step.fn(step.node, n_threads)
                    out.append((step.node, False, time.perf_counter() - t0))
                    continue
                for i in range(step.n0, step.n1):
                    t0 = time.perf_counter()
                    self._run(pool, nth, i, i + 1)
                    out.append((self.nodes[i], True, time.perf_counter() - t0))
        finally:
            pool.release()
        return out

    def _run(self, pool: ThreadPool | None, nth: int, n0: int, n1: int) -> None:
        if pool is not None:
            bad = pool.run_segment(self.fns, self.recs, n0, n1, nth, self.wdata, self.bars)
        else:
            bad = _run_alone(self, n0, n1)
        if bad >= 0:
            # a compiled kernel met data it cannot compute (an index out of range...): the numpy
            # kernel raises the precise error; if it does not, report what the compiled one saw. The error
            # shows at the first barrier, after the last of the records run without one between them: their
            # numpy kernels run in order (the graph's results are void after an error anyway)
            first = bad
            while first > n0 and not self.bars[first - 1]:
                first -= 1
            for node in self.nodes[first : bad + 1]:
                self.resolve(node)(node, n_threads=1)
            node = self.nodes[bad]
            raise PyGGMLError(f"{node.op.name} node {node.name!r}: the compiled kernel rejected its inputs")


def _extent(t: Tensor) -> tuple[int, int]:
    return t.data, t.data + t.nbytes()


def _layout(t: Tensor) -> tuple:
    return t.data, tuple(t.ne), tuple(t.nb)


class _Access:
    """What one record reads and writes (every source and output whole, a fused record's parts too), and the
    rows its threads split when its kernel is a ROWS one."""

    def __init__(self, node: Tensor, choice: jit.Choice, kind: int) -> None:
        nodes = [*(part for part, _ in choice.parts), node]
        self.writes = [(_extent(n), n) for n in nodes]
        self.reads = [(_extent(src), src) for n in nodes for src in n.src if src is not None]
        self.rows = tuple(node.ne[1:]) if kind == ROWS else None

    def aligned(self, later: _Access, a: Tensor, b: Tensor) -> bool:
        """Whether bytes both records touch, as ``a`` here and ``b`` in ``later``, are the same rows for the same
        thread: both ROWS records over the same rows, ``a`` and ``b`` one tensor of those rows."""
        return (self.rows is not None and self.rows == later.rows and tuple(a.ne[1:]) == self.rows
                and _layout(a) == _layout(b))

    def before(self, later: _Access) -> bool:
        """Whether ``later`` may start in a thread that has finished its share of this record while others have
        not: it writes nothing this one reads or writes and reads nothing this one writes, but for the rows
        each thread owns in both (a row kernel over what the same thread's rows of this one wrote)."""
        for (lo, hi), t in self.writes:
            for (l2, h2), u in (*later.reads, *later.writes):
                if lo < h2 and l2 < hi and not self.aligned(later, t, u):
                    return False
        for (lo, hi), t in self.reads:
            for (l2, h2), u in later.writes:
                if lo < h2 and l2 < hi and not self.aligned(later, t, u):
                    return False
        return True


def _barriers(compiled: list[tuple[Tensor, jit.Choice]], independent: Independent | None) -> np.ndarray:
    """The plan's barrier table: runs of consecutive records whose kernels may run without barriers
    (``independent``) and whose memory is apart, or shared only row for row between row kernels over the same
    rows (each thread reads back what it wrote itself), run without barriers between them."""
    bars = np.ones(max(len(compiled), 1), dtype=np.uint8)
    if independent is None:
        return bars
    run: list[_Access] = []
    for i, (node, choice) in enumerate(compiled):
        kind = independent(choice)
        if kind == NOT_FREE:
            run = []
            continue
        acc = _Access(node, choice, kind)
        if run and all(earlier.before(acc) for earlier in run):
            bars[i - 1] = 0
            run.append(acc)
        else:
            run = [acc]
    return bars


def _settle(steps: list[_Python | _Run], compiled: list[tuple[Tensor, jit.Choice]]) -> None:
    """The last record, if it is a fusion only a later node completes (Choice.pending) and none did: back to
    the records it took in."""
    if compiled and compiled[-1][1].pending:
        pending = list(compiled[-1][1].pending)
        compiled[-1:] = pending
        steps[-1].n1 += len(pending) - 1


def _run_alone(plan: GraphPlan, n0: int, n1: int) -> int:
    """A run on the calling thread only, with a private control block (the pool is busy)."""
    from .threads import C_FNS, C_N0, C_N1, C_NTH, C_RECS, C_WDATA, C_WSIZE

    ctrl = new_ctrl()
    ctrl[C_FNS], ctrl[C_RECS] = plan.fns.ctypes.data, plan.recs.ctypes.data
    ctrl[C_N0], ctrl[C_N1], ctrl[C_NTH] = n0, n1, 1
    ctrl[C_WDATA], ctrl[C_WSIZE] = plan.wdata.ctypes.data, plan.wdata.nbytes
    return run_nodes(int(ctrl.ctypes.data), 0)


def plan_for(graph: Graph, resolve: Callable[[Tensor], Kernel], fuse: Fuse | None = None,
             independent: Independent | None = None, warm: Warm | None = None) -> GraphPlan:
    """The graph's cached plan if it still applies, else a new one (kept on the graph)."""
    plan = getattr(graph, "_cpu_plan", None)
    if plan is not None and plan.matches(graph) and not plan.kernels_landed():
        return plan
    plan = GraphPlan(graph, resolve, fuse, independent, warm)
    if graph.uid != 0:
        graph._cpu_plan = plan
    return plan
