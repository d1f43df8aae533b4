"""Fixtures the tests/llm modules share."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyggml.llm.model import Model


@pytest.fixture(scope="package")
def gemma_model(gemma_path: Path) -> Model:
    """The default Gemma model loaded once for the llm tests that run it (they only read its weights;
    each builds its own LlamaContext). Skipped, with the reason, when the model is not installed."""
    return Model(gemma_path, progress=False)
