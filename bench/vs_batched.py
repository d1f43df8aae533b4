"""pyggml vs llama.cpp with several sequences at once: ``pyggml bench -npp/-ntg/-npl`` and
``llama-batched-bench`` with the same flags, alternating run by run, and a table of medians and ratios.

Each round runs every model once with each program (the order swapped every round), so both meet
the same load on this shared machine. S_PP is prompt tokens/s (B prompts), S_TG the aggregate
generation tokens/s of B sequences decoded together, one token each per step.

    python bench/vs_batched.py --llama-batched-bench /path/to/llama-batched-bench \\
        -m gemma.gguf -m qwen0.5b.gguf -npp 128 -ntg 64 -npl 1,2,4,8 -c 2048 -t 2 --rounds 2

``../shared/tools/build_llamacpp.sh DIR`` builds llama-batched-bench (llama.cpp 0c1e570) for this CPU.
Both use llama.cpp's default KV layout (a stream per sequence); ``--kvu`` gives both a unified cache.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path


def _rows(cmd: list[str]) -> list[dict]:
    """The JSON lines a run prints (one per PP/TG/B test)."""
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    if not rows:
        raise RuntimeError(f"no JSON rows from {' '.join(cmd)}:\n{out.stdout}\n{out.stderr}")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-batched-bench", required=True, help="path of llama.cpp's llama-batched-bench")
    ap.add_argument("-m", "--model", action="append", required=True, help="GGUF file (repeatable)")
    ap.add_argument("-npp", default="128", help="prompt lengths (default 128)")
    ap.add_argument("-ntg", default="64", help="generated tokens per sequence (default 64)")
    ap.add_argument("-npl", default="1,2,4,8", help="parallel sequences (default 1,2,4,8)")
    ap.add_argument("-c", type=int, default=2048, help="context size, all sequences together (default 2048)")
    ap.add_argument("-t", type=int, default=2, help="threads (default 2)")
    ap.add_argument("--kvu", action="store_true", help="a unified KV cache for both (default: a stream per sequence)")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds (default 2)")
    ap.add_argument("--pyggml", default=None, help="pyggml command (default: the one next to this Python)")
    args = ap.parse_args()
    lbb = Path(args.llama_batched_bench)
    if not lbb.is_file():
        ap.error(f"llama-batched-bench not found at {lbb}")
    pyggml = args.pyggml or shutil.which("pyggml", path=os.path.dirname(sys.executable)) or shutil.which("pyggml")
    if pyggml is None:
        ap.error("the pyggml command is not installed (pip install -e .)")
    common = ["-npp", args.npp, "-ntg", args.ntg, "-npl", args.npl, "-c", str(args.c), "-t", str(args.t)]
    if args.kvu:
        common.append("-kvu")
    # (model, pp, tg, pl) -> program -> [(speed_pp, speed_tg), ...]
    got: dict[tuple, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for rnd in range(args.rounds):
        for model in args.model:
            runs = {"llama.cpp": [str(lbb), "-m", model, "-b", "512", "-ub", "512", *common,
                                  "--output-format", "jsonl"],
                    "pyggml": [pyggml, "bench", "-m", model, *common, "-o", "json", "-q"]}
            order = list(runs) if rnd % 2 == 0 else list(runs)[::-1]
            for prog in order:
                for r in _rows(runs[prog]):
                    got[(Path(model).name, r["pp"], r["tg"], r["pl"])][prog].append((r["speed_pp"], r["speed_tg"]))
                print(f"round {rnd + 1}: {Path(model).name} {prog} done", file=sys.stderr, flush=True)
    print("| model | PP | TG | B | pyggml S_PP | llama.cpp S_PP | ratio | pyggml S_TG | llama.cpp S_TG | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (name, pp, tg, pl), by in got.items():
        med = {p: [statistics.median(x[i] for x in v) for i in (0, 1)] for p, v in by.items()}
        py, ll = med.get("pyggml"), med.get("llama.cpp")
        if not (py and ll):
            continue
        print(f"| {name} | {pp} | {tg} | {pl} | {py[0]:.1f} | {ll[0]:.1f} | {py[0] / ll[0]:.2f}x | "
              f"{py[1]:.1f} | {ll[1]:.1f} | {py[1] / ll[1]:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
