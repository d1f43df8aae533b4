"""pyggml's graph allocator against ggml's own (libggml-base through ctypes), when that library is present.

The library is not part of pyggml; point PYGGML_LIBGGML_BASE at a libggml-base.so built from the
ggml this project tracks (bench/alloc_vs_ggml.py has the details and runs longer comparisons).
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

from helpers.data import ROOT

BENCH = ROOT / "bench" / "alloc_vs_ggml.py"


def _load_bench():
    spec = importlib.util.spec_from_file_location("alloc_vs_ggml", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


cmp = _load_bench()
needs_lib = pytest.mark.skipif(not Path(cmp.LIB).exists(),
                               reason=f"reference libggml-base not found at {cmp.LIB} (set PYGGML_LIBGGML_BASE)")


@needs_lib
@pytest.mark.parametrize("mode", ["plain", "cap", "multi"])
def test_same_sizes_and_offsets_as_ggml(mode):
    lib = cmp.load(cmp.LIB)
    rng = random.Random(1234 + len(mode))
    for _ in range(150):
        recipe = cmp.random_recipe(rng)
        cap = rng.choice([256, 1024, 4096])
        ids_seed = rng.randrange(1 << 30)
        assert cmp.plan_py(recipe, mode, cap, ids_seed) == cmp.plan_c(lib, recipe, mode, cap, ids_seed), recipe
