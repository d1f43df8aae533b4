"""``pyggml dump``: text and JSON views of a file, and one ``error:`` line for a bad one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pyggml.cli.main import main
from pyggml.gguf import GGUFReader, GGUFWriter
from pyggml.types import GGMLType


@pytest.fixture
def model(tmp_path: Path) -> Path:
    w = GGUFWriter()
    w.set_str("general.architecture", "llama")
    w.set_u32("general.alignment", 64)
    w.set_f32("llama.eps", 0.5)
    w.set_arr("tokenizer.ggml.tokens", [f"tok{i}" for i in range(100)])
    w.set_arr("scores", np.arange(100, dtype=np.float32))
    w.add_tensor("token_embd.weight", np.zeros((3, 64), np.float32))
    w.add_tensor("q", np.zeros((2, 144), np.uint8), type=GGMLType.Q4_K)
    return w.write(tmp_path / "m.gguf")


def test_json(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dump", "--json", str(model)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert list(d) == ["version", "alignment", "metadata", "tensors"]
    assert d["version"] == 3 and d["alignment"] == 64
    assert d["metadata"]["llama.eps"] == 0.5
    assert d["metadata"]["tokenizer.ggml.tokens"] == [f"tok{i}" for i in range(100)]  # whole, not abbreviated
    assert d["metadata"]["scores"] == list(range(100))
    r = GGUFReader(model)
    assert d["tensors"] == [
        {"name": "token_embd.weight", "type": "f32", "ne": [64, 3], "offset": r.data_offset, "nbytes": 768},
        {"name": "q", "type": "q4_K", "ne": [256, 2], "offset": r.data_offset + 768, "nbytes": 288},
    ]


def test_text(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dump", str(model)]) == 0
    out = capsys.readouterr().out
    assert "general.architecture = 'llama'" in out
    assert "'tok0'" in out and "(100 items)" in out and "'tok99'" not in out  # long arrays abbreviated
    line = next(ln for ln in out.splitlines() if " q " in ln)
    assert "q4_K" in line and "[256, 2]" in line and line.split()[-1] == "288"


@pytest.mark.subprocess
def test_malformed_file_is_one_error_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + (4).to_bytes(4, "little") + bytes(16))
    p = subprocess.run(
        [sys.executable, "-m", "pyggml.cli.main", "dump", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 1
    assert p.stdout == ""
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:")
    assert "unsupported GGUF version" in lines[0] and "[V5]" in lines[0] and str(bad) in lines[0]


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dump", str(tmp_path / "nope.gguf")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error:") and "nope.gguf" in err
