"""The layer contract of docs/architecture.md, checked on the source with ``ast`` (no import runs).

Every module under src/pyggml maps to one layer; a module may import (at module level, inside a
function, or under TYPE_CHECKING alike) only from its own layer or the layers below it, and no module
imports itself through others (a loop), at module level or inside a function: a loop means two
modules that cannot be understood, tested or moved one without the other. Imports under
``if TYPE_CHECKING:`` do not count for loops (they are type names only, ggml's forward declarations). Private
names (``_x``) and private modules (``_x.py``) are not imported across packages: a package's
private parts serve that package and its subpackages only (backend/cpu/ and backend/torch/ count
as separate packages, as two backends that share only backend/'s public interfaces).
"""

from __future__ import annotations

import ast
import functools
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.data import SRC

PKG = SRC / "pyggml"

#: lowest first; a module belongs to the longest prefix that names it
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("pyggml.errors", "pyggml.notice")),
    ("types", ("pyggml.types",)),
    ("quants", ("pyggml.quants",)),
    ("gguf", ("pyggml.gguf",)),
    # ggml.h's struct ggml_tensor and enum ggml_op go together: a tensor's op field is an Op
    ("tensor", ("pyggml.memory", "pyggml.tensor", "pyggml.context", "pyggml.tensor_data", "pyggml.gguf_loader",
                "pyggml.ops.enums")),
    ("ops", ("pyggml.ops",)),
    ("graph", ("pyggml.graph",)),
    ("backend", ("pyggml.backend",)),
    ("alloc", ("pyggml.alloc",)),
    ("rpc", ("pyggml.rpc",)),
    ("sched", ("pyggml.sched",)),
    ("llm", ("pyggml.llm", "pyggml.quantize")),  # quantize: llama.cpp's llama_model_quantize and imatrix
    ("serve", ("pyggml.serve",)),
    ("llama", ("pyggml.llama",)),  # llama-cpp-python's Llama API over llm/
    ("cli", ("pyggml.cli",)),
    ("api", ("pyggml",)),  # pyggml/__init__.py: the flat ggml API re-exports every layer; nothing imports it
]
RANK = {name: i for i, (name, _) in enumerate(LAYERS)}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_package(mod: str) -> bool:
    return (SRC.joinpath(*mod.split(".")) / "__init__.py").exists()


def is_module(mod: str) -> bool:
    p = SRC.joinpath(*mod.split("."))
    return p.with_suffix(".py").exists() or (p / "__init__.py").exists()


def layer_of(mod: str) -> str:
    best, best_len = None, -1
    for name, prefixes in LAYERS:
        for p in prefixes:
            if (mod == p or mod.startswith(p + ".")) and len(p) > best_len:
                best, best_len = name, len(p)
    assert best is not None, mod
    return best


def room_of(mod: str) -> str:
    """The package whose private parts ``mod`` may use: its top-level package (backend/<impl>/ for a backend)."""
    parts = mod.split(".")
    if len(parts) >= 3 and parts[1] == "backend" and is_package(".".join(parts[:3])):
        return ".".join(parts[:3])
    return ".".join(parts[:2])


def _statements(body: list[ast.stmt], type_checking: bool = False) -> Iterator[tuple[ast.stmt, bool]]:
    """Every statement in ``body`` and the statement lists inside it (functions, classes, branches, loops,
    ``with``, ``try``, ``match``), with whether it sits under ``if TYPE_CHECKING:``. Imports are statements,
    so expressions need no visit (a tenth of the nodes of ast.walk)."""
    for stmt in body:
        yield stmt, type_checking
        under = type_checking or (isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test))
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, field, None)
            if isinstance(inner, list):
                yield from _statements(inner, under if field == "body" else type_checking)
        for part in (*getattr(stmt, "handlers", ()), *getattr(stmt, "cases", ())):
            yield from _statements(part.body, type_checking)


@functools.cache
def _parse(text: str) -> ast.Module:
    """A file's tree, parsed once per test process: the checker's own tests run it on copies of the package
    that differ from it in one file."""
    return ast.parse(text)


