"""The RPC server: pyggml devices served over TCP with ggml's RPC protocol 7.0.0.

Like ggml-rpc-server it serves **one client at a time** (listen backlog 1): llama.cpp's client
never holds two connections to one endpoint at once, and sequential serving keeps buffers and
compute from racing. A refused request or a vanished client ends only that connection: its
buffers are freed and the next client is accepted. Where ggml-rpc-server would abort the
whole process (see deserialize.py), this server drops the connection instead.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from ..backend.base import Backend, Buffer, BufferType, Device
from .deserialize import CloseConnection
from .protocol import PROTO_MAJOR, PROTO_MINOR, PROTO_PATCH, Cmd, RPCError
from .session import Session, write_atomically

LOOPBACK = "127.0.0.1"


def default_cache_dir() -> Path:
    """rpc-server.cpp's cache location: $LLAMA_CACHE, else $XDG_CACHE_HOME/llama.cpp, else
    ~/.cache/llama.cpp; then ``rpc`` under it. Shared with llama.cpp's server on purpose, so
    weights one of them cached are found by the other (the files are the raw bytes)."""
    env = os.environ.get("LLAMA_CACHE")
    if env:
        base = Path(env)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = (Path(xdg) if xdg else Path.home() / ".cache") / "llama.cpp"
    return base / "rpc"


class RPCServer:
    """Serve ``backends`` (one RPC device each) on host:port; ``port=0`` picks a free port.

    ``memory_limit`` caps the bytes all live buffers may hold (the ``-m`` option); requests
    beyond it get ggml's allocation-failure reply (handle 0). ``client_timeout`` (seconds)
    drops a client silent for that long; None waits forever, as ggml-rpc-server does.
    """

    def __init__(self, backends: list[Backend], host: str = LOOPBACK, port: int = 50052,
                 cache_dir: str | Path | None = None, memory_limit: int | None = None,
                 client_timeout: float | None = None, log: Callable[[str], None] | None = None) -> None:
        if not backends:
            raise RPCError("an RPC server needs at least one device")
        self.backends = list(backends)
        self.bufts: list[BufferType] = [b.get_default_buffer_type() for b in self.backends]
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        if self.cache_dir is not None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.memory_limit = memory_limit
        self.client_timeout = client_timeout
        self.log = log or (lambda msg: None)
        self.debug = os.environ.get("GGML_RPC_DEBUG", "") not in ("", "0")
        self.allocated = 0
        self.live_buffers = 0
        self.clients_served = 0
        self.clients_dropped = 0
        #: commands handled successfully, by Cmd, counted once the handler (and its reply) is done
        self.command_counts: Counter[Cmd] = Counter()
        self._next_handle = 0x1000
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._client: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind((host, port))
        except OSError:
            self._listener.close()
            raise
        self._listener.listen(1)
        self.host, self.port = self._listener.getsockname()[:2]

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    # ------------------------------------------------------------------ memory
    def new_handle(self) -> int:
        with self._lock:
            self._next_handle += 0x100
            return self._next_handle

    def allocate(self, dev: int, size: int) -> Buffer | None:
        """ALLOC_BUFFER: None (the client sees handle 0) when the limit or the host refuses."""
        with self._lock:
            if self.memory_limit is not None and self.allocated + size > self.memory_limit:
                self.log(f"refusing a buffer of {size} bytes: {self.allocated} of {self.memory_limit} in use")
                return None
            self.allocated += size
        try:
            buf = self.bufts[dev].alloc_buffer(size)
        except (MemoryError, ValueError, OverflowError, RPCError) as e:
            self.log(f"failed to allocate a buffer of {size} bytes: {e}")
            buf = None
        except Exception as e:  # a backend's own allocation error (AllocationError is a MemoryError)
            self.log(f"failed to allocate a buffer of {size} bytes: {type(e).__name__}: {e}")
            buf = None
        with self._lock:
            if buf is None:
                self.allocated -= size
            else:
                self.allocated += buf.get_size() - size
                self.live_buffers += 1
        return buf

    def release_buffer(self, buf: Buffer) -> None:
        buf.free()
        with self._lock:
            self.allocated -= buf.get_size()
            self.live_buffers -= 1

    def device_memory(self, dev: int) -> tuple[int, int]:
        if self.memory_limit is not None:
            return max(self.memory_limit - self.allocated, 0), self.memory_limit
        device = self.backends[dev].get_device()
        return device.memory() if device is not None else (0, 0)

    # ------------------------------------------------------------------ cache
    def _cache_path(self, h: int) -> Path | None:
        return None if self.cache_dir is None else self.cache_dir / f"{h:016x}"

    def cache_load(self, h: int) -> bytes | None:
        path = self._cache_path(h)
        if path is None or not path.is_file():
            return None
        return path.read_bytes()

    def cache_store(self, h: int, data: memoryview) -> None:
        path = self._cache_path(h)
        if path is not None:
            write_atomically(str(path), data)

    # ------------------------------------------------------------------ serving
    def serve_forever(self) -> None:
        """Accept and serve clients one after another until :meth:`stop`."""
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                if self._stop.is_set():
                    return
                raise
            self.serve_connection(conn)

    def serve_connection(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.settimeout(self.client_timeout)
        self._client = conn
        self.log("Accepted client connection")
        session = Session(self, conn)
        try:
            session.serve()
        except (CloseConnection, RPCError) as e:
            self.clients_dropped += 1
            self.log(f"dropping client: {e}")
        except (OSError, TimeoutError) as e:
            self.clients_dropped += 1
            self.log(f"client connection failed: {e}")
        except Exception as e:  # a bug must not take the server down: drop the client, keep serving
            self.clients_dropped += 1
            self.log(f"dropping client after an internal error: {type(e).__name__}: {e}")
            if self.debug:
                traceback.print_exc()
        finally:
            self._client = None
            with contextlib.suppress(OSError):
                conn.close()
            self.clients_served += 1
            self.log("Client connection closed")

    def start(self) -> RPCServer:
        """Serve on a daemon thread (tests, embedding); returns self."""
        self._thread = threading.Thread(target=self.serve_forever, name=f"rpc-server-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop accepting, drop the current client and wait (bounded) for the serving thread."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        client = self._client
        if client is not None:
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> RPCServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def banner(self, devices: list[Device]) -> str:
        lines = [f"Starting RPC server v{PROTO_MAJOR}.{PROTO_MINOR}.{PROTO_PATCH}",
                 f"  endpoint       : {self.endpoint}",
                 f"  local cache    : {self.cache_dir if self.cache_dir is not None else 'n/a'}",
                 "Devices:"]
        for dev in devices:
            free, total = dev.memory()
            lines.append(f"  {dev.name()}: {dev.description()} ({total // 2**20} MiB, {free // 2**20} MiB free)")
        if self.memory_limit is not None:
            lines.append(f"  memory limit   : {self.memory_limit // 2**20} MiB")
        lines.append("  transport      : TCP")
        return "\n".join(lines)


def security_warning(host: str) -> str | None:
    """rpc-server.cpp's warning for any host but 127.0.0.1: the protocol has no authentication."""
    if host == LOOPBACK:
        return None
    bar = "!" * 59
    return (f"\n{bar}\nWARNING: Host ('{host}') is != '{LOOPBACK}'\n"
            "         Never expose the RPC server to an open network!\n"
            "         The RPC protocol has no authentication: anyone who can connect can\n"
            "         allocate memory and run graphs on this machine.\n"
            f"{bar}\n")


def print_log(msg: str) -> None:
    print(msg, flush=True, file=sys.stdout)
