"""pyggml's tools against llama.cpp's, whole runs: wall time and peak memory of ``pyggml perplexity``,
``pyggml imatrix`` and ``pyggml bench -npp/-ntg/-npl`` beside ``llama-perplexity``, ``llama-imatrix`` and
``llama-batched-bench`` with the same flags, alternating run by run (issue #31 item 6: >= 1.0x llama.cpp's
speed, <= 1.0x its peak RSS).

    python -P bench/vs_tools.py --llama-bin /path/to/llama.cpp/build/bin -m gemma.gguf -f text.txt \\
        -c 512 --chunks 8 -t 2 --rounds 2

Each round runs every tool with both programs, the order swapped every round, so both meet the same
load on this shared machine. The wall time is the whole process (loading included, as a user waits
for it); peak RSS is the child's ``ru_maxrss``. The speed ratio is llama.cpp's time over pyggml's
(above 1: pyggml faster), the memory ratio pyggml's RSS over llama.cpp's (below 1: pyggml smaller).
``../shared/tools/build_llamacpp.sh DIR`` builds the llama.cpp tools for this CPU.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path


def _timed(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in MB) of one run of ``cmd``; its output is discarded unless it fails."""
    with tempfile.TemporaryFile() as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            log.seek(0)
            tail = log.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}:\n{tail}")
    return wall, usage.ru_maxrss / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-bin", required=True, help="llama.cpp's build/bin folder (llama-perplexity, "
                                                       "llama-imatrix, llama-batched-bench)")
    ap.add_argument("-m", "--model", required=True, help="GGUF file")
    ap.add_argument("-f", "--file", required=True, help="text for perplexity and imatrix")
    ap.add_argument("-c", type=int, default=512, help="perplexity/imatrix chunk size (default 512)")
    ap.add_argument("--chunks", type=int, default=8, help="chunks for perplexity/imatrix (default 8)")
    ap.add_argument("-npp", default="128", help="batched-bench prompt lengths (default 128)")
    ap.add_argument("-ntg", default="64", help="batched-bench generated tokens (default 64)")
    ap.add_argument("-npl", default="1,4", help="batched-bench parallel sequences (default 1,4)")
    ap.add_argument("-t", type=int, default=2, help="threads (default 2)")
    ap.add_argument("--tools", default="perplexity,imatrix,batched-bench",
                    help="which tools, comma-separated (default all three)")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds (default 2)")
    ap.add_argument("--pyggml", default=None, help="pyggml command (default: the one next to this Python)")
    args = ap.parse_args()
    bin_dir = Path(args.llama_bin)
    pyggml = args.pyggml or shutil.which("pyggml", path=os.path.dirname(sys.executable)) or shutil.which("pyggml")
    if pyggml is None:
        ap.error("the pyggml command is not installed (pip install -e .)")
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    unknown = set(tools) - {"perplexity", "imatrix", "batched-bench"}
    if unknown:
        ap.error(f"unknown tool(s): {', '.join(sorted(unknown))}")
    out_dir = Path(tempfile.mkdtemp(prefix="vs_tools_"))
    text = ["-m", args.model, "-f", args.file, "-c", str(args.c), "--chunks", str(args.chunks), "-t", str(args.t)]
    batched = ["-m", args.model, "-npp", args.npp, "-ntg", args.ntg, "-npl", args.npl, "-c", "2048",
               "-t", str(args.t)]
    runs = {
        "perplexity": {"pyggml": [pyggml, "perplexity", *text],
                       "llama.cpp": [str(bin_dir / "llama-perplexity"), *text]},
        "imatrix": {"pyggml": [pyggml, "imatrix", *text, "-o", str(out_dir / "p.gguf")],
                    "llama.cpp": [str(bin_dir / "llama-imatrix"), *text, "-o", str(out_dir / "l.gguf")]},
        "batched-bench": {"pyggml": [pyggml, "bench", *batched, "-q"],
                          "llama.cpp": [str(bin_dir / "llama-batched-bench"), *batched]},
    }
    for tool in tools:
        if not Path(runs[tool]["llama.cpp"][0]).is_file():
            ap.error(f"{runs[tool]['llama.cpp'][0]} not found")
    got: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for rnd in range(args.rounds):
        for tool in tools:
            order = ["pyggml", "llama.cpp"] if rnd % 2 == 0 else ["llama.cpp", "pyggml"]
            for prog in order:
                got[tool][prog].append(_timed(runs[tool][prog]))
                wall, rss = got[tool][prog][-1]
                print(f"round {rnd + 1}: {tool} {prog} {wall:.1f} s {rss:.0f} MB", file=sys.stderr, flush=True)
    print(f"model {Path(args.model).name}, -t {args.t}, {args.rounds} rounds (medians)")
    for tool in tools:
        print(f"  {tool}: {' '.join(runs[tool]['pyggml'][1:])}")
    print("| tool | pyggml s | llama.cpp s | speed ratio | pyggml MB | llama.cpp MB | memory ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for tool in tools:
        py = [statistics.median(x[i] for x in got[tool]["pyggml"]) for i in (0, 1)]
        ll = [statistics.median(x[i] for x in got[tool]["llama.cpp"]) for i in (0, 1)]
        print(f"| {tool} | {py[0]:.1f} | {ll[0]:.1f} | {ll[0] / py[0]:.2f}x | {py[1]:.0f} | {ll[1]:.0f} | "
              f"{py[1] / ll[1]:.2f}x |")
    shutil.rmtree(out_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
