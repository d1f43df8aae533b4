"""How fast gallocr plans, and how much it saves, on a transformer-shaped graph.

    python bench/bench_alloc.py [n_layers] [n_embd] [n_tokens]

Prints the node count, reserve and alloc_graph times, the planned buffer size against the size
with every tensor in its own memory, and the per-buffer table of the first nodes.
"""

from __future__ import annotations

import sys
import time

from pyggml.alloc import backend_alloc_ctx_tensors_from_buft, gallocr_new
from pyggml.alloc.dyn_tallocr import round_up
from pyggml.backend.cpu.backend import backend_cpu_buffer_type
from pyggml.context import Context
from pyggml.graph import Graph
from pyggml.ops import builders as B
from pyggml.tensor import Tensor
from pyggml.types import GGMLType

F32 = GGMLType.F32


def build(n_layers: int, n_embd: int, n_tok: int) -> tuple[Graph, Context]:
    wctx = Context(1 << 24, no_alloc=True)
    ctx = Context(1 << 26, no_alloc=True)
    x = ctx.new_tensor(F32, n_embd, n_tok).set_name("inp")
    x.set_input()
    cur: Tensor = x
    for il in range(n_layers):
        wq, wk, wv, wo = (wctx.new_tensor(F32, n_embd, n_embd) for _ in range(4))
        w_up, w_down = wctx.new_tensor(F32, n_embd, 4 * n_embd), wctx.new_tensor(F32, 4 * n_embd, n_embd)
        h = B.rms_norm(ctx, cur, 1e-6)
        q, k, v = B.mul_mat(ctx, wq, h), B.mul_mat(ctx, wk, h), B.mul_mat(ctx, wv, h)
        kq = B.soft_max(ctx, B.scale(ctx, B.mul_mat(ctx, k, q), n_embd**-0.5))
        att = B.mul_mat(ctx, B.cont(ctx, B.transpose(ctx, v)), kq)
        cur = B.add(ctx, B.mul_mat(ctx, wo, att), cur)
        ff = B.mul_mat(ctx, w_down, B.silu(ctx, B.mul_mat(ctx, w_up, B.rms_norm(ctx, cur, 1e-6))))
        cur = B.add(ctx, ff, cur)
        cur.name = f"l{il}_out"
    cur.set_output()
    backend_alloc_ctx_tensors_from_buft(wctx, backend_cpu_buffer_type())
    g = Graph(size=32 * n_layers + 64)
    g.build_forward_expand(cur)
    return g, wctx


def main() -> None:
    defaults = [32, 256, 64]
    args = [int(a) for a in sys.argv[1:4]]
    n_layers, n_embd, n_tok = args + defaults[len(args) :]
    g, _keep = build(n_layers, n_embd, n_tok)
    ga = gallocr_new(backend_cpu_buffer_type())
    t0 = time.perf_counter()
    ga.reserve(g)
    t1 = time.perf_counter()
    ga.alloc_graph(g)
    t2 = time.perf_counter()
    own = sum(round_up(t.nbytes(), 32) for t in [*g.nodes, *g.leafs] if t.view_src is None and t.buffer in
              ga.get_buffers(0))
    print(f"graph: {g.n_nodes} nodes, {g.n_leafs} leafs ({n_layers} layers, n_embd {n_embd}, {n_tok} tokens)")
    print(f"reserve: {1e3 * (t1 - t0):.1f} ms   alloc_graph: {1e3 * (t2 - t1):.1f} ms")
    print(f"planned: {ga.get_buffer_size(0) / 2**20:.2f} MiB   every tensor in its own memory: {own / 2**20:.2f} MiB")
    print("\n".join(ga.plan().table().splitlines()[:14]))


if __name__ == "__main__":
    main()
