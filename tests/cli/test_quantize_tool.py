"""``pyggml quantize`` against llama.cpp's llama-quantize: the same bytes for every file type and option.

The models are regenerated from seeds (tests/helpers/quantize_models.py) and checked against the recorded
SHA-256 of the inputs; the outputs' SHA-256 are llama-quantize's (tests/data/quantize/reference.json,
made by tests/helpers/quantize_reference.py). Cases llama-quantize refused must be refused here too, with a
one-line error and no output file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

import pytest

from helpers.data import load_json
from helpers.quantize_models import make_models
from helpers.quantize_reference import case_id
from pyggml.cli.main import main

REF = load_json("quantize", "reference.json")
CASES = REF["cases"]

pytestmark = pytest.mark.slow  # 200 quantizations: each quantizer compiles on first use (minutes, cold)


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("qmodels")
    for m, (p, _) in make_models(d).items():
        assert sha256(p) == REF["models"][m], f"the generator no longer makes the recorded {m} model"
    return d


def run_case(models: Path, c: dict, out_name: str) -> int:
    argv = ["quantize", "-q", *c["options"], *(["--imatrix", f"{c['model']}.imatrix.gguf"] if c["imatrix"] else []),
            f"{c['model']}.gguf", out_name, c["ftype"], "2"]
    cwd = os.getcwd()
    os.chdir(models)  # relative names, as the reference was made: quantize.imatrix.file records the path given
    try:
        return main(argv)
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("cid", list(CASES))
def test_matches_llama_quantize(models: Path, cid: str, capsys: pytest.CaptureFixture[str]) -> None:
    c = CASES[cid]
    assert case_id(c) == cid
    out = models / f"out-{cid}.gguf"
    t0 = time.perf_counter()
    rc = run_case(models, c, out.name)
    err = capsys.readouterr().err
    if c["error"]:
        assert rc == 1, f"llama-quantize refused {cid}, pyggml did not"
        assert err.startswith("error: ") and err.count("\n") == 1, err
        assert not out.exists()
        assert not [p for p in models.iterdir() if p.name.startswith(f".{out.name}")], "temporary file left behind"
        return
    assert rc == 0, err
    try:
        took = time.perf_counter() - t0
        assert sha256(out) == c["sha256"], f"{cid}: bytes differ from llama-quantize's ({took:.1f}s)"
    finally:
        out.unlink(missing_ok=True)


def test_requantize_needs_allow(models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    q = tmp_path / "q8.gguf"
    assert main(["quantize", "-q", str(models / "qwen3odd.gguf"), str(q), "Q8_0"]) == 0
    out = tmp_path / "q4.gguf"
    assert main(["quantize", "-q", str(q), str(out), "Q4_0"]) == 1
    assert "requantizing from type q8_0 is disabled" in capsys.readouterr().err
    assert not out.exists()
    assert main(["quantize", "-q", "--allow-requantize", str(q), str(out), "Q4_0"]) == 0
    assert out.exists()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["M", "OUT", "Q9_9"], "invalid file type 'Q9_9'"),
        (["M", "OUT", "99"], "invalid file type '99'"),
        (["--tensor-type", "attn_q", "M", "OUT", "Q4_0"], "malformed tensor type 'attn_q'"),
        (["--tensor-type", "attn_q=q9", "M", "OUT", "Q4_0"], "invalid quantization type 'q9'"),
        (["--tensor-type", "attn_q[=q8_0", "M", "OUT", "Q4_0"], "bad --tensor-type pattern"),
        (["--output-tensor-type", "nope", "M", "OUT", "Q4_0"], "invalid ggml_type 'nope'"),
        (["--prune-layers", "1,x", "M", "OUT", "Q4_0"], "invalid layer id 'x'"),
        (["--override-kv", "a.b=long:3", "M", "OUT", "Q4_0"], "invalid type for KV override"),
        (["--imatrix", "missing.gguf", "M", "OUT", "IQ2_XS"], "cannot read imatrix file 'missing.gguf'"),
        (["--tensor-type-file", "missing.txt", "M", "OUT", "Q4_0"], "failed to open tensor type file"),
        (["nothere.gguf", "OUT", "Q4_0"], "cannot read model 'nothere.gguf'"),
        (["M", "M", "Q4_0"], "input and output files are the same"),
        (["M", "OUT"], "missing file type after the output file"),
        (["M", "nodir/o.gguf", "Q4_0"], "is not a writable directory"),
        (["M", "OUT", "Q4_0", "x"], "invalid nthread 'x'"),
        (["M", "OUT", "Q4_0", "2", "3"], "unexpected arguments: 3"),
    ],
)
def test_bad_input_is_one_line(models: Path, tmp_path: Path, argv: list[str], needle: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    m = str(models / "qwen3odd.gguf")
    argv = [m if a == "M" else str(tmp_path / "o.gguf") if a == "OUT" else a for a in argv]
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        rc = main(["quantize", "-q", *argv])
    finally:
        os.chdir(cwd)
    err = capsys.readouterr().err
    assert rc == 1 and needle in err and err.count("\n") == 1, err
    assert not (tmp_path / "o.gguf").exists()


def test_small_buffer_gives_the_same_bytes(models: Path, tmp_path: Path) -> None:
    """A 8 KiB buffer quantizes every tensor in slabs of a few rows: the bytes do not change."""
    from pyggml.quantize import QuantizeOptions, quantize_model

    out = tmp_path / "o.gguf"
    quantize_model(models / "llama8.gguf", out, "Q4_K_M", QuantizeOptions(max_buffer_size=8192, progress=False))
    assert sha256(out) == CASES["llama8-Q4_K_M"]["sha256"]
    assert main(["quantize", "-q", "--max-buffer-size", "0", str(models / "llama8.gguf"), str(out), "Q4_0"]) == 1


def test_input_alignment_key_is_copied_but_not_used(models: Path, tmp_path: Path) -> None:
    """An input with general.alignment = 64: llama-quantize copies the key yet lays the output out with 32."""
    from pyggml.gguf import GGUFReader, GGUFWriter

    ref = load_json("quantize", "alignment64.json")
    with GGUFReader(models / "qwen3odd.gguf") as r:
        w = GGUFWriter.from_context(r)
        w.set_u32("general.alignment", 64)
        w.write(tmp_path / "al64.gguf")
    assert main(["quantize", "-q", str(tmp_path / "al64.gguf"), str(tmp_path / "o.gguf"), "Q4_0", "2"]) == 0
    assert sha256(tmp_path / "o.gguf") == ref["Q4_0"]


def test_default_output_name(models: Path, tmp_path: Path) -> None:
    """``IN TYPE`` writes ggml-model-TYPE.gguf beside the input, as llama-quantize does."""
    shutil.copy(models / "qwen3odd.gguf", tmp_path / "m.gguf")
    assert main(["quantize", "-q", str(tmp_path / "m.gguf"), "q8_0", "1"]) == 0
    c = CASES["qwen3odd-Q8_0"]
    assert sha256(tmp_path / "ggml-model-Q8_0.gguf") == c["sha256"]


def test_not_a_gguf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    assert main(["quantize", "-q", str(bad), str(tmp_path / "o.gguf"), "Q4_0"]) == 1
    assert "cannot read model" in capsys.readouterr().err


def test_interrupt_leaves_no_file(models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyboardInterrupt mid-write (here: in the 5th tensor's quantization) removes the temporary file."""
    from pyggml.quantize import driver

    calls = {"n": 0}
    real = driver._quantize_tensor

    def boom(*a, **k):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        yield from real(*a, **k)

    monkeypatch.setattr(driver, "_quantize_tensor", boom)
    shutil.copy(models / "qwen3odd.gguf", tmp_path / "m.gguf")
    assert main(["quantize", "-q", str(tmp_path / "m.gguf"), str(tmp_path / "o.gguf"), "Q4_0"]) == 130
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


def test_dry_run_writes_nothing_and_lists_types(models: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from pyggml.quantize import QuantizeOptions, quantize_model

    res = quantize_model(models / "llama8.gguf", None, "IQ2_XS", QuantizeOptions(dry_run=True, progress=False))
    types = {p.name: p.new_type.type_name for p in res.plans}
    assert types["blk.0.ffn_down.weight"] == "q2_K" and types["blk.1.ffn_down.weight"] == "iq2_xs"
    assert types["blk.0.attn_v.weight"] == "q4_K"  # GQA 4
    assert types["output.weight"] == "q5_K" and types["token_embd.weight"] == "q2_K"
    assert res.path is None and list(tmp_path.iterdir()) == []
