"""The scheduler tests' second device: TWIN (tests/helpers/twin.py, pure Python) always, so these
tests run on every install; the torch backend's CPU device as well where torch is installed, so
the one real accelerator backend pyggml ships is scheduled by the same tests."""

from __future__ import annotations

import pytest

from helpers.twin import twin_init
from pyggml.backend.base import Backend


@pytest.fixture(params=["twin", "torch"])
def second(request: pytest.FixtureRequest) -> Backend:
    """A fresh backend of the GPU-like device beside the CPU."""
    if request.param == "torch":
        pytest.importorskip("torch", reason="the optional torch backend (pip install 'pyggml[torch]') is not installed")
        from pyggml.backend.torch import backend_torch_init

        return backend_torch_init("cpu")
    return twin_init()
