"""``pyggml devices``: the devices models can use, as llama.cpp's ``--list-devices`` prints them.

One line per device: name (what -dev takes), description, type, total and free memory. llama.cpp
lists only the devices layers can be offloaded to; the CPU is listed here too, with its type, since
-ot can place tensors on it by name.
"""

from __future__ import annotations

import argparse

from ..backend.registry import backend_devices
from ..rpc.client import parse_rpc_servers

MIB = 1024 * 1024


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("devices", help="list the devices (CPU, torch, RPC servers) and their memory",
                       description="List every device pyggml can run on: its name (for -dev), description, "
                                   "type and total/free memory.")
    p.add_argument("--rpc", default=None, metavar="HOST:PORT[,HOST:PORT...]",
                   help="also connect to these ggml RPC servers and list their devices")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.rpc:
        parse_rpc_servers(args.rpc)
    print("Available devices:")
    for dev in backend_devices():
        free, total = dev.memory()
        print(f"  {dev.name()}: {dev.description()} ({dev.type().name}, {total // MIB} MiB, {free // MIB} MiB free)")
    return 0
