"""The RPC client backend: devices, buffer types, buffers and streams whose memory is remote.

Behaves as llama.cpp's ggml-rpc client (ggml-rpc.cpp): devices are ``RPC<n>`` (n counts across
every server added in this process) described by their endpoint; buffer types and backends are
``RPC<device>[endpoint]``; tensors in RPC buffers hold the server's addresses in ``data``;
graphs go over as GRAPH_COMPUTE, or as GRAPH_RECOMPUTE when the same graph (same non-zero uid)
runs again on a device; weights above 10 MiB try the server's cache first. Where llama.cpp's
client aborts (unreachable server, malformed reply) this one raises :class:`RPCError`.
"""

from __future__ import annotations

import struct
import threading
from typing import TYPE_CHECKING

import numpy as np

from ..backend.base import (
    Backend,
    Buffer,
    BufferType,
    BufferUsage,
    Device,
    DeviceCaps,
    DeviceProps,
    DeviceType,
    Event,
    GGMLStatus,
    Registry,
)
from ..backend.errors import AllocationError
from ..backend.registry import backend_dev_by_name, backend_register
from ..ops.enums import Op
from .connection import Connection, get_connection
from .protocol import HASH_THRESHOLD, REPLY_SIZE, RPC_GUID, SET_TENSOR_HEADER, Cmd, RPCError, fnv1a_64, parse_endpoint
from .wire import RemoteBuffer, serialize_graph, serialize_tensor

if TYPE_CHECKING:
    from ..graph import Graph
    from ..tensor import Tensor

#: ops whose allocation a server may enlarge (ggml_op_alloc_size_may_expand)
_MAY_EXPAND = frozenset({Op.FLASH_ATTN_EXT, Op.MUL_MAT, Op.MUL_MAT_ID, Op.CUMSUM, Op.ARGSORT, Op.TOP_K})

_alloc_size_cache: dict[tuple, int] = {}
_cache_lock = threading.Lock()


# --------------------------------------------------------------------------------------- buffers
class RPCBuffer(RemoteBuffer):
    """A buffer on the server: ``remote_ptr`` is the server's handle, the base is fetched lazily."""

    def __init__(self, buft: RPCBufferType, conn: Connection, remote_ptr: int, size: int) -> None:
        super().__init__(buft, size)
        self.conn = conn
        self.remote_ptr = remote_ptr
        self._base: int | None = None

    def get_base(self) -> int | None:
        if self._base is None:
            reply = self.conn.call(Cmd.BUFFER_GET_BASE, struct.pack("<Q", self.remote_ptr), 8)
            self._base = struct.unpack("<Q", reply)[0]
        return self._base

    def init_tensor(self, tensor: Tensor) -> GGMLStatus:
        # only quantized rows that a CUDA server would pad need the server's init (bandwidth)
        if tensor.type.is_quantized and tensor.ne[0] % 512 and tensor.view_src is None:
            self.conn.call(Cmd.INIT_TENSOR, serialize_tensor(tensor))
        return GGMLStatus.SUCCESS

    def memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        self.conn.call(Cmd.MEMSET_TENSOR, serialize_tensor(tensor) + struct.pack("<QQB", offset, size, value & 0xFF))

    def set_tensor(self, tensor: Tensor, data: np.ndarray, offset: int, size: int) -> None:
        send_tensor_data(self.conn, tensor, data, offset, size)

    def get_tensor(self, tensor: Tensor, data: np.ndarray, offset: int, size: int) -> None:
        req = serialize_tensor(tensor) + struct.pack("<QQ", offset, size)
        self.conn.call(Cmd.GET_TENSOR, req, size, into=memoryview(data[:size]))

    def cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        src_buf = src.view_src.buffer if src.view_src is not None else src.buffer
        if not isinstance(src_buf, RPCBuffer) or src_buf.conn is not self.conn:
            return False
        reply = self.conn.call(Cmd.COPY_TENSOR, serialize_tensor(src) + serialize_tensor(dst), 1)
        return reply[0] != 0

    def clear(self, value: int) -> None:
        self.conn.call(Cmd.BUFFER_CLEAR, struct.pack("<QB", self.remote_ptr, value & 0xFF))

    def free(self) -> None:
        if not self.freed and not self.conn.broken:
            self.conn.call(Cmd.FREE_BUFFER, struct.pack("<Q", self.remote_ptr))
            # the server forgets every stored graph of the connection on a free; llama.cpp's client
            # would still send GRAPH_RECOMPUTE (and be dropped), so the next graph goes in full
            reg = self.buft.device.reg if self.buft.device is not None else None
            for dev in reg.devices() if reg is not None else []:
                if isinstance(dev, RPCDevice):
                    dev.last_graph_uid = 0
        super().free()


