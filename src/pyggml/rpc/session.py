"""One client connection of the RPC server: the command loop and every command's handler.

This is ggml-rpc.cpp's ``rpc_serve_client`` plus ``rpc_server``: state (buffers, the stored graph
of each device) belongs to the connection and is freed when it ends. A handler either replies
with exactly the bytes llama.cpp's client expects, stays silent for the seven fire-and-forget
commands, or raises :class:`CloseConnection`; an error reply never goes on the wire.
"""

from __future__ import annotations

import os
import socket
import struct
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..backend import api
from ..backend.base import Backend, Buffer, GGMLStatus
from .deserialize import (
    CloseConnection,
    buffer_base,
    build_graph,
    check_in_tensor,
    check_region,
    deserialize_tensor,
    new_context,
)
from .protocol import (
    CMD_COUNT,
    REQUEST_SIZE,
    RPC_TENSOR_SIZE,
    SET_TENSOR_HEADER,
    Cmd,
    RPCTensor,
    fnv1a_64,
    hello_reply,
    recv_exact,
    recv_into_exact,
    send_reply,
)

if TYPE_CHECKING:
    from ..context import Context
    from ..graph import Graph
    from ..tensor import Tensor
    from .server import RPCServer

#: largest GRAPH_COMPUTE payload accepted (a Gemma 3 270M graph is 0.3 MB, a 70B model's a few MB);
#: ggml takes any size it can allocate
MAX_GRAPH_PAYLOAD = 256 << 20
#: payloads above this are read as they arrive instead of into one buffer allocated up front, so a
#: client announcing a huge frame and sending little costs the server little
_PREALLOC_LIMIT = 1 << 20


@dataclass
class StoredGraph:
    graph: Graph
    ctx: Context


