"""A writer killed mid-write (``pyggml quantize`` under kill -9) leaves its hidden temporary file beside
the target; the next write to that target removes it, once its writer's process is gone (issue #32)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from helpers import data
from pyggml.gguf.writer import GGUFWriter

# a child that writes a GGUF whose tensor data never finishes: it stops inside write(), temp file open
_CHILD = """
import sys, time
import numpy as np
from pyggml.gguf.writer import GGUFWriter
def slow():
    yield np.zeros(4, np.float32).tobytes()
    print("writing", flush=True)
    time.sleep(120)
    yield np.zeros(4, np.float32).tobytes()
w = GGUFWriter()
w.add_tensor("t", slow, type="F32", ne=[8])
w.write(sys.argv[1])
"""


def _temps(target: Path) -> list[Path]:
    return sorted(p for p in target.parent.iterdir() if p.name.startswith(f".{target.name}.") and p.suffix == ".tmp")


def _write(target: Path) -> None:
    w = GGUFWriter()
    w.add_tensor("t", np.arange(8, dtype=np.float32))
    w.write(target)


def test_killed_writer_temp_is_removed_by_the_next_write(tmp_path: Path) -> None:
    target = tmp_path / "out.gguf"
    env = dict(os.environ, PYTHONPATH=str(data.SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(target)], stdout=subprocess.PIPE, env=env)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"writing"
        left = _temps(target)
        assert len(left) == 1 and str(child.pid) in left[0].name
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    assert _temps(target) == left  # kill -9: nothing could clean up
    # another writer's temp, still alive (this test's parent process), is left alone
    alive = tmp_path / f".out.gguf.{os.getppid()}.x1y2.tmp"
    alive.write_bytes(b"in progress")
    t0 = time.time()
    _write(target)
    assert _temps(target) == [alive] and target.stat().st_size > 0
    assert time.time() - t0 < 5
    # a temp of another target is not this writer's business
    other = tmp_path / f".other.gguf.{child.pid}.zz.tmp"
    other.write_bytes(b"")
    _write(target)
    assert other.exists()
