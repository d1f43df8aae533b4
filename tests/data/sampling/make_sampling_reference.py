"""Write llama.cpp's sampler outputs for tests/llm/test_llm_samplers_reference.py (``reference.npz``).

Not run by the tests (they read what this wrote). Needs llama.cpp 0c1e570's libllama (its build/bin)
and the ctypes bindings of the llama-cpp-python 0.3.36 sdist:

    PYTHONPATH=tests:<sdist>/llama_cpp_python-0.3.36:<diskcache> LLAMA_CPP_LIB_PATH=<llama.cpp>/build/bin \\
        python tests/data/sampling/make_sampling_reference.py

Each case is a chain of llama.cpp samplers (``llama_sampler_init_*``) applied one at a time with
``llama_sampler_apply`` to a ``llama_token_data_array`` of fixed random logits over the tiny chat
model's vocabulary (tests/helpers/chat_model.py, whose vocabulary DRY's sequence breakers are
tokenized with), for several steps: after each sampler the candidates (ids and logits, in order), at
the end the probabilities and the selected token, which every sampler then accepts (as a chain does).
"""

from __future__ import annotations

import ctypes
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from llama_cpp import llama_cpp as L

from helpers.chat_model import make_chat_model

HERE = Path(__file__).resolve().parent
SEED = 1234
BREAKERS = ["\n", ":", '"', "*"]

#: name -> (steps, history accepted first, stages); a stage is [kind, args...] in llama_sampler_init_* order
CASES: dict[str, tuple[int, list[int], list[list[Any]]]] = {
    "logit_bias": (3, [], [["logit_bias", [[5, 4.0], [10, -math.inf], [5, 1.5], [700, 2.0]]], ["top_k", 20],
                           ["dist", SEED]]),
    # token 12 is "*", a sequence breaker: inside the repeated end it caps the repeat's length (2, not 4)
    "dry": (6, [5, 12, 101, 102, 103, 160, 5, 12, 101, 102], [["dry", 2.0, 1.75, 2, 64], ["dist", SEED]]),
    # ... and a breaker that would continue a repeat is never penalized itself
    "dry_skip": (3, [100, 101, 102, 12, 130, 100, 101, 102, 103, 140, 100, 101, 102],
                 [["dry", 2.0, 1.75, 2, 64], ["dist", SEED]]),
    "top_n_sigma": (4, [], [["top_n_sigma", 1.5], ["temp", 1.0], ["dist", SEED]]),
    "xtc": (8, [], [["top_k", 30], ["xtc", 0.6, 0.05, 1, SEED], ["temp", 0.9], ["dist", SEED]]),
    "typical": (3, [], [["typical", 0.8, 1], ["dist", SEED]]),
    "mirostat1": (8, [], [["temp", 0.8], ["mirostat", 5.0, 0.1, 100]]),
    "mirostat2": (8, [], [["temp", 0.8], ["mirostat_v2", 5.0, 0.1]]),
    # llama.cpp's default order, every sampler on
    "full_chain": (6, [100, 101, 102, 103, 140, 100, 101, 102],
                   [["logit_bias", [[3, 2.0], [7, -1.0]]], ["penalties", 64, 1.1, 0.05, 0.1], ["dry", 1.5, 1.75, 2, 64],
                    ["top_n_sigma", 3.0], ["top_k", 60], ["typical", 0.95, 1], ["top_p", 0.9, 1], ["min_p", 0.15, 1],
                    ["xtc", 0.5, 0.08, 1, SEED], ["temp", 0.7], ["dist", SEED]]),
    # --sampling-seq tmp: min-p on unsorted candidates keeps their order, top-p sorts them
    "custom_order": (3, [], [["temp", 1.3], ["min_p", 0.05, 1], ["top_p", 0.8, 1], ["dist", SEED]]),
}


