"""pyggml vs llama.cpp speed, measured interleaved on the same machine: ``pyggml bench`` and
``llama-bench`` with the same -p/-n/-r/-t, alternating run by run, and a table of the ratios.

This machine is shared and noisy: running the two programs back to back, several rounds, and
comparing medians per test keeps both exposed to the same load. Each round runs every model once
with each program (order swapped every round).

    python bench/vs_llamacpp.py --llama-bench /path/to/llama-bench \\
        -m gemma.gguf -m qwen0.5b.gguf -p 512 -n 128 -r 3 -t 2 --rounds 2

``../shared/tools/build_llamacpp.sh DIR`` builds llama-bench (llama.cpp 0c1e570) for this CPU.
Per model, ``-p``/``-n`` may be overridden with ``-m FILE:P:N`` (e.g. ``-m q1.5b.gguf:256:64``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path


def _run_json(cmd: list[str]) -> list[dict]:
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {out.returncode}):\n{out.stderr[-4000:]}")
    start = out.stdout.find("[")
    if start < 0:
        raise RuntimeError(f"no JSON from {' '.join(cmd)}:\n{out.stdout}\n{out.stderr}")
    return json.loads(out.stdout[start:])


def _tests(results: list[dict]) -> dict[str, float]:
    """test name (pp512 / tg128) -> tokens/s."""
    named = {}
    for r in results:
        name = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
        named[name] = float(r["avg_ts"])
    return named


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-bench", required=True, help="path of llama.cpp's llama-bench")
    ap.add_argument("-m", "--model", action="append", required=True, help="GGUF file (repeatable), FILE[:P:N]")
    ap.add_argument("-p", type=int, default=512, help="prompt tokens (default 512)")
    ap.add_argument("-n", type=int, default=128, help="generated tokens (default 128)")
    ap.add_argument("-r", type=int, default=3, help="repetitions per run (default 3)")
    ap.add_argument("-t", type=int, default=2, help="threads (default 2)")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds (default 2)")
    ap.add_argument("-fa", "--flash-attn", choices=["on", "off", "auto"], default="auto",
                    help="flash attention for both programs (default auto, both programs' default: on for the CPU)")
    ap.add_argument("--pyggml", default=None, help="pyggml command (default: the one next to this Python)")
    args = ap.parse_args()
    lb = Path(args.llama_bench)
    if not lb.is_file():
        ap.error(f"llama-bench not found at {lb}")
    pyggml = args.pyggml or shutil.which("pyggml", path=os.path.dirname(sys.executable)) or shutil.which("pyggml")
    if pyggml is None:
        ap.error("the pyggml command is not installed (pip install -e .)")
    models = []
    for spec in args.model:
        parts = spec.split(":")
        path, p, n = parts[0], args.p, args.n
        if len(parts) == 3:
            p, n = int(parts[1]), int(parts[2])
        if not Path(path).is_file():
            ap.error(f"model not found: {path}")
        models.append((path, p, n))
    samples: dict[tuple[str, str, str], list[float]] = {}
    for rnd in range(args.rounds):
        for path, p, n in models:
            common = ["-m", path, "-p", str(p), "-n", str(n), "-r", str(args.r), "-t", str(args.t),
                      "-fa", args.flash_attn, "-o", "json"]
            runs = [("pyggml", [pyggml, "bench", *common]), ("llama.cpp", [str(lb), *common])]
            for prog, cmd in runs if rnd % 2 == 0 else runs[::-1]:
                for test, ts in _tests(_run_json(cmd)).items():
                    samples.setdefault((path, test, prog), []).append(ts)
                    print(f"round {rnd + 1}: {Path(path).name} {test} {prog}: {ts:.2f} t/s", file=sys.stderr)
    print(f"\n{args.t} threads, flash attention {args.flash_attn}, {args.rounds} rounds x {args.r} repetitions, "
          "medians of the rounds\n")
    print("| model | test | pyggml t/s | llama.cpp t/s | ratio |")
    print("|---|---|---:|---:|---:|")
    for path, p, n in models:
        for test in (f"pp{p}", f"tg{n}"):
            py = samples.get((path, test, "pyggml"))
            ll = samples.get((path, test, "llama.cpp"))
            if not py or not ll:
                continue
            a, b = statistics.median(py), statistics.median(ll)
            print(f"| {Path(path).name} | {test} | {a:.2f} | {b:.2f} | {a / b:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
