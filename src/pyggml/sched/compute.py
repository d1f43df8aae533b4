"""compute_splits: run a scheduled graph split by split with ggml's synchronisation rules.

Per split: wait for the previous backend when the split has no inputs (the allocator may have
reused its memory), copy the inputs in (user inputs at once and blocking, others after the
split's event or a synchronize, offloaded MoE weights only for the experts in use), compute
(node by node ranges when an eval callback is set), then record the split's event.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .. import memory
from ..backend import api
from ..backend.base import Backend, BufferUsage, GGMLStatus
from ..graph import Graph, graph_next_uid
from ..ops.enums import Op
from ..tensor import FLAG_INPUT
from .assign import SchedError

if TYPE_CHECKING:
    from ..tensor import Tensor
    from .scheduler import BackendSched, SchedSplit


def _sync_split_event(sched: BackendSched, backend_id: int) -> None:
    ev = sched.events[backend_id][sched.cur_copy]
    if ev is not None:
        api.backend_event_synchronize(ev)
    else:
        sched.backends[backend_id].synchronize()


def _copy_inputs(sched: BackendSched, split: SchedSplit) -> None:
    bid = split.backend_id
    backend = sched.backends[bid]
    ev = sched.events[bid][sched.cur_copy]
    assert split.graph is not None
    first = split.graph.nodes[0] if split.graph.nodes else None
    for k, inp in enumerate(split.inputs):
        inp_backend = sched.get_tensor_backend(inp)
        inp_cpy = sched.tensor_copy(inp, bid, sched.cur_copy)
        assert inp_cpy is not None and inp_backend is not None
        if inp.flags & FLAG_INPUT:
            # copy user inputs at once: the caller may overwrite them as soon as we return
            _sync_split_event(sched, bid)
            api.backend_tensor_copy(inp, inp_cpy)
            continue
        if ev is not None:
            api.backend_event_wait(backend, ev)
        else:
            backend.synchronize()
        if (first is not None and first.op == Op.MUL_MAT_ID and first.src[0] is inp_cpy
                and inp.buffer is not None and inp.buffer.usage == BufferUsage.WEIGHTS and inp.buffer.is_host()):
            _copy_used_experts(sched, split, k, inp_backend, first)
            continue
        if not backend.cpy_tensor_async(inp_backend, inp, inp_cpy):
            inp_backend.synchronize()
            _sync_split_event(sched, bid)
            api.backend_tensor_copy(inp, inp_cpy)


def _copy_used_experts(sched: BackendSched, split: SchedSplit, k: int, inp_backend: Backend, node: Tensor) -> None:
    """Offloaded MoE weights: upload only the runs of experts the ids name (ggml copies each
    run plus up to 512 bytes of the next expert, so no NaNs sit right after the last one)."""
    bid = split.backend_id
    backend = sched.backends[bid]
    inp = split.inputs[k]
    inp_cpy = sched.tensor_copy(inp, bid, sched.cur_copy)
    assert inp_cpy is not None and inp.data is not None
    n_expert, expert_size = inp.ne[2], inp.nb[2]
    inp_backend.synchronize()
    ids_t, ids_backend = node.src[2], backend
    assert ids_t is not None
    # the ids may be a later input of this split that is not copied yet: read the original
    for later in split.inputs[k + 1 :]:
        if ids_t is sched.tensor_copy(later, bid, sched.cur_copy):
            ids_t, ids_backend = later, sched.get_tensor_backend(later) or backend
            break
    if ids_t is not sched._prev_ids_tensor:
        raw = np.empty(ids_t.nbytes(), dtype=np.uint8)
        api.backend_tensor_get_async(ids_backend, ids_t, raw, 0, ids_t.nbytes())
        ids_backend.synchronize()
        flat = raw[: raw.size // 4 * 4].view(np.int32)
        s0, s1 = ids_t.nb[0] // 4, ids_t.nb[1] // 4
        used: set[int] = set()
        for i1 in range(ids_t.ne[1]):
            for i0 in range(ids_t.ne[0]):
                e = int(flat[i1 * s1 + i0 * s0])
                if not 0 <= e < n_expert:
                    raise SchedError(f"MUL_MAT_ID {node.name!r}: expert id {e} is not in 0..{n_expert - 1}")
                used.add(e)
        sched._prev_ids_tensor = ids_t
        sched._used_experts = sorted(used)
    host = memory.region_view(inp.data, inp.nbytes())
    runs: list[list[int]] = []
    for e in sched._used_experts:
        if runs and e == runs[-1][1] + 1:
            runs[-1][1] = e
        else:
            runs.append([e, e])
    for first_id, last_id in runs:
        offset = first_id * expert_size
        size = (last_id - first_id + 1) * expert_size
        if last_id < n_expert - 1:
            size += min(expert_size, 512)
        api.backend_tensor_set_async(backend, inp_cpy, host[offset : offset + size], offset, size)


def _compute_split_with_callback(sched: BackendSched, split: SchedSplit) -> GGMLStatus:
    """ggml's eval-callback loop: ask each node in turn, compute up to the first wanted one,
    show it; a False answer to the observation ends this split (later splits still run)."""
    assert split.graph is not None and sched.callback_eval is not None
    backend = sched.backends[split.backend_id]
    nodes = split.graph.nodes
    j0 = 0
    while j0 < len(nodes):
        j1 = j0
        need = _call_eval(sched, nodes[j1], True)
        while not need and j1 < len(nodes) - 1:
            j1 += 1
            need = _call_eval(sched, nodes[j1], True)
        status = api.backend_graph_compute_async(backend, _segment(split.graph, j0, j1 + 1))
        if status != GGMLStatus.SUCCESS:
            return status
        backend.synchronize()
        if need and not _call_eval(sched, nodes[j1], False):
            break
        j0 = j1 + 1
    return GGMLStatus.SUCCESS


def _segment(graph: Graph, i0: int, i1: int) -> Graph:
    """``graph.view(i0, i1)``, made once per split graph and given a uid (ggml's views have none), so that the
    backend keeps what it prepared for it: the eval callback cuts a reused graph at the same nodes every ubatch
    (imatrix: at each of ~130 matrix products), and the CPU backend planned every piece anew, 7 ms each, for
    each ubatch. The views live as long as the split graph, which a new split or allocation replaces."""
    views = graph.__dict__.setdefault("_segments", {})
    view = views.get((i0, i1))
    if view is None:
        view = views[(i0, i1)] = graph.view(i0, i1)
        view.uid = graph_next_uid()
    return view


def _call_eval(sched: BackendSched, t: Tensor, ask: bool) -> bool:
    assert sched.callback_eval is not None
    if sched.callback_eval_user_data is None:
        return bool(sched.callback_eval(t, ask))
    return bool(sched.callback_eval(t, ask, sched.callback_eval_user_data))


def compute_splits(sched: BackendSched) -> GGMLStatus:
    sched._prev_ids_tensor = None
    sched._used_experts = []
    prev_id = -1
    for split in sched.splits:
        bid = split.backend_id
        backend = sched.backends[bid]
        # the allocator may have reused memory across splits: let the previous one finish
        if not split.inputs and prev_id >= 0 and prev_id != bid:
            _sync_split_event(sched, prev_id)
        _copy_inputs(sched, split)
        if sched.callback_eval is None:
            assert split.graph is not None
            status = api.backend_graph_compute_async(backend, split.graph)
        else:
            status = _compute_split_with_callback(sched, split)
        if status != GGMLStatus.SUCCESS:
            return status
        ev = sched.events[bid][sched.cur_copy]
        if ev is not None:
            api.backend_event_record(ev, backend)
        prev_id = bid
    return GGMLStatus.SUCCESS
