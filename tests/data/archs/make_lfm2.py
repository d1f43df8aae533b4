"""Write the tiny LFM2 model of tests/data/archs (tests/helpers/lfm2_model.py) and llama.cpp's outputs on it.

Not run by the tests (they read what this wrote). Run as make_reference.py (same llama.cpp build, bindings and
settings: a 24-token prompt in one batch with logits at every position, n_ctx 64, F16 KV cache, no flash
attention, 2 threads, then 8 greedy tokens one at a time):

    PYTHONPATH=tests:tests/data/archs:<sdist>/llama_cpp_python-0.3.36:<diskcache> \\
        LLAMA_CPP_LIB_PATH=<llama.cpp>/build/bin python tests/data/archs/make_lfm2.py

on ``lfm2.gguf`` (F32) and ``lfm2-q8_0.gguf`` (quantized by ``pyggml quantize``, as make_rwkv.py), into
``lfm2.npz`` (its own file: reference.npz is make_reference.py's).
"""

from __future__ import annotations

import numpy as np
from make_reference import HERE, L, prompt, run_llamacpp
from make_rwkv import write_pair

from helpers import lfm2_model


def main() -> None:
    L.llama_backend_init()
    toks = prompt()
    out = {"tokens": np.array(toks, dtype=np.int32)}
    for kind, path in write_pair(lfm2_model.write, "lfm2"):
        logits, greedy = run_llamacpp(path, toks)
        print(f"lfm2 {kind}: logits {logits.shape}, greedy {greedy}")
        out[f"lfm2-{kind}-logits"] = logits.astype(np.float32)
        out[f"lfm2-{kind}-greedy"] = np.array(greedy, dtype=np.int32)
    np.savez_compressed(HERE / "lfm2.npz", **out)


if __name__ == "__main__":
    main()
