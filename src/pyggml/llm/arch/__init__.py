"""The architectures pyggml runs, one module each (llama.cpp's src/models/<arch>.cpp), found by the
GGUF ``general.architecture`` name.

Adding one is adding a module: a subclass of ``Arch`` with its ``name``, ``rope_type``,
``load_hparams``, ``load_tensors`` and ``build_graph``, decorated with ``@register``, and its name
in ``_MODULES`` below.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from ...gguf.constants import Keys
from ..hparams import ModelLoadError
from .base import Arch

#: the modules that define architectures, imported on first use
_MODULES = ("llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "granite", "olmo2", "phi3", "starcoder2",
            "smollm3", "gpt2", "stablelm", "qwen3moe", "olmoe", "granitemoe",
            "openai_moe", "bert", "gemma_embedding", "mamba", "mamba2",
            "granitehybrid", "falcon_h1", "jamba", "rwkv6", "rwkv7", "rwkv6qwen2", "arwkv7",
            "lfm2")

ARCHS: dict[str, type[Arch]] = {}


def register(cls: type[Arch]) -> type[Arch]:
    """Class decorator: make ``cls`` the architecture for its ``name``."""
    if cls.name in ARCHS and ARCHS[cls.name] is not cls:
        raise ValueError(f"architecture {cls.name!r} is registered twice")
    ARCHS[cls.name] = cls
    return cls


def _load_all() -> None:
    if len(ARCHS) < len(_MODULES):
        for mod in _MODULES:
            importlib.import_module(f"{__name__}.{mod}")


def supported_archs() -> list[str]:
    """The ``general.architecture`` values pyggml runs, sorted."""
    _load_all()
    return sorted(ARCHS)


def get_arch(name: str) -> Arch:
    """The architecture for a GGUF ``general.architecture`` value; an unknown one is a ModelLoadError
    naming it and the ones pyggml runs."""
    _load_all()
    cls = ARCHS.get(name)
    if cls is None:
        raise ModelLoadError(f"unsupported architecture {name!r} (pyggml runs {', '.join(supported_archs())})")
    return cls()


def arch_of(md: Mapping[str, Any]) -> Arch:
    """The architecture a file names in ``general.architecture`` (a missing key or an unknown name is a
    ModelLoadError naming it)."""
    if Keys.GENERAL_ARCHITECTURE not in md:
        raise ModelLoadError(f"model metadata is missing the required key {Keys.GENERAL_ARCHITECTURE!r}")
    return get_arch(str(md[Keys.GENERAL_ARCHITECTURE]))


__all__ = ["ARCHS", "Arch", "arch_of", "get_arch", "register", "supported_archs"]