def make_sampler(kind: str, args: list[Any], vocab: Any, n_vocab: int) -> Any:
    if kind == "logit_bias":
        arr = (L.llama_logit_bias * len(args[0]))(*[L.llama_logit_bias(t, b) for t, b in args[0]])
        return L.llama_sampler_init_logit_bias(n_vocab, len(args[0]), arr)
    if kind == "dry":
        brk = (ctypes.c_char_p * len(BREAKERS))(*[b.encode() for b in BREAKERS])
        return L.llama_sampler_init_dry(vocab, *args, brk, len(BREAKERS))
    if kind == "mirostat":
        return L.llama_sampler_init_mirostat(n_vocab, SEED, *args)
    if kind == "mirostat_v2":
        return L.llama_sampler_init_mirostat_v2(SEED, *args)
    init = {"top_n_sigma": L.llama_sampler_init_top_n_sigma, "temp": L.llama_sampler_init_temp,
            "xtc": L.llama_sampler_init_xtc, "typical": L.llama_sampler_init_typical,
            "top_k": L.llama_sampler_init_top_k, "top_p": L.llama_sampler_init_top_p,
            "min_p": L.llama_sampler_init_min_p, "penalties": L.llama_sampler_init_penalties,
            "dist": L.llama_sampler_init_dist}[kind]
    if kind == "penalties":
        return init(n_vocab, *args)
    return init(*args)


def candidates(arr: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = arr.size
    ids = np.array([arr.data[i].id for i in range(n)], dtype=np.int32)
    logits = np.array([arr.data[i].logit for i in range(n)], dtype=np.float32)
    p = np.array([arr.data[i].p for i in range(n)], dtype=np.float32)
    return ids, logits, p


def run_case(name: str, vocab: Any, n_vocab: int, out: dict[str, np.ndarray]) -> None:
    steps, history, stages = CASES[name]
    samplers = [make_sampler(kind, args, vocab, n_vocab) for kind, *args in stages]
    for t in history:
        for s in samplers:
            L.llama_sampler_accept(s, t)
    rng = np.random.default_rng(sum(map(ord, name)))
    for step in range(steps):
        logits = (rng.standard_normal(n_vocab) * 3.0).astype(np.float32)
        if history:  # make the repeated tokens likely, so that the repetition penalties matter
            logits[history] += 4.0
        data = (L.llama_token_data * n_vocab)(*[L.llama_token_data(i, float(v), 0.0) for i, v in enumerate(logits)])
        arr = L.llama_token_data_array(data, n_vocab, -1, False)
        key = f"{name}/{step}"
        out[f"{key}/logits"] = logits
        for j, s in enumerate(samplers):
            L.llama_sampler_apply(s, ctypes.byref(arr))
            ids, lg, p = candidates(arr)
            out[f"{key}/stage{j}/ids"], out[f"{key}/stage{j}/logits"] = ids, lg
        out[f"{key}/p"] = p
        out[f"{key}/selected"] = np.array([arr.selected], dtype=np.int64)
        token = int(arr.data[arr.selected].id)
        out[f"{key}/token"] = np.array([token], dtype=np.int32)
        for s in samplers:
            L.llama_sampler_accept(s, token)
    for s in samplers:
        L.llama_sampler_free(s)


def main() -> None:
    L.llama_backend_init()
    with tempfile.TemporaryDirectory() as tmp:
        path = make_chat_model(Path(tmp) / "tiny-chat.gguf")
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        model = L.llama_model_load_from_file(str(path).encode(), mp)
        if not model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        vocab = L.llama_model_get_vocab(model)
        n_vocab = L.llama_vocab_n_tokens(vocab)
        out: dict[str, np.ndarray] = {}
        for name in CASES:
            run_case(name, vocab, n_vocab, out)
        out["cases"] = np.array(json.dumps({k: [s, h, st] for k, (s, h, st) in CASES.items()}))
        out["breakers"] = np.array(json.dumps(BREAKERS))
        L.llama_model_free(model)
    np.savez_compressed(HERE / "reference.npz", **out)
    print(f"wrote {HERE / 'reference.npz'}: {len(CASES)} cases, {len(out)} arrays")


if __name__ == "__main__":
    main()
