"""Backend registration and discovery (ggml-backend-reg.cpp).

Built-in backends register on first use, as ggml's static registry does: the CPU always, torch
when it can be imported. Third-party backends are Python packages that declare an entry point in
the group ``pyggml.backends``; ``backend_load_all()`` loads them, as ggml's loads the
``libggml-*.so`` it finds. An entry point names a Registry instance, a Registry class, or a
function returning a Registry (or None: "not supported on this system"); an optional
``backend_score()`` beside it returning 0 skips it, like ggml_backend_score.

Devices are kept GPU-type first, then integrated GPUs, accelerators, and the CPU last (a stable
order otherwise), so "the first device" is the best one. ``PYGGML_BACKEND_DEBUG=1`` prints to
stderr what was registered and why anything was skipped.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from .base import Backend, Device, DeviceType, Registry, nth
from .cpu.backend import backend_cpu_reg
from .errors import BackendError

ENTRY_POINT_GROUP = "pyggml.backends"

_TYPE_RANK = {DeviceType.GPU: 0, DeviceType.IGPU: 1, DeviceType.ACCEL: 2, DeviceType.META: 2, DeviceType.CPU: 3}


class BackendLoadError(BackendError):
    """A backend entry point could not be loaded or did not give a registry."""


def _debug(msg: str) -> None:
    if os.environ.get("PYGGML_BACKEND_DEBUG", "") not in ("", "0"):
        print(f"pyggml-backend: {msg}", file=sys.stderr)


class _BackendRegistry:
    """The process-wide list of registries and their devices (ggml_backend_registry)."""

    def __init__(self) -> None:
        self.regs: list[Registry] = []
        self.sources: dict[int, str] = {}
        self.devices: list[Device] = []
        self.loaded_entry_points: set[str] = set()
        #: id(registry) -> the entry point it came from, so unloading allows loading it again
        self.entry_point_of: dict[int, str] = {}
        self.builtins_done = False
        self.cpu_done = False

    def ensure_cpu(self) -> None:
        """Register the CPU backend once (cheap: its module is loaded with pyggml)."""
        if not self.cpu_done:
            self.cpu_done = True
            self.register(backend_cpu_reg(), "built-in")

    def ensure_builtins(self) -> None:
        if self.builtins_done:
            return
        self.builtins_done = True
        self.ensure_cpu()
        if importlib.util.find_spec("torch") is None:
            _debug("skipped backend Torch: torch is not installed (pip install pyggml[torch])")
            return
        try:
            from .torch import backend_torch_reg  # deferred: torch is optional and slow to import
        except Exception as e:  # a broken torch install must not take the CPU backend down
            _debug(f"skipped backend Torch: importing torch failed: {e}")
            return
        self.register(backend_torch_reg(), "built-in")

    def registries(self) -> list[Registry]:
        """Every registry, the built-in ones registered first."""
        self.ensure_builtins()
        return self.regs

    def all_devices(self) -> list[Device]:
        """Every device, the built-in backends' registered first."""
        self.ensure_builtins()
        return self.devices

    def register(self, reg: Registry, source: str = "user") -> None:
        if any(r is reg for r in self.regs):
            return
        devs = list(reg.devices())
        self.regs.append(reg)
        self.sources[id(reg)] = source
        _debug(f"registered backend {reg.name()} ({len(devs)} devices, {source})")
        for dev in devs:
            self.register_device(dev)

    def register_device(self, dev: Device) -> None:
        if any(d is dev for d in self.devices):
            return
        self.devices.append(dev)
        self.devices.sort(key=lambda d: _TYPE_RANK.get(d.type(), 2))  # stable: registration order within a rank
        _debug(f"registered device {dev.name()} ({dev.type().name}: {dev.description()})")

    def unregister(self, reg: Registry) -> None:
        self.loaded_entry_points.discard(self.entry_point_of.pop(id(reg), ""))
        self.regs = [r for r in self.regs if r is not reg]
        self.devices = [d for d in self.devices if d.reg is not reg]
        self.sources.pop(id(reg), None)


_state = _BackendRegistry()


# ---------------------------------------------------------------------- entry points
def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def _registry_from(obj: Any, name: str) -> Registry | None:
    """Turn what an entry point names into a registry (None when the backend declines)."""
    if isinstance(obj, Registry):
        return obj
    if isinstance(obj, type) and issubclass(obj, Registry):
        return obj()
    if callable(obj):
        result = obj()
        if result is None or isinstance(result, Registry):
            return result
        raise BackendLoadError(f"backend entry point {name!r} returned {type(result).__name__}, not a Registry")
    raise BackendLoadError(f"backend entry point {name!r} names a {type(obj).__name__}, not a Registry "
                           "or a function returning one")


