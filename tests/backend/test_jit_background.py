"""Kernels that only make a plan faster compile in a background process (jit.lean_unless_ready's ``later``):
the plan takes the lean kernel now and a later lookup finds the other one in numba's disk cache; with background
compiles off, the faster kernel is compiled before the plan runs.

The kernels live in a module written to a fresh folder per test, so their disk cache starts empty every run."""

from __future__ import annotations

import importlib
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from pyggml.backend.cpu import jit

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
