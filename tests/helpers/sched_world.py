"""A small world for scheduler tests: weights placed on chosen backends, graphs run through a
scheduler the way llama.cpp drives one (reset, build, alloc_graph, set inputs, compute)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from helpers.backend_run import Inputs, read, to_bytes, upload_inputs
from pyggml.backend import api
from pyggml.backend.base import Backend
from pyggml.context import Context
from pyggml.graph import Graph, new_graph
from pyggml.sched import BackendSched, backend_sched_new
from pyggml.tensor import Tensor

PLUGIN_DIR = Path(__file__).parent / "plugin_pkg"


def plugin_module():  # type: ignore[no-untyped-def]
    """The test plugin package (tests/helpers/plugin_pkg), importable without installing it."""
    if str(PLUGIN_DIR) not in sys.path:
        sys.path.insert(0, str(PLUGIN_DIR))
    import pyggml_testplugin

    return pyggml_testplugin

Build = Callable[[Context, dict[str, Tensor]], Tensor]


class World:
    """Weights uploaded once to the backends named in ``placement`` (name -> backend)."""

    def __init__(self, weights: Inputs, placement: dict[str, Backend]) -> None:
        self.tensors: dict[str, Tensor] = {}
        self._ctxs: list[Context] = []
        by_backend: dict[int, tuple[Backend, Inputs]] = {}
        for name, spec in weights.items():
            backend = placement[name]
            by_backend.setdefault(id(backend), (backend, {}))[1][name] = spec
        for backend, group in by_backend.values():
            ctx, ts = upload_inputs(backend, group)
            self._ctxs.append(ctx)
            self.tensors.update(ts)

    def build(self, sched: BackendSched, build: Build, inputs: Inputs,
              before_alloc: Callable[[BackendSched, dict[str, Tensor]], None] | None = None
              ) -> tuple[Graph, dict[str, Tensor], Tensor]:
        """Reset, build the graph with fresh input tensors and allocate it (inputs not yet set)."""
        sched.reset()
        ctx = Context(1 << 20, no_alloc=True)
        self._ctxs.append(ctx)
        ts = dict(self.tensors)
        for name, (ty, ne, _) in inputs.items():
            t = ctx.new_tensor(ty, *ne).set_name(name)
            t.set_input()
            ts[name] = t
        out = build(ctx, ts)
        out.set_output()
        gf = new_graph(ctx)
        gf.build_forward_expand(out)
        if before_alloc is not None:
            before_alloc(sched, ts)
        assert sched.alloc_graph(gf)
        for name, (ty, ne, values) in inputs.items():
            api.backend_tensor_set(ts[name], to_bytes(ty, values, ne[0]))
        return gf, ts, out

    def run(self, sched: BackendSched, build: Build, inputs: Inputs) -> np.ndarray:
        gf, _, out = self.build(sched, build, inputs)
        assert sched.graph_compute(gf) == 0
        return read(out)


def reference(weights: Inputs, build: Build, inputs: Inputs) -> np.ndarray:
    """The same graph with every weight on the CPU and a CPU-only scheduler."""
    from pyggml.backend.cpu.backend import backend_cpu_init

    cpu = backend_cpu_init()
    world = World(weights, dict.fromkeys(weights, cpu))
    return world.run(backend_sched_new([cpu], None, 256, False, True), build, inputs)
