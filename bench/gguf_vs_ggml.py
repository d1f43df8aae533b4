"""Differential check of the GGUF reader against ggml itself (needs a built ``libggml-base.so``).

    python bench/gguf_vs_ggml.py /path/to/libggml-base.so [--mutations 20000] [--seed 0]

Feeds every truncation of a small valid file and random mutations of it to both pyggml's
GGUFReader and ggml's ``gguf_init_from_buffer`` (then, as ggml's loader does when it allocates,
the read of the whole data blob, check C2), and prints how often they disagree on
accept/reject. Build the library from llama.cpp's ``ggml/`` with ``cmake`` and
``make ggml-base``. A dev tool: CI has no libggml, so this is not a test.
"""

from __future__ import annotations

import argparse
import ctypes
import random
import struct
import sys
from pathlib import Path

from pyggml.gguf import GGUFError, GGUFReader


class _Params(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.POINTER(ctypes.c_void_p))]


class Ggml:
    """The few gguf_* functions needed, through ctypes."""

    def __init__(self, path: str) -> None:
        lib = ctypes.CDLL(path)
        lib.gguf_init_from_buffer.restype = ctypes.c_void_p
        lib.gguf_init_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_size_t, _Params]
        for f in ("gguf_get_n_tensors", "gguf_get_data_offset", "gguf_get_alignment"):
            getattr(lib, f).restype = ctypes.c_int64
            getattr(lib, f).argtypes = [ctypes.c_void_p]
        for f in ("gguf_get_tensor_offset", "gguf_get_tensor_size"):
            getattr(lib, f).restype = ctypes.c_uint64
            getattr(lib, f).argtypes = [ctypes.c_void_p, ctypes.c_int64]
        lib.gguf_free.argtypes = [ctypes.c_void_p]
        lib.ggml_free.argtypes = [ctypes.c_void_p]
        self.log: list[str] = []
        self._cb = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(
            lambda _lvl, msg, _ud: self.log.append(msg.decode(errors="replace"))
        )
        lib.ggml_log_set(self._cb, None)
        self.lib = lib

    def accepts(self, data: bytes) -> tuple[bool, str]:
        self.log.clear()
        if not data:  # gguf_init_from_buffer refuses an empty buffer outright
            return False, "empty buffer"
        lib, buf = self.lib, ctypes.create_string_buffer(data, len(data))
        ctx = lib.gguf_init_from_buffer(buf, len(data), _Params(True, None))
        if not ctx:
            return False, "".join(self.log).strip()
        n, end = lib.gguf_get_n_tensors(ctx), lib.gguf_get_data_offset(ctx)
        if n:
            a = lib.gguf_get_alignment(ctx)
            size = lib.gguf_get_tensor_size(ctx, n - 1)
            end += lib.gguf_get_tensor_offset(ctx, n - 1) + (size + a - 1) // a * a
        lib.gguf_free(ctx)
        if end > len(data):  # C2 would fail; do not ask ggml to allocate a huge blob to find out
            return False, "C2: data blob past the end"
        gctx = ctypes.c_void_p()
        ctx = lib.gguf_init_from_buffer(buf, len(data), _Params(False, ctypes.pointer(gctx)))
        if not ctx:
            return False, "".join(self.log).strip()
        lib.gguf_free(ctx)
        lib.ggml_free(gctx)
        return True, ""


def pyggml_accepts(data: bytes) -> tuple[bool, str]:
    try:
        GGUFReader(data)
    except GGUFError as e:
        return False, str(e)
    return True, ""


def mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op, pos = rng.random(), rng.randrange(len(b) + 1)
        if op < 0.5 and pos < len(b):
            b[pos] = rng.randrange(256)
        elif op < 0.7 and pos + 8 <= len(b):
            v = rng.choice([0, 1, 2**30 + 1, 2**63 - 1, 2**64 - 1, rng.randrange(300), rng.randrange(2**64)])
            b[pos : pos + 8] = struct.pack("<Q", v)
        elif op < 0.8:
            del b[pos:]
        elif op < 0.9:
            del b[pos : pos + rng.randint(1, 16)]
        else:
            b[pos:pos] = bytes([rng.randrange(256)])
    return bytes(b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("libggml_base")
    ap.add_argument("--mutations", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    ggml = Ggml(args.libggml_base)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from helpers.gguf_build import small_valid  # the tests' hand-built file, every value type and three tensors

    valid = small_valid().build()
    rng = random.Random(args.seed)
    cases = [valid[:n] for n in range(len(valid) + 1)] + [mutate(valid, rng) for _ in range(args.mutations)]
    accepted = mismatches = 0
    for data in cases:
        (g, gmsg), (p, pmsg) = ggml.accepts(data), pyggml_accepts(data)
        accepted += p
        if g != p:
            mismatches += 1
            if mismatches <= 10:
                print(f"disagree: ggml {'accepts' if g else 'rejects: ' + gmsg} | pyggml {pmsg or 'accepts'}")
    print(f"{len(cases)} files, {accepted} valid, {len(cases) - accepted} rejected, {mismatches} disagreements")


if __name__ == "__main__":
    main()
