"""Compare pyggml's graph allocator with ggml's own, graph by graph, offset by offset.

    PYGGML_LIBGGML_BASE=/path/to/libggml-base.so python bench/alloc_vs_ggml.py [n_graphs] [seed]

Builds the same random graphs (element-wise, in-place variants, matrix products, transposes,
permutes, reshapes, row views, clamps; random INPUT/OUTPUT flags) in pyggml and, through ctypes,
in libggml-base (which holds ggml.c, ggml-alloc.c and ggml-backend.cpp with the CPU buffer type),
lets both gallocrs reserve and place them, and reports every graph whose buffer size or any
tensor offset differs. Exit status 1 on any difference.
"""

from __future__ import annotations

import ctypes as C
import os
import random
import sys
from collections.abc import Callable

from pyggml.alloc import gallocr_new, gallocr_new_n
from pyggml.backend import api
from pyggml.backend.cpu.backend import CPUBufferType, backend_cpu_buffer_type
from pyggml.context import Context
from pyggml.graph import Graph
from pyggml.ops import builders as B
from pyggml.tensor import Tensor

LIB = os.environ.get("PYGGML_LIBGGML_BASE", "/tmp/ggmlref/build/src/libggml-base.so")
GGML_TYPE_F32 = 0
P = C.c_void_p


class InitParams(C.Structure):
    _fields_ = [("mem_size", C.c_size_t), ("mem_buffer", P), ("no_alloc", C.c_bool)]


def load(path: str) -> C.CDLL:
    lib = C.CDLL(path)
    sig: dict[str, tuple[list, object]] = {
        "ggml_init": ([InitParams], P), "ggml_free": ([P], None),
        "ggml_new_tensor_2d": ([P, C.c_int, C.c_int64, C.c_int64], P),
        "ggml_set_name": ([P, C.c_char_p], P), "ggml_set_input": ([P], None), "ggml_set_output": ([P], None),
        "ggml_get_data": ([P], P),
        "ggml_new_graph_custom": ([P, C.c_size_t, C.c_bool], P), "ggml_build_forward_expand": ([P, P], None),
        "ggml_graph_n_nodes": ([P], C.c_int), "ggml_graph_node": ([P, C.c_int], P),
        "ggml_backend_cpu_buffer_type": ([], P), "ggml_gallocr_new": ([P], P), "ggml_gallocr_free": ([P], None),
        "ggml_gallocr_new_n": ([P, C.c_int], P), "ggml_gallocr_reserve_n": ([P, P, P, P], C.c_bool),
        "ggml_backend_buffer_get_size": ([P], C.c_size_t),
        "ggml_gallocr_reserve": ([P, P], C.c_bool), "ggml_gallocr_alloc_graph": ([P, P], C.c_bool),
        "ggml_gallocr_get_buffer_size": ([P, C.c_int], C.c_size_t), "ggml_backend_buffer_get_base": ([P], P),
        "ggml_scale": ([P, P, C.c_float], P), "ggml_scale_inplace": ([P, P, C.c_float], P),
        "ggml_rms_norm": ([P, P, C.c_float], P), "ggml_rms_norm_inplace": ([P, P, C.c_float], P),
        "ggml_clamp": ([P, P, C.c_float, C.c_float], P),
        "ggml_permute": ([P, P, C.c_int, C.c_int, C.c_int, C.c_int], P),
        "ggml_reshape_2d": ([P, P, C.c_int64, C.c_int64], P), "ggml_view_1d": ([P, P, C.c_int64, C.c_size_t], P),
    }
    for name in ("sqr", "neg", "tanh", "soft_max", "transpose", "cont"):
        sig[f"ggml_{name}"] = ([P, P], P)
        sig[f"ggml_{name}_inplace"] = ([P, P], P)
    for name in ("add", "sub", "mul", "mul_mat"):
        sig[f"ggml_{name}"] = ([P, P, P], P)
        sig[f"ggml_{name}_inplace"] = ([P, P, P], P)
    for name, (args, res) in sig.items():
        if not hasattr(lib, name):
            continue
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    return lib


