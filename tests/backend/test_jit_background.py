"""Kernels that only make a plan faster compile in a background process (jit.lean_unless_ready's ``later``):
the plan takes the lean kernel now and a later lookup finds the other one in numba's disk cache; with background
compiles off, the faster kernel is compiled before the plan runs.

The kernels live in a module written to a fresh folder per test, so their disk cache starts empty every run."""

from __future__ import annotations

import importlib
import textwrap
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from helpers.opcheck import OpCase, values
from pyggml.backend.cpu import jit
from pyggml.backend.cpu.compute import _resolve, compute_forward, graph_compute
from pyggml.backend.cpu.ops import mat
from pyggml.backend.cpu.plan import plan_for
from pyggml.backend.cpu.quants import repacked
from pyggml.backend.cpu.quants.quantize import _quantize_q8_k
from pyggml.backend.cpu.repack_buffer import repackable
from pyggml.backend.cpu.traits import traits
from pyggml.cli.common import answer_while_compiling
from pyggml.graph import Graph
from pyggml.ops import builders as B
from pyggml.types import GGMLType

F32 = GGMLType.F32

_SOURCE = textwrap.dedent('''
    from pyggml.backend.cpu.jit import jit_kernel


    @jit_kernel
    def k_lean(node, ith, nth, ctrl):
        pass


    @jit_kernel
    def k_full(node, ith, nth, ctrl):
        pass
''')


