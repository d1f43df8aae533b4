"""Fuzzing the RPC server (bounded): random and truncated frames, wrong sizes, bad handles,
out-of-range tensors and random small graphs. After every example the server must still be
serving, must not hang, and must have freed the dropped connection's buffers."""

from __future__ import annotations

import contextlib
import socket
import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.rpc_util import WAIT_S, RawClient, running_server, tensor_bytes, wait_idle

FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

#: fixed request sizes by command (what a well-formed frame carries), for "almost right" frames
SIZES = {0: 12, 1: 4, 2: 4, 3: 8, 4: 8, 5: 9, 7: 312, 8: 312, 9: 592, 11: 4, 12: 296, 13: 3260, 14: 24, 15: 0,
         16: 4, 17: 313}


@pytest.fixture(scope="module")
def server():
    with running_server(2, memory_limit=8 << 20) as srv:
        yield srv


def _drain(c: RawClient) -> None:
    """Stop sending and read until the server closes (bounded): it must never hang on us."""
    with contextlib.suppress(OSError):
        c.sock.shutdown(socket.SHUT_WR)
    deadline = time.monotonic() + WAIT_S
    c.sock.settimeout(WAIT_S)
    while time.monotonic() < deadline:
        try:
            if not c.sock.recv(1 << 16):
                return
        except (ConnectionResetError, BrokenPipeError):
            return
        except TimeoutError:
            break
    raise AssertionError("the server neither answered nor closed the connection")


def _session(server, frames_of, buffer_size: int = 4096) -> None:
    """Open a client with one buffer, send ``frames_of(handle, base)``, and check the aftermath."""
    before = server.clients_served
    with RawClient(server.port) as c:
        h, _ = c.alloc(buffer_size)
        base = c.base(h)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a hang-up mid-frame is allowed
            c.sock.sendall(frames_of(h, base))
        _drain(c)
    wait_idle(server, before)
    assert server.live_buffers == 0 and server.allocated == 0
    with RawClient(server.port) as c:  # and it still serves the next client
        assert struct.unpack("<I", c.request(15, b"", 4))[0] == 2


@FUZZ
@given(raw=st.binary(max_size=600))
def test_random_bytes_after_hello(server, raw: bytes) -> None:
    _session(server, lambda h, base: raw)


@st.composite
def frames(draw) -> object:
    """A function (handle, base) -> bytes of 1..4 nearly-valid frames, maybe truncated."""
    plan = []
    for _ in range(draw(st.integers(1, 4))):
        cmd = draw(st.sampled_from([*range(19), 19, 255]))
        size_kind = draw(st.sampled_from(["right", "right", "off", "huge"]))
        n_tensors = draw(st.integers(0, 3))
        extra = draw(st.binary(max_size=24))
        delta = draw(st.integers(-9, 9))
        cut = draw(st.one_of(st.none(), st.integers(0, 400)))
        plan.append((cmd, size_kind, n_tensors, extra, delta, cut, draw(st.randoms(use_true_random=False))))

    def build(h: int, base: int) -> bytes:
        out = b""
        for cmd, size_kind, n_tensors, extra, delta, cut, rnd in plan:
            payload = b""
            if cmd in (0, 1, 2, 11, 16):
                payload = struct.pack("<I", rnd.choice([0, 1, 2, 7]))
                if cmd == 0:
                    payload += struct.pack("<Q", rnd.choice([0, 16, 4096, 1 << 30, 2**64 - 1]))
            elif cmd in (3, 4, 5):
                payload = struct.pack("<Q", rnd.choice([h, h + 1, 0])) + (b"\x07" if cmd == 5 else b"")
            elif cmd == 10:
                ids = [rnd.randint(0, 8) for _ in range(rnd.randint(0, 3))]
                payload = struct.pack("<II", rnd.randint(0, 2), len(ids)) + b"".join(struct.pack("<Q", i) for i in ids)
                payload += struct.pack("<I", n_tensors)
            if cmd in (6, 7, 8, 9, 10, 12, 13, 17):
                if cmd == 13:
                    payload = struct.pack("<I", rnd.randint(0, 2))
                for _ in range(max(n_tensors, 1 if cmd != 10 else 0)):
                    payload += _tensor_from(rnd, h, base)
                if cmd in (7, 8):
                    payload += struct.pack("<QQ", rnd.choice([0, 4, 4096]), rnd.choice([0, 4, 16, 4096, 2**63]))
                elif cmd == 6:
                    payload += struct.pack("<BQ", rnd.randint(0, 1), rnd.choice([0, 4, 4092])) + extra
                elif cmd == 17:
                    payload += struct.pack("<QQB", rnd.choice([0, 4, 8]), rnd.choice([0, 4, 4096]), 0xAB)
                elif cmd == 13:
                    payload += bytes(296 * 10)
            payload += extra if cmd not in (6,) and size_kind == "off" else b""
            size = {"right": len(payload), "off": max(len(payload) + delta, 0),
                    "huge": rnd.choice([2**40, 2**63, 2**64 - 1])}[size_kind]
            frame = struct.pack("<BQ", cmd, size) + payload
            out += frame if cut is None else frame[:cut]
        return out

    return build