def send_tensor_data(conn: Connection, tensor: Tensor, data: np.ndarray, offset: int, size: int) -> None:
    """SET_TENSOR, preceded for big weights by SET_TENSOR_HASH (the server may have them cached)."""
    head = serialize_tensor(tensor)
    payload = np.ascontiguousarray(data[:size]).view(np.uint8)
    cache_flag = 0
    if size > HASH_THRESHOLD and tensor.buffer is not None and tensor.buffer.get_usage() == BufferUsage.WEIGHTS:
        h = fnv1a_64(payload.data)
        if conn.call(Cmd.SET_TENSOR_HASH, head + struct.pack("<QQ", offset, h), 1)[0]:
            return
        cache_flag = 1
    msg = bytearray(SET_TENSOR_HEADER + size)
    msg[: len(head)] = head
    struct.pack_into("<BQ", msg, len(head), cache_flag, offset)
    msg[SET_TENSOR_HEADER:] = payload.data
    conn.call(Cmd.SET_TENSOR, msg)


class RPCBufferType(BufferType):
    """``RPC<device>[endpoint]``: memory of one device of one server; alignment and max size are
    asked once, when the type is first used, and kept (as llama.cpp does)."""

    def __init__(self, device: RPCDevice) -> None:
        super().__init__(device)
        self.endpoint = device.endpoint
        self.index = device.index
        self._name = f"RPC{device.index}[{device.endpoint}]"
        conn = get_connection(self.endpoint)
        dev = struct.pack("<I", self.index)
        self.alignment = struct.unpack("<Q", conn.call(Cmd.GET_ALIGNMENT, dev, 8))[0]
        self.max_size = struct.unpack("<Q", conn.call(Cmd.GET_MAX_SIZE, dev, 8))[0]

    def name(self) -> str:
        return self._name

    def _alloc_buffer(self, size: int) -> Buffer:
        conn = get_connection(self.endpoint)
        reply = conn.call(Cmd.ALLOC_BUFFER, struct.pack("<IQ", self.index, size), REPLY_SIZE[Cmd.ALLOC_BUFFER])
        remote_ptr, remote_size = struct.unpack("<QQ", reply)
        if remote_ptr == 0:
            raise AllocationError(f"RPC server {self.endpoint} could not allocate a buffer of {size} bytes "
                                  f"on device {self.index}")
        return RPCBuffer(self, conn, remote_ptr, remote_size)

    def get_alignment(self) -> int:
        return self.alignment

    def get_max_size(self) -> int:
        return self.max_size

    def get_alloc_size(self, tensor: Tensor) -> int:
        """ggml_nbytes, unless the server may need more: then ask it (once per shape, process-wide)."""
        nbytes = tensor.nbytes()
        ask = tensor.type.is_quantized and tensor.ne[0] % 512 != 0 and tensor.view_src is None
        if not (ask or tensor.op in _MAY_EXPAND):
            return nbytes
        key = (self.endpoint, self.index, int(tensor.type), int(tensor.op), tensor.op_params.tobytes(),
               tuple(tensor.ne), tuple(tensor.nb))
        with _cache_lock:
            cached = _alloc_size_cache.get(key)
        if cached is None:
            req = struct.pack("<I", self.index) + serialize_tensor(tensor)
            req += b"".join(serialize_tensor(s) for s in tensor.src)
            reply = get_connection(self.endpoint).call(Cmd.GET_ALLOC_SIZE, req, 8)
            cached = struct.unpack("<Q", reply)[0]
            with _cache_lock:
                _alloc_size_cache[key] = cached
        return max(cached, nbytes)


# --------------------------------------------------------------------------------------- backend
class RPCBackend(Backend):
    """The stream of one remote device. Commands are sent in order on one connection and the
    server runs them in order, so reading a result (GET_TENSOR) is the synchronization."""

    def __init__(self, device: RPCDevice) -> None:
        super().__init__(device, RPC_GUID)
        self.rpc_device = device
        self.conn = get_connection(device.endpoint)
        self._name = f"RPC{device.index}[{device.endpoint}]"

    def name(self) -> str:
        return self._name

    def graph_compute(self, graph: Graph) -> GGMLStatus:
        if not graph.nodes:
            return GGMLStatus.SUCCESS
        dev = self.rpc_device
        if graph.uid != 0 and dev.last_graph_uid == graph.uid:
            self.conn.call(Cmd.GRAPH_RECOMPUTE, struct.pack("<I", dev.index))
        else:
            dev.last_graph_uid = graph.uid
            self.conn.call(Cmd.GRAPH_COMPUTE, serialize_graph(dev.index, graph, self.conn))
        return GGMLStatus.SUCCESS

    def supports_events(self) -> bool:
        return True

    def event_record(self, event: Event) -> None:
        event.recorded = True

    def event_wait(self, event: Event) -> None:
        return None  # a single in-order stream per endpoint: nothing to wait for