def _kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> ModuleType:
    (tmp_path / f"{name}.py").write_text(_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module(name)


def test_the_faster_kernel_compiles_aside_and_a_later_plan_takes_it(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _kernels(tmp_path, monkeypatch, "bg_probe_kernels_on")
    monkeypatch.setenv("PYGGML_JIT_BACKGROUND", "1")
    assert jit.lean_unless_ready(mod.k_lean, mod.k_full, later=True) is mod.k_lean
    assert mod.k_full.key not in jit._background  # queued until the plan has its own kernels
    jit.prepare([])
    proc = jit._background[mod.k_full.key]
    assert jit.lean_unless_ready(mod.k_lean, mod.k_full, later=True) is mod.k_lean
    jit.prepare([])
    assert jit._background[mod.k_full.key] is proc  # started once
    assert proc.wait(timeout=120) == 0
    assert not mod.k_full._ready  # nothing compiled it here
    assert jit.lean_unless_ready(mod.k_lean, mod.k_full, later=True) is mod.k_full
    assert mod.k_full._ready and mod.k_full.key not in jit._background
    assert not mod.k_lean.load_cached()  # the lean kernel itself was never compiled


def test_without_background_compiles_the_faster_kernel_now(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _kernels(tmp_path, monkeypatch, "bg_probe_kernels_off")
    monkeypatch.setenv("PYGGML_JIT_BACKGROUND", "0")
    assert jit.lean_unless_ready(mod.k_lean, mod.k_full, later=True) is mod.k_full
    jit.prepare([])
    assert mod.k_full.key not in jit._background
    # a decode's choice (later=False) never starts a background compile either way
    monkeypatch.setenv("PYGGML_JIT_BACKGROUND", "1")
    assert jit.lean_unless_ready(mod.k_full, mod.k_lean) is mod.k_full
    jit.prepare([])
    assert mod.k_lean.key not in jit._background


# ------------------------------------------------------------------------------ deferring every missing kernel
def test_a_deferring_plan_runs_the_python_kernel_until_the_background_compile_ends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """PYGGML_JIT_BACKGROUND=all (generate, chat and serve's default): a node whose kernel is not compiled runs its
    Python kernel and the kernel is queued for the background; the graph's plan is kept while that runs and built
    again, with the compiled kernel, once it has ended."""
    monkeypatch.setenv("PYGGML_JIT_BACKGROUND", "all")
    c = OpCase()
    out = B.add(c.ctx, c.tensor(F32, 64, 6), c.tensor(F32, 64, 6))
    kern = jit.select(out).kernel
    for k in (kern, *jit.POOL_FUNCTIONS):
        k.compile()
    queued: list[str] = []
    running = [True]
    monkeypatch.setattr(kern, "load_cached", lambda: False)  # as on a first run
    monkeypatch.setattr(jit, "compile_in_background", lambda k: queued.append(k.key))
    monkeypatch.setattr(jit, "compiling", lambda keys: running[0])
    g = Graph()
    g.build_forward_expand(out)
    plan = plan_for(g, _resolve)
    assert plan.nodes == [] and plan.waiting_for == {kern.key} and queued == [kern.key]
    assert graph_compute(g, 2) == 0
    first = values(out).copy()
    assert plan_for(g, _resolve) is plan  # still compiling: the plan stays
    running[0] = False
    monkeypatch.delattr(kern, "load_cached")  # the background process has put it in the disk cache
    again = plan_for(g, _resolve)
    assert again is not plan and again.nodes == [out] and not again.waiting_for
    assert graph_compute(g, 2) == 0
    np.testing.assert_array_equal(values(out), first)


def test_a_kernel_whose_background_compile_failed_compiles_in_the_foreground(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A background process that ended without leaving the kernel in the cache does not start another one on the
    next plan: the kernel compiles here (and a real compile error would show here)."""
    mod = _kernels(tmp_path, monkeypatch, "bg_probe_kernels_failed")
    started: list[str] = []
    monkeypatch.setattr(jit, "compile_in_background", lambda k: started.append(k.key))
    assert jit.missing([mod.k_lean]) == [mod.k_lean.key] and started == [mod.k_lean.key]
    monkeypatch.setattr(jit, "_started", {mod.k_lean.key})  # it was started, and is no longer running
    assert jit.missing([mod.k_lean]) == [] and mod.k_lean._ready
    assert started == [mod.k_lean.key]


def test_a_deferring_run_repacks_only_where_the_repacked_kernel_is_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Python kernels read the plain layout only, so a weight is repacked on a deferring run once its type's
    repacked kernel is compiled; until then that kernel compiles in the background for the next run."""
    if GGMLType.Q4_K not in repacked.TYPES:
        pytest.skip("this CPU has no repacked Q4_K kernel (AVX2 and F16C)")
    w = OpCase().tensor(GGMLType.Q4_K, 256, 16)
    kern = traits(GGMLType.Q4_K).repacked
    queued: list[str] = []
    monkeypatch.setattr(jit, "compile_in_background", lambda k: queued.append(k.key))
    monkeypatch.setattr(kern, "load_cached", lambda: False)
    monkeypatch.setenv("PYGGML_JIT_BACKGROUND", "1")
    assert repackable(w) and queued == []
    monkeypatch.setenv("PYGGML_JIT_BACKGROUND", "all")
    assert not repackable(w) and queued == [kern.key]
    monkeypatch.setattr(kern, "load_cached", lambda: True)  # compiled by then
    assert repackable(w) and queued == [kern.key]


def test_the_background_mode_takes_the_environment_over_the_commands_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jit, "_background_default", "1")
    monkeypatch.delenv("PYGGML_JIT_BACKGROUND")
    assert jit.background_mode() == "1" and not jit.deferring()
    answer_while_compiling()  # what generate, chat and serve do first
    assert jit.background_mode() == "all" and jit.deferring() and jit.background()
    monkeypatch.setenv("PYGGML_JIT_BACKGROUND", "0")
    assert jit.background_mode() == "0" and not jit.background()
    with pytest.raises(ValueError, match="must be '0', '1' or 'all'"):
        jit.set_background_default("yes")


def test_warm_compiles_what_the_python_products_then_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """mat.warm (a first run's helper process) compiles each numba function of the Python products at the
    signature the products then call it with: a decode's row dot and quantizer, a prompt's dequantizer."""
    ty = GGMLType.Q6_K
    tr = traits(ty)
    mat.warm([(ty.name, False), (ty.name, True)])
    funcs = (tr.row_dot, tr.to_float, _quantize_q8_k)
    before = [set(f.overloads) for f in funcs]
    assert all(before)
    c = OpCase()
    w = c.tensor(ty, 512, 8)
    for n in (1, tr.matvec_max_cols + 3):
        compute_forward(B.mul_mat(c.ctx, w, c.tensor(F32, 512, n)), 2)
    assert [set(f.overloads) for f in funcs] == before


class _Proc:
    """A stand-in for the helper process: records waits."""

    def __init__(self) -> None:
        self.waits = 0

    def wait(self) -> int:
        self.waits += 1
        return 0


def test_warm_aside_shares_the_paths_out_and_a_product_waits_for_the_helpers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The paths a plan's products take are shared between this process (compiling its share at once) and one
    helper, longest compile first, each to the side free sooner (the helper starts later), the paths sharing an
    activation quantizer on one side (Q4_K and Q6_K: Q8_K; Q5_0 and Q8_0: Q8_0); a later plan warms only paths
    not seen yet, and a product on a path the helper holds waits for it rather than compile it too. The helper
    defers as this process does, so it compiles the row dots this process calls."""
    helper = _Proc()
    started: list[str] = []
    here: list[list[tuple[str, bool]]] = []
    monkeypatch.setattr(jit, "run_aside", lambda code: started.append(code) or helper)
    monkeypatch.setattr(mat, "warm", here.append)
    monkeypatch.setattr(mat, "_warming", {})
    c = OpCase()
    x = c.tensor(F32, 256, 1)
    nodes = [B.mul_mat(c.ctx, c.tensor(ty, 256, 4), x)
             for ty in (GGMLType.Q5_0, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q8_0, F32)]
    mat.warm_aside(nodes)
    mat.warm_aside(nodes[:2])
    assert len(started) == 1 and "set_background_default('all')" in started[0]
    assert started[0].endswith(f"from {mat.__name__} import warm; warm([('Q5_0', False), ('Q8_0', False)])")
    assert here == [[("Q4_K", False), ("Q6_K", False)]]
    mat._wait_for_warm_up(GGMLType.Q4_K, 1)
    assert helper.waits == 0
    mat._wait_for_warm_up(GGMLType.Q8_0, 1)
    assert helper.waits == 1
    # one quantizer group only: its paths are shared out one by one
    monkeypatch.setattr(mat, "_warming", {})
    started.clear()
    here.clear()
    mat.warm_aside(nodes[2:4])
    assert here == [[("Q4_K", False)]] and started[0].endswith("warm([('Q6_K', False)])")


def test_a_first_run_takes_the_row_dots_that_compile_sooner(monkeypatch: pytest.MonkeyPatch) -> None:
    """While the compiled kernels are deferred, the Python products take the one-row-at-a-time dots (compiled in
    about half the time) where the type has them; otherwise the batched ones. Both give the same bits."""
    from pyggml.backend.cpu.ops import mat_q
    from pyggml.backend.cpu.quants import dots

    monkeypatch.setenv("PYGGML_JIT_BACKGROUND", "all")
    assert mat_q.row_dot(GGMLType.Q4_K) is dots._mv1_q4_k and mat_q.row_dot(GGMLType.Q8_0) is dots._mv1_q8_0
    assert mat_q.row_dot(GGMLType.Q4_1) is dots._mv_q4_1  # no one-row variant
    monkeypatch.setenv("PYGGML_JIT_BACKGROUND", "1")
    assert mat_q.row_dot(GGMLType.Q4_K) is dots._mv_q4_k
