"""Threads under contention: generation speed with one core kept busy by another process, ``-t 2``
against ``-t 1``, for ``pyggml bench`` and (given its path) llama.cpp's ``llama-bench``.

A worker that spins while its core is shared with a busy process only burns the time slices the
scheduler gives it, and a barrier that waits on a descheduled thread stalls every other thread: on
a two-core machine with one core busy, ``-t 2`` can then be slower than ``-t 1``. This script
measures exactly that case, so the cost can be compared with llama.cpp's on the same machine.

The busy loop is a Python process pinned to the last core this process may use; the benchmarks are
not pinned (as a user would run them). Runs are interleaved (pyggml -t1, -t2, llama.cpp -t1, -t2,
order reversed every other round) because the machine is shared and its load drifts; the table
shows every round, then the medians and the -t2/-t1 ratio (above 1: two threads are faster).

    python bench/contention.py --llama-bench /path/to/llama-bench              # tg64, one core busy
    python bench/contention.py --no-busy -p 64 -n 32 --threads 2 --rounds 3    # uncontended pp and tg

The model defaults to the packaged Gemma 3 270M Q4_K_M (its assembled GGUF file is given to both).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script, with or without -P
from vs_llamacpp import _run_json


def _tests(rows: list[dict]) -> dict[str, float]:
    """test name (pp64 / tg64) -> tokens/s."""
    return {(f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"): float(r["avg_ts"]) for r in rows}


def _busy_loop(core: int) -> subprocess.Popen:
    """A process that keeps ``core`` busy (pinned to it) until killed."""
    code = f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass"
    return subprocess.Popen([sys.executable, "-c", code])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-bench", default=None, help="path of llama.cpp's llama-bench (default: pyggml only)")
    ap.add_argument("-m", "--model", default=None, help="GGUF file (default: the packaged Gemma 3 270M Q4_K_M)")
    ap.add_argument("-p", type=int, default=0, help="prompt tokens, 0 = no pp test (default 0)")
    ap.add_argument("-n", type=int, default=64, help="generated tokens (default 64)")
    ap.add_argument("-r", type=int, default=3, help="repetitions per run (default 3)")
    ap.add_argument("--threads", default="1,2", help="thread counts to compare (default 1,2)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    ap.add_argument("--no-busy", action="store_true", help="no busy loop: measure the uncontended speed")
    ap.add_argument("--pyggml", action="append", default=[], metavar="[LABEL=]CMD",
                    help="pyggml command (default: the one next to this Python); repeatable, each labelled, to "
                         "compare builds or flags, e.g. --pyggml old=/tmp/old/pyggml --pyggml 'poll0=pyggml --poll 0'")
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    progs: list[tuple[str, list[str]]] = []
    for spec in args.pyggml:
        label, sep, cmd = spec.partition("=")
        progs.append((label, shlex.split(cmd)) if sep else ("pyggml", shlex.split(spec)))
    if not progs:
        pyggml = shutil.which("pyggml", path=os.path.dirname(sys.executable)) or shutil.which("pyggml")
        if pyggml is None:
            ap.error("the pyggml command is not installed (pip install -e .)")
        progs.append(("pyggml", [pyggml]))
    if args.model is None:
        from pyggml.llm.packaged import resolve

        args.model = str(resolve(None))
    if not Path(args.model).is_file():
        ap.error(f"model not found: {args.model}")
    progs = [(label, [cmd[0], "bench", *cmd[1:]]) for label, cmd in progs]  # CMD's own flags after "bench"
    if args.llama_bench:
        if not Path(args.llama_bench).is_file():
            ap.error(f"llama-bench not found at {args.llama_bench}")
        progs.append(("llama.cpp", [args.llama_bench]))
    cores = sorted(os.sched_getaffinity(0))
    busy = None if args.no_busy else _busy_loop(cores[-1])
    print(f"{len(cores)} cores; busy loop: {'none' if busy is None else f'pid {busy.pid} on core {cores[-1]}'}; "
          f"model {Path(args.model).name}; -p {args.p} -n {args.n} -r {args.r}", file=sys.stderr)
    samples: dict[tuple[str, str, int], list[float]] = {}
    try:
        time.sleep(0.5)  # let the busy loop settle on its core
        for rnd in range(args.rounds):
            runs = [(name, cmd, t) for name, cmd in progs for t in threads]
            for name, cmd, t in runs if rnd % 2 == 0 else runs[::-1]:
                full = [*cmd, "-m", args.model, "-p", str(args.p), "-n", str(args.n), "-r", str(args.r),
                        "-t", str(t), "-o", "json"]
                rows = [r for r in _run_json(full) if r["n_prompt"] or r["n_gen"]]
                for test, ts in _tests(rows).items():
                    samples.setdefault((name, test, t), []).append(ts)
                    print(f"round {rnd + 1}: {name:<10} {test:<6} -t {t}: {ts:8.2f} t/s", file=sys.stderr)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    tests = sorted({k[1] for k in samples}, key=lambda s: (s[:2] != "pp", s))
    head = f"| {'program':<10} | {'test':<6} | " + " | ".join(f"-t {t} t/s (median; rounds)" for t in threads)
    if len(threads) > 1:
        head += f" | -t {threads[-1]} / -t {threads[0]}"
    print(head + " |")
    print("-" * (len(head) + 2))
    for name, _ in progs:
        for test in tests:
            meds = []
            cells = []
            for t in threads:
                v = samples.get((name, test, t), [])
                med = statistics.median(v) if v else float("nan")
                meds.append(med)
                cells.append(f"{med:8.2f} ({', '.join(f'{x:.1f}' for x in v)})")
            line = f"| {name:<10} | {test:<6} | " + " | ".join(cells)
            if len(threads) > 1:
                line += f" | {meds[-1] / meds[0]:.2f}x"
            print(line + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
