"""Turning wire tensors back into pyggml tensors on the server, with every check ggml-rpc makes.

ggml-rpc's server distinguishes requests it *rejects* (``deserialize_tensor`` returns NULL and
the command closes the connection) from requests it *aborts on* (a GGML_ASSERT kills the whole
server: a tensor reaching outside its buffer, an ne product overflowing int64, a NULL graph
node, an op the backend lacks). pyggml cannot let a client kill the server, so both become
:class:`CloseConnection`; :func:`deserialize_tensor` still returns None where ggml returns NULL,
because some commands (GET_ALLOC_SIZE's srcs) accept a NULL tensor.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from ..context import Context, tensor_overhead
from ..graph import Graph, graph_overhead_custom
from ..ops.enums import Op
from ..tensor import Tensor
from ..types import GGMLType
from .protocol import RPC_TENSOR_SIZE, RPCError, RPCTensor

if TYPE_CHECKING:
    from ..backend.base import Buffer

_N_TYPES = len(GGMLType)
_INT64_MAX = (1 << 63) - 1


class CloseConnection(RPCError):
    """The request is malformed or unsafe: the server drops this connection and serves the next."""


def buffer_base(buf: Buffer) -> int:
    """ggml_backend_buffer_get_base, with a zero-size buffer's NULL base as 0."""
    base = buf.get_base()
    return 0 if base is None else int(base)


def new_context(n_tensors: int, n_nodes: int = 0) -> Context:
    """A no_alloc context sized as ggml-rpc sizes its per-request contexts."""
    size = tensor_overhead() * max(n_tensors, 1)
    if n_nodes:
        size += graph_overhead_custom(n_nodes, False)
    return Context(size, no_alloc=True)


def deserialize_tensor(ctx: Context, rt: RPCTensor, buffers: dict[int, Buffer],
                       bad_ops: list[tuple[str, int]] | None = None) -> Tensor | None:
    """ggml-rpc's rpc_server::deserialize_tensor: None where ggml returns NULL.

    An op number ggml does not define becomes NONE and is reported in ``bad_ops``: data commands
    ignore the op (as ggml does), only a graph must reject it.
    """
    if rt.type >= _N_TYPES:
        return None
    ty = GGMLType(rt.type)
    if ty.blck_size == 0:
        return None
    n = 1
    for d in rt.ne:
        if d and n > _INT64_MAX // d:
            raise CloseConnection(f"tensor {rt.name_str!r}: ne {list(rt.ne)} overflows int64 (ggml aborts)")
        n *= d
    # created with a block-sized row, then given the wire's shape: ggml only asserts ne0 % blck in debug builds
    t = ctx.new_tensor_impl(ty, [ty.blck_size, 1, 1, 1])
    t.ne = list(rt.ne)
    t.nb = list(rt.nb)
    buf = buffers.get(rt.buffer) if rt.buffer else None
    if buf is not None:
        base, size, nbytes = buffer_base(buf), buf.get_size(), t.nbytes()
        if rt.data < base or rt.data + nbytes > base + size:
            raise CloseConnection(f"tensor {rt.name_str!r} (data 0x{rt.data:x}, {nbytes} bytes) lies outside its "
                                  f"buffer [0x{base:x}, 0x{base + size:x}) (ggml aborts)")
    t.buffer = buf
    try:
        t.op = Op(rt.op)
    except ValueError:
        t.op = Op.NONE
        if bad_ops is not None:
            bad_ops.append((rt.name_str, rt.op))
    t.op_params = np.array(rt.op_params, dtype=np.int32)
    t.flags = rt.flags
    t.data = rt.data or None
    t.name = rt.name_str.encode()[:63].decode("utf-8", errors="ignore")
    return t


def check_region(rt: RPCTensor, buf: Buffer, offset: int, size: int) -> None:
    """SET_TENSOR / GET_TENSOR / SET_TENSOR_HASH's sanitize block, then ggml_backend_tensor_set/get's
    ``offset + size <= nbytes`` assert (an abort in ggml, a close here)."""
    p0 = buffer_base(buf)
    p1 = p0 + buf.get_size()
    at = rt.data + offset
    if at < p0 or at >= p1 or size > p1 - at:
        raise CloseConnection(f"tensor region (data=0x{rt.data:x}, offset={offset}, size={size}) out of buffer "
                              f"bounds [0x{p0:x}, 0x{p1:x})")


