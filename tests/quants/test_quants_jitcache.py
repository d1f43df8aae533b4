"""quants.jitcache: numba caches dropped when any numba source file changes, kept otherwise."""

from __future__ import annotations

from pathlib import Path

from pyggml.quants.jitcache import drop_stale_caches


def _tree(root: Path) -> tuple[Path, Path, Path]:
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    kernel = root / "pkg" / "kernel.py"
    helper = root / "pkg" / "helper.py"
    kernel.write_text("import numba\n@numba.njit(cache=True)\ndef f(x):\n    return g(x)\n")
    helper.write_text("import numba\n@numba.njit(inline='always')\ndef g(x):\n    return x + 1\n")
    (root / "pkg" / "cli.py").write_text("print('no kernels here')\n")
    return kernel, helper, root / "pkg" / "__pycache__" / "kernel.f-2.py311.nbi"


def test_a_changed_helper_drops_the_caches_of_other_files(tmp_path: Path) -> None:
    _, helper, index = _tree(tmp_path)
    stamp = tmp_path / "stamp"
    assert drop_stale_caches(tmp_path, stamp)  # no stamp yet: whatever is cached cannot be trusted
    index.write_bytes(b"cached")
    assert not drop_stale_caches(tmp_path, stamp) and index.exists()  # nothing changed
    (tmp_path / "pkg" / "cli.py").write_text("print('still no kernels')\n")
    assert not drop_stale_caches(tmp_path, stamp) and index.exists()  # a file without numba changed
    helper.write_text(helper.read_text().replace("x + 1", "x + 2"))  # the inlined helper, not kernel.py
    assert drop_stale_caches(tmp_path, stamp) and not index.exists()
    assert not drop_stale_caches(tmp_path, stamp)


def test_a_read_only_install_is_left_alone(tmp_path: Path) -> None:
    _, _, index = _tree(tmp_path)
    index.write_bytes(b"cached")
    blocked = tmp_path / "pkg" / "kernel.py" / "stamp"  # a path that cannot be created
    assert not drop_stale_caches(tmp_path, blocked)
    assert index.exists()  # no stamp could be written, so nothing was deleted (or it would be on every run)


def test_every_compiled_function_has_its_own_qualname() -> None:
    """Variants of one closure must not share a qualname (jitcache.variant): numba names symbols after it and a
    per-process counter, so two variants compiled by different processes could share a symbol and one kernel
    would call the other's code once both load from the disk cache (Gemma's logits were garbage that way)."""
    import importlib
    import pkgutil

    from numba.core.registry import CPUDispatcher

    import pyggml

    seen: dict[tuple[str, str], object] = {}
    for info in pkgutil.walk_packages(pyggml.__path__, "pyggml."):
        if ".torch" in info.name or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, CPUDispatcher):
                key = (value.py_func.__module__, value.py_func.__qualname__)
                assert seen.setdefault(key, value.py_func) is value.py_func, f"two compiled functions named {key}"
    assert len(seen) > 100
