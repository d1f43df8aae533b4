"""The context's cache of built ubatch graphs, several shapes at once.

llama.cpp keeps one graph and reuses it while the next ubatch has the same shape
(``llm_graph_result::can_reuse``). A server alternates shapes: each request's prompt, then its
one-token steps; speculative decoding alternates a verify batch and single steps. With one graph,
every change of shape builds the graph, splits it over the backends, plans its memory and resolves
the CPU backend's execution plan again (about 31 ms on Qwen2.5 0.5B on a 2-core EPYC: two of its one-token
steps).

This cache keeps, per shape key (the same key llama.cpp's reuse compares), the built graph and the
scheduler's state for it (:class:`~pyggml.sched.scheduler.SchedGraphState`: its splits, each keeping
its compute plan, and its placement in the compute buffers). Memory is not multiplied: every cached
graph lives in the one set of compute buffers the allocator sizes to the largest graph it has planned
(only one graph runs at a time, and each writes its inputs before it computes). When the allocator
replaces its buffers (a larger graph came), the entries placed in the old ones are stale: restoring
one fails and it is built anew. A few entries of Python metadata each; least recently used first out.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from ..sched.scheduler import BackendSched, SchedGraphState
from .graph import UbatchGraph

#: how many graph shapes a context keeps by default (a prompt shape, the one-token step, a verify batch...)
DEFAULT_GRAPH_CACHE = 8


@dataclass
class CachedGraph:
    graph: UbatchGraph
    state: SchedGraphState


class GraphCache:
    """An LRU of ``key -> (graph, scheduler state)`` with at most ``capacity`` entries (0: none kept)."""

    def __init__(self, capacity: int = DEFAULT_GRAPH_CACHE) -> None:
        if capacity < 0:
            raise ValueError(f"the graph cache capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[tuple, CachedGraph] = OrderedDict()
        self.n_evicted = 0  # entries dropped to make room
        self.n_stale = 0  # entries found placed in buffers the allocator has since replaced

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: tuple) -> bool:
        return key in self._entries

    def restore(self, key: tuple, sched: BackendSched) -> UbatchGraph | None:
        """The cached graph of this key made the scheduler's allocated graph again, or None (not cached,
        or stale: then it is dropped)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if not sched.restore_graph_state(entry.state):
            del self._entries[key]
            self.n_stale += 1
            return None
        self._entries.move_to_end(key)
        return entry.graph

    def put(self, key: tuple, graph: UbatchGraph, sched: BackendSched) -> None:
        """Keep the graph the scheduler has just allocated, evicting the least recently used beyond capacity."""
        if self.capacity == 0:
            return
        self._entries[key] = CachedGraph(graph, sched.save_graph_state())
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
            self.n_evicted += 1

    def clear(self) -> None:
        self._entries.clear()