def c_buffer_of(t: int) -> int:
    """struct ggml_tensor: the buffer pointer sits right after the 4-byte type (offset 8)."""
    return C.c_void_p.from_address(t + 8).value or 0


def c_ne(t: int) -> tuple[int, int]:
    ne = (C.c_int64 * 4).from_address(t + 16)
    return ne[0], ne[1]


def c_nb1(t: int) -> int:
    return (C.c_size_t * 4).from_address(t + 48)[1]


class Builder:
    """One op vocabulary over two worlds: ``py`` builds pyggml tensors, ``c`` ggml ones."""

    def __init__(self, lib: C.CDLL, world: str) -> None:
        self.lib, self.world = lib, world
        if world == "py":
            self.ctx = Context(1 << 22, no_alloc=True)
        else:
            self.ctx = lib.ggml_init(InitParams(1 << 24, None, True))

    def leaf(self, ne0: int, ne1: int, name: str) -> object:
        if self.world == "py":
            return self.ctx.new_tensor(0, ne0, ne1).set_name(name)
        t = self.lib.ggml_new_tensor_2d(self.ctx, GGML_TYPE_F32, ne0, ne1)
        self.lib.ggml_set_name(t, name.encode())
        return t

    def ne(self, t: object) -> tuple[int, int]:
        return (t.ne[0], t.ne[1]) if self.world == "py" else c_ne(t)

    def nb1(self, t: object) -> int:
        return t.nb[1] if self.world == "py" else c_nb1(t)

    def op(self, name: str, *args: object) -> object:
        if self.world == "py":
            fn: Callable = getattr(B, name)
            return fn(self.ctx, *args)
        return getattr(self.lib, f"ggml_{name}")(self.ctx, *args)

    def flag(self, t: object, which: str) -> None:
        if self.world == "py":
            # ggml_set_output flags the whole view_src chain (ggml.c); mirror it here in case
            # pyggml's Tensor.set_output does not (yet)
            cur = t if which == "output" else None
            while cur is not None:
                cur.set_output()
                cur = cur.view_src
            if which == "input":
                t.set_input()
        else:
            getattr(self.lib, f"ggml_set_{which}")(t)


# clamp is left out unless asked for: in the ggml this was written against, ggml_clamp makes a new
# tensor while pyggml's builder (like older ggml) returns a view, so the graphs themselves differ
UNARY = ["sqr", "neg", "tanh", "soft_max", "scale", "rms_norm"]
if os.environ.get("PYGGML_CMP_CLAMP"):
    UNARY.append("clamp")
BINARY = ["add", "sub", "mul"]
KINDS = [*UNARY, *BINARY, "mul_mat", "transpose", "permute", "reshape", "row"]


def random_recipe(rng: random.Random) -> dict:
    n_steps = rng.randint(1, rng.choice([8, 24, 80]))
    return {
        "k": rng.randint(1, 40), "m": rng.randint(1, 40),
        "leafs": [(rng.random() < 0.5, rng.random() < 0.5) for _ in range(rng.randint(1, 4))],
        "steps": [(rng.choice(KINDS), rng.randrange(100), rng.randrange(100), rng.random() < 0.3,
                   rng.random() < 0.15) for _ in range(n_steps)],
    }


