"""Small conversions for the quantize options."""

from __future__ import annotations

from ..types import GGMLType
from .ftypes import parse_ggml_type


def as_type_opt(t: GGMLType | str | int | None) -> GGMLType | None:
    """``None`` stays ``None`` (``GGML_TYPE_COUNT`` in llama.cpp); names parse as ``parse_ggml_type``."""
    if t is None or isinstance(t, GGMLType):
        return t
    if isinstance(t, int):
        return GGMLType(t)
    return parse_ggml_type(t)
