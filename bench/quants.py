"""Quantize / dequantize throughput of every registered codec, beside the ``gguf`` package's.

    python bench/quants.py                     # 4096 x 4096, every type with a codec
    python bench/quants.py --size 1024 --types q4_0,q4_K,iq2_xs --repeat 5

Figures are MB/s of float32 data (rows * cols * 4 bytes per second), best of ``--repeat``
runs after one warm-up on a small slice (so numba compile time is not counted). Types that
need an importance matrix get a ones-like one. The ``same`` column says whether gguf's bytes
equal pyggml's (gguf has quantizers only for the simpler types).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pyggml.quants import CODECS, dequantize, quantize
from pyggml.types import GGMLType, type_from_name


def _import_gguf() -> tuple[Any, Any]:
    """The ``gguf`` package, or (None, None). A script's own folder comes first on sys.path,
    and a bench script named gguf.py there would shadow the package, so that folder is skipped."""
    here = Path(__file__).resolve().parent
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    try:
        import gguf.quants  # binds the package name too

        return gguf, gguf.quants
    except ImportError:  # the comparison columns stay empty
        return None, None
    finally:
        sys.path[:] = saved


gguf, gq = _import_gguf()


def _best_time(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Best wall time of ``repeat`` calls (stops early once a single call takes over 5 s)."""
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        dt = time.perf_counter() - t0
        best = min(best, dt)
        if dt > 5.0:
            break
    return best, result


def _gguf_type(ty: GGMLType) -> Any | None:
    if gguf is None or ty == GGMLType.F32:  # gguf's F32 "conversion" is a no-op view: no contest
        return None
    try:
        return gguf.GGMLQuantizationType(int(ty))
    except ValueError:
        return None


def _gguf_quantize(x: np.ndarray, gty: Any) -> np.ndarray | None:
    try:
        out = gq.quantize(x, gty)
    except (NotImplementedError, gq.QuantError):
        return None
    return np.ascontiguousarray(out).view(np.uint8).reshape(x.shape[0], -1)


def _gguf_dequantize(q: np.ndarray, gty: Any) -> np.ndarray | None:
    try:
        return gq.dequantize(q, gty)
    except NotImplementedError:
        return None


def bench_type(ty: GGMLType, x: np.ndarray, repeat: int) -> dict[str, Any]:
    codec = CODECS[ty]
    mb = x.nbytes / 1e6
    imatrix = np.ones(x.shape[1], np.float32) if codec.requires_imatrix else None
    row: dict[str, Any] = {"type": ty.type_name}
    small = x[:2]

    if codec.can_quantize:
        quantize(small, ty, imatrix)  # warm-up / JIT
        t, q = _best_time(lambda: quantize(x, ty, imatrix), repeat)
        row["quant"] = mb / t
    else:
        q = codec.quantize_rows(np.ascontiguousarray(x), None)
        row["quant"] = None
    dequantize(q[:2], ty)
    t, _ = _best_time(lambda: dequantize(q, ty), repeat)
    row["deq"] = mb / t

    gty = _gguf_type(ty)
    if gty is not None and gq is not None:
        gq_small = _gguf_quantize(small, gty)
        if gq_small is not None and imatrix is None:
            t, gq_bytes = _best_time(lambda: _gguf_quantize(x, gty), repeat)
            row["gguf_quant"] = mb / t
            row["same"] = "yes" if np.array_equal(gq_bytes, q) else "NO"
        if _gguf_dequantize(q[:2], gty) is not None:
            t, _ = _best_time(lambda: _gguf_dequantize(q, gty), repeat)
            row["gguf_deq"] = mb / t
    return row


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:9.1f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:6.1f}x"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=4096, help="rows = cols = SIZE (a multiple of 256)")
    ap.add_argument("--rows", type=int, default=None, help="rows, if different from --size")
    ap.add_argument("--types", default="", help="comma-separated ggml type names (default: all codecs)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    if args.types:
        types = [type_from_name(t.strip()) for t in args.types.split(",") if t.strip()]
        missing = [t.type_name for t in types if t not in CODECS]
        if missing:
            ap.error(f"no codec registered for: {', '.join(missing)}")
    else:
        types = sorted(CODECS)
    rows = args.rows or args.size
    x = np.random.default_rng(args.seed).standard_normal((rows, args.size)).astype(np.float32)

    print(f"{rows} x {args.size} float32 ({x.nbytes / 1e6:.0f} MB), best of {args.repeat}; MB/s of f32")
    head = f"{'type':8s} {'deq':>9s} {'gguf deq':>9s} {'speedup':>7s} {'quant':>9s} {'gguf q':>9s} {'speedup':>7s} same"
    print(head)
    print("-" * len(head))
    for ty in types:
        if args.size % ty.blck_size:
            print(f"{ty.type_name:8s} skipped: {args.size} is not a multiple of {ty.blck_size}")
            continue
        r = bench_type(ty, x, args.repeat)
        print(
            f"{r['type']:8s} {_fmt(r['deq'])} {_fmt(r.get('gguf_deq'))} {_ratio(r['deq'], r.get('gguf_deq')):>7s} "
            f"{_fmt(r['quant'])} {_fmt(r.get('gguf_quant'))} {_ratio(r['quant'], r.get('gguf_quant')):>7s} "
            f"{r.get('same', '-')}",
            flush=True,
        )


if __name__ == "__main__":
    main()
