"""Command-line value parsers shared by ``pyggml quantize`` and the API: KV overrides, tensor types, layers."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..types import GGMLType
from .errors import QuantizeError
from .ftypes import parse_ggml_type


@dataclass(frozen=True)
class KVOverride:
    """``llama_model_kv_override``: tag is ``int``, ``float``, ``bool`` or ``str``."""

    key: str
    tag: str
    value: Any


def parse_kv_override(text: str) -> KVOverride:
    """``KEY=TYPE:VALUE`` as llama.cpp's ``string_parse_kv_override`` (int, float, bool, str)."""
    key, sep, rest = text.partition("=")
    if not sep or not key or len(key) >= 128:
        raise QuantizeError(f"malformed KV override {text!r} (expected KEY=TYPE:VALUE)")
    tag, colon, val = rest.partition(":")
    if not colon or tag not in ("int", "float", "bool", "str"):
        raise QuantizeError(f"invalid type for KV override {text!r} (use int:, float:, bool: or str:)")
    if tag == "int":
        try:
            return KVOverride(key, tag, int(val.strip() or 0))
        except ValueError:
            raise QuantizeError(f"KV override {text!r}: {val!r} is not an integer") from None
    if tag == "float":
        try:
            return KVOverride(key, tag, float(val))
        except ValueError:
            raise QuantizeError(f"KV override {text!r}: {val!r} is not a number") from None
    if tag == "bool":
        if val not in ("true", "false"):
            raise QuantizeError(f"KV override {text!r}: bool values are true or false")
        return KVOverride(key, tag, val == "true")
    if len(val.encode()) > 127:
        raise QuantizeError(f"KV override {text!r}: string values are at most 127 bytes")
    return KVOverride(key, tag, val)


def parse_tensor_type(text: str) -> tuple[str, GGMLType]:
    """``PATTERN=TYPE`` (``--tensor-type``); the pattern is lower-cased, as llama-quantize does."""
    pattern, sep, ty = text.partition("=")
    if not sep:
        raise QuantizeError(f"malformed tensor type {text!r} (expected PATTERN=TYPE, e.g. attn_q=q8_0)")
    if not pattern:
        raise QuantizeError(f"missing tensor name in tensor type {text!r}")
    if not ty:
        raise QuantizeError(f"missing quantization type in tensor type {text!r}")
    try:
        t = parse_ggml_type(ty)
    except QuantizeError:
        raise QuantizeError(f"invalid quantization type {ty!r} in tensor type {text!r}") from None
    return pattern.lower(), t


def parse_tensor_type_file(path: str | os.PathLike[str]) -> list[tuple[str, GGMLType]]:
    """A file of ``PATTERN=TYPE`` items separated by spaces or newlines (``--tensor-type-file``)."""
    try:
        with open(path, encoding="utf-8") as f:
            words = f.read().split()
    except OSError as e:
        raise QuantizeError(f"failed to open tensor type file {str(path)!r}: {e.strerror}") from None
    return [parse_tensor_type(w) for w in words]


def parse_prune_layers(text: str) -> list[int]:
    """``L0,L1,...``: sorted, unique, non-negative layer ids (``--prune-layers``)."""
    out: list[int] = []
    for item in text.split(","):
        try:
            i = int(item)
        except ValueError:
            i = -1
        if i < 0:
            raise QuantizeError(f"invalid layer id {item!r} in --prune-layers {text!r}")
        out.append(i)
    return sorted(set(out))
