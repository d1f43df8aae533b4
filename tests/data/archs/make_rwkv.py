"""Write the tiny RWKV models of tests/data/archs (tests/helpers/rwkv_models.py) and llama.cpp's outputs on them.

Not run by the tests (they read what this wrote). Run as make_reference.py (same llama.cpp build and bindings):

    PYTHONPATH=tests:tests/data/archs:<sdist>/llama_cpp_python-0.3.36:<diskcache> \\
        LLAMA_CPP_LIB_PATH=<llama.cpp>/build/bin python tests/data/archs/make_rwkv.py [ARCH ...]

For each architecture: ``<arch>.gguf`` (F32), then llama.cpp's logits at every position of make_reference's
24-token prompt (one batch, 2 threads) and 8 greedy tokens decoded one at a time after it, into ``rwkv.npz``
(its own file: reference.npz is make_reference.py's).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from llama_cpp import llama_cpp as L
from make_reference import prompt, run_llamacpp

from helpers import rwkv_models

HERE = Path(__file__).resolve().parent


def main(archs: list[str]) -> None:
    L.llama_backend_init()
    out = dict(np.load(HERE / "rwkv.npz")) if (HERE / "rwkv.npz").exists() else {}
    toks = prompt()
    out["tokens"] = np.array(toks, dtype=np.int32)
    for arch in archs:
        path = rwkv_models.write(arch, HERE / f"{arch}.gguf")
        logits, greedy = run_llamacpp(path, toks)
        out[f"{arch}-f32-logits"] = logits.astype(np.float32)
        out[f"{arch}-f32-greedy"] = np.array(greedy, dtype=np.int32)
        print(f"{arch}: logits {logits.shape}, greedy {greedy}")
    np.savez_compressed(HERE / "rwkv.npz", **out)


if __name__ == "__main__":
    main(sys.argv[1:] or list(rwkv_models.LAYERS))
