"""Client-side serialization of pyggml tensors and graphs into rpc_tensor records.

A tensor's wire id is its Python ``id()``: like the C pointer llama.cpp sends, unique while the
tensor lives, never 0, and only ever used as a key by the server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..backend.base import Buffer
from .protocol import GGML_MAX_SRC, NULL_TENSOR, RPC_TENSOR, RPCError

if TYPE_CHECKING:
    from ..graph import Graph
    from ..tensor import Tensor
    from .connection import Connection

_U32 = 1 << 32


class RemoteBuffer(Buffer):
    """A buffer whose memory is on an RPC server: the server's handle and the connection to it. The client's
    RPCBuffer is one; the wire format only needs to know that a tensor's buffer is remote, and whose."""

    conn: Connection
    remote_ptr: int


def _remote(tensor: Tensor, conn: Connection | None) -> tuple[int, int]:
    """(buffer handle, data) when the tensor lives in an RPC buffer (of ``conn``'s server, if given)."""
    buf = tensor.buffer
    if isinstance(buf, RemoteBuffer) and (conn is None or buf.conn is conn):
        return buf.remote_ptr, int(tensor.data or 0)
    return 0, 0


def serialize_tensor(tensor: Tensor | None, conn: Connection | None = None, use_count: int = 0) -> bytes:
    """The 296-byte rpc_tensor; None gives 296 zero bytes. ne/nb must fit the wire's u32 fields."""
    if tensor is None:
        return NULL_TENSOR
    if any(n >= _U32 for n in tensor.ne) or any(n >= _U32 for n in tensor.nb):
        raise RPCError(f"tensor {tensor.name!r}: ne {tensor.ne} / nb {tensor.nb} do not fit the protocol's "
                       "32-bit fields (ggml would truncate them silently)")
    buffer, data = _remote(tensor, conn)
    src = [id(s) if s is not None else 0 for s in tensor.src]
    src += [0] * (GGML_MAX_SRC - len(src))
    name = tensor.name.encode()[:63]
    params = np.asarray(tensor.op_params, dtype=np.int32).tolist()
    return RPC_TENSOR.pack(id(tensor), int(tensor.type), buffer, *tensor.ne, *tensor.nb, int(tensor.op), *params,
                           int(tensor.flags), *src, id(tensor.view_src) if tensor.view_src is not None else 0,
                           int(tensor.view_offs), data, name, use_count)


def graph_tensors(graph: Graph) -> list[Tensor]:
    """Every tensor the nodes reach, post-order (srcs, then view_src, then the tensor), no repeats.

    Iterative, because a long model graph nests deeper than Python's recursion limit.
    """
    out: list[Tensor] = []
    seen: set[int] = set()
    for root in graph.nodes:
        if id(root) in seen:
            continue
        seen.add(id(root))
        stack: list[tuple[Tensor, int]] = [(root, 0)]
        while stack:
            t, i = stack.pop()
            kids = [*t.src, t.view_src]
            while i < len(kids):
                k = kids[i]
                i += 1
                if k is not None and id(k) not in seen:
                    seen.add(id(k))
                    stack.append((t, i))
                    stack.append((k, 0))
                    break
            else:
                out.append(t)
    return out


def serialize_graph(device: int, graph: Graph, conn: Connection) -> bytes:
    """GRAPH_COMPUTE's payload: device, node ids, then the rpc_tensors (use counts included)."""
    nodes = graph.nodes
    tensors = graph_tensors(graph)
    parts = [np.array([device, len(nodes)], dtype="<u4").tobytes(),
             np.array([id(n) for n in nodes], dtype="<u8").tobytes(),
             np.array([len(tensors)], dtype="<u4").tobytes()]
    for t in tensors:
        uc = graph.use_counts.get(id(t), 0) if id(t) in graph.visited else 0
        parts.append(serialize_tensor(t, conn, uc))
    return b"".join(parts)
