"""Starting a live ``pyggml serve`` for tests: a subprocess on a free loopback port, always stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from helpers import data

SRC = str(data.SRC)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def live_server(args: list[str], log: Path, timeout: float = 300.0) -> Iterator[str]:
    """Run ``pyggml serve ARGS --port P`` until /health answers; yields the base URL, then stops it."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "pyggml.cli.main", "serve", *args, "--host", "127.0.0.1", "--port", str(port)]
    with open(log, "wb") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout
            while True:
                if p.poll() is not None:
                    raise RuntimeError(f"the server exited with {p.returncode}: {log.read_text()[-2000:]}")
                try:
                    if httpx.get(url + "/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not start in {timeout} s: {log.read_text()[-2000:]}")
                time.sleep(0.5)
            yield url
        finally:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)


def metrics(client: httpx.Client) -> dict[str, float]:
    """The unlabelled llamacpp:* samples of /metrics."""
    out = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("llamacpp:") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            out[name[len("llamacpp:"):]] = float(value)
    return out


def wait_all_idle(client: httpx.Client, timeout: float = 30.0) -> list[dict]:
    """Poll /slots until no slot is processing; returns the slots (fails after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        slots = client.get("/slots").json()
        if not any(s["is_processing"] for s in slots):
            return slots
        if time.monotonic() > deadline:
            raise AssertionError(f"slots still busy after {timeout} s: {slots}")
        time.sleep(0.2)


@contextlib.contextmanager
def in_process_server(argv: list[str], start: bool = True) -> Iterator[tuple[Any, Any]]:
    """``pyggml serve ARGV`` as an app in this process: (a Starlette TestClient on it, the server state).
    The engine runs unless ``start`` is False (to see how requests are refused without one); errors come
    back as replies (500s), as a client would see them."""
    from starlette.testclient import TestClient

    from pyggml.cli.main import build_parser
    from pyggml.cli.serve import build_state
    from pyggml.serve.server import create_app

    state = build_state(build_parser().parse_args(["serve", *argv]))
    if start:
        state.engine.start()
    try:
        with TestClient(create_app(state), raise_server_exceptions=False) as client:
            yield client, state
    finally:
        if start:
            state.engine.stop()
