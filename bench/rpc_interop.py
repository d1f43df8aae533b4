"""Interop check: pyggml's RPC client against llama.cpp's ``ggml-rpc-server`` (protocol 7.0.0).

    python bench/rpc_interop.py /path/to/ggml-rpc-server

Starts the C++ server on a free 127.0.0.1 port with two CPU devices and a throwaway cache
directory, then drives it with pyggml's client: device listing, graphs compared with pyggml's
own CPU backend (NMSE, since the kernels differ), GRAPH_RECOMPUTE, memset/copy/clear, and the
weight hash cache. Prints one line per check and exits non-zero if any fails.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import pyggml as g
from helpers.backend_run import run_graph, upload_inputs
from pyggml.alloc import backend_alloc_ctx_tensors_from_buft, gallocr_alloc_graph, gallocr_new
from pyggml.backend import api
from pyggml.backend.base import BufferUsage
from pyggml.backend.cpu.backend import backend_cpu_init
from pyggml.context import Context
from pyggml.graph import new_graph
from pyggml.rpc.client import rpc_add_server
from pyggml.types import GGMLType as T

RNG = np.random.default_rng(11)


def nmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a - b) ** 2).sum() / max((b**2).sum(), 1e-30))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"ggml-rpc-server did not listen on {port} within {timeout}s")


def main(binary: str) -> int:
    port = free_port()
    cache = tempfile.mkdtemp(prefix="rpc-interop-")
    env = dict(os.environ, LLAMA_CACHE=cache)
    proc = subprocess.Popen([binary, "-H", "127.0.0.1", "-p", str(port), "-d", "CPU,CPU", "-c", "-t", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    failures = 0

    def check(name: str, ok: bool, detail: str = "") -> None:
        nonlocal failures
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}", flush=True)

    try:
        wait_port(port)  # the probe connection sends nothing: the server just sees a client leave
        devs = rpc_add_server(f"127.0.0.1:{port}")
        check("DEVICE_COUNT", len(devs) == 2, f"{[d.name() for d in devs]}")
        free, total = devs[0].memory()
        check("GET_DEVICE_MEMORY", 0 < free <= total, f"free={free >> 20} MiB total={total >> 20} MiB")
        buft = devs[1].get_buffer_type()
        check("GET_ALIGNMENT/GET_MAX_SIZE", buft.get_alignment() == 32 and buft.get_max_size() == 2**64 - 1,
              f"{buft.name()} align={buft.get_alignment()}")
        be = devs[1].init_backend()
        cases = {
            "add*silu": ({"a": (T.F32, [64, 3], RNG.standard_normal((3, 64))),
                          "b": (T.F32, [64, 1], RNG.standard_normal((1, 64)))},
                         lambda c, t: g.mul(c, g.add(c, t["a"], t["b"]), g.silu(c, t["a"])), 1e-7),
            "mul_mat q4_K": ({"w": (T.Q4_K, [256, 32], RNG.standard_normal((32, 256))),
                              "x": (T.F32, [256, 5], RNG.standard_normal((5, 256)))},
                             lambda c, t: g.mul_mat(c, t["w"], t["x"]), 5e-4),
            "mul_mat q8_0": ({"w": (T.Q8_0, [640, 24], RNG.standard_normal((24, 640))),
                              "x": (T.F32, [640, 7], RNG.standard_normal((7, 640)))},
                             lambda c, t: g.mul_mat(c, t["w"], t["x"]), 5e-4),
            "rope neox": ({"x": (T.F32, [64, 4, 6], RNG.standard_normal((6, 4, 64))),
                           "p": (T.I32, [6], np.arange(6) * 5)},
                          lambda c, t: g.rope_ext(c, t["x"], t["p"], None, 64, 2, 4096, 10000.0, 1.0, 0.0, 1.0,
                                                  32.0, 1.0), 1e-7),
            "soft_max_ext": ({"s": (T.F32, [8, 8, 2], RNG.standard_normal((2, 8, 8))),
                              "m": (T.F32, [8, 8], np.triu(np.full((8, 8), -np.inf), 1))},
                             lambda c, t: g.soft_max_ext(c, t["s"], t["m"], 0.125, 0.0), 1e-7),
            "get_rows+rms_norm": ({"e": (T.Q8_0, [64, 10], RNG.standard_normal((10, 64))),
                                   "i": (T.I32, [4], np.array([3, 0, 9, 3]))},
                                  lambda c, t: g.rms_norm(c, g.get_rows(c, t["e"], t["i"]), 1e-6), 1e-7),
        }
        for name, (inputs, build, tol) in cases.items():
            remote = run_graph(be, inputs, build)
            local = run_graph(backend_cpu_init(), inputs, build)
            err = nmse(remote, local)
            check(f"graph {name}", err <= tol, f"nmse={err:.2e} (<= {tol:g})")

        _, t = upload_inputs(be, {"a": (T.F32, [8], np.arange(8.0)), "b": (T.F32, [8], np.ones(8))},
                             BufferUsage.COMPUTE)
        ctx = Context(1 << 20, no_alloc=True)
        out = g.add(ctx, t["a"], t["b"])
        gf = new_graph(ctx)
        gf.build_forward_expand(out)
        galloc = gallocr_new(be.get_default_buffer_type())
        gallocr_alloc_graph(galloc, gf)
        api.backend_graph_compute(be, gf)
        first = np.frombuffer(api.backend_tensor_get(out), np.float32).tolist()
        api.backend_tensor_set(t["b"], np.full(8, 10, np.float32))
        api.backend_graph_compute(be, gf)  # same uid: GRAPH_RECOMPUTE
        second = np.frombuffer(api.backend_tensor_get(out), np.float32).tolist()
        check("GRAPH_COMPUTE then GRAPH_RECOMPUTE", first == list(np.arange(8.0) + 1)
              and second == list(np.arange(8.0) + 10), f"{second[:3]}")
        ok = api.backend_buffer_copy_tensor(t["a"], t["b"])
        api.backend_tensor_memset(t["b"], 0, 4, 8)
        got = np.frombuffer(api.backend_tensor_get(t["b"]), np.float32).tolist()
        check("COPY_TENSOR + MEMSET_TENSOR", ok and got == [0, 0, 0, 3, 4, 5, 6, 7], f"{got}")
        t["a"].buffer.clear(0x3F)
        check("BUFFER_CLEAR", api.backend_tensor_get(t["a"]).tolist() == [0x3F] * 32)

        n = (10 << 20) // 4 + 64
        values = RNG.standard_normal(n).astype(np.float32)
        for attempt in ("first upload (hash miss, cache_flag=1)", "second upload (hash hit, no data)"):
            wctx = Context(1 << 16, no_alloc=True)
            w = wctx.new_tensor(T.F32, n)
            buf = backend_alloc_ctx_tensors_from_buft(wctx, buft)
            buf.set_usage(BufferUsage.WEIGHTS)
            t0 = time.perf_counter()
            api.backend_tensor_set(w, values)
            dt = time.perf_counter() - t0
            same = np.array_equal(np.frombuffer(api.backend_tensor_get(w), np.float32), values)
            files = list(Path(cache, "rpc").iterdir())
            check(f"SET_TENSOR_HASH {attempt}", same and len(files) == 1, f"{dt * 1000:.0f} ms, cache {files[0].name}")
            buf.free()
    finally:
        proc.terminate()
        proc.wait(10)
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    sys.exit(main(sys.argv[1]))
