"""Where things are: the repository, ``src/``, ``tests/`` and the reference data in ``tests/data``.

The one data helper of the suite: tests name a file under tests/data with ``data_path("quant",
"index.json")`` (or ``DATA / ...``) and read it with ``load_json`` / ``load_npz``, never by counting
``Path(__file__).parent`` from where the test happens to live.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
SRC = ROOT / "src"
DATA = TESTS / "data"


def data_path(*parts: str) -> Path:
    """A path under tests/data (``data_path("gemma3", "reference.json")``)."""
    return DATA.joinpath(*parts)


def load_json(*parts: str) -> Any:
    """A JSON file under tests/data, parsed."""
    return json.loads(data_path(*parts).read_text())


def load_npz(*parts: str) -> dict[str, np.ndarray]:
    """An .npz file under tests/data as a dict of arrays (read at once, the file closed)."""
    with np.load(data_path(*parts)) as z:
        return {k: z[k] for k in z.files}


def normal_f32(rng: np.random.Generator) -> Callable[..., np.ndarray]:
    """A drawer of random test data from ``rng``: ``draw(*shape, scale=1.0)`` is float32 standard-normal
    values of ``shape`` (times ``scale``), in the order ``rng`` yields them, so a module keeps its seed
    and its stream (``_r = normal_f32(np.random.default_rng(7))``)."""

    def draw(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return draw
