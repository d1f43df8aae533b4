"""Write llama.cpp's flash-attention logits on two tiny models into ``flash_attn.npz``.

Not run by the tests (they read what this wrote). llama.cpp's default is flash attention on, and
ggml-cpu takes one of three paths by the batch's shape, each with its own rounding; the cases reach
all three: a 20-token prompt (one chunk per query row), 100- and 300-token prompts (64 x 64 tiles),
and the one-token decodes after 300 tokens, over 512 cells (the split-KV path, whose bits depend on
the thread count: 2 here and in the test). n_ctx 1024, one ubatch per prompt, F16 cache, 2 threads.
Needs llama.cpp 0c1e570's libllama and the llama-cpp-python 0.3.36 sdist's ctypes bindings:

    PYTHONPATH=<sdist>/llama_cpp_python-0.3.36:<diskcache> LLAMA_CPP_LIB_PATH=<llama.cpp>/build/bin \\
        python tests/data/archs/make_flash_attn.py
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
from llama_cpp import llama_cpp as L  # the sdist's bindings, over LLAMA_CPP_LIB_PATH's libllama

HERE = Path(__file__).resolve().parent
MODELS = ("llama-q8_0", "gemma3-q8_0")
#: case name -> prompt tokens; the prompts' last N_LAST logits and N_DECODE greedy steps are kept
CASES = {"p20": 20, "p100": 100, "p300": 300}
N_CTX, N_LAST, N_DECODE = 1024, 8, 6


def prompt(n: int, n_vocab: int) -> list[int]:
    return np.random.default_rng(n).integers(2, n_vocab - 1, n).tolist()


def run(model: L.llama_model_p, n_prompt: int, n_vocab: int) -> dict[str, np.ndarray]:
    cp = L.llama_context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = N_CTX
    cp.n_threads = cp.n_threads_batch = 2
    cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED
    ctx = L.llama_init_from_model(model, cp)

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
        ptr = ctypes.cast(L.llama_get_logits(ctx), ctypes.POINTER(ctypes.c_float))
        out = np.ctypeslib.as_array(ptr, shape=(n_out, n_vocab)).copy()
        L.llama_batch_free(b)
        return out

    toks = prompt(n_prompt, n_vocab)
    logits = decode(toks, 0, True)
    greedy, steps, last = [], [], logits[-1]
    for i in range(N_DECODE):
        greedy.append(int(np.argmax(last)))
        last = decode(greedy[-1:], n_prompt + i, False)[0]
        steps.append(last)
    L.llama_free(ctx)
    return {"tokens": np.array(toks, np.int32), "prompt": logits[-N_LAST:], "greedy": np.array(greedy, np.int32),
            "decode": np.array(steps)}


def main() -> None:
    L.llama_backend_init()
    out: dict[str, np.ndarray] = {}
    for name in MODELS:
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        model = L.llama_model_load_from_file(str(HERE / f"{name}.gguf").encode(), mp)
        n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
        for case, n in CASES.items():
            for key, value in run(model, n, n_vocab).items():
                out[f"{name}/{case}/{key}"] = value
        L.llama_model_free(model)
    np.savez_compressed(HERE / "flash_attn.npz", **out)


if __name__ == "__main__":
    main()
