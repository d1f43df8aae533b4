"""Write the tiny RWKV models of tests/data/archs (tests/helpers/rwkv_models.py) and llama.cpp's outputs on them.

Not run by the tests (they read what this wrote). Run as make_reference.py (same llama.cpp build and bindings):

    PYTHONPATH=tests:tests/data/archs:<sdist>/llama_cpp_python-0.3.36:<diskcache> \\
        LLAMA_CPP_LIB_PATH=<llama.cpp>/build/bin python tests/data/archs/make_rwkv.py [ARCH ...]

For each architecture: ``<arch>.gguf`` (F32) and ``<arch>-q8_0.gguf`` (quantized by ``pyggml quantize``, whose
bytes equal llama.cpp's llama_model_quantize for all of these: checked on 2026-12-03), then for each file
llama.cpp's logits at every position of make_reference's 24-token prompt (one batch, 2 threads) and 8 greedy tokens
decoded one at a time after it, into ``rwkv.npz`` (its own file: reference.npz is make_reference.py's).
"""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from llama_cpp import llama_cpp as L
from make_reference import prompt, run_llamacpp

from helpers import rwkv_models

HERE = Path(__file__).resolve().parent


def write_pair(write: Callable[[Path], Path], name: str) -> list[tuple[str, Path]]:
    """The F32 model (``write``) and its Q8_0 quantization by ``pyggml quantize``: [(kind, path)]."""
    f32 = write(HERE / f"{name}.gguf")
    q8 = HERE / f"{name}-q8_0.gguf"
    subprocess.run([sys.executable, "-m", "pyggml.cli.main", "quantize", str(f32), str(q8), "q8_0"], check=True,
                   stdout=subprocess.DEVNULL)
    return [("f32", f32), ("q8_0", q8)]


def main(archs: list[str]) -> None:
    L.llama_backend_init()
    out = dict(np.load(HERE / "rwkv.npz")) if (HERE / "rwkv.npz").exists() else {}
    toks = prompt()
    out["tokens"] = np.array(toks, dtype=np.int32)
    for arch in archs:
        for kind, path in write_pair(functools.partial(rwkv_models.write, arch), arch):
            logits, greedy = run_llamacpp(path, toks)
            out[f"{arch}-{kind}-logits"] = logits.astype(np.float32)
            out[f"{arch}-{kind}-greedy"] = np.array(greedy, dtype=np.int32)
            print(f"{arch} {kind}: logits {logits.shape}, greedy {greedy}")
    np.savez_compressed(HERE / "rwkv.npz", **out)


if __name__ == "__main__":
    main(sys.argv[1:] or list(rwkv_models.LAYERS))
