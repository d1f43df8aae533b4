"""FLASH_ATTN_EXT's decode speed on the CPU: one query token over a long F16 cache, as a model's layers run it.

Two figures, for a model's attention shape (default Qwen2.5 1.5B: 12 query heads on 2 KV heads of 128):

* the one-chunk kernel loop alone (attn_jit._one_chunk, one thread, the cache in cache): ns a (head, cell) pair;
* the op as a decode runs it: one FLASH_ATTN_EXT graph per layer (each layer its own K and V, so they come from
  memory as in a model), computed one after another through the CPU backend: ms a token, ns a pair, on 1 and N
  threads (ggml's split-KV path from 512 cells).

    python -P bench/flash_attn.py [--cells 2000] [--heads 12 --kv-heads 2 --dim 128 --layers 28] [-t 2]

llama.cpp's cost of depth for the same model: ``llama-bench -m MODEL -d 0,2000 -p 0 -n 32 -fa 1``.
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np

from pyggml.backend.cpu.compute import graph_compute
from pyggml.backend.cpu.ops import attn_jit
from pyggml.backend.cpu.simd import F16_TO_F32
from pyggml.context import Context
from pyggml.graph import Graph
from pyggml.ops import builders as B
from pyggml.types import GGMLType


@numba.njit
def _rows(q, k, v, mask, n_head, group, dim, n_kv, reps, qq, acc, vrow, cells, msvs, tab):  # pragma: no cover
    t = np.float32(0.0)
    row = 2 * dim * (n_head // group)  # bytes a cell of the cache: every KV head's row
    for _ in range(reps):
        for h in range(n_head):
            kv = h // group
            _, total = attn_jit._one_chunk(q[h].ctypes.data, k.ctypes.data + 2 * dim * kv, row,
                                             v.ctypes.data + 2 * dim * kv, row, mask.ctypes.data, np.float32(1.0),
                                             np.float32(0.088), np.float32(0.0), 0, n_kv, dim, dim, True, qq, acc,
                                             vrow, cells, msvs, tab)
            t += total
    return t


def kernel_loop(n_head: int, n_head_kv: int, dim: int, n_kv: int, reps: int) -> float:
    """ns a (head, cell) pair of the one-chunk loop, one thread."""
    rng = np.random.default_rng(0)
    k = (rng.standard_normal((n_kv, n_head_kv, dim)) * 0.5).astype(np.float16).view(np.uint16)
    v = rng.standard_normal((n_kv, n_head_kv, dim)).astype(np.float16).view(np.uint16)
    q = rng.standard_normal((n_head, dim)).astype(np.float32)
    mask = np.zeros(n_kv, np.uint16)
    scratch = (np.empty(dim, np.float32), np.empty(dim, np.float32), np.empty(dim, np.float32),
               np.empty(attn_jit._MAD_CELLS, np.int64), np.empty(2 * attn_jit._MAD_CELLS, np.float32))
    args = (q, k, v, mask, n_head, n_head // n_head_kv, dim, n_kv)
    _rows(*args, 1, *scratch, F16_TO_F32)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        _rows(*args, reps, *scratch, F16_TO_F32)
        best = min(best, time.perf_counter() - t0)
    return best / (reps * n_head * n_kv) * 1e9


def layer_graphs(n_head: int, n_head_kv: int, dim: int, n_kv: int, n_live: int, n_layers: int) -> list[Graph]:
    """One decode FLASH_ATTN_EXT graph per layer over its own F16 cache of n_kv cells, n_live of them unmasked."""
    rng = np.random.default_rng(0)
    ctx = Context(n_layers * (4 * n_head_kv * dim * n_kv + 8 * n_kv + 4 * n_head * dim) + (64 << 20))
    graphs = []
    for _ in range(n_layers):
        q = ctx.new_tensor(GGMLType.F32, dim, 1, n_head)
        q.set(rng.standard_normal((n_head, 1, dim)).astype(np.float32))
        kv = []
        for _ in range(2):
            cache = ctx.new_tensor(GGMLType.F16, dim * n_head_kv, n_kv)
            cache.set(rng.standard_normal((n_kv, dim * n_head_kv)).astype(np.float32))
            kv.append(B.view_3d(ctx, cache, dim, n_kv, n_head_kv, cache.nb[1], 2 * dim, 0))
        mask = ctx.new_tensor(GGMLType.F16, n_kv, 1)
        m = np.zeros((1, n_kv), np.float32)
        m[0, n_live:] = -np.inf
        mask.set(m)
        out = B.flash_attn_ext(ctx, q, kv[0], kv[1], mask, 1.0 / np.sqrt(dim), 0.0, 0.0)
        B.flash_attn_ext_set_prec(out, B.GGML_PREC_F32)
        g = Graph()
        g.build_forward_expand(out)
        graphs.append(g)
    return graphs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", type=int, default=2000, help="cells attended (default 2000)")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--dim", type=int, default=128, help="head size, K and V (default 128)")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    n_kv = -(-a.cells // 256) * 256  # the cache view, padded as llama.cpp's
    print(f"{a.heads} heads on {a.kv_heads} KV heads of {a.dim}, {a.cells} cells ({n_kv} in the view), "
          f"{a.layers} layers")
    print(f"one-chunk kernel loop, one thread: {kernel_loop(a.heads, a.kv_heads, a.dim, a.cells, 5):.1f} ns a pair")
    graphs = layer_graphs(a.heads, a.kv_heads, a.dim, n_kv, a.cells, a.layers)
    pairs = a.layers * a.heads * a.cells
    for th in sorted({1, a.threads}):
        for g in graphs:
            graph_compute(g, th)
        best = float("inf")
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            for g in graphs:
                graph_compute(g, th)
            best = min(best, time.perf_counter() - t0)
        print(f"the op, {th} thread(s): {best * 1e3:.2f} ms a token, {best / pairs * 1e9:.1f} ns a pair")


if __name__ == "__main__":
    main()
