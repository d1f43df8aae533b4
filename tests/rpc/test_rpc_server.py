"""The RPC server against hand-built frames: every command's bytes, and every refusal closes only
that connection (ggml-rpc.md §2, §5)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from helpers.rpc_util import RawClient, running_server, tensor_bytes, wait_idle
from pyggml.rpc.protocol import RPC_TENSOR, RPCError, RPCTensor, fnv1a_64, parse_endpoint

ADD, F32, COMPUTE = 2, 0, 16


# ------------------------------------------------------------------ pure wire format
def test_rpc_tensor_layout_offsets() -> None:
    rt = RPCTensor(id=0x1122334455667788, type=12, buffer=0xAABB, ne=(1, 2, 3, 4), nb=(5, 6, 7, 8), op=26,
                   op_params=tuple(range(100, 116)), flags=18, src=tuple(range(1, 11)), view_src=0x77,
                   view_offs=0x88, data=0x99, name=b"blk.0.attn_q", use_count=3)
    raw = rt.pack()
    assert len(raw) == RPC_TENSOR.size == 296
    u32 = lambda off: struct.unpack_from("<I", raw, off)[0]  # noqa: E731
    u64 = lambda off: struct.unpack_from("<Q", raw, off)[0]  # noqa: E731
    assert u64(0) == rt.id and u32(8) == 12 and u64(12) == 0xAABB
    assert [u32(20 + 4 * i) for i in range(4)] == [1, 2, 3, 4]
    assert [u32(36 + 4 * i) for i in range(4)] == [5, 6, 7, 8]
    assert u32(52) == 26 and u32(56) == 100 and u32(116) == 115 and u32(120) == 18
    assert [u64(124 + 8 * i) for i in range(10)] == list(range(1, 11))
    assert (u64(204), u64(212), u64(220)) == (0x77, 0x88, 0x99)
    assert raw[228:240] == b"blk.0.attn_q" and raw[240:292] == bytes(52) and u32(292) == 3
    back = RPCTensor.unpack(raw)
    assert back == rt and back.name_str == "blk.0.attn_q"


def test_fnv1a_matches_reference_vector_and_python_loop() -> None:
    assert fnv1a_64(struct.pack("<4f", 1, 2, 3, 4)) == 0x8FAA0A18FAF0FB98  # ggml-rpc.md §2.5, verified
    data = np.random.default_rng(1).integers(0, 256, 9000, dtype=np.uint8).tobytes()
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & (2**64 - 1)
    assert fnv1a_64(data) == h


@pytest.mark.parametrize("bad", ["localhost", ":50052", "h:", "h:x", "h:0", "h:70000"])
def test_parse_endpoint_rejects(bad: str) -> None:
    with pytest.raises(RPCError, match="endpoint"):
        parse_endpoint(bad)


# ------------------------------------------------------------------ commands
def test_handshake_device_count_memory_alignment() -> None:
    with running_server(2, memory_limit=64 << 20) as srv, RawClient(srv.port) as c:
        assert struct.unpack("<I", c.request(15, b"", 4))[0] == 2
        assert struct.unpack("<Q", c.request(1, struct.pack("<I", 1), 8))[0] == 32
        assert struct.unpack("<Q", c.request(2, struct.pack("<I", 0), 8))[0] == 2**64 - 1
        assert struct.unpack("<QQ", c.request(11, struct.pack("<I", 0), 16)) == (64 << 20, 64 << 20)
        h, size = c.alloc(1 << 20)
        assert h != 0 and size == 1 << 20
        assert struct.unpack("<QQ", c.request(11, struct.pack("<I", 1), 16)) == (63 << 20, 64 << 20)
        assert c.alloc(64 << 20) == (0, 0)  # over the -m cap: ggml's allocation-failure reply
        base = c.base(h)
        assert base % 32 == 0 and base != 0
        assert c.alloc(0)[0] != 0 and c.alloc(0)[1] == 0


def test_set_get_memset_copy_clear_init_free() -> None:
    with running_server() as srv, RawClient(srv.port) as c:
        h, _ = c.alloc(256)
        base = c.base(h)
        a = tensor_bytes(id=1, buffer=h, ne=(8, 1, 1, 1), data=base)
        b = tensor_bytes(id=2, buffer=h, ne=(8, 1, 1, 1), data=base + 64)
        vals = np.arange(8, dtype=np.float32)
        c.set_tensor(a, vals.tobytes())
        c.set_tensor(a, struct.pack("<f", 42.0), offset=4)  # fire-and-forget: no reply bytes
        got = np.frombuffer(c.get_tensor(a, 0, 32), np.float32)
        assert got.tolist() == [0, 42, 2, 3, 4, 5, 6, 7]
        assert c.request(9, a + b, 1) == b"\x01"  # COPY_TENSOR
        assert np.frombuffer(c.get_tensor(b, 0, 32), np.float32).tolist() == got.tolist()
        c.send(17, b + struct.pack("<QQB", 8, 8, 0xFF))  # MEMSET two floats to 0xFFFFFFFF
        assert c.get_tensor(b, 8, 8) == b"\xff" * 8
        c.send(12, tensor_bytes(id=3, type=12, buffer=h, ne=(256, 1, 1, 1), nb=(144, 144, 144, 144), data=base))
        assert c.request(13, struct.pack("<I", 0) + a + bytes(2960), 8) == struct.pack("<Q", 32)
        c.send(5, struct.pack("<QB", h, 0x3F))  # BUFFER_CLEAR
        assert c.get_tensor(a, 0, 4) == b"\x3f" * 4
        assert c.get_tensor(a, 0, 0) == b""  # size 0: an 8-byte zero header
        c.send(4, struct.pack("<Q", h))  # FREE_BUFFER: no reply, so the next reply is DEVICE_COUNT's
        assert struct.unpack("<I", c.request(15, b"", 4))[0] == 1
        assert srv.live_buffers == 0


def _add_graph(h: int, base: int, device: int = 0) -> bytes:
    a = tensor_bytes(id=10, buffer=h, ne=(4, 1, 1, 1), data=base, name=b"a")
    b = tensor_bytes(id=11, buffer=h, ne=(4, 1, 1, 1), data=base + 16, name=b"b")
    c = tensor_bytes(id=12, buffer=h, ne=(4, 1, 1, 1), data=base + 32, op=ADD, flags=COMPUTE | 2,
                     src=(10, 11) + (0,) * 8, name=b"c", use_count=0)
    return struct.pack("<II", device, 1) + struct.pack("<Q", 12) + struct.pack("<I", 3) + a + b + c


def test_graph_compute_and_recompute() -> None:
    with running_server(2) as srv, RawClient(srv.port) as c:
        h, _ = c.alloc(64)
        base = c.base(h)
        a = tensor_bytes(id=10, buffer=h, ne=(8, 1, 1, 1), data=base)  # a and b as one 8-float upload
        out = tensor_bytes(id=12, buffer=h, ne=(4, 1, 1, 1), data=base + 32)
        c.set_tensor(a, np.array([1, 2, 3, 4, 10, 20, 30, 40], np.float32).tobytes())
        c.send(10, _add_graph(h, base, device=1))
        assert np.frombuffer(c.get_tensor(out, 0, 16), np.float32).tolist() == [11, 22, 33, 44]
        c.set_tensor(a, np.array([100], np.float32).tobytes(), offset=4)
        c.send(16, struct.pack("<I", 1))  # RECOMPUTE the stored graph of device 1
        assert np.frombuffer(c.get_tensor(out, 4, 8), np.float32).tolist() == [120, 33]
        c.send(4, struct.pack("<Q", c.alloc(16)[0]))  # any FREE_BUFFER drops the stored graphs
        c.send(16, struct.pack("<I", 1))
        assert c.closed()
    assert srv.live_buffers == 0


def test_hash_cache(tmp_path) -> None:
    data = np.random.default_rng(2).standard_normal(1024).astype(np.float32).tobytes()
    with running_server(cache_dir=tmp_path) as srv:
        with RawClient(srv.port) as c:
            h, _ = c.alloc(4096)
            t = tensor_bytes(buffer=h, ne=(1024, 1, 1, 1), data=c.base(h))
            req = t + struct.pack("<QQ", 0, fnv1a_64(data))
            assert c.request(7, req, 1) == b"\x00"  # unknown hash
            c.set_tensor(t, data, cache_flag=1)
            c.request(15, b"", 4)  # SET_TENSOR has no reply: sync on the next request
            assert (tmp_path / f"{fnv1a_64(data):016x}").read_bytes() == data
        with RawClient(srv.port) as c:  # a later client: the bytes come from the cache
            h, _ = c.alloc(4096)
            t = tensor_bytes(buffer=h, ne=(1024, 1, 1, 1), data=c.base(h))
            assert c.request(7, t + struct.pack("<QQ", 0, fnv1a_64(data)), 1) == b"\x01"
            assert c.get_tensor(t, 0, 4096) == data
            c.set_tensor(t, data[:8])  # cache_flag 0: nothing new is written
            c.request(15, b"", 4)
        assert len(list(tmp_path.iterdir())) == 1


# ------------------------------------------------------------------ refusals close one connection
def _frame(cmd: int, payload: bytes, size: int | None = None) -> bytes:
    return struct.pack("<BQ", cmd, len(payload) if size is None else size) + payload


def _bad_requests(h: int, base: int) -> dict[str, bytes]:
    t = lambda **kw: tensor_bytes(buffer=h, data=base, **kw)  # noqa: E731
    graph_node = lambda **kw: (struct.pack("<IIQI", 0, 1, 5, 1) + tensor_bytes(id=5, **kw))  # noqa: E731
    return {
        "second HELLO": _frame(14, bytes(24)),
        "cmd NONE": _frame(18, b""),
        "cmd 19": _frame(19, b""),
        "cmd 255": _frame(255, b""),
        "GET_ALIGNMENT size 8": _frame(1, bytes(8)),
        "DEVICE_COUNT size 4": _frame(15, bytes(4)),
        "GET_TENSOR size 304": _frame(8, bytes(304)),
        "device out of range": _frame(0, struct.pack("<IQ", 3, 16)),
        "unknown handle": _frame(3, struct.pack("<Q", 0xDEAD)),
        "free unknown handle": _frame(4, struct.pack("<Q", h + 1)),
        "SET_TENSOR short": _frame(6, bytes(300)),
        "SET_TENSOR huge size": _frame(6, b"", 2**64 - 1),
        "SET_TENSOR buffer 0": _frame(6, tensor_bytes(data=base) + bytes(9) + b"abcd"),
        "type 43": _frame(8, t(type=43) + struct.pack("<QQ", 0, 4)),
        "removed type 4": _frame(8, t(type=4) + struct.pack("<QQ", 0, 4)),
        "tensor crosses buffer end": _frame(8, tensor_bytes(buffer=h, data=base + 60, ne=(4, 1, 1, 1))
                                            + struct.pack("<QQ", 0, 4)),
        "data before base": _frame(8, tensor_bytes(buffer=h, data=base - 4) + struct.pack("<QQ", 4, 4)),
        "huge stride": _frame(8, t(ne=(2, 1, 1, 1), nb=(2**31, 4, 4, 4)) + struct.pack("<QQ", 0, 4)),
        "ne overflows int64": _frame(8, t(ne=(2**32 - 1,) * 4) + struct.pack("<QQ", 0, 4)),
        "read past tensor": _frame(8, t(ne=(2, 1, 1, 1)) + struct.pack("<QQ", 4, 8)),
        "read at buffer end": _frame(8, tensor_bytes(buffer=h, data=base + 64, ne=(0, 1, 1, 1))
                                     + struct.pack("<QQ", 0, 0)),
        "memset past tensor": _frame(17, t(ne=(2, 1, 1, 1)) + struct.pack("<QQB", 4, 8, 0)),
        "copy too big": _frame(9, t(ne=(16, 1, 1, 1)) + tensor_bytes(buffer=h, data=base + 32)),
        "recompute without graph": _frame(16, struct.pack("<I", 0)),
        "graph short": _frame(10, bytes(7)),
        "graph node count lies": _frame(10, struct.pack("<II", 0, 1000)),
        "graph node id 0": _frame(10, struct.pack("<IIQI", 0, 1, 0, 0)),
        "graph missing src": _frame(10, graph_node(buffer=h, data=base, op=ADD, flags=16, src=(77,) + (0,) * 9)),
        "graph op 200": _frame(10, graph_node(buffer=h, data=base, op=200, flags=16)),
        "graph data without buffer": _frame(10, graph_node(data=base, op=ADD, flags=16)),
        "graph node without memory": _frame(10, graph_node(op=1, flags=16, src=(5, 5) + (0,) * 8)),
        "graph add of mismatched shapes": _frame(10, struct.pack("<IIQI", 0, 1, 5, 3)
                                                 + tensor_bytes(id=5, buffer=h, data=base, ne=(4, 1, 1, 1), op=ADD,
                                                                flags=16, src=(6, 7) + (0,) * 8)
                                                 + tensor_bytes(id=6, buffer=h, data=base + 16, ne=(4, 1, 1, 1))
                                                 + tensor_bytes(id=7, buffer=h, data=base + 32, ne=(3, 1, 1, 1))),
    }


def test_every_refusal_closes_only_that_connection() -> None:
    with running_server(memory_limit=1 << 20) as srv:
        bad = _bad_requests(0x1000, 0x1000)  # only the names: handles and bases differ per connection
        for name in bad:
            before = srv.clients_served
            with RawClient(srv.port) as c:
                h, _ = c.alloc(64)
                base = c.base(h)
                c.sock.sendall(_bad_requests(h, base)[name])
                assert c.closed(), f"{name}: the server kept the connection open"
            wait_idle(srv, before)
            assert srv.live_buffers == 0, f"{name}: the dropped connection's buffers were not freed"
        with RawClient(srv.port) as c:  # and the server still serves
            assert struct.unpack("<I", c.request(15, b"", 4))[0] == 1
        assert srv.clients_dropped >= len(bad)


@pytest.mark.parametrize("first", [_frame(15, b""), _frame(14, bytes(25)), _frame(14, bytes(0)), b"\x0e\x18"])
def test_bad_handshake_closes(first: bytes) -> None:
    with running_server() as srv:
        with RawClient(srv.port, hello=False) as c:
            c.sock.sendall(first)
            if len(first) < 9:
                c.sock.shutdown(1)  # a truncated frame: the peer is gone
            assert c.closed()
        with RawClient(srv.port) as c:
            assert struct.unpack("<I", c.request(15, b"", 4))[0] == 1