@dataclass
class Session:
    """The state of one connection (ggml-rpc's rpc_server object)."""

    server: RPCServer
    sock: socket.socket
    buffers: dict[int, Buffer] = field(default_factory=dict)
    graphs: dict[int, StoredGraph] = field(default_factory=dict)
    n_commands: int = 0

    @property
    def backends(self) -> list[Backend]:
        return self.server.backends

    # ------------------------------------------------------------------ loop
    def serve(self) -> None:
        """Handshake, then commands until the peer leaves or a request is refused."""
        try:
            self._handshake()
            while True:
                head = self.sock.recv(1)
                if not head:
                    return
                self._dispatch(head[0])
                self.n_commands += 1
        finally:
            self.release()

    def _handshake(self) -> None:
        cmd = recv_exact(self.sock, 1)[0]
        if cmd != Cmd.HELLO:
            raise CloseConnection(f"expected HELLO as the first command, got {cmd}")
        self._recv_fixed(Cmd.HELLO)  # the client's caps: this TCP-only server answers zeros
        send_reply(self.sock, hello_reply())

    def _recv_size(self) -> int:
        return struct.unpack("<Q", recv_exact(self.sock, 8))[0]

    def _recv_fixed(self, cmd: Cmd) -> bytes:
        size = self._recv_size()
        want = REQUEST_SIZE[cmd]
        if size != want:
            raise CloseConnection(f"{cmd.name} request of {size} bytes, expected {want}")
        return recv_exact(self.sock, want)

    def _recv_var(self, cmd: Cmd, limit: int) -> bytearray:
        size = self._recv_size()
        if size > limit:
            raise CloseConnection(f"{cmd.name} payload of {size} bytes is larger than this server accepts ({limit})")
        if size <= _PREALLOC_LIMIT:
            buf = bytearray(size)
            recv_into_exact(self.sock, memoryview(buf))
            return buf
        grown = bytearray()
        while len(grown) < size:
            grown += recv_exact(self.sock, min(size - len(grown), 16 << 20))
        return grown

    def _dispatch(self, cmd: int) -> None:
        if cmd >= CMD_COUNT:
            raise CloseConnection(f"unknown command {cmd}")
        handler = _HANDLERS.get(Cmd(cmd))
        if handler is None:  # a second HELLO, or NONE (a client-internal marker)
            raise CloseConnection(f"command {Cmd(cmd).name} is not valid here")
        handler(self)
        self.server.command_counts[Cmd(cmd)] += 1

    def release(self) -> None:
        """Free every buffer the connection still holds (the client vanished or was dropped)."""
        self.graphs.clear()
        for buf in self.buffers.values():
            self.server.release_buffer(buf)
        self.buffers.clear()

    # ------------------------------------------------------------------ helpers
    def _device(self, raw: bytes) -> int:
        dev = struct.unpack_from("<I", raw)[0]
        if dev >= len(self.backends):
            raise CloseConnection(f"device {dev} requested, the server has {len(self.backends)}")
        return dev

    def _buffer(self, handle: int) -> Buffer:
        buf = self.buffers.get(handle)
        if buf is None:
            raise CloseConnection(f"buffer handle 0x{handle:x} is not one of this connection's buffers")
        return buf

    def _tensor(self, raw: bytes | bytearray, offset: int = 0) -> tuple[RPCTensor, Tensor]:
        """Deserialize a data command's tensor, which must have a known buffer."""
        rt = RPCTensor.unpack(raw, offset)
        t = deserialize_tensor(new_context(1), rt, self.buffers)
        if t is None or t.buffer is None:
            raise CloseConnection(f"tensor {rt.name_str!r}: invalid type {rt.type} or unknown buffer 0x{rt.buffer:x}")
        return rt, t

    # ------------------------------------------------------------------ commands
    def device_count(self) -> None:
        self._recv_fixed(Cmd.DEVICE_COUNT)
        send_reply(self.sock, struct.pack("<I", len(self.backends)))

    def alloc_buffer(self) -> None:
        raw = self._recv_fixed(Cmd.ALLOC_BUFFER)
        dev = self._device(raw)
        size = struct.unpack_from("<Q", raw, 4)[0]
        buf = self.server.allocate(dev, size)
        if buf is None:
            send_reply(self.sock, struct.pack("<QQ", 0, 0))
            return
        handle = self.server.new_handle()
        self.buffers[handle] = buf
        send_reply(self.sock, struct.pack("<QQ", handle, buf.get_size()))

    def get_alignment(self) -> None:
        dev = self._device(self._recv_fixed(Cmd.GET_ALIGNMENT))
        send_reply(self.sock, struct.pack("<Q", self.server.bufts[dev].get_alignment()))

    def get_max_size(self) -> None:
        dev = self._device(self._recv_fixed(Cmd.GET_MAX_SIZE))
        send_reply(self.sock, struct.pack("<Q", self.server.bufts[dev].get_max_size()))

    def get_device_memory(self) -> None:
        dev = self._device(self._recv_fixed(Cmd.GET_DEVICE_MEMORY))
        free, total = self.server.device_memory(dev)
        send_reply(self.sock, struct.pack("<QQ", free, total))

    def buffer_get_base(self) -> None:
        buf = self._buffer(struct.unpack("<Q", self._recv_fixed(Cmd.BUFFER_GET_BASE))[0])
        send_reply(self.sock, struct.pack("<Q", buffer_base(buf)))

    def free_buffer(self) -> None:
        handle = struct.unpack("<Q", self._recv_fixed(Cmd.FREE_BUFFER))[0]
        buf = self._buffer(handle)
        del self.buffers[handle]
        self.server.release_buffer(buf)
        self.graphs.clear()  # ggml-rpc drops every stored graph of the connection on any free

    def buffer_clear(self) -> None:
        handle, value = struct.unpack("<QB", self._recv_fixed(Cmd.BUFFER_CLEAR))
        buf = self._buffer(handle)
        if buf.get_size():
            buf.clear(value)

    def set_tensor(self) -> None:
        limit = SET_TENSOR_HEADER + max((b.get_size() for b in self.buffers.values()), default=0)
        raw = self._recv_var(Cmd.SET_TENSOR, limit)
        if len(raw) < SET_TENSOR_HEADER:
            raise CloseConnection(f"SET_TENSOR payload of {len(raw)} bytes is shorter than its 305-byte header")
        rt, t = self._tensor(raw)
        cache_flag = raw[RPC_TENSOR_SIZE]
        offset = struct.unpack_from("<Q", raw, RPC_TENSOR_SIZE + 1)[0]
        data = np.frombuffer(raw, dtype=np.uint8, offset=SET_TENSOR_HEADER)
        check_region(rt, t.buffer, offset, data.size)
        check_in_tensor(t, offset, data.size)
        if cache_flag and self.server.cache_dir is not None:
            self.server.cache_store(fnv1a_64(memoryview(raw)[SET_TENSOR_HEADER:]), memoryview(raw)[SET_TENSOR_HEADER:])
        api.backend_tensor_set(t, data, offset, data.size)

    def set_tensor_hash(self) -> None:
        raw = self._recv_fixed(Cmd.SET_TENSOR_HASH)
        offset, h = struct.unpack_from("<QQ", raw, RPC_TENSOR_SIZE)
        cached = self.server.cache_load(h)
        if cached is None:
            send_reply(self.sock, b"\0")
            return
        rt, t = self._tensor(raw)
        check_region(rt, t.buffer, offset, len(cached))
        check_in_tensor(t, offset, len(cached))
        api.backend_tensor_set(t, np.frombuffer(cached, dtype=np.uint8), offset, len(cached))
        send_reply(self.sock, b"\1")

    def get_tensor(self) -> None:
        raw = self._recv_fixed(Cmd.GET_TENSOR)
        offset, size = struct.unpack_from("<QQ", raw, RPC_TENSOR_SIZE)
        rt, t = self._tensor(raw)
        check_region(rt, t.buffer, offset, size)
        check_in_tensor(t, offset, size)
        out = np.empty(size, dtype=np.uint8)
        if size:
            api.backend_tensor_get(t, out, offset, size)
        send_reply(self.sock, out.data)

    def copy_tensor(self) -> None:
        raw = self._recv_fixed(Cmd.COPY_TENSOR)
        ctx = new_context(2)
        src = deserialize_tensor(ctx, RPCTensor.unpack(raw, 0), self.buffers)
        dst = deserialize_tensor(ctx, RPCTensor.unpack(raw, RPC_TENSOR_SIZE), self.buffers)
        if src is None or dst is None or src.buffer is None or dst.buffer is None:
            raise CloseConnection("COPY_TENSOR: a tensor has an invalid type or no known buffer")
        dst_end = buffer_base(dst.buffer) + dst.buffer.get_size()
        if (dst.data or 0) + src.nbytes() > dst_end:
            raise CloseConnection(f"COPY_TENSOR: {src.nbytes()} bytes do not fit at the destination in its buffer")
        ok = dst.buffer.cpy_tensor(src, dst) if src.nbytes() else True
        send_reply(self.sock, b"\1" if ok else b"\0")

    def memset_tensor(self) -> None:
        raw = self._recv_fixed(Cmd.MEMSET_TENSOR)
        offset, size, value = struct.unpack_from("<QQB", raw, RPC_TENSOR_SIZE)
        rt, t = self._tensor(raw)
        nbytes = t.nbytes()
        if offset > nbytes or size > nbytes - offset:
            raise CloseConnection(f"MEMSET_TENSOR region (offset={offset}, size={size}) out of tensor bounds {nbytes}")
        buf = t.buffer
        base = buffer_base(buf)
        if rt.data < base:
            raise CloseConnection("MEMSET_TENSOR: tensor data before buffer start")
        at = rt.data - base
        if at > buf.get_size() or offset > buf.get_size() - at or size > buf.get_size() - at - offset:
            raise CloseConnection("MEMSET_TENSOR: tensor region out of buffer bounds")
        if size:
            api.backend_tensor_memset(t, value, offset, size)

    def init_tensor(self) -> None:
        raw = self._recv_fixed(Cmd.INIT_TENSOR)
        rt = RPCTensor.unpack(raw)
        t = deserialize_tensor(new_context(1), rt, self.buffers)
        if t is None:
            raise CloseConnection(f"INIT_TENSOR: tensor {rt.name_str!r} has an invalid type {rt.type}")
        if t.buffer is not None:
            t.buffer.init_tensor(t)
        if t.extra is not None:
            raise CloseConnection("INIT_TENSOR: the backend set tensor->extra, which RPC cannot carry")

    def get_alloc_size(self) -> None:
        raw = self._recv_fixed(Cmd.GET_ALLOC_SIZE)
        dev = self._device(raw)
        ctx = new_context(11)
        rt = RPCTensor.unpack(raw, 4)
        t = deserialize_tensor(ctx, rt, self.buffers)
        if t is None:
            raise CloseConnection(f"GET_ALLOC_SIZE: tensor {rt.name_str!r} has an invalid type {rt.type}")
        for i in range(10):
            srt = RPCTensor.unpack(raw, 4 + RPC_TENSOR_SIZE * (1 + i))
            if srt.id:
                t.src[i] = deserialize_tensor(ctx, srt, self.buffers)  # a bad src is accepted as NULL
        buft = t.buffer.get_type() if t.buffer is not None else self.server.bufts[dev]
        send_reply(self.sock, struct.pack("<Q", buft.get_alloc_size(t)))

    def graph_compute(self) -> None:
        raw = self._recv_var(Cmd.GRAPH_COMPUTE, MAX_GRAPH_PAYLOAD)
        dev, graph, ctx = build_graph(bytes(raw), len(self.backends), self.buffers)
        self._compute(dev, graph)
        self.graphs[dev] = StoredGraph(graph, ctx)

    def graph_recompute(self) -> None:
        dev = self._device(self._recv_fixed(Cmd.GRAPH_RECOMPUTE))
        stored = self.graphs.get(dev)
        if stored is None:
            raise CloseConnection(f"GRAPH_RECOMPUTE for device {dev}, which has no stored graph")
        self._compute(dev, stored.graph)

    def _compute(self, dev: int, graph: Graph) -> None:
        try:
            status = self.backends[dev].graph_compute(graph)
        except Exception as e:  # ggml aborts on an op it cannot run; the server drops the client
            raise CloseConnection(f"graph compute failed: {type(e).__name__}: {e}") from e
        if status != GGMLStatus.SUCCESS:
            raise CloseConnection(f"graph compute returned {GGMLStatus(status).name}")