def build(b: Builder, recipe: dict) -> list[object]:
    """Build the recipe; returns the tensors to expand (outputs, then the last tensor)."""
    k, m = recipe["k"], recipe["m"]
    pool: list[object] = []
    for i, (transposed, is_input) in enumerate(recipe["leafs"]):
        t = b.leaf(*((m, k) if transposed else (k, m)), f"in{i}")
        if is_input:
            b.flag(t, "input")
        pool.append(t)
    roots: list[object] = []
    for kind, i, j, inplace, out in recipe["steps"]:
        a = pool[i % len(pool)]
        sfx = "_inplace" if inplace else ""
        if kind == "scale":
            r = b.op("scale" + sfx, a, 0.5)
        elif kind == "rms_norm":
            r = b.op("rms_norm" + sfx, a, 1e-5)
        elif kind == "clamp":
            r = b.op("clamp", a, -0.5, 0.5)
        elif kind in UNARY:
            r = b.op(kind + sfx, a)
        elif kind in BINARY:
            ne_a = b.ne(a)
            cands = [t for t in pool if all(ne_a[d] % b.ne(t)[d] == 0 for d in (0, 1))]
            r = b.op(kind + sfx, a, cands[j % len(cands)])
        elif kind == "mul_mat":
            cands = [t for t in pool if b.ne(t)[0] == b.ne(a)[0]]
            r = b.op("mul_mat", a, cands[j % len(cands)])
        elif kind == "transpose":
            r = b.op("cont", b.op("transpose", a))
        elif kind == "permute":
            r = b.op("cont", b.op("permute", a, 1, 0, 2, 3))
        elif kind == "reshape":
            ne0, ne1 = b.ne(a)
            r = b.op("reshape_2d", a, ne1, ne0)
        else:
            ne0, ne1 = b.ne(a)
            row = b.op("view_1d", a, ne0, (j % ne1) * b.nb1(a))
            cands = [t for t in pool if b.ne(t)[0] == ne0]
            r = b.op("add", cands[i % len(cands)], row)
        if out:
            b.flag(r, "output")
            roots.append(r)
        pool.append(r)
    roots.append(pool[-1])
    return roots


class CappedCPU(CPUBufferType):
    """pyggml side of a CPU buffer type with a max buffer size (forces several chunks)."""

    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap

    def get_max_size(self) -> int:
        return self.cap


GET_NAME = C.CFUNCTYPE(C.c_char_p, P)
ALLOC_BUFFER = C.CFUNCTYPE(P, P, C.c_size_t)
SIZE_FN = C.CFUNCTYPE(C.c_size_t, P)
ALLOC_SIZE = C.CFUNCTYPE(C.c_size_t, P, P)
IS_HOST = C.CFUNCTYPE(C.c_bool, P)


class BuftIface(C.Structure):
    _fields_ = [("get_name", GET_NAME), ("alloc_buffer", ALLOC_BUFFER), ("get_alignment", SIZE_FN),
                ("get_max_size", SIZE_FN), ("get_alloc_size", ALLOC_SIZE), ("is_host", IS_HOST)]


class Buft(C.Structure):
    _fields_ = [("iface", BuftIface), ("device", P), ("context", P)]


def c_capped_buft(lib: C.CDLL, cap: int) -> tuple[Buft, list]:
    """A ggml buffer type that allocates CPU buffers but reports ``cap`` as its max size (SIZE_MAX: 0)."""
    cpu = lib.ggml_backend_cpu_buffer_type()
    lib.ggml_backend_buft_alloc_buffer.argtypes, lib.ggml_backend_buft_alloc_buffer.restype = [P, C.c_size_t], P
    keep = [GET_NAME(lambda b: b"CAPPED"), ALLOC_BUFFER(lambda b, n: lib.ggml_backend_buft_alloc_buffer(cpu, n)),
            SIZE_FN(lambda b: 32), SIZE_FN(lambda b: cap or (1 << 64) - 1), IS_HOST(lambda b: True)]
    iface = BuftIface(keep[0], keep[1], keep[2], keep[3], ALLOC_SIZE(), keep[4])
    return Buft(iface, None, None), keep


