"""``pyggml rpc-server`` as a user runs it: a subprocess on a free loopback port."""

from __future__ import annotations

import os
import selectors
import socket
import subprocess
import sys
import time

import pytest

from helpers.rpc_util import WAIT_S
from pyggml.cli.main import main
from pyggml.rpc.client import rpc_add_server
from pyggml.rpc.server import security_warning


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


pytestmark = pytest.mark.subprocess


def _start(*args: str) -> tuple[subprocess.Popen, list[str]]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "pyggml.cli.main", "rpc-server", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=env)
    out = b""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and b"transport" not in out:
        if sel.select(timeout=1):
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            out += chunk
    return proc, out.decode().splitlines(keepends=True)


def test_cli_serves_devices_with_memory_cap() -> None:
    port = _free_port()
    proc, banner = _start("-p", str(port), "-d", "cpu,CPU", "-t", "1", "-m", "3")
    try:
        text = "".join(banner)
        assert "Starting RPC server v7.0.0" in text and f"127.0.0.1:{port}" in text, text
        assert "WARNING" not in text
        devs = rpc_add_server(f"127.0.0.1:{port}")
        assert len(devs) == 2
        assert devs[1].memory() == (3 << 20, 3 << 20)
    finally:
        proc.terminate()
        proc.wait(WAIT_S)


def test_cli_rejects_bad_options(capsys) -> None:
    assert main(["rpc-server", "-d", "nosuchdevice", "-p", str(_free_port())]) == 1
    assert "unknown device 'nosuchdevice'" in capsys.readouterr().err
    assert main(["rpc-server", "-t", "0"]) == 1
    assert "--threads must be positive" in capsys.readouterr().err
    assert main(["rpc-server", "-p", "70000"]) == 1


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.2", "localhost"])
def test_non_loopback_hosts_are_warned_about(host: str) -> None:
    text = security_warning(host)
    assert text is not None and f"Host ('{host}')" in text and "no authentication" in text
    assert security_warning("127.0.0.1") is None
