"""Write the tiny encoder models of tests/data/archs and llama.cpp's embeddings on them.

Not run by the tests (they read what this wrote). Needs llama.cpp 0c1e570's shared libraries and the ctypes
bindings of the llama-cpp-python 0.3.36 sdist that vendors it, as make_reference.py:

    PYTHONPATH=src:tests:<sdist>/llama_cpp_python-0.3.36:<diskcache> LLAMA_CPP_LIB_PATH=<llama.cpp>/build/bin \\
        python tests/data/archs/make_embeddings.py

Writes ``bert.gguf``, ``nomic-bert.gguf`` and ``gemma-embedding.gguf`` (F32, tests/helpers/arch_models.py), then
``embeddings.npz``: for those and the decoder ``qwen2.gguf`` (kept by make_reference.py), llama.cpp's
embeddings of one batch of two sequences (24 and 10 tokens; n_ctx 64, n_batch = n_ubatch = 64, n_seq_max 2,
unified KV cache, no flash attention, 2 threads) with embeddings on and each pooling type: ``<model>-none``
[34, n_embd] in batch order, ``<model>-mean|cls|last`` [2, n_embd] by sequence, and ``bert-rank`` [2, n_cls_out];
``qwen2_noncausal-none|mean`` with qwen2's attention made non-causal (LLAMA_ATTENTION_TYPE_NON_CAUSAL);
``bert_q8_0-none|cls`` on ``bert-q8_0.gguf``, bert.gguf quantized by ``pyggml quantize``.
Then, for the ``pyggml embedding`` tests, what llama-embedding computes for the two lines of ``CLI_PROMPTS`` on
bert.gguf: llama.cpp's tokens of each (``cli-tokens-<i>``) and their embeddings decoded as one batch,
unnormalised, pooled by the file's CLS (``cli-bert-cls``) and per token (``cli-bert-none``). (The
llama-embedding binary itself is not used: its log thread loses output lines at exit now and then.)
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import numpy as np
from llama_cpp import llama_cpp as L  # the sdist's bindings, over LLAMA_CPP_LIB_PATH's libllama

from helpers import arch_models

HERE = Path(__file__).resolve().parent
ENCODERS = ("bert", "nomic-bert", "gemma-embedding")
POOLINGS = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}
LENGTHS = (24, 10)
CLI_PROMPTS = "hello world\nthe cat sat on the mat"


def batch_tokens() -> tuple[list[int], list[int], list[int]]:
    """Tokens, positions and sequence ids of the two sequences (ids avoid the special tokens 0-4)."""
    rng = np.random.default_rng(2)
    toks, pos, seq = [], [], []
    for s, n in enumerate(LENGTHS):
        toks += rng.integers(5, arch_models.N_VOCAB, n).tolist()
        pos += list(range(n))
        seq += [s] * n
    return toks, pos, seq


def run_llamacpp(path: Path, pooling: int, seqs: list[list[int]] | None = None, causal: bool = True) -> np.ndarray:
    """llama.cpp's embeddings of the sequences ``seqs`` (default: batch_tokens's) decoded as one batch."""
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(str(path).encode(), mp)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch, cp.n_seq_max = 64, 64, 64, 2, 2, 2
    cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.embeddings = True
    cp.kv_unified = True  # one ubatch for the decoder too (llama-embedding unifies the KV cache as well)
    if not causal:
        cp.attention_type = 1  # LLAMA_ATTENTION_TYPE_NON_CAUSAL
    cp.pooling_type = pooling
    ctx = L.llama_init_from_model(model, cp)
    n_embd = L.llama_model_n_embd(model)
    if seqs is None:
        toks, pos, seq = batch_tokens()
    else:
        toks = [t for ts in seqs for t in ts]
        pos = [p for ts in seqs for p in range(len(ts))]
        seq = [s for s, ts in enumerate(seqs) for _ in ts]
    b = L.llama_batch_init(len(toks), 0, 1)
    for i, (t, p, s) in enumerate(zip(toks, pos, seq, strict=True)):
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, p, 1, True
        b.seq_id[i][0] = s
    b.n_tokens = len(toks)
    if L.llama_decode(ctx, b) != 0:
        raise RuntimeError("llama_decode failed")

    def floats(ptr: object, n: int) -> np.ndarray:
        return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n,)).copy()

    if pooling == POOLINGS["none"]:
        out = np.stack([floats(L.llama_get_embeddings_ith(ctx, i), n_embd) for i in range(len(toks))])
    else:
        width = L.llama_model_n_cls_out(model) if pooling == POOLINGS["rank"] else n_embd
        out = np.stack([floats(L.llama_get_embeddings_seq(ctx, s), width) for s in range(max(seq) + 1)])
    L.llama_batch_free(b)
    L.llama_free(ctx)
    L.llama_model_free(model)
    return out.astype(np.float32)


def tokenize(path: Path, text: str) -> list[int]:
    """llama.cpp's tokens of ``text`` with the special tokens added ([CLS] ... [SEP] for WordPiece)."""
    mp = L.llama_model_default_params()
    model = L.llama_model_load_from_file(str(path).encode(), mp)
    vocab = L.llama_model_get_vocab(model)
    buf = (L.llama_token * 256)()
    raw = text.encode()
    n = L.llama_tokenize(vocab, raw, len(raw), buf, 256, True, True)
    L.llama_model_free(model)
    return list(buf[:n])


def main() -> None:
    L.llama_backend_init()
    out: dict[str, np.ndarray] = {}
    toks, pos, seq = batch_tokens()
    out["tokens"], out["pos"], out["seq"] = (np.array(x, dtype=np.int32) for x in (toks, pos, seq))
    for name in ENCODERS:
        arch_models.write(name, HERE / f"{name}.gguf")
    for name in (*ENCODERS, "qwen2"):
        for kind, pooling in POOLINGS.items():
            if kind == "rank" and name != "bert":
                continue  # only bert has a classifier head
            out[f"{name}-{kind}"] = run_llamacpp(HERE / f"{name}.gguf", pooling)
            print(f"{name} {kind}: {out[f'{name}-{kind}'].shape}")
    # bert quantized to Q8_0 by pyggml quantize (whose bytes are llama-quantize's): the quantized matmuls
    subprocess.run([sys.executable, "-m", "pyggml.cli.main", "quantize", str(HERE / "bert.gguf"),
                    str(HERE / "bert-q8_0.gguf"), "q8_0"], check=True, stdout=subprocess.DEVNULL)
    for kind in ("none", "cls"):
        out[f"bert_q8_0-{kind}"] = run_llamacpp(HERE / "bert-q8_0.gguf", POOLINGS[kind])
    for kind in ("none", "mean"):  # the decoder with its attention made non-causal (llama-embedding --attention)
        out[f"qwen2_noncausal-{kind}"] = run_llamacpp(HERE / "qwen2.gguf", POOLINGS[kind], causal=False)
    bert = HERE / "bert.gguf"
    prompts = [tokenize(bert, p) for p in CLI_PROMPTS.split("\n")]
    for i, p in enumerate(prompts):
        out[f"cli-tokens-{i}"] = np.array(p, dtype=np.int32)
    out["cli-bert-cls"] = run_llamacpp(bert, POOLINGS["cls"], prompts)
    out["cli-bert-none"] = run_llamacpp(bert, POOLINGS["none"], prompts)
    np.savez_compressed(HERE / "embeddings.npz", **out)


if __name__ == "__main__":
    main()