def _tensor_from(rnd, h: int, base: int) -> bytes:
    """A tensor with fields near and beyond the valid ranges, from the example's seeded Random."""
    ne = tuple(rnd.choice([0, 1, 2, 3, 4, 16, 33, 256, 1024, 2**31, 2**32 - 1]) for _ in range(4))
    nb = tuple(rnd.choice([0, 1, 2, 4, 8, 64, 1024, 2**31, 2**32 - 1]) for _ in range(4))
    return tensor_bytes(id=rnd.randint(0, 8), type=rnd.randint(0, 50), buffer=rnd.choice([h, 0, h + 0x100]),
                        ne=ne, nb=nb, op=rnd.randint(0, 110), flags=rnd.choice([0, 16, 18]),
                        src=tuple(rnd.randint(0, 8) for _ in range(10)), view_src=rnd.randint(0, 8),
                        data=rnd.choice([base, base + 4, base + 4092, base + 4096, base - 4, 0]))


@FUZZ
@given(build=frames())
def test_nearly_valid_frames(server, build) -> None:
    _session(server, build)


OPS = {"ADD": 2, "MUL": 6, "SCALE": 30, "CPY": 31, "CONT": 32, "SOFT_MAX": 42, "MUL_MAT": 26, "GET_ROWS": 40,
       "RMS_NORM": 24, "SUM_ROWS": 11, "VIEW": 37, "PERMUTE": 38}


@st.composite
def graphs(draw) -> object:
    """Small graphs of real ops over tensors inside a 64 KiB buffer, with shapes that are often
    compatible (so kernels run) and often not (so they must fail cleanly)."""
    n = draw(st.integers(1, 5))
    specs = []
    for i in range(n):
        earlier = [0] + [100 + j for j in range(i)]
        specs.append(dict(
            id=100 + i,
            type=draw(st.sampled_from([0, 0, 0, 0, 1, 26, 8])),
            ne=(draw(st.sampled_from([1, 2, 4, 8, 32])), draw(st.sampled_from([1, 1, 2, 3])),
                draw(st.sampled_from([1, 1, 2])), 1),
            op=draw(st.sampled_from(list(OPS.values()))) if i else 0,
            src=tuple(draw(st.sampled_from(earlier)) for _ in range(2)) + (0,) * 8,
            off=draw(st.integers(0, 64)) * 32,
            op_params=tuple(draw(st.sampled_from([0, 0, 1, 2, 3, 0x3F800000])) for _ in range(4)) + (0,) * 12,
        ))
    n_nodes = draw(st.integers(1, n))
    recompute = draw(st.booleans())

    def build(h: int, base: int) -> bytes:
        body = b""
        for s in specs:
            ne = s["ne"]
            ts, bs = {0: (4, 1), 26: (4, 1), 1: (2, 1), 8: (34, 32)}[s["type"]]
            row = ts * max(ne[0] // bs, 1)
            nb = (ts, row, row * ne[1], row * ne[1] * ne[2])
            body += tensor_bytes(id=s["id"], type=s["type"], buffer=h, ne=ne, nb=nb, op=s["op"],
                                 flags=16 if s["op"] else 0, src=s["src"], data=base + s["off"],
                                 op_params=s["op_params"])
        ids = [100 + i for i in range(n - n_nodes, n)]
        head = struct.pack("<II", 0, len(ids)) + b"".join(struct.pack("<Q", i) for i in ids)
        frame = head + struct.pack("<I", len(specs)) + body
        out = struct.pack("<BQ", 10, len(frame)) + frame
        return out + struct.pack("<BQI", 16, 4, 0) if recompute else out

    return build


@FUZZ
@given(build=graphs())
def test_random_graphs(server, build) -> None:
    _session(server, build, buffer_size=1 << 16)


def test_fuzzing_reached_the_handlers(server) -> None:
    """Runs last in this module: the fuzz examples must have exercised real commands, not only
    been refused at the first byte (otherwise the fuzzer proves nothing)."""
    counts = server.command_counts
    assert server.clients_dropped >= 50
    from pyggml.rpc.protocol import Cmd

    for cmd in (Cmd.ALLOC_BUFFER, Cmd.BUFFER_GET_BASE, Cmd.DEVICE_COUNT):
        assert counts[cmd] > 100
    assert counts[Cmd.GRAPH_COMPUTE] + counts[Cmd.GRAPH_RECOMPUTE] > 0