# --------------------------------------------------------------------------------------- device
class RPCDevice(Device):
    """Device ``index`` of the server at ``endpoint``, named RPC<n> with a process-wide n."""

    def __init__(self, reg: RPCRegistry, endpoint: str, index: int, global_id: int) -> None:
        super().__init__(reg)
        self.endpoint = endpoint
        self.index = index
        self._name = f"RPC{global_id}"
        self.last_graph_uid = 0
        self._buft: RPCBufferType | None = None

    def name(self) -> str:
        return self._name

    def description(self) -> str:
        return self.endpoint

    def memory(self) -> tuple[int, int]:
        reply = get_connection(self.endpoint).call(Cmd.GET_DEVICE_MEMORY, struct.pack("<I", self.index), 16)
        free, total = struct.unpack("<QQ", reply)
        return free, total

    def type(self) -> DeviceType:
        return DeviceType.GPU  # as ggml-rpc: the server's real type is not on the wire

    def props(self) -> DeviceProps:
        free, total = self.memory()
        caps = DeviceCaps(async_=True, host_buffer=False, buffer_from_host_ptr=False, events=True)
        return DeviceProps(self.name(), self.description(), free, total, self.type(), None, caps)

    def init_backend(self, params: str | None = None) -> Backend:
        return RPCBackend(self)

    def get_buffer_type(self) -> BufferType:
        if self._buft is None:
            self._buft = RPCBufferType(self)
        return self._buft

    def supports_op(self, op: Tensor) -> bool:
        """The client cannot ask (ggml-rpc answers always true); pyggml's server runs the CPU
        kernels, so the CPU device's answer (asked through the registry) is the honest one."""
        cpu = backend_dev_by_name("CPU")
        return cpu is None or cpu.supports_op(op)

    def supports_buft(self, buft: BufferType) -> bool:
        return isinstance(buft, RPCBufferType) and buft.endpoint == self.endpoint and buft.index == self.index

    def event_new(self) -> Event | None:
        return Event(self)

    def event_synchronize(self, event: Event) -> None:
        return None


class RPCRegistry(Registry):
    """``RPC[endpoint]``: the devices of one server."""

    def __init__(self, endpoint: str) -> None:
        super().__init__()
        self.endpoint = endpoint

    def name(self) -> str:
        return f"RPC[{self.endpoint}]"

    def get_proc_address(self, name: str) -> object:
        return {"ggml_backend_rpc_add_server": rpc_add_server}.get(name)


_regs: dict[str, RPCRegistry] = {}
_regs_lock = threading.Lock()
_next_dev_id = 0


def rpc_add_server(endpoint: str) -> list[Device]:
    """ggml_backend_rpc_add_server: ask ``host:port`` how many devices it has and make one
    RPCDevice per device (the same objects when the endpoint was added before)."""
    global _next_dev_id
    parse_endpoint(endpoint)
    with _regs_lock:
        reg = _regs.get(endpoint)
        if reg is not None:
            return list(reg.devices())
        count = struct.unpack("<I", get_connection(endpoint).call(Cmd.DEVICE_COUNT, b"", 4))[0]
        if count == 0:
            return []
        reg = RPCRegistry(endpoint)
        for i in range(count):
            reg._devices.append(RPCDevice(reg, endpoint, i, _next_dev_id))
            _next_dev_id += 1
        _regs[endpoint] = reg
        return list(reg.devices())


def rpc_registry(endpoint: str) -> RPCRegistry | None:
    return _regs.get(endpoint)


def parse_rpc_servers(servers: str, register: bool = True) -> list[Device]:
    """``--rpc host:port[,host:port...]``: add each server and (like llama.cpp's argument parser)
    register its devices with pyggml's backend registry so the scheduler and model loader see them."""
    endpoints = [s.strip() for s in servers.split(",") if s.strip()]
    if not endpoints:
        raise RPCError(f"no RPC servers in {servers!r}; expected host:port[,host:port...]")
    devices: list[Device] = []
    for ep in endpoints:
        devs = rpc_add_server(ep)
        if register and devs:
            backend_register(_regs[ep])
        devices.extend(devs)
    return devices
