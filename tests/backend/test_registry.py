"""Backend registration and discovery: built-ins, device order, init_* helpers, and third-party
backends found through the ``pyggml.backends`` entry-point group (a dist-info directory on
sys.path, read by importlib.metadata exactly as for an installed package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import pyggml as g
from helpers.backend_run import read
from helpers.opcheck import NMSE_MATMUL, assert_close
from helpers.sched_world import PLUGIN_DIR, World, plugin_module, reference
from pyggml import sched as S
from pyggml.backend import registry as R
from pyggml.backend.base import DeviceType
from pyggml.backend.cpu.backend import CPUBackend
from pyggml.types import GGMLType as T


def _dist_info(root: Path, name: str, entry_points: dict[str, str]) -> None:
    d = root / f"{name}-0.1.0.dist-info"
    d.mkdir()
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    lines = "\n".join(f"{k} = {v}" for k, v in entry_points.items())
    (d / "entry_points.txt").write_text(f"[{R.ENTRY_POINT_GROUP}]\n{lines}\n")


def test_builtins_and_lookups() -> None:
    cpu_reg = R.backend_reg_by_name("cpu")  # case-insensitive, as ggml
    assert cpu_reg is not None and cpu_reg is R.backend_reg_by_name("CPU")
    names = [R.backend_reg_get(i).name() for i in range(R.backend_reg_count())]
    assert "CPU" in names
    assert ("Torch" in names) == (importlib.util.find_spec("torch") is not None)
    devs = [R.backend_dev_get(i) for i in range(R.backend_dev_count())]
    assert devs[-1].type() == DeviceType.CPU  # the CPU comes last
    assert R.backend_dev_by_type(DeviceType.CPU) is R.backend_dev_by_name("cpu")
    assert isinstance(R.backend_init_by_name("CPU"), CPUBackend)
    assert isinstance(R.backend_init_by_type(DeviceType.CPU), CPUBackend)
    assert R.backend_init_by_name("no-such-device") is None
    with pytest.raises(IndexError, match="no device"):
        R.backend_dev_get(R.backend_dev_count())


def test_init_best_is_the_first_gpu_else_the_cpu() -> None:
    # torch's cpu device is an ACCEL device: never "best" over the real CPU backend
    gpu = R.backend_dev_by_type(DeviceType.GPU)
    best = R.backend_init_best()
    if gpu is None:
        assert isinstance(best, CPUBackend)
    else:
        assert best.get_device() is gpu


def test_gpu_devices_come_first_and_are_best() -> None:
    mod = plugin_module()

    class GpuDevice(mod.SubsetDevice):
        def type(self) -> DeviceType:
            return DeviceType.GPU

    class GpuRegistry(mod.SubsetRegistry):
        def __init__(self) -> None:
            self._devices = [GpuDevice(self, "FAKEGPU")]

        def name(self) -> str:
            return "FakeGpu"

    reg = GpuRegistry()
    R.backend_register(reg)
    try:
        assert R.backend_dev_get(0).name() == "FAKEGPU"  # registered last, listed first
        assert R.backend_dev_get(R.backend_dev_count() - 1).type() == DeviceType.CPU
        assert R.backend_init_best().name() == "FAKEGPU"
        R.backend_register(reg)  # registering twice adds nothing
        assert [R.backend_dev_get(i).name() for i in range(R.backend_dev_count())].count("FAKEGPU") == 1
    finally:
        R.backend_unload(reg)
    assert R.backend_dev_by_name("FAKEGPU") is None


def test_entry_point_backend_is_discovered_and_scheduled(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PYGGML_BACKEND_DEBUG", "1")
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    _dist_info(tmp_path, "pyggml_testplugin", {"subset": "pyggml_testplugin:backend_reg"})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert R.backend_dev_by_name("SUBSET") is None  # nothing before load_all, as in ggml
    R.backend_load_all()
    reg = R.backend_reg_by_name("SubsetTest")
    try:
        assert reg is not None
        assert "registered backend SubsetTest (1 devices, entry point pyggml_testplugin:backend_reg)" in \
            capsys.readouterr().err
        R.backend_load_all()  # idempotent
        assert [R.backend_reg_get(i) for i in range(R.backend_reg_count())].count(reg) == 1
        sub = R.backend_init_by_name("subset")
        cpu = R.backend_init_by_type(DeviceType.CPU)
        assert sub is not None and cpu is not None

        weights = {"w": (T.F32, [32, 8], np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32))}
        inputs = {"x": (T.F32, [32, 3], np.random.default_rng(1).standard_normal((3, 32)).astype(np.float32))}

        def build(ctx, t):
            return g.scale(ctx, g.mul_mat(ctx, t["w"], t["x"]).set_name("mm"), 2.0)

        world = World(weights, {"w": cpu})
        sched = S.backend_sched_new([sub, cpu], None, 64, False, True)
        gf, _, out = world.build(sched, build, inputs)
        assert sched.graph_compute(gf) == 0
        assert sub.computed == ["mm"]  # the plugin ran the op it supports
        assert_close(read(out), reference(weights, build, inputs), NMSE_MATMUL)
    finally:
        if reg is not None:
            R.backend_unload(reg)


def test_bad_entry_points_are_skipped_with_a_reason(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PYGGML_BACKEND_DEBUG", "1")
    (tmp_path / "pyggml_declines.py").write_text(
        "def reg():\n    return None\n\n\nnot_a_registry = 42\n")
    (tmp_path / "pyggml_unsupported.py").write_text(
        "def backend_score():\n    return 0\n\n\ndef reg():\n    raise AssertionError('must not be called')\n")
    _dist_info(tmp_path, "pyggml_badplugins", {
        "broken": "pyggml_no_such_module:reg",
        "declines": "pyggml_declines:reg",
        "notareg": "pyggml_declines:not_a_registry",
        "unsupported": "pyggml_unsupported:reg",
    })
    monkeypatch.syspath_prepend(str(tmp_path))
    n_regs = R.backend_reg_count()
    R.backend_load_all()
    assert R.backend_reg_count() == n_regs
    err = capsys.readouterr().err
    assert "skipped backend broken (pyggml_no_such_module:reg): ModuleNotFoundError" in err
    assert "skipped backend declines: its init returned no registry" in err
    assert "skipped backend notareg" in err and "not a Registry" in err
    assert "skipped backend unsupported: backend_score() is 0" in err
    with pytest.raises(R.BackendLoadError, match="broken"):
        R.backend_load("broken")
    with pytest.raises(R.BackendLoadError, match="no backend entry point named 'nothing'"):
        R.backend_load("nothing")