def _load_entry_point(ep: importlib.metadata.EntryPoint, silent: bool) -> Registry | None:
    try:
        obj = ep.load()
        score_fn: Callable[[], int] | None = None
        module = sys.modules.get(ep.module)
        if module is not None:
            score_fn = getattr(module, "backend_score", None)
        if score_fn is not None and score_fn() == 0:
            _debug(f"skipped backend {ep.name}: backend_score() is 0 (not supported on this system)")
            return None
        reg = _registry_from(obj, ep.name)
    except Exception as e:
        _debug(f"skipped backend {ep.name} ({ep.value}): {type(e).__name__}: {e}")
        if silent:
            return None
        if isinstance(e, BackendLoadError):
            raise
        raise BackendLoadError(f"failed to load backend entry point {ep.name!r} ({ep.value}): {e}") from e
    if reg is None:
        _debug(f"skipped backend {ep.name}: its init returned no registry")
        return None
    if getattr(reg, "api_version", None) != Registry.api_version:
        version = getattr(reg, "api_version", None)
        msg = f"backend {ep.name!r} has API version {version}, expected {Registry.api_version}"
        _debug(f"skipped backend {ep.name}: {msg}")
        if silent:
            return None
        raise BackendLoadError(msg)
    _state.register(reg, f"entry point {ep.value}")
    _state.entry_point_of[id(reg)] = ep.name
    return reg


def backend_load(name: str) -> Registry | None:
    """ggml_backend_load: load the backend whose entry point is called ``name``."""
    _state.ensure_builtins()
    for ep in _entry_points():
        if ep.name == name:
            _state.loaded_entry_points.add(ep.name)
            return _load_entry_point(ep, silent=False)
    raise BackendLoadError(f"no backend entry point named {name!r} in group {ENTRY_POINT_GROUP!r}")


def backend_load_all() -> None:
    """ggml_backend_load_all: the built-ins plus every installed ``pyggml.backends`` entry point.

    A backend that fails to load is skipped (with the reason under PYGGML_BACKEND_DEBUG=1), as
    ggml skips a library that does not load; loading twice registers nothing twice.
    """
    _state.ensure_builtins()
    for ep in _entry_points():
        if ep.name in _state.loaded_entry_points:
            continue
        _state.loaded_entry_points.add(ep.name)
        _load_entry_point(ep, silent=True)


def backend_unload(reg: Registry) -> None:
    """ggml_backend_unload: forget a registry and its devices."""
    _state.unregister(reg)


# ---------------------------------------------------------------------- registries and devices
_Entry = TypeVar("_Entry", Registry, Device)


class _Roster(Generic[_Entry]):
    """ggml's ``*_count`` / ``*_get`` / ``*_by_name`` over the registries or over the devices, written once
    for both: each call reads the current list (``entries()`` registers the built-in backends first)."""

    def __init__(self, entries: Callable[[], list[_Entry]], many: str, one: str) -> None:
        self._entries, self._many, self._one = entries, many, one

    def count(self) -> int:
        return len(self._entries())

    def get(self, index: int) -> _Entry:
        return nth(self._entries(), index, "there are", self._many, self._one)

    def by_name(self, name: str) -> _Entry | None:
        """The first whose name matches, case-insensitively (ggml's striequals)."""
        return next((e for e in self._entries() if e.name().lower() == name.lower()), None)


_registries = _Roster(_state.registries, "backend registries", "registry")
_devices = _Roster(_state.all_devices, "backend devices", "device")
backend_reg_count = _registries.count
backend_reg_get = _registries.get
backend_reg_by_name = _registries.by_name
backend_dev_count = _devices.count
backend_dev_get = _devices.get
backend_dev_by_name = _devices.by_name


def backend_register(reg: Registry) -> None:
    _state.ensure_builtins()
    _state.register(reg)


def backend_device_register(device: Device) -> None:
    _state.ensure_builtins()
    _state.register_device(device)


def backend_dev_by_type(type: DeviceType | int) -> Device | None:
    if type == DeviceType.CPU:
        # the other built-in backend (torch) has no CPU-type device (its CPU one is ACCEL), so
        # finding the CPU device, as llama.cpp does for its weights and its CPU backend, need not import torch
        _state.ensure_cpu()
    else:
        _state.ensure_builtins()
    return next((d for d in _state.devices if d.type() == type), None)


def backend_devices() -> list[Device]:
    """All devices in priority order (GPU-type first, CPU last)."""
    return list(_state.all_devices())


# ---------------------------------------------------------------------- backends
def backend_init_by_name(name: str, params: str | None = None) -> Backend | None:
    dev = backend_dev_by_name(name)
    return None if dev is None else dev.init_backend(params)


def backend_init_by_type(type: DeviceType | int, params: str | None = None) -> Backend | None:
    dev = backend_dev_by_type(type)
    return None if dev is None else dev.init_backend(params)


def backend_init_best() -> Backend:
    """ggml_backend_init_best: a GPU, else an integrated GPU, else the CPU."""
    for kind in (DeviceType.GPU, DeviceType.IGPU, DeviceType.CPU):
        dev = backend_dev_by_type(kind)
        if dev is not None:
            return dev.init_backend(None)
    raise BackendError("no backend device is registered")
