"""``pyggml embedding`` against llama.cpp's ``llama-embedding`` on a BERT-size random-weight model.

    python -P bench/embedding_speed.py --llama-embedding .../llama-embedding [--out DIR]
        [--dims 768,12,12,64,3072,12,64] [--type q8_0] [--texts 16] [--words 48] [--rounds 3] [-t 2] [-fa off]

The model is tests/helpers/arch_models.py's ``bert`` spec at bert-base sizes (12 layers of 768, 12 heads, an FFN
of 3072: 85M parameters in the layers; the vocabulary is the tests' 256 WordPiece tokens), written in F32 and
quantized by ``pyggml quantize``. Both tools embed the same texts (``--texts`` lines of ``--words`` random
words, one batch, CLS pooling, euclidean normalisation, JSON output) in interleaved runs. The time compared is
a run's wall time minus that of the same command on the one-word text "hello" (loading, warm-up and, for
pyggml, Python's start cancel out): llama-embedding's own timings cannot be read, as its log thread drops the
lines it prints at exit (llama_perf_context_print). The embeddings of the two tools are compared too (the lowest
cosine over the texts).

With ``--in-process`` (llama-cpp-python's ctypes bindings importable, LLAMA_CPP_LIB_PATH naming llama.cpp's
build/bin) the decode alone is timed too: the same batch of token ids through ``LlamaContext.decode_batch`` and
``llama_decode`` in this process, interleaved, each context made once and warmed up by one decode.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"


def write_model(dims: str, qtype: str, out: Path) -> Path:
    """The bert spec at ``dims`` (written in a child process, where PYGGML_ARCH_MODEL_DIMS sets the sizes), then
    quantized to ``qtype`` by pyggml."""
    q = out / f"bert-{dims.replace(',', '_')}-{qtype}.gguf"
    if q.exists():
        return q
    f32 = q if qtype == "f32" else out / "bert-f32.gguf"
    import pyggml

    src = str(Path(pyggml.__file__).resolve().parents[1])  # (not this process's whole path: another gguf may be on it)
    env = dict(os.environ, PYGGML_ARCH_MODEL_DIMS=dims, PYTHONPATH=os.pathsep.join([str(TESTS), src]))
    code = f"from helpers import arch_models; arch_models.write('bert', {str(f32)!r})"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    if qtype == "f32":
        return q
    subprocess.run([sys.executable, "-m", "pyggml.cli.main", "quantize", str(f32), str(q), qtype], check=True,
                   stdout=subprocess.DEVNULL)
    f32.unlink()
    return q


def texts(n: int, words: int) -> str:
    sys.path.insert(0, str(TESTS))
    from helpers.arch_models import WPM_WORDS

    rng = np.random.default_rng(0)
    return "\n".join(" ".join(rng.choice(WPM_WORDS, words)) for _ in range(n))


def run(cmd: list[str]) -> tuple[float, np.ndarray | None]:
    """(wall seconds, the embeddings from the JSON on stdout, or None when it does not parse: llama-embedding's
    log thread loses lines at exit now and then)."""
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    try:
        out = p.stdout
        emb = np.array([d["embedding"] for d in json.loads(out[out.index("{") : out.rindex("}") + 1])["data"]])
    except ValueError:
        emb = None
    return wall, emb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-embedding", required=True, help="path of llama.cpp's llama-embedding")
    ap.add_argument("--out", type=Path, default=Path("/tmp/pyggml-embedding-speed"), help="folder for the model")
    ap.add_argument("--dims", default="768,12,12,64,3072,12,64",
                    help="n_embd,n_head,n_head_kv,head,n_ff,n_layer,n_ff_exp (default: bert-base)")
    ap.add_argument("--type", default="q8_0", help="the model's weight type: f32, or a type pyggml quantize makes "
                                                      "(default q8_0)")
    ap.add_argument("--texts", type=int, default=16)
    ap.add_argument("--words", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", default="2")
    ap.add_argument("-fa", "--flash-attn", default="off", choices=["on", "off"])
    ap.add_argument("--in-process", action="store_true", help="also time the decode alone, in this process, "
                                                                "against libllama through llama-cpp-python")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    model = write_model(a.dims, a.type, a.out)
    prompt = texts(a.texts, a.words)
    common = ["-t", a.threads, "-fa", a.flash_attn, "--embd-output-format", "json", "-c", "512", "-m", str(model)]
    tools = {"pyggml": [sys.executable, "-m", "pyggml.cli.main", "embedding", *common],
             "llama.cpp": [a.llama_embedding, *common]}
    print(f"model: {model} ({model.stat().st_size / 2**20:.1f} MiB)")
    for name, cmd in tools.items():
        print(f"{name}: {' '.join(cmd[1:] if name == 'pyggml' else cmd)} -p <{a.texts} texts of {a.words} words> "
              "(and -p hello for the baseline)")
    run([*tools["pyggml"], "-p", "hello"])  # warm-up: the kernel cache and the page cache
    compute: dict[str, list[float]] = {n: [] for n in tools}
    full: dict[str, list[float]] = {n: [] for n in tools}
    embs: dict[str, np.ndarray | None] = {}
    for r in range(a.rounds):
        for name, cmd in tools.items():
            base, _ = run([*cmd, "-p", "hello"])
            wall, embs[name] = run([*cmd, "-p", prompt])
            compute[name].append(wall - base)
            full[name].append(wall)
        print(f"round {r}: " + "   ".join(f"{n} {compute[n][-1]:6.2f} s (of {full[n][-1]:5.2f} s wall)"
                                           for n in tools), flush=True)
    med = {n: statistics.median(v) for n, v in compute.items()}
    print(f"median embedding time (wall minus the one-word baseline run): pyggml {med['pyggml']:.2f} s, llama.cpp "
          f"{med['llama.cpp']:.2f} s: pyggml at {med['llama.cpp'] / med['pyggml']:.2f}x llama.cpp's speed")
    e0, e1 = embs["pyggml"], embs["llama.cpp"]
    if e0 is not None and e1 is not None:
        cos = (e0 * e1).sum(1) / (np.linalg.norm(e0, axis=1) * np.linalg.norm(e1, axis=1))
        print(f"lowest cosine between the two tools' embeddings: {cos.min():.6f}")
    if a.in_process:
        in_process(model, a.texts, a.words + 2, int(a.threads), a.flash_attn == "on", a.rounds)


def in_process(model: Path, n_texts: int, n_tokens: int, threads: int, flash: bool, rounds: int) -> None:
    """Time one decode of ``n_texts`` sequences of ``n_tokens`` random token ids in pyggml and in libllama."""
    import ctypes

    from llama_cpp import llama_cpp as L

    from pyggml.llm.batch import Batch
    from pyggml.llm.context import ContextParams, LlamaContext
    from pyggml.llm.hparams import PoolingType
    from pyggml.llm.model import Model

    rng = np.random.default_rng(1)
    toks = rng.integers(5, 256, n_texts * n_tokens).tolist()
    pos = [p for _ in range(n_texts) for p in range(n_tokens)]
    seq = [s for s in range(n_texts) for _ in range(n_tokens)]
    n = len(toks)
    ours = LlamaContext(Model(model, progress=False), ContextParams(
        n_ctx=n, n_batch=n, n_ubatch=n, n_threads=threads, n_seq_max=n_texts, flash_attn=flash, embeddings=True,
        pooling_type=PoolingType.CLS))
    quiet = L.llama_log_callback(lambda level, text, data: None)  # libllama logs every tensor it loads
    L.llama_log_set(quiet, None)
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    lm = L.llama_model_load_from_file(str(model).encode(), mp)
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n, n, n, n_texts
    cp.n_threads = cp.n_threads_batch = threads
    cp.embeddings, cp.pooling_type, cp.kv_unified = True, int(PoolingType.CLS), True
    cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    lctx = L.llama_init_from_model(lm, cp)
    b = L.llama_batch_init(n, 0, 1)
    for i in range(n):
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = toks[i], pos[i], 1, True
        b.seq_id[i][0] = seq[i]
    b.n_tokens = n
    batch = Batch(token=toks, pos=pos, seq_id=seq)

    def ours_once() -> float:
        t0 = time.perf_counter()
        ours.decode_batch(batch)
        return time.perf_counter() - t0

    def theirs_once() -> float:
        t0 = time.perf_counter()
        if L.llama_decode(lctx, b) != 0:
            raise RuntimeError("llama_decode failed")
        return time.perf_counter() - t0

    ours_once()
    theirs_once()
    t_ours, t_theirs = [], []
    for r in range(rounds):
        t_ours.append(ours_once())
        t_theirs.append(theirs_once())
        print(f"in-process round {r}: pyggml {t_ours[-1] * 1e3:8.1f} ms   llama.cpp {t_theirs[-1] * 1e3:8.1f} ms",
              flush=True)
    e0 = np.stack([ours.get_embeddings_seq(s) for s in range(n_texts)])
    e1 = np.stack([np.ctypeslib.as_array(ctypes.cast(L.llama_get_embeddings_seq(lctx, s),
                                                     ctypes.POINTER(ctypes.c_float)), shape=(e0.shape[1],))
                   for s in range(n_texts)])
    cos = (e0 * e1).sum(1) / (np.linalg.norm(e0, axis=1) * np.linalg.norm(e1, axis=1))
    mo, mt = statistics.median(t_ours), statistics.median(t_theirs)
    print(f"median decode of {n} tokens ({n_texts} sequences): pyggml {mo * 1e3:.1f} ms, llama.cpp {mt * 1e3:.1f} ms: "
          f"pyggml at {mt / mo:.2f}x llama.cpp's speed; lowest cosine {cos.min():.6f}")
    L.llama_batch_free(b)
    L.llama_free(lctx)
    L.llama_model_free(lm)


if __name__ == "__main__":
    main()
