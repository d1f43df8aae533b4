"""``pyggml rpc-server [-H HOST] [-p PORT] [-d DEV,...] [-t N] [-c] [-m MiB]``: serve devices over RPC.

Speaks ggml's RPC protocol 7.0.0, so llama.cpp (``llama-bench --rpc``, ``llama-cli --rpc``) and
pyggml's own RPC client can offload to it. Options mirror llama.cpp's ``ggml-rpc-server``; ``-m``
is pyggml's addition: the protocol has no authentication, so a cap on what a client can
allocate is the one safety knob. Clients are served one at a time.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any

from ..backend.base import DeviceType
from ..backend.registry import backend_dev_by_name, backend_dev_by_type, backend_devices
from ..rpc.server import RPCServer, default_cache_dir, print_log, security_warning
from .errors import CLIError


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("rpc-server", help="serve pyggml devices to llama.cpp / pyggml RPC clients")
    p.add_argument("-H", "--host", default="127.0.0.1", help="IPv4 address to bind (default 127.0.0.1)")
    p.add_argument("-p", "--port", type=int, default=50052, help="TCP port (default 50052)")
    p.add_argument("-d", "--device", default=None,
                   help="comma- or slash-separated device names; repeat a name to expose it twice "
                        "(default: the GPU devices, else the CPU)")
    p.add_argument("-t", "--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                   help="threads for the CPU backend (default: half the cores)")
    p.add_argument("-c", "--cache", action="store_true",
                   help="cache large weights on disk ($LLAMA_CACHE/rpc or ~/.cache/llama.cpp/rpc)")
    p.add_argument("-m", "--mem", type=int, default=None, metavar="MiB",
                   help="cap on the memory all client buffers may use, in MiB (default: no cap)")
    p.set_defaults(func=run)


def _devices(spec: str | None) -> list[Any]:
    """rpc-server.cpp's choice: the named devices, else every device that is not a CPU or an
    accelerator (GPUs), else the CPU."""

    if spec is None:
        gpus = [d for d in backend_devices() if d.type() not in (DeviceType.CPU, DeviceType.ACCEL)]
        cpu = backend_dev_by_type(DeviceType.CPU)
        if not gpus and cpu is None:
            raise CLIError("no devices found")
        return gpus or [cpu]
    devs = []
    for name in (n for n in re.split(r"[,/]", spec) if n):
        dev = backend_dev_by_name(name)
        if dev is None:
            avail = ", ".join(d.name() for d in backend_devices())
            raise CLIError(f"unknown device {name!r}; available devices: {avail}")
        devs.append(dev)
    if not devs:
        raise CLIError("no devices given to -d")
    return devs


def _backend_for(dev: Any, n_threads: int) -> Any:
    backend = dev.init_backend(None)
    reg = dev.backend_reg()
    set_threads = reg.get_proc_address("ggml_backend_set_n_threads") if reg is not None else None
    if set_threads is not None:
        set_threads(backend, n_threads)
    return backend


def run(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        raise CLIError(f"port {args.port} is out of range 1..65535")
    if args.threads <= 0:
        raise CLIError(f"--threads must be positive, got {args.threads}")
    if args.mem is not None and args.mem < 0:
        raise CLIError(f"--mem must be >= 0 MiB, got {args.mem}")
    warning = security_warning(args.host)
    if warning:
        print(warning, file=sys.stderr)
    devices = _devices(args.device)
    backends = [_backend_for(d, args.threads) for d in devices]
    cache = default_cache_dir() if args.cache else None
    limit = args.mem * 2**20 if args.mem is not None else None
    try:
        server = RPCServer(backends, args.host, args.port, cache_dir=cache, memory_limit=limit, log=print_log)
    except OSError as e:
        raise CLIError(f"cannot listen on {args.host}:{args.port}: {e}") from e
    print(server.banner(devices), flush=True)
    try:
        server.serve_forever()
    finally:
        server.stop()
    return 0