def plan_py(recipe: dict, mode: str, cap: int, ids_seed: int) -> tuple[list[int], list]:
    b = Builder(None, "py")  # type: ignore[arg-type]
    g = Graph(size=4096)
    for t in build(b, recipe):
        g.build_forward_expand(t)
    if mode == "multi":
        ga = gallocr_new_n([backend_cpu_buffer_type(), CPUBufferType()])
        rng = random.Random(ids_seed)
        ga.reserve_n(g, [rng.randrange(2) for _ in g.nodes], [rng.randrange(2) for _ in g.leafs])
    else:
        ga = gallocr_new(backend_cpu_buffer_type() if mode == "plain" else CappedCPU(cap))
    ga.alloc_graph(g)
    sizes = [ga.get_buffer_size(i) for i in range(ga.n_buffers)]
    return sizes, [_py_place(t) for t in g.nodes]


def _py_place(t: Tensor) -> tuple[int, int] | None:
    buf = t.view_src.buffer if t.view_src is not None else t.buffer
    if buf is None or t.data is None:
        return None
    return t.data - api.backend_buffer_get_base(buf), buf.size


def plan_c(lib: C.CDLL, recipe: dict, mode: str, cap: int, ids_seed: int) -> tuple[list[int], list]:
    b = Builder(lib, "c")
    keep: list = []
    try:
        g = lib.ggml_new_graph_custom(b.ctx, 4096, False)
        for t in build(b, recipe):
            lib.ggml_build_forward_expand(g, t)
        n_nodes = lib.ggml_graph_n_nodes(g)
        if mode == "multi":
            other, keep = c_capped_buft(lib, 0)
            bufts = (P * 2)(lib.ggml_backend_cpu_buffer_type(), C.cast(C.pointer(other), P))
            ga = lib.ggml_gallocr_new_n(bufts, 2)
            rng = random.Random(ids_seed)
            n_leafs = C.c_int.from_address(g + 8).value  # struct ggml_cgraph: size, n_nodes, n_leafs
            node_ids = (C.c_int * max(n_nodes, 1))(*[rng.randrange(2) for _ in range(n_nodes)])
            leaf_ids = (C.c_int * max(n_leafs, 1))(*[rng.randrange(2) for _ in range(n_leafs)])
            lib.ggml_gallocr_reserve_n(ga, g, node_ids, leaf_ids)
            n_bufs = 2
        else:
            if mode == "plain":
                buft = lib.ggml_backend_cpu_buffer_type()
            else:
                capped, keep = c_capped_buft(lib, cap)
                buft = C.cast(C.pointer(capped), P)
                keep.append(capped)
            ga = lib.ggml_gallocr_new(buft)
            n_bufs = 1
        lib.ggml_gallocr_alloc_graph(ga, g)
        places: list = []
        for i in range(n_nodes):
            t = lib.ggml_graph_node(g, i)
            data, buf = lib.ggml_get_data(t), c_buffer_of(t)
            places.append(None if not data or not buf else
                          (data - lib.ggml_backend_buffer_get_base(buf), lib.ggml_backend_buffer_get_size(buf)))
        sizes = [lib.ggml_gallocr_get_buffer_size(ga, i) for i in range(n_bufs)]
        lib.ggml_gallocr_free(ga)
        return sizes, places
    finally:
        lib.ggml_free(b.ctx)
        del keep


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    lib = load(LIB)
    rng = random.Random(seed)
    bad = 0
    total_nodes = 0
    for it in range(n):
        recipe = random_recipe(rng)
        mode = rng.choice(["plain", "cap", "multi"])
        cap = rng.choice([256, 1024, 4096, 16384])
        ids_seed = rng.randrange(1 << 30)
        got = plan_py(recipe, mode, cap, ids_seed)
        want = plan_c(lib, recipe, mode, cap, ids_seed)
        total_nodes += len(want[1])
        if got != want:
            bad += 1
            if bad <= 5:
                print(f"graph {it} ({mode}, cap {cap}): buffer sizes pyggml {got[0]} ggml {want[0]}")
                print(f"  pyggml {got[1]}\n  ggml   {want[1]}\n  recipe {recipe}")
    print(f"{n} graphs, {total_nodes} nodes: {bad} differ from ggml ({LIB})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
