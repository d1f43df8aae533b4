"""Helpers for the RPC tests: in-process servers on free loopback ports and a raw-frame client.

The raw client speaks the wire format by hand (struct packing written here, independently of
pyggml.rpc.wire), so the server tests check bytes, not pyggml's own client against itself.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import time
from collections.abc import Iterator

from pyggml.backend.cpu.backend import backend_cpu_init
from pyggml.rpc.server import RPCServer

#: every wait in these tests is bounded by this many seconds
WAIT_S = 20.0

_TENSOR = struct.Struct("<QIQ4I4II16ii10QQQQ64si")


@contextlib.contextmanager
def running_server(n_devices: int = 1, **kw: object) -> Iterator[RPCServer]:
    """A server on 127.0.0.1 with a free port and n CPU devices, stopped afterwards."""
    kw.setdefault("client_timeout", 300.0)  # idle clients: long enough for a first numba compile
    if os.environ.get("PYGGML_RPC_TEST_LOG"):
        kw.setdefault("log", print)
    srv = RPCServer([backend_cpu_init() for _ in range(n_devices)], "127.0.0.1", 0, **kw)  # type: ignore[arg-type]
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def wait_idle(srv: RPCServer, served_before: int, n: int = 1) -> None:
    """Wait (bounded) until the server has finished ``n`` more connections."""
    deadline = time.monotonic() + WAIT_S
    while srv.clients_served < served_before + n:
        if time.monotonic() > deadline:
            raise AssertionError(f"server did not finish the connection within {WAIT_S}s")
        time.sleep(0.005)


def tensor_bytes(*, id: int = 1, type: int = 0, buffer: int = 0, ne: tuple = (1, 1, 1, 1), nb: tuple | None = None,
                 op: int = 0, op_params: tuple = (0,) * 16, flags: int = 0, src: tuple = (0,) * 10,
                 view_src: int = 0, view_offs: int = 0, data: int = 0, name: bytes = b"", use_count: int = 0) -> bytes:
    """An rpc_tensor; nb defaults to contiguous f32/i32 strides."""
    if nb is None:
        nb = (4, 4 * ne[0], 4 * ne[0] * ne[1], 4 * ne[0] * ne[1] * ne[2])
        nb = tuple(x & 0xFFFFFFFF for x in nb)  # the wire's u32, truncated as ggml's client does
    return _TENSOR.pack(id, type, buffer, *ne, *nb, op, *op_params, flags, *src, view_src, view_offs, data, name,
                        use_count)


class RawClient:
    """A socket speaking frames by hand. ``closed()`` tells whether the server hung up on us."""

    def __init__(self, port: int, hello: bool = True) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
        if hello:
            assert self.request(14, bytes(24), 28) == bytes([7, 0, 0, 0]) + bytes(24)

    def send(self, cmd: int, payload: bytes = b"", size: int | None = None) -> None:
        n = len(payload) if size is None else size
        self.sock.sendall(struct.pack("<BQ", cmd, n) + payload)

    def recv_exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError(f"server closed after {len(out)} of {n} bytes")
            out += chunk
        return out

    def reply(self, expect: int) -> bytes:
        size = struct.unpack("<Q", self.recv_exact(8))[0]
        assert size == expect, f"reply of {size} bytes, expected {expect}"
        return self.recv_exact(size)

    def request(self, cmd: int, payload: bytes, expect: int) -> bytes:
        self.send(cmd, payload)
        return self.reply(expect)

    # typed helpers for the commands the tests use most
    def alloc(self, size: int, device: int = 0) -> tuple[int, int]:
        return struct.unpack("<QQ", self.request(0, struct.pack("<IQ", device, size), 16))

    def base(self, handle: int) -> int:
        return struct.unpack("<Q", self.request(3, struct.pack("<Q", handle), 8))[0]

    def set_tensor(self, tensor: bytes, data: bytes, offset: int = 0, cache_flag: int = 0) -> None:
        self.send(6, tensor + struct.pack("<BQ", cache_flag, offset) + data)

    def get_tensor(self, tensor: bytes, offset: int, size: int) -> bytes:
        return self.request(8, tensor + struct.pack("<QQ", offset, size), size)

    def closed(self) -> bool:
        """True once the server has closed the connection (waits up to WAIT_S for EOF)."""
        self.sock.settimeout(WAIT_S)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