_HANDLERS = {
    Cmd.ALLOC_BUFFER: Session.alloc_buffer,
    Cmd.GET_ALIGNMENT: Session.get_alignment,
    Cmd.GET_MAX_SIZE: Session.get_max_size,
    Cmd.BUFFER_GET_BASE: Session.buffer_get_base,
    Cmd.FREE_BUFFER: Session.free_buffer,
    Cmd.BUFFER_CLEAR: Session.buffer_clear,
    Cmd.SET_TENSOR: Session.set_tensor,
    Cmd.SET_TENSOR_HASH: Session.set_tensor_hash,
    Cmd.GET_TENSOR: Session.get_tensor,
    Cmd.COPY_TENSOR: Session.copy_tensor,
    Cmd.GRAPH_COMPUTE: Session.graph_compute,
    Cmd.GET_DEVICE_MEMORY: Session.get_device_memory,
    Cmd.INIT_TENSOR: Session.init_tensor,
    Cmd.GET_ALLOC_SIZE: Session.get_alloc_size,
    Cmd.DEVICE_COUNT: Session.device_count,
    Cmd.GRAPH_RECOMPUTE: Session.graph_recompute,
    Cmd.MEMSET_TENSOR: Session.memset_tensor,
}


def write_atomically(path: str, data: memoryview) -> None:
    """Write a cache file so that a crash never leaves a truncated entry under the final name."""
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
