"""qwen2 (src/models/qwen2.cpp): the llama block with NEOX RoPE, Q/K/V biases and an optional
output bias, and no frequency factors."""

from __future__ import annotations

from . import register
from .base import LLAMA_ROPE_TYPE_NEOX
from .llama import LlamaLike


@register
class Qwen2(LlamaLike):
    name = "qwen2"
    rope_type = LLAMA_ROPE_TYPE_NEOX
