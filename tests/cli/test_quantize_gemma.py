"""Requantizing the default Gemma 3 270M (Q4_K_M) to Q8_0 and Q4_0 gives llama-quantize's bytes.

Skipped when the default model package is not installed. The SHA-256 are llama-quantize's
(tests/data/quantize/gemma-requant.json, command there).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from helpers.data import load_json
from pyggml.cli.main import main

REF = load_json("quantize", "gemma-requant.json")

pytestmark = pytest.mark.slow  # requantizes all of Gemma 3 270M


@pytest.fixture(scope="module")
def gemma(gemma_path: Path) -> Path:
    if hashlib.sha256(gemma_path.read_bytes()).hexdigest() != REF["input_sha256"]:
        pytest.skip("the installed default model is not the file the reference was made from")
    return gemma_path


@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_0"])
def test_gemma_requantize_matches_llama_quantize(gemma: Path, tmp_path: Path, ftype: str) -> None:
    out = tmp_path / f"gemma-{ftype}.gguf"
    assert main(["quantize", "-q", str(gemma), str(out), ftype]) == 1  # already quantized: needs the flag
    assert not out.exists()
    assert main(["quantize", "-q", "--allow-requantize", str(gemma), str(out), ftype]) == 0
    assert hashlib.sha256(out.read_bytes()).hexdigest() == REF[ftype]
