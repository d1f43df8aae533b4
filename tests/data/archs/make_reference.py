"""Write the tiny per-architecture models of tests/data/archs and llama.cpp's outputs on them.

Not run by the tests (they read what this wrote). Needs llama.cpp 0c1e570's shared libraries (built by
../shared/tools/build_llamacpp.sh; its build/bin holds libllama.so) and the ctypes bindings of the
llama-cpp-python 0.3.36 sdist that vendors it:

    PYTHONPATH=tests:<sdist>/llama_cpp_python-0.3.36:<diskcache> LLAMA_CPP_LIB_PATH=<llama.cpp>/build/bin \\
        python tests/data/archs/make_reference.py [ARCH ...]

For each model: ``<name>.gguf`` (F32, from tests/helpers/arch_models.py) and ``<name>-<type>.gguf``
(Q8_0, or the type its spec names, quantized by ``pyggml quantize``, whose bytes equal llama-quantize's),
then, for each file, llama.cpp's logits at every position of a 24-token prompt (one batch, n_ctx 64,
F16 KV cache, no flash attention, 2 threads) and 8 greedy tokens decoded one at a time after it, into ``reference.npz``.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from llama_cpp import llama_cpp as L  # the sdist's bindings, over LLAMA_CPP_LIB_PATH's libllama

from helpers import arch_models

HERE = Path(__file__).resolve().parent
N_PROMPT, N_GREEDY = 24, 8


def prompt() -> list[int]:
    return np.random.default_rng(1).integers(2, arch_models.N_VOCAB - 1, N_PROMPT).tolist()


def decoder(ctx: L.llama_context_p, n_vocab: int) -> Callable[[list[int], int, bool], np.ndarray]:
    """decode(tokens, first position, all_logits) on sequence 0 of ``ctx``: the logits of every token, or the last."""

    def decode(toks: list[int], pos0: int, all_logits: bool) -> np.ndarray:
        b = L.llama_batch_init(len(toks), 0, 1)
        for i, t in enumerate(toks):
            b.token[i], b.pos[i], b.n_seq_id[i] = t, pos0 + i, 1
            b.seq_id[i][0] = 0
            b.logits[i] = all_logits or i == len(toks) - 1
        b.n_tokens = len(toks)
        if L.llama_decode(ctx, b) != 0:
            raise RuntimeError("llama_decode failed")
        n_out = len(toks) if all_logits else 1
        ptr = L.llama_get_logits(ctx)
        out = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n_out, n_vocab)).copy()
        L.llama_batch_free(b)
        return out

    return decode


def run_llamacpp(path: Path, tokens: list[int]) -> tuple[np.ndarray, list[int]]:
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(str(path).encode(), mp)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = 64, 64, 64, 2, 2
    cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = L.llama_init_from_model(model, cp)
    decode = decoder(ctx, L.llama_vocab_n_tokens(L.llama_model_get_vocab(model)))
    logits = decode(tokens, 0, True)
    greedy, last = [], logits[-1]
    for step in range(N_GREEDY):
        t = int(np.argmax(last))
        greedy.append(t)
        last = decode([t], len(tokens) + step, False)[0]
    L.llama_free(ctx)
    L.llama_model_free(model)
    return logits, greedy


def main(archs: list[str]) -> None:
    L.llama_backend_init()
    out = dict(np.load(HERE / "reference.npz")) if (HERE / "reference.npz").exists() else {}
    toks = prompt()
    out["tokens"] = np.array(toks, dtype=np.int32)
    for arch in archs:
        f32 = arch_models.write(arch, HERE / f"{arch}.gguf")
        quant = arch_models.SPECS[arch].quant
        qfile = HERE / f"{arch}-{quant}.gguf"
        subprocess.run([sys.executable, "-m", "pyggml.cli.main", "quantize", str(f32), str(qfile), quant], check=True,
                       stdout=subprocess.DEVNULL)
        for kind, path in (("f32", f32), (quant, qfile)):
            logits, greedy = run_llamacpp(path, toks)
            out[f"{arch}-{kind}-logits"] = logits.astype(np.float32)
            out[f"{arch}-{kind}-greedy"] = np.array(greedy, dtype=np.int32)
            print(f"{arch} {kind}: logits {logits.shape}, greedy {greedy}")
    np.savez_compressed(HERE / "reference.npz", **out)


if __name__ == "__main__":
    main(sys.argv[1:] or list(arch_models.SPECS))
