"""ggml RPC protocol 7.0.0 on the wire: commands, message sizes, the 296-byte rpc_tensor, FNV-1a.

Everything here is pure bytes-in, bytes-out so that the server, the client and the tests share
one definition of the wire format. The layout is llama.cpp's ``#pragma pack(1)`` structs,
little-endian (ggml-rpc.cpp:40-205); see ``shared/reference/ggml-rpc.md`` §2.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from ..errors import PyGGMLError

PROTO_MAJOR = 7
PROTO_MINOR = 0
PROTO_PATCH = 0

#: the backend GUID llama.cpp's RPC backend reports (ggml-rpc.cpp:211-214)
RPC_GUID = bytes([0x99, 0x68, 0x5B, 0x6C, 0xD2, 0x83, 0x3D, 0x24, 0x25, 0x36, 0x72, 0xE1, 0x5B, 0x0E, 0x14, 0x03])

#: uploads above this many bytes into WEIGHTS buffers go through SET_TENSOR_HASH first
HASH_THRESHOLD = 10 * 1024 * 1024

GGML_MAX_SRC = 10
GGML_MAX_NAME = 64
CONN_CAPS_SIZE = 24


class RPCError(PyGGMLError, ConnectionError):
    """The RPC peer closed, sent a malformed frame, or the request cannot be expressed on the wire."""


class Cmd(IntEnum):
    """enum rpc_cmd (ggml-rpc.cpp:61-84). NONE never goes on the wire."""

    ALLOC_BUFFER = 0
    GET_ALIGNMENT = 1
    GET_MAX_SIZE = 2
    BUFFER_GET_BASE = 3
    FREE_BUFFER = 4
    BUFFER_CLEAR = 5
    SET_TENSOR = 6
    SET_TENSOR_HASH = 7
    GET_TENSOR = 8
    COPY_TENSOR = 9
    GRAPH_COMPUTE = 10
    GET_DEVICE_MEMORY = 11
    INIT_TENSOR = 12
    GET_ALLOC_SIZE = 13
    HELLO = 14
    DEVICE_COUNT = 15
    GRAPH_RECOMPUTE = 16
    MEMSET_TENSOR = 17
    NONE = 18


CMD_COUNT = 19

# ------------------------------------------------------------------------------------ rpc_tensor
#: id, type, buffer, ne[4] u32, nb[4] u32, op, op_params i32[16], flags, src[10], view_src, view_offs, data,
#: name[64], use_count
RPC_TENSOR = struct.Struct("<QIQ4I4II16ii10QQQQ64si")
RPC_TENSOR_SIZE = RPC_TENSOR.size
assert RPC_TENSOR_SIZE == 296

#: fixed request payload sizes; the server closes on any other size field (ggml-rpc.cpp:268-277)
REQUEST_SIZE: dict[Cmd, int] = {
    Cmd.ALLOC_BUFFER: 12,
    Cmd.GET_ALIGNMENT: 4,
    Cmd.GET_MAX_SIZE: 4,
    Cmd.BUFFER_GET_BASE: 8,
    Cmd.FREE_BUFFER: 8,
    Cmd.BUFFER_CLEAR: 9,
    Cmd.SET_TENSOR_HASH: RPC_TENSOR_SIZE + 16,
    Cmd.GET_TENSOR: RPC_TENSOR_SIZE + 16,
    Cmd.COPY_TENSOR: 2 * RPC_TENSOR_SIZE,
    Cmd.GET_DEVICE_MEMORY: 4,
    Cmd.INIT_TENSOR: RPC_TENSOR_SIZE,
    Cmd.GET_ALLOC_SIZE: 4 + RPC_TENSOR_SIZE * (1 + GGML_MAX_SRC),
    Cmd.HELLO: CONN_CAPS_SIZE,
    Cmd.DEVICE_COUNT: 0,
    Cmd.GRAPH_RECOMPUTE: 4,
    Cmd.MEMSET_TENSOR: RPC_TENSOR_SIZE + 17,
}

#: reply payload sizes of the eleven commands that reply (GET_TENSOR replies with its ``size``)
REPLY_SIZE: dict[Cmd, int] = {
    Cmd.HELLO: 4 + CONN_CAPS_SIZE,
    Cmd.DEVICE_COUNT: 4,
    Cmd.ALLOC_BUFFER: 16,
    Cmd.GET_ALIGNMENT: 8,
    Cmd.GET_MAX_SIZE: 8,
    Cmd.BUFFER_GET_BASE: 8,
    Cmd.GET_DEVICE_MEMORY: 16,
    Cmd.GET_ALLOC_SIZE: 8,
    Cmd.SET_TENSOR_HASH: 1,
    Cmd.COPY_TENSOR: 1,
}

#: SET_TENSOR's header: rpc_tensor, u8 cache_flag, u64 offset (new in 7.0.0: the flag)
SET_TENSOR_HEADER = RPC_TENSOR_SIZE + 1 + 8


@dataclass
class RPCTensor:
    """One ``rpc_tensor`` as plain integers: what a tensor looks like on the wire.

    ``id`` is the sender's identity for the tensor (a pointer in C, ``id()`` in pyggml) and
    ``src``/``view_src`` refer to other tensors by that id; 0 means none.
    """

    id: int = 0
    type: int = 0
    buffer: int = 0
    ne: tuple[int, int, int, int] = (0, 0, 0, 0)
    nb: tuple[int, int, int, int] = (0, 0, 0, 0)
    op: int = 0
    op_params: tuple[int, ...] = (0,) * 16
    flags: int = 0
    src: tuple[int, ...] = (0,) * GGML_MAX_SRC
    view_src: int = 0
    view_offs: int = 0
    data: int = 0
    name: bytes = b""
    use_count: int = 0

    def pack(self) -> bytes:
        name = self.name[: GGML_MAX_NAME - 1]
        return RPC_TENSOR.pack(self.id, self.type, self.buffer, *self.ne, *self.nb, self.op, *self.op_params,
                               self.flags, *self.src, self.view_src, self.view_offs, self.data, name,
                               self.use_count)

    @classmethod
    def unpack(cls, raw: bytes | memoryview, offset: int = 0) -> RPCTensor:
        v = RPC_TENSOR.unpack_from(raw, offset)
        return cls(id=v[0], type=v[1], buffer=v[2], ne=tuple(v[3:7]), nb=tuple(v[7:11]), op=v[11],  # type: ignore[arg-type]
                   op_params=tuple(v[12:28]), flags=v[28], src=tuple(v[29:39]), view_src=v[39],
                   view_offs=v[40], data=v[41], name=v[42].split(b"\0", 1)[0], use_count=v[43])

    @property
    def name_str(self) -> str:
        return self.name.split(b"\0", 1)[0].decode("utf-8", errors="replace")


NULL_TENSOR = bytes(RPC_TENSOR_SIZE)


# ------------------------------------------------------------------------------------ hashing
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK64 = (1 << 64) - 1


def fnv1a_64(data: bytes | bytearray | memoryview, h: int = _FNV_OFFSET) -> int:
    """FNV-1a-64 as ggml-rpc's fnv_hash: the cache key of SET_TENSOR_HASH and the cache file name.

    Weights run to hundreds of MB, so the per-byte loop is done by numba when available.
    """
    buf = memoryview(data).cast("B")
    if len(buf) >= 4096:
        try:
            return _fnv_fast(buf, h)
        except ImportError:
            pass
    for b in buf:
        h = ((h ^ b) * _FNV_PRIME) & _MASK64
    return h


def _fnv_fast(buf: memoryview, h: int) -> int:
    from ._fnv import fnv1a_u8  # deferred: compiles a numba kernel, needed only for large buffers

    return int(fnv1a_u8(np.frombuffer(buf, dtype=np.uint8), np.uint64(h)))


# ------------------------------------------------------------------------------------ framing
def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Read exactly n bytes; a peer that closes early raises RPCError (llama.cpp: recv 0 = failure)."""
    if n == 0:
        return b""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, 1 << 24))
        if k == 0:
            raise RPCError(f"connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def recv_into_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from the socket (used for large tensor payloads to avoid a copy)."""
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, 1 << 24))
        if k == 0:
            raise RPCError(f"connection closed after {got} of {n} bytes")
        got += k


