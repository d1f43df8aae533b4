"""Write the tiny recurrent and hybrid models of tests/data/archs and llama.cpp's outputs on them.

Not run by the tests (they read what this wrote). The same llama.cpp 0c1e570 libraries, bindings and
settings as make_reference.py (whose ``run_llamacpp`` this calls: a 24-token prompt in one batch with
logits at every position, n_ctx 64, 2 threads, then 8 greedy tokens one at a time), on the F32 models of
the recurrent architectures (tests/helpers/arch_models.py) and their Q8_0 versions (quantized by ``pyggml
quantize``, which keeps the SSM convs, A, D and norms in F32 as llama-quantize does), into
``recurrent.npz`` (kept apart from reference.npz):

    PYTHONPATH=tests:<sdist>/llama_cpp_python-0.3.36:<diskcache> LLAMA_CPP_LIB_PATH=<llama.cpp>/build/bin \\
        python tests/data/archs/make_recurrent.py [ARCH ...]
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
from make_reference import HERE, L, prompt, run_llamacpp

from helpers import arch_models

RECURRENT = ("mamba", "mamba2", "granitehybrid", "falcon-h1", "jamba")


def main(archs: list[str]) -> None:
    L.llama_backend_init()
    path = HERE / "recurrent.npz"
    out = dict(np.load(path)) if path.exists() else {}
    toks = prompt()
    out["tokens"] = np.array(toks, dtype=np.int32)
    for arch in archs:
        f32 = arch_models.write(arch, HERE / f"{arch}.gguf")
        qfile = HERE / f"{arch}-q8_0.gguf"
        subprocess.run([sys.executable, "-m", "pyggml.cli.main", "quantize", str(f32), str(qfile), "q8_0"], check=True,
                       stdout=subprocess.DEVNULL)
        for kind, model in (("f32", f32), ("q8_0", qfile)):
            logits, greedy = run_llamacpp(model, toks)
            out[f"{arch}-{kind}-logits"] = logits.astype(np.float32)
            out[f"{arch}-{kind}-greedy"] = np.array(greedy, dtype=np.int32)
            print(f"{arch} {kind}: logits {logits.shape}, greedy {greedy}")
    np.savez_compressed(path, **out)


if __name__ == "__main__":
    main(sys.argv[1:] or list(RECURRENT))
