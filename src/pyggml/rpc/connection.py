"""The client's connection to one RPC endpoint (llama.cpp's rpc_dispatcher, synchronously).

llama.cpp keeps one connection per endpoint alive while any buffer or backend uses it, and
opens a short-lived one for one-off queries when none is alive (a server serves one client at
a time, so a second connection would wait behind the first). :func:`get_connection` does the
same with a weak-value map: buffers and backends hold their connection strongly, queries borrow
whichever is alive. Requests are sent and their replies read under a lock, so a connection can
be shared between threads; there is no queue, so "async" commands are simply sent.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import weakref

from .protocol import (
    CONN_CAPS_SIZE,
    PROTO_MAJOR,
    PROTO_MINOR,
    REPLY_SIZE,
    Cmd,
    RPCError,
    parse_endpoint,
    recv_exact,
    recv_into_exact,
    send_request,
)

#: seconds to wait for connect and for each reply; a graph on a slow server can take long
CONNECT_TIMEOUT = 10.0
REPLY_TIMEOUT = 600.0


class Connection:
    """One socket to ``endpoint``, handshaken (HELLO 7.0.0) on creation."""

    def __init__(self, endpoint: str, timeout: float = REPLY_TIMEOUT) -> None:
        self.endpoint = endpoint
        host, port = parse_endpoint(endpoint)
        try:
            self.sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
        except OSError as e:
            raise RPCError(f"failed to connect to {endpoint}: {e}") from e
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(timeout)
        self._lock = threading.Lock()
        self.broken = False
        self._finalizer = weakref.finalize(self, _close_socket, self.sock)
        reply = self.call(Cmd.HELLO, bytes(CONN_CAPS_SIZE), REPLY_SIZE[Cmd.HELLO])
        major, minor, patch = reply[0], reply[1], reply[2]
        if major != PROTO_MAJOR or minor > PROTO_MINOR:
            self.close()
            raise RPCError(f"RPC server version mismatch: {major}.{minor}.{patch} (this client speaks "
                           f"{PROTO_MAJOR}.{PROTO_MINOR}.x); RPC handshake failed for {endpoint}")

    def call(self, cmd: Cmd, payload: bytes | bytearray | memoryview = b"", reply_size: int | None = None,
             into: memoryview | None = None) -> bytes:
        """Send one request; read its reply when ``reply_size`` is given (into ``into`` if passed).

        A reply whose size field differs from what the command must answer means the peer and
        this client disagree about the protocol: the connection is unusable from then on.
        """
        if cmd == Cmd.NONE:
            raise RPCError("RPC_CMD_NONE is a client-internal marker and never goes on the wire")
        with self._lock:
            if self.broken:
                raise RPCError(f"the connection to {self.endpoint} failed earlier and is closed")
            try:
                send_request(self.sock, cmd, payload)
                if reply_size is None:
                    return b""
                size = struct.unpack("<Q", recv_exact(self.sock, 8))[0]
                if size != reply_size:
                    raise RPCError(f"{cmd.name} reply of {size} bytes, expected {reply_size}")
                if into is not None:
                    recv_into_exact(self.sock, into[:size])
                    return b""
                return recv_exact(self.sock, size)
            except (OSError, RPCError) as e:
                self.broken = True
                _close_socket(self.sock)
                raise RPCError(f"remote RPC server {self.endpoint} crashed or returned a malformed response "
                               f"({cmd.name}): {e}") from e

    def close(self) -> None:
        self.broken = True
        self._finalizer()


def _close_socket(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()


_live: weakref.WeakValueDictionary[str, Connection] = weakref.WeakValueDictionary()
_live_lock = threading.Lock()


def get_connection(endpoint: str) -> Connection:
    """The live connection to ``endpoint``, or a new one (kept only while someone holds it)."""
    with _live_lock:
        conn = _live.get(endpoint)
        if conn is not None and not conn.broken:
            return conn
        conn = Connection(endpoint)
        _live[endpoint] = conn
        return conn