def send_request(sock: socket.socket, cmd: int, payload: bytes | bytearray | memoryview = b"") -> None:
    """``u8 cmd | u64 size | payload``."""
    sock.sendall(struct.pack("<BQ", cmd, len(payload)))
    if len(payload):
        sock.sendall(payload)


def send_reply(sock: socket.socket, payload: bytes | bytearray | memoryview) -> None:
    """``u64 size | payload``."""
    sock.sendall(struct.pack("<Q", len(payload)))
    if len(payload):
        sock.sendall(payload)


def hello_reply() -> bytes:
    """28 bytes: version 7.0.0, a pad byte and zero connection caps (TCP only, no RDMA)."""
    return bytes([PROTO_MAJOR, PROTO_MINOR, PROTO_PATCH, 0]) + bytes(CONN_CAPS_SIZE)


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port`` split at the first ':' as ggml-rpc's parse_endpoint (so no IPv6 literals)."""
    host, sep, port_s = endpoint.partition(":")
    if not sep or not host:
        raise RPCError(f"failed to parse endpoint {endpoint!r}: expected host:port")
    try:
        port = int(port_s)
    except ValueError:
        raise RPCError(f"failed to parse endpoint {endpoint!r}: port {port_s!r} is not a number") from None
    if not 0 < port < 65536:
        raise RPCError(f"failed to parse endpoint {endpoint!r}: port {port} is out of range")
    return host, port