def imports_of(path: Path, runtime_only: bool = False) -> list[tuple[int, str, str | None]]:
    """(line, imported module, imported name or None) for every pyggml import in the file (``runtime_only``:
    leaving out those under TYPE_CHECKING)."""
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out: list[tuple[int, str, str | None]] = []
    for node, type_checking in _statements(_parse(path.read_text(encoding="utf-8")).body):
        if runtime_only and type_checking:
            continue
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, None) for a in node.names if a.name.split(".")[0] == "pyggml"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "pyggml":
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                # "from pkg import submodule" imports the submodule
                out.append((node.lineno, sub, None) if is_module(sub) else (node.lineno, target, a.name))
    return out


def violations(root: Path = PKG) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        src = module_name(path)
        for line, target, name in imports_of(path):
            where = f"{path.relative_to(SRC)}:{line}"
            low, high = layer_of(src), layer_of(target)
            if RANK[high] > RANK[low]:
                found.append(f"{where}: {src} ({low}) imports {target} from the higher layer {high}")
            private_mod = any(p.startswith("_") and not p.startswith("__") for p in target.split("."))
            private_name = name is not None and name.startswith("_") and not name.startswith("__")
            if (private_mod or private_name) and room_of(target) != room_of(src):
                what = f"{target}.{name}" if name else target
                found.append(f"{where}: {src} imports the private {what} of another package")
    return found


def import_graph(root: Path = PKG) -> dict[str, set[str]]:
    """module -> the pyggml modules it imports at run time (a name imported from a package counts as the
    package, a submodule as the submodule)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        src = module_name(path)
        graph.setdefault(src, set()).update(t for _, t, _ in imports_of(path, runtime_only=True) if t != src)
    return graph


def loops(root: Path = PKG) -> list[list[str]]:
    """The import loops between modules: each strongly connected set of two or more modules, sorted
    (Tarjan's algorithm, iteratively)."""
    graph = import_graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                scc = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    scc.append(w)
                    if w == v:
                        break
                if len(scc) > 1:
                    found.append(sorted(scc))
    return sorted(found)


def test_every_module_has_a_layer() -> None:
    for path in PKG.rglob("*.py"):
        assert layer_of(module_name(path)) in RANK


def test_imports_go_down_the_layers() -> None:
    found = violations()
    assert not found, "imports against docs/architecture.md's layers:\n" + "\n".join(found)


def test_no_import_loops() -> None:
    found = loops()
    assert not found, "modules that import each other (at run time):\n" + "\n".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize(("line", "expect"), [
    ("from ..llm.model import Model", "from the higher layer llm"),
    ("def f():\n    from ..sched import BackendSched\n", "from the higher layer sched"),
    ("import pyggml.alloc.gallocr", "from the higher layer alloc"),
    ("from ..backend.cpu.backend import _cpu_buft", "private"),
])
def test_the_checker_catches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str, expect: str) -> None:
    """A copy of the tree with one bad import added to gguf/reader.py (or rpc/client.py, for a private one) fails."""
    src = tmp_path / "src"
    shutil.copytree(PKG, src / "pyggml", ignore=shutil.ignore_patterns("__pycache__", "*.nb*"))
    victim = src / "pyggml" / ("rpc/client.py" if expect == "private" else "gguf/reader.py")
    victim.write_text(victim.read_text(encoding="utf-8") + "\n" + line + "\n", encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "SRC", src)
    found = violations(src / "pyggml")
    assert len(found) == 1 and expect in found[0], found


@pytest.mark.parametrize("line", ["from .writer import GGUFWriter", "def f():\n    from . import writer\n"])
def test_the_checker_catches_a_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str) -> None:
    """A copy of the tree where gguf/constants.py imports gguf/writer.py (which imports constants) has one loop,
    through those two modules; the same import under TYPE_CHECKING makes none."""
    src = tmp_path / "src"
    shutil.copytree(PKG, src / "pyggml", ignore=shutil.ignore_patterns("__pycache__", "*.nb*"))
    victim = src / "pyggml" / "gguf" / "constants.py"
    original = victim.read_text(encoding="utf-8")
    victim.write_text(original + "\n" + line + "\n", encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "SRC", src)
    found = loops(src / "pyggml")
    assert len(found) == 1 and {"pyggml.gguf.constants", "pyggml.gguf.writer"} <= set(found[0]), found
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .writer import GGUFWriter\n"
    victim.write_text(original + "\n" + typed, encoding="utf-8")
    assert loops(src / "pyggml") == []
