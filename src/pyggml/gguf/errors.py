"""GGUF's exceptions: one base type, so callers can catch every GGUF problem at once."""

from __future__ import annotations

from ..errors import PyGGMLError

#: ggml's validation checks, in the order gguf_init_from_reader applies them
#: (ggml-internals.md section 3.4), plus D4, which ggml lacks.
CHECKS: dict[str, str] = {
    "M1": "failed to read magic",
    "M2": "invalid magic",
    "V1": "failed to read version",
    "V2": "bad GGUF version",
    "V3": "byte order mismatch",
    "V4": "GGUFv1 is no longer supported",
    "V5": "unsupported GGUF version",
    "H1": "bad tensor count",
    "H2": "bad key-value count",
    "K1": "failed to read key",
    "K2": "empty key",
    "K3": "duplicate key",
    "K4": "failed to read value type",
    "K5": "invalid value type",
    "K6": "failed to read value",
    "A1": "bad alignment type",
    "A2": "bad alignment value",
    "T1": "bad tensor name",
    "T2": "duplicate tensor name",
    "T3": "too many dimensions",
    "T4": "negative dimension",
    "T5": "element count overflow",
    "T6": "invalid tensor type",
    "T7": "bad tensor type or row size",
    "T8": "tensor byte size overflow",
    "T9": "failed to read tensor offset",
    "D1": "failed to seek to the data section",
    "D2": "wrong tensor offset",
    "D3": "data size overflow",
    "D4": "tensor data past end of file",
}


class GGUFError(PyGGMLError, ValueError):
    """A malformed GGUF file, or a GGUF operation that cannot be done.

    For a failed validation check, ``check`` is its code (a key of :data:`CHECKS`),
    ``offset`` the byte offset of the offending field, and ``key``/``tensor`` name what
    was being read; the message says all of them.
    """

    def __init__(
        self,
        message: str,
        *,
        check: str | None = None,
        offset: int | None = None,
        key: str | None = None,
        tensor: str | None = None,
    ) -> None:
        self.check = check
        self.offset = offset
        self.key = key
        self.tensor = tensor
        self.detail = message
        if check is not None:
            message = f"{CHECKS[check]} [{check}]: {message}"
        if offset is not None:
            message = f"{message} (at byte {offset})"
        super().__init__(message)


class GGUFKeyError(GGUFError, LookupError):
    """A key or tensor that is not there, or an index out of range (ggml asserts)."""


class GGUFTypeError(GGUFError, TypeError):
    """A typed getter or setter used with a value of another type (ggml asserts)."""