def check_in_tensor(t: Tensor, offset: int, size: int) -> None:
    if size and offset + size > t.nbytes():
        raise CloseConnection(f"tensor {t.name!r}: offset {offset} + size {size} is past its {t.nbytes()} bytes "
                              "(ggml aborts: tensor read/write out of bounds)")


def build_graph(payload: bytes, n_devices: int, buffers: dict[int, Buffer]) -> tuple[int, Graph, Context]:
    """rpc_server::graph_compute's parsing and create_node, without recursion (graphs nest deeply).

    Returns (device, graph, context). The context owns the tensors and must outlive the graph.
    """
    size = len(payload)
    if size < 8:
        raise CloseConnection(f"GRAPH_COMPUTE payload of {size} bytes is shorter than its 8-byte header")
    device, n_nodes = np.frombuffer(payload, dtype="<u4", count=2)
    device, n_nodes = int(device), int(n_nodes)
    if device >= n_devices:
        raise CloseConnection(f"GRAPH_COMPUTE for device {device}, the server has {n_devices}")
    if size < 12 + 8 * n_nodes:
        raise CloseConnection(f"GRAPH_COMPUTE payload of {size} bytes cannot hold {n_nodes} node ids")
    node_ids = np.frombuffer(payload, dtype="<u8", count=n_nodes, offset=8).tolist()
    n_tensors = int(np.frombuffer(payload, dtype="<u4", count=1, offset=8 + 8 * n_nodes)[0])
    start = 12 + 8 * n_nodes
    if size < start + RPC_TENSOR_SIZE * n_tensors:
        raise CloseConnection(f"GRAPH_COMPUTE payload of {size} bytes cannot hold {n_tensors} tensors")
    wire: dict[int, RPCTensor] = {}
    for i in range(n_tensors):
        rt = RPCTensor.unpack(payload, start + i * RPC_TENSOR_SIZE)
        wire.setdefault(rt.id, rt)  # the first occurrence of a duplicate id wins, as emplace does
    ctx = new_context(n_nodes + n_tensors, n_nodes)
    made: dict[int, Tensor] = {}
    bad_ops: list[tuple[str, int]] = []
    for nid in node_ids:
        if nid == 0:
            raise CloseConnection("GRAPH_COMPUTE lists node id 0 (a NULL node; ggml crashes)")
        _create_nodes(nid, ctx, wire, made, buffers, bad_ops)
    if bad_ops:
        name, op = bad_ops[0]
        raise CloseConnection(f"tensor {name!r} has op {op}, which ggml does not define (ggml aborts)")
    graph = Graph(max(n_nodes, 1))
    for nid in node_ids:
        node = made[nid]
        graph.nodes.append(node)
        graph.visited[id(node)] = node
        graph.use_counts[id(node)] = wire[nid].use_count
    _check_runnable(graph, made.values())
    return device, graph, ctx


def _create_nodes(root: int, ctx: Context, wire: dict[int, RPCTensor], made: dict[int, Tensor],
                  buffers: dict[int, Buffer], bad_ops: list[tuple[str, int]]) -> None:
    """create_node for ``root`` and everything it reaches; any missing or bad id fails the graph."""
    todo = [root]
    new: list[int] = []
    while todo:
        tid = todo.pop()
        if tid in made:
            continue
        rt = wire.get(tid)
        if rt is None:
            raise CloseConnection(f"GRAPH_COMPUTE refers to tensor id 0x{tid:x}, which it does not send")
        t = deserialize_tensor(ctx, rt, buffers, bad_ops)
        if t is None:
            raise CloseConnection(f"GRAPH_COMPUTE tensor {rt.name_str!r} has an invalid type {rt.type}")
        if t.buffer is None and t.data is not None:
            raise CloseConnection(f"GRAPH_COMPUTE tensor {rt.name_str!r} has data 0x{rt.data:x} but no known buffer")
        made[tid] = t
        new.append(tid)
        todo.extend(s for s in rt.src if s)
        if rt.view_src:
            todo.append(rt.view_src)
    for tid in new:
        rt, t = wire[tid], made[tid]
        t.src = [made[s] if s else None for s in rt.src]
        t.view_src = made[rt.view_src] if rt.view_src else None
        t.view_offs = rt.view_offs


def _check_runnable(graph: Graph, tensors: Iterable[Tensor]) -> None:
    """Where ggml would crash mid-compute (a tensor without memory), refuse up front."""
    for t in tensors:
        if t.data is None and t.nbytes() > 0:
            raise CloseConnection(f"tensor {t.name!r} has no memory on this server (buffer 0, data 0; ggml crashes)")
